"""Countdown solution coverage and entrances (rlvr_envs.harness.coverage): canonical forms and entrances by hand,
agreement with the micro lane's trace checker, metrics in results files, and leaderboard re-verification."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.policy.countdown_traces import check_trace, write_trace
from rlvr_envs.harness import evaluate
from rlvr_envs.harness import leaderboard as lb
from rlvr_envs.harness.coverage import (
    canonical_expression,
    coverage_metrics,
    entropy_bits,
    expression_entrance,
    is_countdown,
    is_coverage_key,
    response_entrance,
    task_stats,
    trace_entrance,
)
from rlvr_envs.harness.metrics import compute_metrics, metrics_match

ROOT = Path(__file__).resolve().parent.parent
MICRO_HELD_OUT = dict(min_numbers=3, max_numbers=3, min_number=1, max_number=9, min_target=2, max_target=40,
                      prompt_template="{question}", seed_base=1)


def test_canonical_form_by_hand():
    # 2+3*4: (+ 2 (* 3 4)); operands of * sorted "3" < "4"; of +: "(3*4)" < "2" since "(" sorts before digits
    assert canonical_expression("2+3*4") == "((3*4)+2)"
    assert canonical_expression("4*3+2") == canonical_expression("(2 + (4 * 3))") == "((3*4)+2)"
    assert canonical_expression("2 × 3 + 4") == "((2*3)+4)"  # the verifier's normalization applies
    # associativity is not normalized: two bracketings start differently
    assert canonical_expression("(1+2)+3") == "((1+2)+3)"
    assert canonical_expression("1+(2+3)") == "((2+3)+1)"
    # - and / keep their operand order
    assert canonical_expression("8-3") == "(8-3)" and canonical_expression("3-8") == "(3-8)"
    assert canonical_expression("6/(1-3/4)") == "(6/(1-(3/4)))"
    assert canonical_expression("(7)") == "7"


@pytest.mark.parametrize("text", [None, 3, "", "abc", "2**3", "-3+5", "2//3", "3 % 2", "1.5+2", "__import__('os')",
                                  "(1+2", "1+2)", "(" * 30 + "1" + ")" * 30, "9" * 20 + "+1", "+".join("1" * 40)])
def test_malformed_expressions_have_no_form_and_no_entrance(text):
    assert canonical_expression(text) is None and expression_entrance(text) is None


def test_expression_entrance_by_hand():
    # post-order, left to right: the first operation whose operands are both literals
    assert expression_entrance("2+3*4") == (4, "*", 3)           # 3*4 is the first completed literal-literal op
    assert expression_entrance("4*3+2") == (4, "*", 3)
    assert expression_entrance("(100 - 93) * 3 + 2") == (100, "-", 93)
    assert expression_entrance("2*(3+4)") == (4, "+", 3)
    assert expression_entrance("(1+2)*(3+4)") == (2, "+", 1)
    assert expression_entrance("(3+4)*(1+2)") == (4, "+", 3)     # same solution, the other entrance
    assert expression_entrance("3-8+20") == (3, "-", 8)          # - keeps its order (a negative intermediate)
    assert expression_entrance("6/2+1") == (6, "/", 2)
    assert expression_entrance("7") is None


def test_trace_entrance_is_the_first_search_line():
    trace = "9+7=16 [2 16]\n 16+2=18 x\n7*2=14 [9 14]\n 14+9=23 !\n<answer>7*2+9</answer>"
    assert trace_entrance(trace) == (9, "+", 7)
    assert trace_entrance("noise\n3+8=11 [11 2]\n<answer>3+8</answer>") == (8, "+", 3)  # canonical: larger first
    assert trace_entrance("<answer>3+8</answer>\n3+8=11 [11 2]") is None  # lines after the answer are not the search
    assert trace_entrance("I think 9+7=16 is a start") is None
    # a response with a trace: the trace decides; without: the answer expression; else none
    assert response_entrance(trace, "7*2+9") == ((9, "+", 7), "trace")
    assert response_entrance("so <answer>7*2+9</answer>", "7*2+9") == ((7, "*", 2), "expression")
    assert response_entrance("garbage", None) == (None, "none")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 12), min_size=3, max_size=4), st.integers(1, 40), st.integers(0, 2**31))
def test_trace_entrance_matches_check_trace(nums, target, seed):
    try:
        trace = write_trace(nums, target, np.random.default_rng(seed))
    except ValueError:
        return
    first = check_trace(nums, target, trace).first_move
    a, op, b = first
    expected = (b, op, a) if op in "+*" and a < b else first
    assert trace_entrance(trace) == expected


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("0123456789+-*/=()[] !x\n<>answer/.")), max_size=200),
       st.one_of(st.none(), st.text(max_size=60)))
def test_garbage_never_raises(response, parsed):
    entrance, source = response_entrance(response, parsed)
    assert source in ("trace", "expression", "none") and (entrance is None) == (source == "none")
    assert task_stats([{"response": response, "parsed_answer": parsed, "correct": True}])["n"] == 1
    canonical_expression(parsed)


def test_entropy_by_hand():
    assert entropy_bits([]) == 0.0 and entropy_bits([5]) == 0.0 and entropy_bits([0, 3]) == 0.0
    assert entropy_bits([1, 1]) == pytest.approx(1.0)
    assert entropy_bits([1, 1, 1, 1]) == pytest.approx(2.0)
    # 2/3, 1/3: 2/3*log2(3/2) + 1/3*log2(3) = 2/3*0.5849625 + 1/3*1.5849625 = 0.3899750 + 0.5283208 = 0.9182958
    assert entropy_bits([2, 1]) == pytest.approx(0.9182958, abs=1e-7)


def rec(ti, si, correct, parsed, response=None):
    return {"task_index": ti, "sample_index": si, "task_id": f"countdown-{ti}", "correct": correct,
            "parsed_answer": parsed, "response": response if response is not None else f"<answer>{parsed}</answer>",
            "tokens": 5, "format_ok": True, "metadata": {"target": 10, "solution": "x"}}


def four_samples():
    # task 0 (numbers 2 3 4, target 14; correctness flags are given, the metric does not recompute them):
    #   "2+3*4" and "4*3+2": one solution ((3*4)+2), entrance 4 * 3 for both
    #   "(2+5)*2"... stands for another correct solution with entrance 5 + 2; one wrong sample entering with 9 - 1
    # task 1: nothing correct; two samples enter with 3 + 1, one unparseable
    return [rec(0, 0, True, "2+3*4"), rec(0, 1, True, "4*3+2"), rec(0, 2, True, "(2+5)*2"),
            rec(0, 3, False, "9-1"),
            rec(1, 0, False, "1+3"), rec(1, 1, False, "3+1"), rec(1, 2, False, None, "junk"),
            rec(1, 3, False, "1/0")]


def test_task_stats_and_coverage_metrics_by_hand():
    recs = four_samples()
    t0 = task_stats(recs[:4])
    # solutions {((3*4)+2), ((2+5)*2)} = 2; correct entrances {4 * 3: 2, 5 + 2: 1} = 2, entropy H(2/3, 1/3)
    # all entrances {4 * 3: 2, 5 + 2: 1, 9 - 1: 1}: H(1/2, 1/4, 1/4) = 0.5 + 0.5 + 0.5 = 1.5 bits
    assert (t0["correct"], t0["solutions"], t0["entrances"]) == (3, 2, 2)
    assert t0["entrance_entropy"] == pytest.approx(0.9182958, abs=1e-7)
    assert t0["entrance_entropy_all"] == pytest.approx(1.5)
    assert t0["entrance_counts"] == {"4 * 3": 2, "5 + 2": 1}
    t1 = task_stats(recs[4:])
    # nothing correct: 0 solutions / entrances / entropy; all: {3 + 1: 2, 1 / 0: 1} ("1/0" parses; its entrance is
    # still the first operation written) and one none: H(2/3, 1/3)
    assert (t1["correct"], t1["solutions"], t1["entrances"], t1["entrance_entropy"]) == (0, 0, 0, 0.0)
    assert t1["entrance_entropy_all"] == pytest.approx(0.9182958, abs=1e-7)
    m = coverage_metrics([recs[:4], recs[4:]], 4)
    # means over the two tasks: coverage (2 + 0)/2 = 1, entrances (2 + 0)/2 = 1,
    # entropy (0.9182958 + 0)/2 = 0.4591479, all (1.5 + 0.9182958)/2 = 1.2091479
    assert m["coverage@4"] == 1.0 and m["entrances@4"] == 1.0
    assert m["entrance_entropy@4"] == pytest.approx(0.4591479, abs=1e-7)
    assert m["entrance_entropy_all@4"] == pytest.approx(1.2091479, abs=1e-7)
    assert m["entrance_sources"] == {"trace": 0, "expression": 7, "none": 1}
    assert all(is_coverage_key(k) for k in m) and not is_coverage_key("pass@4") and not is_coverage_key("accuracy")


def test_compute_metrics_adds_coverage_for_countdown_records_only():
    recs = four_samples()
    assert is_countdown(recs)
    m = compute_metrics(recs, 4)
    assert m["coverage@4"] == 1.0 and m["pass@4"] == 0.5
    other = [{**r, "metadata": {"subject": "x"}} for r in recs]
    assert not is_countdown(other) and not any(is_coverage_key(k) for k in compute_metrics(other, 4))
    assert not is_countdown([{**r, "metadata": {"target": True, "solution": "x"}} for r in recs])
    assert not is_countdown([])


def test_metrics_match_accepts_old_claims_without_coverage_but_checks_given_ones():
    recomputed = compute_metrics(four_samples(), 4)
    old = {k: v for k, v in recomputed.items() if not is_coverage_key(k)}
    assert metrics_match(old, recomputed) == []
    assert metrics_match(recomputed, recomputed) == []
    assert metrics_match({**recomputed, "coverage@4": 3.0}, recomputed) == ["coverage@4: claimed 3.0, re-verified 1.0"]
    assert metrics_match(recomputed, old)  # a claim the records do not support is still a difference
    assert metrics_match({k: v for k, v in recomputed.items() if k != "pass@4"}, recomputed)


def test_committed_lane_results_still_reverify():
    # a results file written before the coverage metrics existed re-verifies, and the board gets the new numbers
    path = ROOT / "leaderboards" / "results" / "lane-micro-grpo-s0.json"
    doc = json.loads(path.read_text())
    assert not any(is_coverage_key(k) for k in doc["metrics"])
    recomputed = lb.verify_results(doc)
    n = doc["config"]["n_samples"]
    assert 0 < recomputed[f"coverage@{n}"] <= n and recomputed["entrance_sources"]["trace"] > 0


class TraceAgent:
    """Answers with a solver-written search trace drawn with the sample's seed (diverse, correct)."""

    def act(self, observations, infos):
        import re

        out = []
        for obs in observations:
            nums = [int(x) for x in re.search(r"\[([\d, ]+)\]", obs).group(1).split(",")]
            target = int(re.search(r"equals (\d+)", obs).group(1))
            out.append(write_trace(nums, target, np.random.default_rng(infos[len(out)]["seed"]), noise=2.0))
        return out


