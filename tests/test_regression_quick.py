"""Every declared comparison runs end to end (tiny model, two steps, two seeds) and writes a complete result."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from agents.grpo.comparisons import Comparison, comparisons, declare, recheck, summarize
from agents.grpo.regression import run_comparison

REQUIRED = {"method", "baseline", "lane", "seeds", "metric", "method_value", "baseline_value", "interval",
            "direction_reproduced", "commit", "recipes", "curves", "claim", "direction", "key", "command"}


def test_every_method_declares_a_comparison() -> None:
    names = comparisons()
    assert {"vigor_vs_grpo", "err_plus_vs_grpo", "lampo_vs_grpo", "dapo_vs_grpo", "dr_grpo_vs_grpo"} <= set(names)
    with pytest.raises(ValueError, match="declared twice"):
        declare(names["vigor_vs_grpo"])
    with pytest.raises(ValueError, match="unknown metric"):
        Comparison("a", "b", "speed", "higher", "x")


@pytest.mark.parametrize("name", sorted(comparisons()))
def test_quick_comparison_runs_and_is_reused(name: str, tmp_path: Path) -> None:
    comparison = comparisons()[name]
    messages: list[str] = []
    result = run_comparison(comparison, results_dir=tmp_path / "res", runs_dir=tmp_path / "runs", quick=True,
                            log=messages.append)
    on_disk = json.loads((tmp_path / "res" / f"{comparison.result_name}.json").read_text())
    assert REQUIRED <= set(on_disk) and on_disk["quick"] is True
    assert (tmp_path / "res" / f"{comparison.result_name}.png").stat().st_size > 0
    assert result["recipes"]["method"]["lane"] == comparison.lane
    assert result["recipes"]["method"]["model"] == "tiny" and result["seeds"] == [0, 1]
    for side in ("method", "baseline"):
        assert set(result["curves"][side]) == {"0", "1"}
        assert [c["step"] for c in result["curves"][side]["0"]] == [0, 1, 2]
    lo, hi = result["interval"]
    assert lo <= result["difference"] <= hi
    # the committed evidence alone gives back the interval and the verdict
    again_from_file = recheck(on_disk)
    assert again_from_file["verdict"] == on_disk["verdict"]
    assert again_from_file["interval"] == pytest.approx(on_disk["interval"])
    assert set(on_disk["evidence"]["per_task"]["method"]) == {"0", "1"}
    assert set(on_disk["weights"]["method"]["0"]) >= {"warmstart_weights_hash", "final_weights_hash"}
    # nothing changed: the result is read back, no training
    again = run_comparison(comparison, results_dir=tmp_path / "res", runs_dir=tmp_path / "runs", quick=True,
                           log=messages.append)
    assert again["key"] == result["key"] and any("reusing" in m for m in messages)


def _run(accs: list[float], rollouts_per_step: int = 10, length: float = 5.0, bits: str | None = None) -> list[dict]:
    out = []
    for step, acc in enumerate(accs):
        if step:
            out.append({"kind": "train", "step": step, "rollouts_total": step * rollouts_per_step})
        out.append({"kind": "eval", "step": step, "eval_accuracy": acc, "eval_len_mean": length,
                    **({"eval_correct": bits} if bits is not None and step == len(accs) - 1 else {})})
    return out


def test_summarize_rollouts_to_target_and_direction() -> None:
    c = Comparison("m", "b", "rollouts_to_target", "lower", "m is faster", seeds=(0, 1, 2), params={"gain": 0.2})
    method = {s: _run([0.3, 0.4, 0.5 + 0.01 * s, 0.6]) for s in range(3)}  # reaches 0.5 at step 2 -> 20 rollouts
    base = {s: _run([0.3, 0.35, 0.4, 0.45]) for s in range(3)}  # never: censored at 30
    out = summarize(c, method, base)
    assert out["method_value"] == 20 and out["baseline_value"] == 30 and out["difference"] == -10
    assert out["direction_reproduced"] and out["censored"] == {"method": 0, "baseline": 3}
    assert out["ratio_baseline_over_method"] == pytest.approx(1.5)
    flipped = summarize(Comparison("m", "b", "rollouts_to_target", "higher", "x", seeds=(0, 1, 2), params={"gain": 0.2}),
                      method, base)
    assert not flipped["direction_reproduced"]


def test_summarize_final_accuracy_pairs_tasks() -> None:
    """The eval-noise component is the variance of per-task *paired* differences: two runs that agree on most tasks
    have little eval noise in their difference, whatever each one's own task-to-task spread."""
    c = Comparison("m", "b", "final_accuracy", "higher", "x", seeds=(0, 1, 2))
    base_bits = ["1000" * 10, "1100" * 10, "1010" * 10]
    # the method solves what the baseline solves plus task 3 of every block of four (+0.25 on every seed)
    method_bits = ["".join(x[:3] + "1" for x in [b[i:i + 4] for i in range(0, 40, 4)]) for b in base_bits]
    method = {s: _run([0.0, 0.5], bits=method_bits[s]) for s in range(3)}
    base = {s: _run([0.0, 0.25], bits=base_bits[s]) for s in range(3)}
    out = summarize(c, method, base)
    assert out["interval_kind"].startswith("student-t over 3 paired seeds")
    diffs = [np.array([int(a) - int(b) for a, b in zip(m, b)], dtype=float) for m, b in zip(method_bits, base_bits)]
    paired = np.mean([d.var(ddof=1) / len(d) for d in diffs])
    unpaired = np.mean([(np.var([int(x) for x in m], ddof=1) + np.var([int(x) for x in b], ddof=1)) / 40
                        for m, b in zip(method_bits, base_bits)])
    assert out["variance_components"]["eval"] == pytest.approx(paired) and paired < unpaired / 2
    assert out["difference"] == pytest.approx(np.mean([d.mean() for d in diffs]))
    assert out["evidence"]["per_task"]["method"]["1"] == method_bits[1] and out["evidence"]["samples"] == 1
    again = recheck({**out, "seeds": [0, 1, 2], "metric": "final_accuracy", "direction": "higher",
                     "method": "m", "baseline": "b"})
    assert again["interval"] == pytest.approx(out["interval"]) and again["verdict"] == out["verdict"]


