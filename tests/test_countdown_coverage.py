"""benchmarks/countdown_coverage.py: per-task coverage numbers, paired bootstrap differences, and the script end to end
on the tiny model (a name and a trained run directory) with a few tasks."""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from agents.grpo.config import load_lane, load_recipe
from agents.grpo.trainer import Trainer

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("countdown_coverage", ROOT / "benchmarks" / "countdown_coverage.py")
cc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cc)


def rec(ti, si, correct, parsed):
    return {"task_index": ti, "sample_index": si, "task_id": f"countdown-{ti}", "correct": correct,
            "parsed_answer": parsed, "response": f"<answer>{parsed}</answer>", "metadata": {"target": 1, "solution": ""}}


# Policy A: task 0 two solutions (entrances 4 * 3 and 5 + 2), task 1 one correct of two.
A = [rec(0, 0, True, "2+3*4"), rec(0, 1, True, "(2+5)*2"), rec(1, 0, True, "9-1"), rec(1, 1, False, "8+1")]
# Policy B: task 0 the same solution twice, task 1 nothing correct.
B = [rec(0, 0, True, "2+3*4"), rec(0, 1, True, "4*3+2"), rec(1, 0, False, "9+1"), rec(1, 1, False, "8+1")]


def test_per_task_by_hand():
    a = cc.per_task(A, 2)
    # A: pass@1 per task (2/2, 1/2), pass@2 (1, 1), coverage (2, 1), correct entrances (2, 1), entropy (1 bit, 0)
    assert a["values"]["pass@1"].tolist() == [1.0, 0.5] and a["values"]["pass@k"].tolist() == [1.0, 1.0]
    assert a["values"]["coverage"].tolist() == [2.0, 1.0] and a["values"]["entrances"].tolist() == [2.0, 1.0]
    assert a["values"]["entrance_entropy"].tolist() == pytest.approx([1.0, 0.0])
    # all samples of task 1 enter with 9 - 1 and 8 + 1: 1 bit
    assert a["values"]["entrance_entropy_all"].tolist() == pytest.approx([1.0, 1.0])
    assert a["tasks"][0] == {"task_id": "countdown-0", "correct": 2, "solutions": 2,
                             "entrance_counts": {"4 * 3": 1, "5 + 2": 1}}
    with pytest.raises(ValueError, match="expected 3"):
        cc.per_task(A, 3)


def test_bootstrap_interval_by_hand():
    assert cc.bootstrap_interval([0.5, 0.5, 0.5]) == (0.5, 0.5)  # constant differences: a point
    # two tasks with differences 0 and 1: a resample's mean is 0, 1/2 or 1 with probabilities 1/4, 1/2, 1/4, so the
    # 2.5% and 97.5% quantiles of many resamples are 0 and 1
    assert cc.bootstrap_interval([0.0, 1.0], n_boot=4000) == (0.0, 1.0)
    lo, hi = cc.bootstrap_interval(np.r_[np.zeros(50), np.ones(50)], n_boot=4000)
    # mean 1/2, standard error sqrt(0.25/100) = 0.05: the interval is about 0.5 -+ 1.96 * 0.05 = [0.40, 0.60]
    assert 0.38 <= lo <= 0.42 and 0.58 <= hi <= 0.62
    assert cc.bootstrap_interval([0.0, 1.0], seed=3) == cc.bootstrap_interval([0.0, 1.0], seed=3)
    with pytest.raises(ValueError):
        cc.bootstrap_interval([])
    with pytest.raises(ValueError):
        cc.bootstrap_interval([1.0], n_boot=0)


def test_compare_by_hand():
    report = cc.compare({"A": cc.per_task(A, 2), "B": cc.per_task(B, 2)}, n_boot=500)
    assert report["baseline"] == "A" and list(report["differences"]) == ["B"]
    b, d = report["policies"]["B"], report["differences"]["B"]
    # B: coverage (1, 0) -> 0.5 vs A's 1.5: -1 (per-task differences -1, -1: a point interval)
    assert b["coverage"] == 0.5 and report["policies"]["A"]["coverage"] == 1.5
    assert d["coverage"] == {"difference": -1.0, "ci95": [-1.0, -1.0]}
    # pass@1: B (1, 0) vs A (1, 0.5): differences (0, -0.5), mean -0.25
    assert d["pass@1"]["difference"] == -0.25 and d["pass@1"]["ci95"] == [-0.5, 0.0]
    table = cc.format_report(report, 2)
    assert "coverage@2" in table and "0.500 (-1.000 [-1.000, -1.000])" in table
    with pytest.raises(ValueError, match="same tasks"):
        cc.compare({"A": cc.per_task(A, 2), "C": cc.per_task([{**r, "task_id": "x"} for r in B], 2)})