def test_evaluate_results_summary_and_board_carry_coverage(tmp_path):
    res = evaluate(TraceAgent(), "rlvr/Countdown-v0", env_kwargs=MICRO_HELD_OUT, n_samples=4, limit=6, seed=0,
                   out=tmp_path / "r.json", progress=False)
    m = res.metrics
    assert m["accuracy"] == 1.0 and m["entrance_sources"] == {"trace": 24, "expression": 0, "none": 0}
    assert 1.0 <= m["coverage@4"] <= 4.0 and 1.0 <= m["entrances@4"] <= 4.0
    # the metric is the mean of the per-task numbers
    groups = [[r for r in res.records if r["task_index"] == i] for i in range(6)]
    assert m["coverage@4"] == pytest.approx(np.mean([task_stats(g)["solutions"] for g in groups]))
    assert math.isclose(m["entrance_entropy@4"], np.mean([task_stats(g)["entrance_entropy"] for g in groups]))
    summary = res.summary()
    assert "coverage@4=" in summary and "entrances@4=" in summary and "entrance_entropy@4=" in summary
    entry = lb.submit(tmp_path / "r.json", "cov", boards_dir=tmp_path / "boards")
    assert entry["metrics"]["coverage@4"] == m["coverage@4"]
    # one sample per task: the numbers are there, the summary leaves them out
    one = evaluate(TraceAgent(), "rlvr/Countdown-v0", env_kwargs=MICRO_HELD_OUT, n_samples=1, limit=3,
                   progress=False)
    assert "coverage@1" in one.metrics and "coverage@" not in one.summary()


def test_entrance_hint_runs_through_the_harness(tmp_path):
    res = evaluate(TraceAgent(), "rlvr/Countdown-v0", env_kwargs={**MICRO_HELD_OUT, "entrance_hint": "task"},
                   n_samples=2, limit=3, progress=False, out=tmp_path / "h.json")
    assert res.metrics["accuracy"] == 1.0  # the hint is in the prompt; the trace agent reads only the numbers
    lb.verify_results(json.loads((tmp_path / "h.json").read_text()))
