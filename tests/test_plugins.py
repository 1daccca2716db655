"""Plugins: a real distribution on sys.path (a ``*.dist-info`` with ``entry_points.txt``) adds an env and a GRPO
component; ``gymnasium.make``, ``rlvr list``, ``rlvr train --list`` and ``rlvr train`` find them, and broken plugins
warn with their distribution's name without breaking anything else."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import gymnasium as gym
import pytest

import rlvr_envs  # noqa: F401
from agents.grpo import registry
from rlvr_envs import plugins, registration
from rlvr_envs.cli import main
from rlvr_envs.plugins import PluginWarning, load_env_plugins

ENV_ID = "rlvrplugin/Echo-v0"
COMPONENT = "plugin_demo_bonus"

DEMO_INIT = '''
"""rlvr-plugin-demo: one env (say the word back). Light: the rlvr_envs.envs entry point imports this module."""
from rlvr_envs.core import ListSource, Task, TextEnv, Verdict
from rlvr_envs.registration import EnvEntry

WORDS = ["alpha", "beta", "gamma", "delta"]


def score(task, response):
    said = response.strip().strip(".").lower()
    return Verdict(correct=said == task.answer, reward=float(said == task.answer), parsed=said, format_ok=True)


def make_env(**kwargs):
    tasks = [Task(f"echo-{i}", f"Say the word {w} and nothing else.", w) for i, w in enumerate(WORDS)]
    return TextEnv(ListSource(tasks, name="echo"), score, verifier_name="exact word", **kwargs)


def envs():
    return [EnvEntry("rlvrplugin/Echo-v0", "rlvr_plugin_demo:make_env", "say the word back", "4", "exact word")]
'''

DEMO_COMPONENTS = '''
"""rlvr-plugin-demo's GRPO component: importing this module registers it."""
from agents.grpo.registry import Component, register


@register("plugin_demo_bonus", stage="reward_shaper")
class BonusShaper(Component):
    """Adds a constant to every reward and counts its calls (reported in the train records)."""

    def __init__(self, bonus: float = 0.5):
        self.bonus, self.calls = float(bonus), 0

    def __call__(self, batch):
        self.calls += 1
        return batch.rewards + self.bonus

    def metrics(self):
        return {"calls": float(self.calls)}
