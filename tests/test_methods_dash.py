"""DASH: drift credit on Countdown search traces and on answer patterns (golden), properties, trainer."""

from __future__ import annotations

import pytest
import torch
from countdown_rows import batch_of, expected, garbage_batches
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_grpo_trainer import trainer

from agents.grpo.registry import build
from agents.methods.dash import answer_matches, drift_credits, same_answer

G = 0.8660254  # |A^GRPO| for rewards [1, 0, 0, 1]: mean .5, unbiased std sqrt(1/3) = .57735, .5 / .57735 = .866025

# Segments of four traces of one task (2, 7, 9 -> 23), cut after each commitment (a leaf line or </answer>).
# A: x then a valid ! (wrong -> right), correct answer. B: x, wrong answer. C: a valid ! then a wrong answer (right ->
# wrong). D: an invalid leaf (11+7 is not 19: wrong), a valid !, correct answer.
A = ["9+7=16 [2 16]\n 16+2=18 x\n", "7*2=14 [9 14]\n 14+9=23 !\n", "<answer>7*2+9</answer>"]
B = ["9+7=16 [2 16]\n 16+2=18 x\n", "<answer>9+7+2</answer>"]
C = ["7*2=14 [9 14]\n 14+9=23 !\n", "<answer>7+2+9</answer>"]
D = ["9+2=11 [7 11]\n 11+7=19 x\n", "7*2=14 [9 14]\n 14+9=23 !\n", "<answer>7*2+9</answer>"]


def test_drift_credits_golden():
    # states: wrong, right, right, wrong -> (first: none) +eta, 0, -eta
    assert drift_credits([False, True, True, False], 0.5) == [0.0, 0.5, 0.0, -0.5]
    # initial "wrong": the first right commitment is a move wrong -> right
    assert drift_credits([True, False], 0.5, "wrong") == [0.5, -0.5]
    assert drift_credits([False, False], 0.5, "wrong") == [0.0, 0.0]


def test_dash_countdown_golden():
    rows = [(A, 1), (B, 0), (C, 0), (D, 1)]
    adv = build("advantage", "dash", {"eta": 0.5})(batch_of(rows))
    # A: [first segment, no credit] .866 | [x -> !: +.5] 1.366 | [! -> correct answer: 0] .866 | EOS .866
    # B: [first] -.866 | [x -> wrong answer: 0] -.866 | EOS -.866
    # C: [first] -.866 | [! -> wrong answer: -.5] -1.366 | EOS -.866
    # D: [first, its leaf invalid] .866 | [x -> !: +.5] 1.366 | [answer: 0] .866 | EOS .866
    want = expected(rows, [[G, G + 0.5, G, G], [-G, -G, -G], [-G, -G - 0.5, -G], [G, G + 0.5, G, G]])
    torch.testing.assert_close(adv, want, atol=1e-5, rtol=0)


def test_dash_initial_wrong_credits_the_first_segment():
    rows = [(C, 0), (A, 1)]  # rewards [0, 1]: mean .5, unbiased std .7071 -> A^GRPO = -/+ .7071
    adv = build("advantage", "dash", {"eta": 0.5, "initial": "wrong"})(batch_of(rows))
    g = 0.5 / 0.5 ** 0.5
    # C: [none -> !: +.5] -.7071 + .5 | [! -> wrong answer: -.5] -.7071 - .5 | EOS -.7071
    # A: [none -> x: 0] .7071 | [x -> !: +.5] 1.2071 | [! -> correct: 0] .7071 | EOS .7071
    want = expected(rows, [[-g + 0.5, -g - 0.5, -g], [g, g + 0.5, g, g]])
    torch.testing.assert_close(adv, want, atol=1e-5, rtol=0)


def test_dash_generic_answer_patterns_golden():
    # gold 5. Row 0: boxed 3 (wrong), boxed 5 (right), final boxed 5 (row correct) -> none, +eta, 0
    # Row 1: boxed 5 (right), final <answer>3</answer> (row incorrect) -> none, -eta.
    r0 = ["so \\boxed{3}", " wait \\boxed{5}", " so \\boxed{5}", "."]
    r1 = ["\\boxed{5}", " no <answer>3</answer>", " end"]
    rows = [(r0, 1), (r1, 0)]
    adv = build("advantage", "dash", {"eta": 0.25})(batch_of(rows, meta={}, answer="5"))
    g = 0.5 / 0.5 ** 0.5  # rewards [1, 0]
    want = expected(rows, [[g, g + 0.25, g, g, g], [-g, -g - 0.25, -g, -g]])
    torch.testing.assert_close(adv, want, atol=1e-5, rtol=0)


