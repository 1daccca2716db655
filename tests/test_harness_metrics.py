"""pass@k, mean@k, maj@k and the other metrics, checked against brute force and hand-computed cases."""

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlvr_envs.harness.metrics import (
    answer_classes,
    answer_equivalence,
    compute_metrics,
    default_ks,
    majority_answer,
    metrics_match,
    pass_at_k,
)


def brute_force_pass_at_k(outcomes: list[bool], k: int) -> float:
    subsets = list(itertools.combinations(range(len(outcomes)), k))
    return sum(any(outcomes[i] for i in s) for s in subsets) / len(subsets)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=10), st.data())
def test_pass_at_k_equals_enumeration_over_all_k_subsets(outcomes, data):
    k = data.draw(st.integers(1, len(outcomes)))
    assert pass_at_k(len(outcomes), sum(outcomes), k) == pytest.approx(brute_force_pass_at_k(outcomes, k), abs=1e-12)


def test_pass_at_k_edges_and_large_n_stay_exact():
    assert pass_at_k(5, 0, 3) == 0.0
    assert pass_at_k(5, 5, 1) == 1.0
    assert pass_at_k(5, 3, 3) == 1.0  # fewer wrong samples than k: some correct sample is always drawn
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    # Large n: the binomial form overflows floats, the product form does not.
    assert pass_at_k(2000, 1, 1) == pytest.approx(1 / 2000)
    assert pass_at_k(2000, 10, 100) == pytest.approx(1 - math.comb(1990, 100) / math.comb(2000, 100), rel=1e-9)
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)


def test_default_ks():
    assert default_ks(1) == [1]
    assert default_ks(4) == [1, 2, 4]
    assert default_ks(6) == [1, 2, 4, 6]


def test_majority_vote_breaks_ties_by_first_seen_and_ignores_unparsed():
    assert majority_answer(["3", " 4", "4 ", None]) == 1
    assert majority_answer(["5", "6", "6", "5"]) == 0  # tie: "5" was seen first
    assert majority_answer([None, "", None]) is None


def record(ti, si, correct, parsed, response="a b c", tokens=None, meta=None, format_ok=True):
    return {"task_index": ti, "sample_index": si, "correct": correct, "parsed_answer": parsed, "response": response,
            "tokens": tokens, "metadata": meta or {}, "format_ok": format_ok}


def test_compute_metrics_by_hand():
    recs = [
        # task 0: 1 of 3 correct, majority answer "7" is wrong
        record(0, 0, True, "8", tokens=10, meta={"subject": "algebra", "level": 1}),
        record(0, 1, False, "7", tokens=20, meta={"subject": "algebra", "level": 1}),
        record(0, 2, False, "7", tokens=30, meta={"subject": "algebra", "level": 1}),
        # task 1: 2 of 3 correct, majority right; one unparsed sample is a format error
        record(1, 0, True, "2", tokens=40, meta={"subject": "geometry", "level": 2}),
        record(1, 1, True, "2", tokens=50, meta={"subject": "geometry", "level": 2}),
        record(1, 2, False, None, tokens=60, meta={"subject": "geometry", "level": 2}, format_ok=False),
    ]
    m = compute_metrics(recs, 3, n_params=100)
    assert m["pass@1"] == pytest.approx((1 / 3 + 2 / 3) / 2)
    assert m["mean@3"] == m["accuracy"] == pytest.approx(0.5)
    assert m["pass@2"] == pytest.approx(((1 - 1 / 3) + 1.0) / 2)
    assert m["pass@3"] == 1.0
    assert m["maj@3"] == 0.5
    assert m["accuracy_by_subject"] == {"algebra": {"accuracy": pytest.approx(1 / 3), "n": 3},
                                        "geometry": {"accuracy": pytest.approx(2 / 3), "n": 3}}
    assert set(m["accuracy_by_level"]) == {"1", "2"}
    assert m["length_unit"] == "tokens" and m["length_mean"] == 35.0 and m["length_median"] == 35.0
    assert m["tokens_generated"] == 210
    assert m["flops_estimate"] == 2 * 100 * 210
    assert m["format_error_rate"] == pytest.approx(1 / 6)


def test_lengths_fall_back_to_labelled_whitespace_words_without_token_counts():
    recs = [record(0, 0, True, "1", response="one two three"), record(1, 0, False, "2", response="x", tokens=4)]
    m = compute_metrics(recs, 1, n_params=100)
    assert m["length_unit"] == "whitespace_words"
    assert m["length_mean"] == 2.0
    assert m["tokens_generated"] is None and m["flops_estimate"] is None
    recs[0]["tokens"] = 3
    assert compute_metrics(recs, 1, n_params="1e6")["flops_estimate"] is None  # junk params: no estimate, no crash
    assert compute_metrics(recs, 1, n_params=10)["flops_estimate"] == 2 * 10 * 7


def test_compute_metrics_rejects_ragged_samples():
    with pytest.raises(ValueError, match="expected 2"):
        compute_metrics([record(0, 0, True, "1"), record(0, 1, True, "1"), record(1, 0, True, "1")], 2)


def test_metrics_match_reports_differences():
    a = {"accuracy": 0.5, "by": {"x": {"accuracy": 0.25, "n": 4}}, "unit": "tokens"}
    assert metrics_match(a, dict(a)) == []
    assert metrics_match(a, {**a, "accuracy": 0.5 + 1e-15}) == []
    diffs = metrics_match({**a, "accuracy": 0.75}, a)
    assert diffs == ["accuracy: claimed 0.75, re-verified 0.5"]
    assert metrics_match({**a, "flag": True}, {**a, "flag": 1})


# Gold 1/2: three samples say it in three ways, two say 3. A vote on raw strings picks "3" (2 votes vs 1 each).
HALF = ["3", "1/2", "3", "0.5", "\\frac{1}{2}"]
HALF_CORRECT = [False, True, False, True, True]


def test_maj_votes_on_verified_equivalent_math_answers():
    from rlvr_envs.verifiers.math import same_answer

    assert same_answer("1/2", "0.5") and same_answer("0.5", "\\frac{1}{2}") and not same_answer("1/2", "3")
    assert answer_classes(HALF, same_answer) == [0, 1, 0, 1, 1]
    assert majority_answer(HALF, same_answer) == 1
    recs = [record(0, i, c, p) for i, (p, c) in enumerate(zip(HALF, HALF_CORRECT))]
    assert compute_metrics(recs, 5, same_answer=same_answer)["maj@5"] == 1.0
    assert compute_metrics(recs, 5)["maj@5"] == 0.0  # no rule given: strings only
    # A tie between classes goes to the class seen first, whichever spelling its members use.
    assert majority_answer(["0.5", "3", " 3", "\\frac{1}{2}", None], same_answer) == 0
    assert majority_answer(["3", "0.5", "3", "\\frac{1}{2}"], same_answer) == 0


def test_envs_supply_their_verifiers_answer_equivalence():
    import gymnasium as gym

    import rlvr_envs  # noqa: F401

    env = gym.make("rlvr/MultiHopSynth-v0")  # QA: exact match after SQuAD normalization
    same = answer_equivalence(env)
    assert same("The Beatles", "beatles!") and not same("Beatles", "Rolling Stones")
    assert majority_answer(["Rolling Stones", "the Beatles", "Beatles."], same) == 1
    env.close()
    env = gym.make("rlvr/Arithmetic-v0")  # parsed answers are canonical integers: strings suffice
    assert answer_equivalence(env)("7", " 7") and not answer_equivalence(env)("7", "8")
    env.close()
