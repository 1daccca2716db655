"""GraphPO: the state DAG of a group's search traces, correctness and efficiency advantages (golden), the generic
number-set states, properties, trainer."""

from __future__ import annotations

import pytest
import torch
from countdown_rows import batch_of, expected, garbage_batches
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_grpo_trainer import trainer

from agents.grpo.batch import GroupBatch
from agents.grpo.registry import build
from agents.methods.graphpo import countdown_steps, number_steps

G = 0.8660254  # |A^GRPO| for rewards [1, 0, 0, 1]: mean .5, unbiased std s = sqrt(1/3) = .57735, .5 / s = .866025
S = 3 ** -0.5

# Four traces of one task (2, 7, 9 -> 23), one piece per line, then the answer (EOS follows).
A = ["9+7=16 [2 16]\n", " 16+2=18 x\n", "7*2=14 [9 14]\n", " 14+9=23 !\n", "<answer>7*2+9</answer>"]  # r = 1
B = ["9+7=16 [2 16]\n", " 16+2=18 x\n", "<answer>9+7+2</answer>"]  # r = 0
C = ["7*2=14 [9 14]\n", " 14+9=23 !\n", "<answer>7+2+9</answer>"]  # r = 0 (found it, wrote a wrong answer)
D = ["9+2=11 [7 11]\n", " 11+7=19 x\n", "7*2=14 [9 14]\n", " 14+9=23 !\n", "<answer>7*2+9</answer>"]  # r = 1
# D's second line is invalid (11 + 7 = 18): no node.
# The DAG: root (2 7 9) V = mean = .5
#   (2 16) <- A1 B1: V = (1 + 0)/2 = .5    (18) <- A2 B2: V = .5    (9 14) <- A3 C1 D3: V = 2/3
#   (23)   <- A4 C2 D4: V = 2/3            (7 11) <- D1: V = 1
# Correctness C = dV / s: root->(2 16) 0; (2 16)->(18) 0; root->(9 14) (2/3 - .5)/s = .288675; (9 14)->(23) 0;
#   root->(7 11) .5/s = .866025.
# Shortest arrival (step position): (2 16) 1 (A, B); (18) 2; (9 14) 1 (C); (23) 2 (C); (7 11) 1 (D).
# Efficiency E = -min(clip, (n - s)/s): A3 (3-1)/1 = 2, A4 (4-2)/2 = 1, D3 2, D4 1; every other step 0.
# Answer edges (from the state the last valid step reached to a shared terminal): A (23)->right, D (23)->right,
#   B (18)->wrong, C (23)->wrong. V(right) = 1, V(wrong) = 0. C: A, D (1 - 2/3)/s = .57735; B (0 - .5)/s = -.866025;
#   C (0 - 2/3)/s = -1.154701. Arrivals: right at 5 (A, D), wrong at 3 (B, C): E = 0.
# Along the branch that produced the answer C sums to A^GRPO: A .288675 + 0 + .57735 = .866025; C .288675 + 0 - 1.1547.
EDGE = 0.2886751
RIGHT, WRONG_B, WRONG_C = 0.5773503, -0.8660254, -1.1547005


ROWS = [(A, 1), (B, 0), (C, 0), (D, 1)]


def test_countdown_steps_track_the_branch():
    steps = countdown_steps([2, 7, 9], 23, "".join(D), correct=True)
    root = ("countdown", 2, 7, 9)
    assert [(s.position, s.parent, s.child) for s in steps] == [
        (1, root, ("countdown", 7, 11)), (2, None, None),  # 11+7=19: invalid, no node
        (3, root, ("countdown", 9, 14)), (4, ("countdown", 9, 14), ("countdown", 23)),
        (5, ("countdown", 23), ("answer", True))]
    assert "".join(D)[steps[-1].start:steps[-1].end] == D[-1]
    # an invalid first line: its subtree is off the path; the answer leaves from the root
    steps = countdown_steps([2, 7, 9], 23, "9+7=15 [2 15]\n 15+2=17 x\n<answer>1</answer>", correct=False)
    assert [(s.parent, s.child) for s in steps] == [(None, None), (None, None), (root, ("answer", False))]
    assert countdown_steps([2, 7, 9], 23, "".join(B))[-1].child == ("countdown", 18)  # no answer edge


