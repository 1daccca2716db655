"""Install profiles: a missing optional extra fails where it is needed, with the extra to install.

A missing module is simulated with ``sys.modules[name] = None``, which makes ``import name`` raise ImportError and
``importlib.util.find_spec(name)`` return None, exactly as when the package is not installed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import gymnasium as gym
import pytest

import rlvr_envs  # noqa: F401
from rlvr_envs.cli import main
from rlvr_envs.data import DataNotFoundError, HFSource, load_rows
from rlvr_envs.extras import EXTRAS, MissingExtraError, missing, require, require_extra
from rlvr_envs.registration import all_entries

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent


def hide(monkeypatch: pytest.MonkeyPatch, *modules: str) -> None:
    for name in modules:
        monkeypatch.setitem(sys.modules, name, None)


def test_require_imports_an_installed_module():
    assert require("json", "agents", "a test").dumps([1]) == "[1]"


def test_require_names_the_extra_and_what_needed_it(monkeypatch):
    hide(monkeypatch, "bm25s")
    with pytest.raises(MissingExtraError) as info:
        require("bm25s", "search", "rlvr/HotpotQA-v0")
    message = str(info.value)
    assert message.startswith("rlvr/HotpotQA-v0 needs the [search] extra: pip install 'rlvr-envs[search]'")
    assert "'bm25s'" in message
    assert isinstance(info.value, ImportError) and info.value.extra == "search" and info.value.name == "bm25s"


def test_missing_and_require_extra_check_without_importing(monkeypatch):
    hide(monkeypatch, "ot")
    assert missing("bisim") == ["ot"]
    assert missing("search", ("bm25s",)) == []
    with pytest.raises(MissingExtraError, match=r"rlvr bisim needs the \[bisim\] extra"):
        require_extra("bisim", "rlvr bisim")
    with pytest.raises(ValueError, match="unknown extra"):
        missing("nope")


@pytest.mark.parametrize(("env_id", "kwargs", "hidden"), [
    ("rlvr/MultiHopSynth-v0", {}, "bm25s"),
    ("rlvr/MultiHopSynth-v0", {"retriever": "dense"}, "faiss"),
    ("rlvr/HotpotQA-v0", {}, "bm25s"),
])
def test_making_a_search_env_without_the_extra_says_which(monkeypatch, env_id, kwargs, hidden):
    hide(monkeypatch, hidden)
    expected = rf"{env_id} needs the \[search\] extra: pip install 'rlvr-envs\[search\]'"
    with pytest.raises(MissingExtraError, match=expected):
        gym.make(env_id, **kwargs)


def test_every_table_row_names_a_known_extra():
    extras = {e.extra for e in all_entries()}
    assert extras - {None} <= set(EXTRAS)
    assert {e.id for e in all_entries() if e.extra == "search"} == {"rlvr/HotpotQA-v0", "rlvr/MultiHopSynth-v0"}


def test_commands_that_need_an_extra_say_which(monkeypatch, capsys):
    hide(monkeypatch, "torch")
    assert main(["train", "--list"]) == 1
    assert "rlvr train needs the [agents] extra: pip install 'rlvr-envs[agents]'" in capsys.readouterr().err
    hide(monkeypatch, "ot")
    assert main(["bisim", "--env", "rlvr/Grouped64-v0"]) == 1
    assert "[bisim] extra" in capsys.readouterr().err


def test_hub_fallback_without_datasets_names_the_hub_extra(monkeypatch, tmp_path):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    hide(monkeypatch, "datasets")
    with pytest.raises(DataNotFoundError, match=r"\[hub\] extra: pip install 'rlvr-envs\[hub\]'"):
        load_rows("nope/test.jsonl", data_dir=tmp_path, hf=HFSource("someone/nope", "test"))


def test_pyproject_extras_match_the_table():
    """Every extra in rlvr_envs.extras is a pip extra; [all] holds them all but vllm; [dev] pulls [all]."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    optional = project["optional-dependencies"]
    assert set(EXTRAS) <= set(optional)
    assert optional["all"] == [f"rlvr-envs[{','.join(e for e in EXTRAS if e != 'vllm')}]"]
    assert "rlvr-envs[all]" in optional["dev"]
    heavy = ("torch", "transformers", "faiss", "bm25s", "POT", "datasets", "scipy")
    assert not [d for d in project["dependencies"] if d.split(">")[0].split("<")[0].split(";")[0] in heavy]
