"""`rlvr eval` end to end on rlvr/Arithmetic-v0 with external agents, then the board; and import hygiene."""

import json
import subprocess
import sys

import pytest
from harness_toy import GoldAgent

from rlvr_envs.cli import main as rlvr_main
from rlvr_envs.harness import Results
from rlvr_envs.harness import leaderboard as lb

ARITH = "rlvr/Arithmetic-v0"


class HalfRightAgent(GoldAgent):
    """Gold on even task indices, a wrong number on odd ones (every response is well formatted)."""

    def act(self, observations, infos):
        gold = super().act(observations, infos)
        return [g if i["task_index"] % 2 == 0 else "The final answer is \\boxed{123456789}." for g, i in zip(gold, infos)]


def test_rlvr_eval_on_arithmetic_then_submit(tmp_path, capsys):
    out = tmp_path / "arith.json"
    code = rlvr_main(["eval", "--env", ARITH, "--agent", "test_harness_cli:HalfRightAgent", "--agent-kwargs",
                      json.dumps({"env_id": ARITH}), "--samples", "2", "--limit", "10", "--out", str(out),
                      "--no-progress"])
    assert code == 0
    assert "pass@1=0.5000" in capsys.readouterr().out
    res = Results.load(out)
    assert res.metrics["accuracy"] == 0.5 and res.metrics["maj@2"] == 0.5 and res.metrics["format_error_rate"] == 0
    assert [r["correct"] for r in res.records[::2]] == [True, False] * 5
    assert res.provenance["env"]["id"] == ARITH and res.provenance["data"]["fingerprint"]
    boards = tmp_path / "boards"
    assert lb.submit(out, "arithmetic", boards_dir=boards)["metrics"]["accuracy"] == 0.5
    doc = json.loads(out.read_text())
    doc["records"][0]["correct"] = False
    with pytest.raises(lb.SubmissionRejected, match="arith-0"):
        lb.submit(doc, "arithmetic", boards_dir=boards)


def test_three_task_gold_run_cannot_join_a_twelve_task_board(tmp_path, capsys):
    from rlvr_envs.harness import evaluate

    boards = str(tmp_path / "boards")
    evaluate(GoldAgent(ARITH), ARITH, limit=12, out=tmp_path / "r12.json", progress=False)
    evaluate(GoldAgent(ARITH), ARITH, limit=3, out=tmp_path / "r3.json", progress=False)
    assert rlvr_main(["leaderboard", "submit", str(tmp_path / "r12.json"), "--board", "arith", "--boards-dir", boards]) == 0
    capsys.readouterr()
    assert rlvr_main(["leaderboard", "submit", str(tmp_path / "r3.json"), "--board", "arith", "--boards-dir", boards]) == 1
    err = capsys.readouterr().err
    print(err)
    sha12, sha3 = (lb.task_ids_sha256(f"arith-{i}" for i in range(n)) for n in (12, 3))
    assert f"rejected: board 'arith' is pinned to 12 tasks (task ids sha256 {sha12}) x 1 sample per task; " \
           f"these results have 3 tasks (task ids sha256 {sha3}) x 1 sample per task. Different task set" in err
    assert len(lb.load_board(tmp_path / "boards" / "arith.json")["entries"]) == 1


class EquivalentFormsAgent:
    """Task 0 (gold 1/2): 3, 1/2, 3, 0.5, \\frac{1}{2}; task 1 (gold 7): 7 every time."""

    FORMS = ["3", "1/2", "3", "0.5", "\\frac{1}{2}"]

    def act(self, observations, infos):
        return [f"The answer is \\boxed{{{self.FORMS[i['sample_index']] if i['task_index'] == 0 else 7}}}."
                for i in infos]