def test_graphpo_countdown_golden():
    adv = build("advantage", "graphpo", {"alpha": 1.0, "lam_eff": 0.1, "clip": 10.0})(batch_of(ROWS))
    # A = A^GRPO + C + .1 E per line; answer and EOS: A^GRPO
    want = expected(ROWS, [
        [G, G, G + EDGE - 0.2, G - 0.1, G + RIGHT, G],  # A3: +.288675 - .1*2; A4: 0 - .1*1; EOS: A^GRPO
        [-G, -G, -G + WRONG_B, -G],
        [-G + EDGE, -G, -G + WRONG_C, -G],  # C's steps are the earliest arrivals: no efficiency penalty
        [G + 0.8660254, G, G + EDGE - 0.2, G - 0.1, G + RIGHT, G],  # D1: +.5/s; D2 invalid: A^GRPO only
    ])
    torch.testing.assert_close(adv, want, atol=1e-5, rtol=0)


def test_graphpo_clip_penalty_and_graph_only_steps():
    params = {"alpha": 1.0, "lam_eff": 0.1, "clip": 1.0, "group_on_steps": False, "invalid_penalty": 0.2}
    adv = build("advantage", "graphpo", params)(batch_of(ROWS))
    # step tokens (answers too): C + .1 E with E clipped at -1 (A3, D3: -min(1, 2) = -1; A4, D4: -1); EOS: A^GRPO;
    # D2 (invalid): A^GRPO - .2
    want = expected(ROWS, [
        [0.0, 0.0, EDGE - 0.1, -0.1, RIGHT, G],
        [0.0, 0.0, WRONG_B, -G],
        [EDGE, 0.0, WRONG_C, -G],
        [0.8660254, G - 0.2, EDGE - 0.1, -0.1, RIGHT, G],
    ])
    torch.testing.assert_close(adv, want, atol=1e-5, rtol=0)


def test_unnormalized_correctness_is_the_value_difference():
    adv = build("advantage", "graphpo", {"alpha": 1.0, "lam_eff": 0.0, "normalize": False,
                                         "group_on_steps": False})(batch_of(ROWS))
    # C = V(child) - V(parent): C1 root->(9 14) 2/3 - 1/2 = 1/6; D1 root->(7 11) 1 - 1/2 = .5;
    # answers A, D 1 - 2/3 = 1/3, B 0 - .5, C 0 - 2/3
    want = expected(ROWS, [[0, 0, 1 / 6, 0, 1 / 3, G], [0, 0, -0.5, -G], [1 / 6, 0, -2 / 3, -G],
                           [0.5, G, 1 / 6, 0, 1 / 3, G]])
    torch.testing.assert_close(adv, want, atol=1e-5, rtol=0)


def test_without_answer_edge_the_answer_keeps_the_group_advantage():
    adv = build("advantage", "graphpo", {"alpha": 1.0, "lam_eff": 0.1, "clip": 10.0,
                                         "answer_edge": False})(batch_of(ROWS))
    want = expected(ROWS, [[G, G, G + EDGE - 0.2, G - 0.1, G, G], [-G, -G, -G, -G], [-G + EDGE, -G, -G, -G],
                           [G + 0.8660254, G, G + EDGE - 0.2, G - 0.1, G, G]])
    torch.testing.assert_close(adv, want, atol=1e-5, rtol=0)


def test_generic_number_states_golden():
    # Not Countdown: a step is a line adding numbers; the state the set seen so far. Rewards [1, 0, 0]:
    # mean 1/3, unbiased std s = sqrt(((2/3)^2 + 2 (1/3)^2) / 2) = sqrt(1/3); A^GRPO = [1.1547, -.57735, -.57735]
    r0 = ["take 2\n", "add 3\n", "so 5"]  # {2} {2 3} {2 3 5}
    r1 = ["take 2\n", "so 4"]  # {2} {2 4}
    r2 = ["hmm\n", "take 3\n", "take 2\n", "so 5"]  # (no number: no step) {3} {2 3} {2 3 5}
    rows = [(r0, 1), (r1, 0), (r2, 0)]
    # V: root 1/3; {2} (r0 r1) .5; {2 3} (r0 r2) .5; {2 3 5} (r0 r2) .5; {2 4} (r1) 0; {3} (r2) 0
    # C = dV / s: root->{2} (1/6)/s = .288675; {2}->{2 3} 0; {2 3}->{2 3 5} 0; {2}->{2 4} -.5/s = -.866025;
    #   root->{3} -(1/3)/s = -.57735; {3}->{2 3} .5/s = .866025. Arrivals all at their shortest: E = 0.
    a0, a1 = 2 / 3 / S, -1 / 3 / S
    want = expected(rows, [[a0 + EDGE, a0, a0, a0], [a1 + EDGE, a1 - 0.8660254, a1],
                           [a1, a1 - 0.5773503, a1 + 0.8660254, a1, a1]])
    adv = build("advantage", "graphpo", {"alpha": 1.0, "lam_eff": 0.5})(batch_of(rows, meta={}))
    torch.testing.assert_close(adv, want, atol=1e-5, rtol=0)
    off = build("advantage", "graphpo", {"generic": "none"})(batch_of(rows, meta={}))
    torch.testing.assert_close(off, expected(rows, [[a0] * 4, [a1] * 3, [a1] * 5]), atol=1e-5, rtol=0)