def test_summarize_final_accuracy_reads_the_larger_final_eval() -> None:
    """A lane with final_eval_size: the final accuracy and the evidence come from the final set, not the curve's."""
    c = Comparison("m", "b", "final_accuracy", "higher", "x", seeds=(0, 1))
    runs = {}
    for side, final in (("m", "1" * 30 + "0" * 10), ("b", "1" * 20 + "0" * 20)):
        runs[side] = {s: _run([0.0, 0.5], bits="10") for s in range(2)}
        for records in runs[side].values():
            records[-1].update(final_eval_correct=final, final_eval_accuracy=final.count("1") / 40, final_eval_n=40)
    out = summarize(c, runs["m"], runs["b"])
    assert out["method_value"] == pytest.approx(0.75) and out["baseline_value"] == pytest.approx(0.5)
    assert len(out["evidence"]["per_task"]["method"]["0"]) == 40


def test_summarize_final_eval_coverage_pairs_tasks_and_is_skipped_where_absent() -> None:
    """Coverage: per-task distinct solutions paired by task; a comparison on another metric lists coverage among its
    secondary metrics only where the runs record it."""
    def with_coverage(runs: dict, per_task: list[int]) -> dict:
        for records in runs.values():
            last = [r for r in records if r["kind"] == "eval"][-1]
            last.update(eval_coverage=sum(per_task) / len(per_task), eval_solutions=per_task)
        return runs

    method = with_coverage({s: _run([0.0, 0.5]) for s in range(2)}, [2, 2, 1, 3] * 10)  # mean 2
    base = with_coverage({s: _run([0.0, 0.5]) for s in range(2)}, [1, 1, 1, 1] * 10)  # mean 1
    out = summarize(Comparison("m", "b", "final_eval_coverage", "higher", "x", seeds=(0, 1)), method, base)
    assert out["difference"] == pytest.approx(1.0) and out["interval_kind"].startswith("student-t")
    assert out["evidence"]["per_task"]["method"]["0"] == "2213" * 10
    assert out["variance_components"]["eval"] == pytest.approx(np.var([1, 1, 0, 2] * 10, ddof=1) / 40)
    acc = summarize(Comparison("m", "b", "final_accuracy", "higher", "x", seeds=(0, 1)), method, base)
    assert acc["secondary"]["final_eval_coverage"] == {"method": 2.0, "baseline": 1.0}
    plain = summarize(Comparison("m", "b", "final_accuracy", "higher", "x", seeds=(0, 1)),
                      {s: _run([0.0, 0.5]) for s in range(2)}, {s: _run([0.0, 0.5]) for s in range(2)})
    assert "final_eval_coverage" not in plain["secondary"] and "accuracy_auc" in plain["secondary"]