def test_generic_without_gold_or_with_countdown_off():
    rows = [(["\\boxed{3}", " \\boxed{5}"], 1), (["x"], 0)]
    g = 0.5 / 0.5 ** 0.5
    adv = build("advantage", "dash", {"eta": 0.5})(batch_of(rows, meta={}, answer=None))  # nothing to check against
    torch.testing.assert_close(adv, expected(rows, [[g, g, g], [-g, -g]]), atol=1e-5, rtol=0)
    # countdown=False: the trace rows go down the answer-pattern path; with no pattern in them, no credit at all
    rows = [(A, 1), (B, 0)]
    adv = build("advantage", "dash", {"eta": 0.5, "countdown": False, "patterns": ["boxed"]})(batch_of(rows))
    torch.testing.assert_close(adv, expected(rows, [[g] * 4, [-g] * 3]), atol=1e-5, rtol=0)


def test_answer_matching():
    assert [c for _, c in answer_matches("a \\boxed{\\frac{1}{2}} b \\boxed{7", ["boxed"])] == ["\\frac{1}{2}"]
    # nested: the <answer> holding a \boxed counts once
    assert [c for _, c in answer_matches("<answer>\\boxed{5}</answer>", ["boxed", "answer_tag"])] == ["\\boxed{5}"]
    assert [c for _, c in answer_matches("So the answer is 42. Done", ["answer_is"])] == ["42"]
    assert same_answer(" $1,000$ ", "1000") and same_answer("5.", "5.0") and same_answer("X", "x")
    assert not same_answer("5", "6") and not same_answer("inf", "1e999")  # infinities are no answers


def test_no_tokenizer_gives_the_group_advantage():
    b = batch_of([(A, 1), (B, 0)])
    b.tokenizer = None
    adv = build("advantage", "dash", {"eta": 0.5})(b)
    grpo = build("advantage", "grpo")(b)
    torch.testing.assert_close(adv, grpo[:, None] * b.response_mask)


@pytest.mark.parametrize("params", [{"eta": -1.0}, {"eta": float("nan")}, {"initial": "right"},
                                    {"patterns": ["latex"]}, {"patterns": "boxed"}, {"patterns": 3}])
def test_bad_hyper_parameters_name_the_key(params):
    with pytest.raises(ValueError, match=next(iter(params))):
        build("advantage", "dash", params)


# -- properties ---------------------------------------------------------------------------------------------------
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(garbage_batches(), st.sampled_from(["none", "wrong"]), st.floats(0.05, 2.0))
def test_properties_eta_zero_is_grpo_padding_zero_never_raises(batch, initial, eta):
    grpo = build("advantage", "grpo")(batch)
    mask = batch.response_mask
    every = ["boxed", "answer_tag", "answer_is"]
    zero = build("advantage", "dash", {"eta": 0.0, "initial": initial, "patterns": every})(batch)
    torch.testing.assert_close(zero, grpo[:, None] * mask)  # (a) eta = 0: GRPO on every response token
    adv = build("advantage", "dash", {"eta": eta, "initial": initial})(batch)  # (c) garbage never raises
    assert adv.shape == mask.shape and bool(torch.isfinite(adv).all())
    assert bool((adv[~mask] == 0).all())  # (b) padding gets 0
    # the credit is a multiple of eta
    k = ((adv - grpo[:, None]) / eta)[mask]
    torch.testing.assert_close(k, k.round(), atol=1e-4, rtol=0)


# -- trainer ------------------------------------------------------------------------------------------------------
def test_dash_runs_in_the_trainer(tmp_path):
    # the toy env is not Countdown and writes no \boxed: the fallback path (no commitments, plain GRPO credit)
    t = trainer(tmp_path, steps=2, stages={"advantage": "dash"},
                params={"rollout_allocator": {"n": 4}, "advantage": {"eta": 0.3}})
    train = [r for r in t.run(resume=False) if r["kind"] == "train"]
    assert len(train) == 2
    for r in train:
        assert r["advantage.commit_rows"] == 0.0 and r["advantage.up_segments"] == 0.0