def test_math_env_maj_votes_on_equivalent_answers_and_the_board_agrees(tmp_path):
    from rlvr_envs.harness import evaluate

    data = tmp_path / "data" / "math"
    data.mkdir(parents=True)
    rows = [{"problem": "What is 1 divided by 2?", "answer": "\\frac{1}{2}", "subject": "Prealgebra", "level": 1,
             "unique_id": "toy/half.json"},
            {"problem": "What is 3 + 4?", "answer": "7", "subject": "Prealgebra", "level": 1,
             "unique_id": "toy/seven.json"}]
    (data / "math500.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "maj.json"
    res = evaluate(EquivalentFormsAgent(), "rlvr/MATH500-v0", env_kwargs={"data_dir": str(tmp_path / "data")},
                   n_samples=5, out=out, progress=False)
    assert res.metrics["mean@5"] == 0.8
    assert res.metrics["maj@5"] == 1.0  # a vote on raw strings would elect "3" on task 0: 0.5
    assert lb.submit(out, "maj", boards_dir=tmp_path / "b")["metrics"]["maj@5"] == 1.0
    doc = json.loads(out.read_text())
    doc["metrics"]["maj@5"] = 0.5
    with pytest.raises(lb.SubmissionRejected, match=r"maj@5: claimed 0.5, re-verified 1.0"):
        lb.submit(doc, "maj", boards_dir=tmp_path / "b")


def test_rlvr_eval_bad_arguments(tmp_path, capsys):
    with pytest.raises(SystemExit, match="module:attr"):
        rlvr_main(["eval", "--env", ARITH, "--agent", "nocolon", "--out", str(tmp_path / "x.json")])
    with pytest.raises(SystemExit, match="--env-kwargs"):
        rlvr_main(["eval", "--env", ARITH, "--agent", "harness_toy:GoldAgent", "--env-kwargs", "[1]"])
    with pytest.raises(SystemExit, match=">= 1"):
        rlvr_main(["eval", "--env", ARITH, "--agent", "harness_toy:GoldAgent", "--samples", "0"])


def test_harness_imports_neither_agents_nor_torch():
    code = ("import sys, rlvr_envs.harness, rlvr_envs.harness.leaderboard, rlvr_envs.harness.render, "
            "rlvr_envs.commands.eval, rlvr_envs.commands.leaderboard\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('agents', 'torch', 'transformers'))\n"
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_math500_gold_run_is_accepted_and_a_flip_is_caught(data_dir, tmp_path):
    from rlvr_envs.harness import evaluate

    out = tmp_path / "m.json"
    res = evaluate(GoldAgent("rlvr/MATH500-v0"), "rlvr/MATH500-v0", limit=6, out=out, progress=False)
    assert res.metrics["accuracy"] == 1.0 and "accuracy_by_subject" in res.metrics and "accuracy_by_level" in res.metrics
    assert lb.submit(out, "math500", boards_dir=tmp_path)["metrics"]["accuracy_by_level"] == res.metrics["accuracy_by_level"]
    doc = json.loads(out.read_text())
    doc["records"][4]["response"] = "I am not sure, maybe \\boxed{-7/3}."
    with pytest.raises(lb.SubmissionRejected, match="1 record"):
        lb.submit(doc, "math500", boards_dir=tmp_path)


@pytest.mark.parametrize("wrong", [False, True])
def test_multi_turn_search_env_with_its_oracle(tmp_path, wrong):
    import gymnasium as gym

    from rlvr_envs.harness import evaluate
    from rlvr_envs.search.env import OracleAgent

    kwargs = {"corpus_size": 300, "hops": 2, "retriever": "bm25"}
    agent = OracleAgent(gym.make("rlvr/MultiHopSynth-v0", **kwargs).unwrapped, wrong=wrong)
    out = tmp_path / "search.json"
    res = evaluate(agent, "rlvr/MultiHopSynth-v0", env_kwargs=kwargs, limit=4, batch_size=3, out=out, progress=False)
    assert res.metrics["accuracy"] == (0.0 if wrong else 1.0)
    assert all(r["turns"][0].startswith("<search>") and r["turns"][-1].startswith("<answer>") for r in res.records)
    assert lb.submit(out, "search", boards_dir=tmp_path / "boards")["metrics"]["accuracy"] == res.metrics["accuracy"]
