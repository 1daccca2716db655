"""Small CLI behaviours a new user meets: ``--agent`` by file path and its PYTHONPATH hint, ``--no-progress`` hiding
transformers' weight-loading bar, and a pin rejection that prints the flags to rerun with."""

from __future__ import annotations

import json
import shlex

import pytest
from harness_toy import SeededAgent

import rlvr_envs  # noqa: F401
from rlvr_envs.cli import main as rlvr_main
from rlvr_envs.harness import evaluate
from rlvr_envs.harness import leaderboard as lb

ARITH = "rlvr/Arithmetic-v0"
AGENT_FILE = '''
class EchoAgent:
    """Answers every task with 0."""

    def act(self, observations, infos):
        return ["\\\\boxed{0}" for _ in observations]


def make():
    return EchoAgent()
'''


def test_agent_from_a_file_path(tmp_path, capsys):
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    (folder / "myagent_file_only.py").write_text(AGENT_FILE)
    out = tmp_path / "r.json"
    assert rlvr_main(["eval", "--env", ARITH, "--agent", f"{folder / 'myagent_file_only.py'}:make", "--limit", "2",
                      "--out", str(out), "--no-progress"]) == 0
    records = json.loads(out.read_text())["records"]
    assert [r["response"] for r in records] == ["\\boxed{0}", "\\boxed{0}"]
    with pytest.raises(SystemExit, match="no file"):
        rlvr_main(["eval", "--env", ARITH, "--agent", f"{folder / 'missing.py'}:make", "--out", str(out)])


def test_an_unimportable_agent_module_names_pythonpath_and_the_file_form(tmp_path):
    with pytest.raises(SystemExit) as raised:
        rlvr_main(["eval", "--env", ARITH, "--agent", "myagent_not_on_path:make", "--out", str(tmp_path / "x.json")])
    message = str(raised.value)
    assert "PYTHONPATH" in message and "--agent path/to/myagent_not_on_path.py:make" in message


def test_no_progress_hides_the_weight_loading_bar(tmp_path, capfd):
    pytest.importorskip("transformers")
    from agents.policy import load_policy

    tiny = load_policy("tiny", seed=0)
    model_dir = tmp_path / "tiny-saved"
    tiny.model.save_pretrained(model_dir)
    tiny.tokenizer.save_pretrained(model_dir)
    common = ["eval", "--env", ARITH, "--model", str(model_dir), "--limit", "1", "--max-new-tokens", "2"]
    assert rlvr_main([*common, "--out", str(tmp_path / "a.json")]) == 0
    assert "Loading weights" in capfd.readouterr().err  # the bar this flag must hide is really there without it
    try:
        assert rlvr_main([*common, "--out", str(tmp_path / "b.json"), "--no-progress"]) == 0
        assert "Loading weights" not in capfd.readouterr().err
    finally:  # the flag turns transformers' bars off for the process; later tests get them back
        from transformers.utils import logging as hf_logging

        hf_logging.enable_progress_bar()


def test_a_pin_rejection_prints_the_flags_to_rerun_with(tmp_path):
    boards = tmp_path / "boards"
    kwargs = {"max_operand": 9}
    lb.create_board("pinned", ARITH, n_tasks=4, n_samples=2, env_kwargs=kwargs, boards_dir=boards)
    out = tmp_path / "short.json"
    evaluate(SeededAgent(), ARITH, n_samples=2, limit=3, env_kwargs=kwargs, out=out, progress=False)
    with pytest.raises(lb.SubmissionRejected) as raised:
        lb.submit(out, "pinned", boards_dir=boards)
    flags = str(raised.value).split("Rerun with: ")[1].split(" (the first")[0]
    assert shlex.split(flags) == ["rlvr", "eval", "--env", ARITH, "--env-kwargs", '{"max_operand": 9}', "--limit", "4",
                                  "--samples", "2"]