def test_script_on_the_tiny_model(tmp_path, capsys):
    out = tmp_path / "cov.json"
    assert cc.main(["tiny", "tiny", "--tasks", "3", "--k", "2", "--max-new-tokens", "6", "--bootstrap", "50",
                    "--out", str(out), "--results-dir", str(tmp_path / "res")]) == 0
    printed = capsys.readouterr().out
    assert "coverage@2" in printed and "tiny#1" in printed
    report = json.loads(out.read_text())
    lane = load_lane("micro")
    assert report["settings"]["env_kwargs"] == {**lane["env_kwargs"], **lane["eval_env_kwargs"]}
    assert report["settings"]["temperature"] == 1.0 and report["settings"]["max_new_tokens"] == 6
    assert list(report["policies"]) == ["tiny", "tiny#1"]
    for label in ("tiny", "tiny#1"):
        p = report["policies"][label]
        assert p["model"] == "tiny-seed0" and len(p["tasks"]) == 3 and set(cc.METRICS) <= set(p)
        assert sum(p["entrance_sources"].values()) == 6
    # the same policy with the same per-sample seeds: identical samples, zero differences
    assert all(v == {"difference": 0.0, "ci95": [0.0, 0.0]} for v in report["differences"]["tiny#1"].values())
    assert (tmp_path / "res" / "coverage-0-tiny.json").exists()


def test_script_on_a_trained_run_directory(tmp_path):
    run_dir = tmp_path / "grpo-s0"
    cfg = load_recipe("grpo", ["model=tiny", "steps=1", "prompts_per_step=2", "max_new_tokens=4", "eval_size=2", "final_eval_size=0",
                               "eval_every=0", "progress=false", "plot=false", f"out_dir={run_dir}", "seed=0"],
                      lane="micro")
    Trainer(cfg).run()
    report = cc.run(["tiny", str(run_dir)], tasks=2, k=2, max_new_tokens=4, n_boot=20)
    assert report["policies"][str(run_dir)]["model"] == "tiny + grpo (seed 0)"
    assert report["policies"][str(run_dir)]["source"].startswith("trained: step-1.pt of grpo-s0")
    assert set(report["differences"][str(run_dir)]) == set(cc.METRICS)


def test_unselected_entrances_avoid_what_the_samples_started_with():
    """Numbers [2, 3, 4] -> 24 (solvable entrances include 4 * 3, 3 + 2, 4 + 2, 4 * 2, 3 * 2, ...): a task whose samples
    all started with 4*3 gets another solvable entrance; the draw is seeded per task."""
    from rlvr_envs.tasks.countdown import solvable_entrances

    meta = {"numbers": [2, 3, 4], "target": 24, "solution": "2*3*4"}
    trace = "4*3=12 [2 12]\n 12*2=24 !\n<answer>4*3*2</answer>"
    records = [{"task_index": 0, "sample_index": j, "task_id": "countdown-0", "correct": True, "parsed_answer": "4*3*2",
                "response": trace, "metadata": meta} for j in range(3)]
    table = cc.unselected_entrances(records, lambda task_id: ([2, 3, 4], 24), seed=0)
    options = {e.text for e in solvable_entrances([2, 3, 4], 24)}
    assert set(table) == {"countdown-0"} and table["countdown-0"] in options
    assert not table["countdown-0"].startswith("4 * 3")
    assert cc.unselected_entrances(records, lambda task_id: ([2, 3, 4], 24), seed=0) == table  # deterministic


def test_script_with_the_unselected_entrance_intervention(tmp_path):
    report = cc.run(["tiny"], tasks=2, k=2, max_new_tokens=6, n_boot=20, unselected=True,
                    results_dir=tmp_path / "res")
    assert list(report["policies"]) == ["tiny", "tiny+unselected"]
    again = json.loads((tmp_path / "res" / "coverage-0-tiny-unselected.json").read_text())
    # every response of the intervention run starts with the prefilled entrance line
    assert again["config"]["env_kwargs"]["entrance_as"] == "prefill"
    table = again["config"]["env_kwargs"]["entrances"]
    for r in again["records"]:
        first = r["response"].splitlines()[0]
        a, op_b = table[r["task_id"]].split(" ", 1)
        assert first.startswith(a + op_b.split(" ")[0]), (first, table[r["task_id"]])