def test_number_steps_read_standalone_numbers():
    steps = number_steps("t0 and p1\nx = 2.50, y=2.5\n007 then 7.\n")
    # t0 / p1 are words; 2.50 = 2.5; 007 = 7 = 7.
    assert [s.child for s in steps] == [("numbers", "2.5"), ("numbers", "2.5", "7")]


def test_one_group_per_dag():
    # the same traces in two groups with opposite rewards: each group's values are its own
    b = GroupBatch.concat([batch_of([(A, 1), (C, 0)], group="x"), batch_of([(A, 0), (C, 1)], group="y")])
    adv = build("advantage", "graphpo", {"alpha": 1.0, "lam_eff": 0.0, "normalize": False,
                                         "group_on_steps": False})(b)
    # group x: V(9 14) = (1 + 0)/2 = .5 = V(root): C's first step gets 0; A's first step (2 16) only A: 1 - .5 = .5
    assert float(adv[0, 0]) == pytest.approx(0.5) and float(adv[1, 0]) == pytest.approx(0.0)
    assert float(adv[2, 0]) == pytest.approx(-0.5) and float(adv[3, 0]) == pytest.approx(0.0)


def test_no_tokenizer_gives_the_group_advantage():
    b = batch_of(ROWS)
    b.tokenizer = None
    torch.testing.assert_close(build("advantage", "graphpo")(b), build("advantage", "grpo")(b)[:, None] * b.response_mask)


@pytest.mark.parametrize("params", [{"alpha": -1.0}, {"lam_eff": float("inf")}, {"invalid_penalty": -0.1},
                                    {"clip": 0.0}, {"generic": "sentences"}])
def test_bad_hyper_parameters_name_the_key(params):
    with pytest.raises(ValueError, match=next(iter(params))):
        build("advantage", "graphpo", params)


# -- properties ---------------------------------------------------------------------------------------------------
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(garbage_batches(), st.floats(0.0, 2.0), st.floats(0.0, 1.0), st.booleans(), st.sampled_from(["numbers", "none"]))
def test_properties_zero_weights_are_grpo_padding_zero_never_raises(batch, alpha, lam, normalize, generic):
    grpo = build("advantage", "grpo")(batch)
    mask = batch.response_mask
    zero = build("advantage", "graphpo", {"alpha": 0.0, "lam_eff": 0.0, "normalize": normalize,
                                          "generic": generic})(batch)
    torch.testing.assert_close(zero, grpo[:, None] * mask)  # (a) alpha = lam_eff = 0: GRPO on every response token
    adv = build("advantage", "graphpo", {"alpha": alpha, "lam_eff": lam, "normalize": normalize,
                                         "generic": generic, "invalid_penalty": 0.1})(batch)  # (c) never raises
    assert adv.shape == mask.shape and bool(torch.isfinite(adv).all())
    assert bool((adv[~mask] == 0).all())  # (b) padding gets 0
    # efficiency is a penalty: with alpha = 0 no token rises above its group advantage
    eff = build("advantage", "graphpo", {"alpha": 0.0, "lam_eff": max(lam, 0.1), "generic": generic})(batch)
    assert bool((eff <= grpo[:, None] * mask + 1e-6).all())


# -- trainer ------------------------------------------------------------------------------------------------------
def test_graphpo_runs_in_the_trainer(tmp_path):
    # the toy env is not Countdown: the generic path (its words t0.. hold no standalone number: no steps, plain GRPO)
    t = trainer(tmp_path, steps=2, stages={"advantage": "graphpo"},
                params={"rollout_allocator": {"n": 4}, "advantage": {"alpha": 1.0, "lam_eff": 0.1}})
    train = [r for r in t.run(resume=False) if r["kind"] == "train"]
    assert len(train) == 2
    for r in train:
        assert r["advantage.step_rows"] == 0.0 and r["advantage.nodes"] == 0.0