def test_run_keys_ignore_declarations_but_not_code(tmp_path, monkeypatch):
    import agents.grpo.regression as regression

    method = tmp_path / "agents" / "methods" / "m.py"
    method.parent.mkdir(parents=True)
    body = "def f(x):\n    return x + 1\n"
    method.write_text(body + "\ndeclare(Comparison('m', 'grpo', 'final_accuracy', 'higher', 'claim'))\n")
    monkeypatch.setattr(regression, "ROOT", tmp_path)
    before = regression.code_hash(("agents/methods",))
    method.write_text(body + "\ndeclare(Comparison('m', 'grpo', 'final_accuracy', 'higher', 'claim',\n"
                             "                   known_result='measured: +0.01 [-0.02, 0.04]'))\n")
    assert regression.code_hash(("agents/methods",)) == before  # recording a result keeps the runs
    documented = '"""What m does."""\n\n\ndef f(x):\n    """Adds one."""\n    return x + 1  # why\n'
    method.write_text(documented + "\ndeclare(Comparison('m', 'grpo', 'final_accuracy', 'higher', 'claim'))\n")
    assert regression.code_hash(("agents/methods",)) == before  # so does documenting it
    method.write_text(body.replace("x + 1", "x + 2") + "\ndeclare(Comparison('m', 'grpo', 'final_accuracy', 'higher', 'c'))\n")
    assert regression.code_hash(("agents/methods",)) != before  # a change to what runs retrains



def test_a_run_keys_only_the_method_files_it_uses():
    """Adding or editing one method's file must not retrain the runs of GRPO or of any other method."""
    import agents.grpo.regression as regression
    from agents.grpo.config import load_recipe

    grpo, vigor = load_recipe("grpo", ["model=tiny"]), load_recipe("vigor", ["model=tiny"])
    assert regression.method_files(grpo) == []
    assert regression.run_code_hash(grpo) == regression.code_hash()  # reads nothing under agents/methods
    assert regression.method_files(vigor) == ["agents/methods/vigor.py"]
    assert regression.run_code_hash(vigor) == f"{regression.code_hash()}+{regression.code_hash(('agents/methods/vigor.py',))}"


def test_method_files_follow_imports_between_methods(tmp_path):
    from agents.grpo.regression import _with_imports

    methods = tmp_path / "agents" / "methods"
    methods.mkdir(parents=True)
    (methods / "a.py").write_text("from agents.methods.b import f\nimport agents.methods.c\nimport torch\n")
    (methods / "b.py").write_text("from agents.methods import d\n")
    (methods / "c.py").write_text("")
    (methods / "d.py").write_text("from agents.methods.a import g\n")  # a cycle ends
    (methods / "unused.py").write_text("")
    assert {p.name for p in _with_imports([methods / "a.py"], methods)} == {"a.py", "b.py", "c.py", "d.py"}


def test_an_efficiency_claim_needs_accuracy_to_hold() -> None:
    """Shorter answers by no longer solving the task do not reproduce "fewer tokens at about equal accuracy"."""
    base = {s: _run([0.3, 0.5], length=30.0) for s in range(3)}
    short_and_right = {s: _run([0.3, 0.47], length=20.0) for s in range(3)}
    short_and_wrong = {s: _run([0.3, 0.10], length=20.0) for s in range(3)}
    claim = Comparison("m", "b", "final_eval_tokens", "lower", "x", seeds=(0, 1, 2), accuracy_tolerance=0.05)
    held = summarize(claim, short_and_right, base)
    assert held["direction_reproduced"] and held["accuracy_held"] == {"tolerance": 0.05, "held": True}
    lost = summarize(claim, short_and_wrong, base)
    assert lost["difference"] == -10 and not lost["direction_reproduced"] and not lost["accuracy_held"]["held"]
    assert summarize(dataclasses.replace(claim, accuracy_tolerance=None), short_and_wrong, base)["direction_reproduced"]
    with pytest.raises(ValueError, match="accuracy_tolerance"):
        Comparison("m", "b", "final_eval_tokens", "lower", "x", accuracy_tolerance=2.0)