'''


def write_distribution(root: Path, dist: str, entry_points: str, files: dict[str, str]) -> None:
    """A distribution as pip leaves it in site-packages: the package files and ``<name>-<version>.dist-info``."""
    info = root / f"{dist.replace('-', '_')}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(textwrap.dedent(entry_points))
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def write_demo(root: Path) -> None:
    write_distribution(root, "rlvr-plugin-demo", """
        [rlvr_envs.envs]
        demo = rlvr_plugin_demo:envs

        [rlvr_envs.components]
        demo = rlvr_plugin_demo.components
        """, {"rlvr_plugin_demo/__init__.py": DEMO_INIT, "rlvr_plugin_demo/components.py": DEMO_COMPONENTS})


def write_broken(root: Path) -> None:
    """One plugin whose env module raises on import, one whose env ID is taken, one whose component name is."""
    write_distribution(root, "rlvr-plugin-broken", """
        [rlvr_envs.envs]
        raises = rlvr_plugin_broken.boom:envs
        clash = rlvr_plugin_broken:clashing_envs

        [rlvr_envs.components]
        clash = rlvr_plugin_broken.components
        """, {
        "rlvr_plugin_broken/__init__.py": (
            "from rlvr_envs.registration import EnvEntry\n\n\n"
            "def clashing_envs():\n"
            "    return [EnvEntry('rlvr/Arithmetic-v0', 'rlvr_plugin_broken:nope', 'x', '1', 'x')]\n"),
        "rlvr_plugin_broken/boom.py": "raise RuntimeError('plugin exploded on import')\n",
        "rlvr_plugin_broken/components.py": (
            "from agents.grpo.registry import Component, register\n\n\n"
            "@register('none', stage='reward_shaper')\nclass Shadow(Component):\n    pass\n"),
    })


@pytest.fixture
def plugin_path(tmp_path, monkeypatch):
    """tmp_path/site on sys.path, with this process's plugin bookkeeping isolated and restored afterwards."""
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(plugins, "_tried", set())
    monkeypatch.setattr(plugins, "_loaded", [])
    monkeypatch.setattr(registration, "_PLUGIN_ENTRIES", [])
    monkeypatch.setattr(registry, "_PLUGIN_PACKAGES", {})
    yield site
    gym.registry.pop(ENV_ID, None)
    registry.unregister(COMPONENT, stage="reward_shaper")
    for name in [m for m in sys.modules if m.startswith(("rlvr_plugin_demo", "rlvr_plugin_broken"))]:
        del sys.modules[name]


def test_plugin_env_and_component_are_found_listed_and_used(plugin_path, monkeypatch, capsys, tmp_path):
    write_demo(plugin_path)
    loaded = load_env_plugins()
    assert [(p.distribution, p.name) for p in loaded] == [("rlvr-plugin-demo", "demo")]
    assert load_env_plugins() == []  # each entry point loads once

    env = gym.make(ENV_ID)
    obs, info = env.reset(seed=0, options={"index": 1})
    assert "beta" in obs
    assert env.step("beta")[1] == 1.0
    env.reset(seed=0, options={"index": 1})
    assert env.step("gamma")[1] == 0.0

    assert main(["list", "--filter", "rlvrplugin"]) == 0
    out = capsys.readouterr().out
    assert ENV_ID in out and "rlvr-plugin-demo" in out

    monkeypatch.setattr(registry, "_loaded", False)  # this process loaded the built-ins already: scan again
    assert main(["train", "--list"]) == 0
    assert f"{COMPONENT} (rlvr-plugin-demo)" in capsys.readouterr().out
    assert registry.package_of("reward_shaper", COMPONENT) == "rlvr-plugin-demo"
    assert registry.package_of("reward_shaper", "none") == "rlvr-envs"

    out_dir = tmp_path / "run"
    overrides = ["model=tiny", "steps=1", "max_new_tokens=4", "prompts_per_step=2", "eval_size=2", "progress=false",
                 "plot=false", f"env={ENV_ID}", "eval_env_kwargs={}", f"stages.reward_shaper={COMPONENT}",
                 f"out_dir={out_dir}"]
    assert main(["train", "grpo", *[x for o in overrides for x in ("--set", o)]]) == 0
    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    assert len(train) == 1 and train[0]["reward_shaper.calls"] == 1.0


def test_broken_plugins_warn_with_their_distribution_and_are_skipped(plugin_path, monkeypatch):
    write_broken(plugin_path)
    write_demo(plugin_path)
    with pytest.warns(PluginWarning) as caught:
        loaded = load_env_plugins()
    messages = sorted(str(w.message) for w in caught)
    assert len(messages) == 2 and all("'rlvr-plugin-broken'" in m for m in messages)
    assert any("RuntimeError: plugin exploded on import" in m for m in messages)
    assert any("already registered: rlvr/Arithmetic-v0" in m for m in messages)
    assert [p.distribution for p in loaded] == ["rlvr-plugin-demo"]  # the good plugin still loads
    assert gym.spec("rlvr/Arithmetic-v0").entry_point == "rlvr_envs.tasks.arithmetic:make_env"  # not shadowed

    monkeypatch.setattr(registry, "_loaded", False)
    with pytest.warns(PluginWarning, match=r"'rlvr-plugin-broken'.*RegistryError: reward_shaper: name 'none'"):
        names = registry.names("reward_shaper")["reward_shaper"]
    assert "none" in names and COMPONENT in names
    assert registry.get("reward_shaper", "none").__module__ == "agents.grpo.baselines"


def test_import_rlvr_envs_loads_env_plugins_and_survives_broken_ones(plugin_path):
    write_demo(plugin_path)
    write_broken(plugin_path)
    code = ("import gymnasium as gym; env = gym.make('rlvr_envs:rlvrplugin/Echo-v0'); "
            "print(env.reset(seed=0)[0]); print(env.step('alpha')[1] in (0.0, 1.0))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugin_path), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert "Say the word" in out.stdout and out.stdout.strip().endswith("True")
    assert "PluginWarning" in out.stderr and "rlvr-plugin-broken" in out.stderr

    off = subprocess.run([sys.executable, "-c", "import gymnasium as gym, rlvr_envs; print('rlvrplugin/Echo-v0' in "
                          "gym.registry)"], capture_output=True, text=True, timeout=120,
                         env={**env, "RLVR_NO_PLUGINS": "1"})
    assert off.returncode == 0 and off.stdout.strip() == "False" and "PluginWarning" not in off.stderr