def test_a_point_estimate_whose_interval_crosses_zero_is_inconclusive() -> None:
    base = {s: _run([0.3, 0.5]) for s in range(3)}
    noisy = {s: _run([0.3, v]) for s, v in zip(range(3), (0.56, 0.45, 0.52))}  # diffs +0.06, -0.05, +0.02
    out = summarize(Comparison("m", "b", "accuracy_auc", "higher", "x", seeds=(0, 1, 2)), noisy, base)
    assert out["difference"] > 0 and out["interval"][0] < 0 < out["interval"][1]
    assert out["verdict"] == "inconclusive" and not out["direction_reproduced"] and out["point_estimate_in_direction"]
    worse = summarize(Comparison("m", "b", "accuracy_auc", "lower", "x", seeds=(0, 1, 2)), noisy, base)
    assert worse["verdict"] == "not reproduced"


def test_parallel_driver_trains_shared_runs_once_and_writes_results(tmp_path: Path, capsys) -> None:
    from agents.grpo.regression import main, pending_runs

    selected = [c for n, c in comparisons().items() if n in ("vigor_vs_grpo", "lampo_vs_grpo")]
    assert len(pending_runs(selected, quick=True)) == 6  # two methods x 2 seeds + the shared GRPO baseline x 2
    args = ["--quick", "-k", "vigor_vs_grpo", "-k", "lampo_vs_grpo", "--jobs", "2", "--runs-dir",
            str(tmp_path / "runs"), "--results-dir", str(tmp_path / "res")]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "6 runs for 2 comparisons" in out and "[6/6]" in out and "vigor_vs_grpo:" in out
    assert {p.name for p in (tmp_path / "res").glob("*.json")} == {"vigor.json", "lampo.json"}
    assert len(list((tmp_path / "runs").glob("*/done.json"))) == 6
    stamps = {p: p.stat().st_mtime_ns for p in (tmp_path / "runs").glob("*/metrics.jsonl")}
    assert main(args) == 0  # all done: read back, nothing retrained
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "runs").glob("*/metrics.jsonl")} == stamps


def test_a_result_is_written_as_soon_as_its_own_runs_are_done(tmp_path: Path, capsys) -> None:
    from agents.grpo.regression import main

    # one job: runs finish in the order they are pending, the first comparison's method runs and the shared GRPO runs
    # (4 of 6) before the second's two method runs, so the first result is out before the last run is reported (the
    # pool may have finished later runs by the time a run is reported: what is done by then is written then)
    assert main(["--quick", "-k", "vigor_vs_grpo", "-k", "lampo_vs_grpo", "--jobs", "1", "--runs-dir",
                 str(tmp_path / "runs"), "--results-dir", str(tmp_path / "res")]) == 0
    out = capsys.readouterr().out
    first = min(out.index("vigor_vs_grpo:"), out.index("lampo_vs_grpo:"))
    assert out.index("[1/6]") < first < out.index("[6/6]")
    assert {p.name for p in (tmp_path / "res").glob("*.json")} == {"vigor.json", "lampo.json"}


def test_seeds_option_runs_the_given_seeds_and_refuses_bad_ones(tmp_path: Path, monkeypatch, capsys) -> None:
    from agents.grpo import regression

    trained: list[tuple[str, tuple[int, ...]]] = []
    written: list[tuple[str, tuple[int, ...]]] = []
    monkeypatch.setattr(regression, "train_parallel",
                        lambda selected, **kw: trained.extend((c.name, c.seeds) for c in selected))

    def fake_result(c, **kw):
        written.append((c.name, c.seeds))
        return {"interval": (0.0, 0.0), "metric": c.metric, "method_value": 0.0, "baseline_value": 0.0,
                "difference": 0.0, "verdict": "x"}

    monkeypatch.setattr(regression, "run_comparison", fake_result)
    args = ["-k", "vigor_vs_grpo", "--runs-dir", str(tmp_path), "--results-dir", str(tmp_path)]
    assert regression.main([*args, "--seeds", "2,0"]) == 0
    assert trained == written == [("vigor_vs_grpo", (2, 0))]
    trained.clear()
    assert regression.main(args) == 0
    assert trained == [("vigor_vs_grpo", comparisons()["vigor_vs_grpo"].seeds)]  # default: the comparison's own
    for bad in ("1,1", "a", "-1", ","):
        with pytest.raises(SystemExit):
            regression.main([*args, "--seeds", bad])
    with pytest.raises(SystemExit):
        regression.main([*args, "--seeds", "0", "--quick"])
    assert "--seeds" in capsys.readouterr().err


def test_rollouts_to_target_interpolates_between_evals_when_asked() -> None:
    """Two runs that cross the target between the same two evals tie on the eval grid; interpolated, the one that
    gets closer to the target at the earlier eval crosses sooner."""
    from agents.grpo.comparisons import rollouts_to_target

    fast, slow = _run([0.3, 0.39, 0.5]), _run([0.3, 0.31, 0.5])  # target 0.4, crossed between step 1 and step 2
    assert rollouts_to_target(fast, start=0.3) == rollouts_to_target(slow, start=0.3) == 20
    # linear between (10 rollouts, acc) and (20, 0.5): fast 10 + 10 * 0.01 / 0.11, slow 10 + 10 * 0.09 / 0.19
    assert rollouts_to_target(fast, start=0.3, interpolate=True) == pytest.approx(10 + 10 * 0.01 / 0.11)
    assert rollouts_to_target(slow, start=0.3, interpolate=True) == pytest.approx(10 + 10 * 0.09 / 0.19)
    assert rollouts_to_target(_run([0.45, 0.5]), start=0.3, interpolate=True) == 0  # already there at step 0


def test_stale_selection_skips_current_and_precondition_rows_and_runs_the_cheapest_first(tmp_path: Path) -> None:
    from agents.grpo.regression import ROOT, code_hash, missing_runs, stale_first, status_at_head

    declared, shared = comparisons(), code_hash()
    picked = stale_first(list(declared.values()))
    names = {c.name for c in picked}
    assert not any(declared[n].precondition_not_met for n in names)
    assert "opsd_vs_grpo" not in names and "opsd_vs_grpo_smollm2" in names
    for name, c in declared.items():  # left out exactly when current at HEAD (or its precondition is not met)
        path = ROOT / "benchmarks" / "results" / f"{c.result_name}.json"
        result = json.loads(path.read_text()) if path.is_file() else {}
        current = result.get("lane") == c.lane and status_at_head(result, c, shared=shared)["status"] == "current"
        assert (name in names) == (not current and not c.precondition_not_met), name
    needed = [missing_runs(c, shared=shared) for c in picked]
    assert needed == sorted(needed) and needed[-1] > needed[0]
    # with no result files every comparison is selected, a fully archived one first
    fresh = stale_first([declared["vigor_vs_grpo"], declared["dr_grpo_vs_grpo"]], results_dir=tmp_path)
    assert {c.name for c in fresh} == {"vigor_vs_grpo", "dr_grpo_vs_grpo"}
    assert [missing_runs(c, shared=shared) for c in fresh] == sorted(missing_runs(c, shared=shared) for c in fresh)


def test_git_commit_commits_only_the_named_files_and_reports_failure(tmp_path: Path) -> None:
    import subprocess

    from agents.grpo.regression import git_commit

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True,
                              text=True).stdout

    git("init", "-q")
    git("config", "user.email", "t@example.org")
    git("config", "user.name", "t")
    (tmp_path / "archive.jsonl.gz").write_bytes(b"run")
    (tmp_path / "other.txt").write_text("staged by someone else")
    git("add", "other.txt")
    assert git_commit([tmp_path / "archive.jsonl.gz", tmp_path / "absent.png"], "Run archive: x", repo=tmp_path)
    assert git("show", "--name-only", "--format=%s", "HEAD").split() == ["Run", "archive:", "x", "archive.jsonl.gz"]
    assert "other.txt" in git("diff", "--cached", "--name-only")  # still staged, not swept into the commit
    assert not git_commit([tmp_path / "absent.png"], "nothing", repo=tmp_path)
    with pytest.warns(UserWarning, match="could not commit"):
        assert not git_commit([tmp_path / "archive.jsonl.gz"], "nothing changed", repo=tmp_path)
