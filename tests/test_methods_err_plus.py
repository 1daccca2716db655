"""ERR+: entropy relief (phase 1), relative efficiency (phase 2), the thinking span and the phase switch."""

from __future__ import annotations

import pytest
import torch

from agents.grpo.batch import GroupBatch, Sample
from agents.grpo.registry import build
from agents.methods.err_plus import entropy_relief, thinking_tokens


class PieceTokenizer:
    """decode() joins fixed string pieces: enough to locate </think> in token space."""

    def __init__(self, pieces):
        self.pieces = pieces

    def decode(self, ids):
        return "".join(self.pieces[i] for i in ids)


def test_entropy_relief_golden():
    # drops: 2-1-.01 = .99, (1 -> 1.5 rises: 0), 1.5-.5-.01 = .99 ; / log(4 + 1)
    assert entropy_relief(torch.tensor([2.0, 1.0, 1.5, 0.5])) == pytest.approx(1.98 / 1.6094379, rel=1e-6)
    assert entropy_relief(torch.tensor([1.0])) == 0.0


def test_thinking_span_stops_at_marker():
    tok = PieceTokenizer(["x", "y", "</th", "ink>", "z"])
    assert thinking_tokens("xy</think>z", [0, 1, 2, 3, 4], tok) == 2
    assert thinking_tokens("xyz", [0, 1, 4], tok) == 3  # no marker: the whole response


def shaped(name, params, samples, step=0, tokenizer=None):
    b = GroupBatch.from_samples(samples, step=step, tokenizer=tokenizer)
    return build("reward_shaper", name, params)(b)


def test_err_reward_golden_and_cap_and_thinking_only():
    ent = [2.0, 1.0, 1.5, 0.5]
    s = Sample("g", "p", [9], [0, 1, 2, 3], "abcd", reward=1.0, correct=True, entropies=ent)
    out = shaped("err", {}, [s])
    assert float(out[0]) == pytest.approx(1.0 + 0.3 * 1.2302432, rel=1e-6)
    assert float(shaped("err", {"lam": 10.0}, [s])[0]) == pytest.approx(1.5)  # capped
    # with </think> after two tokens only H_1, H_2 count: relu(2-1-.01)/log(3)
    tok = PieceTokenizer(["a", "b", "</think>", "c"])
    s2 = Sample("g", "p", [9], [0, 1, 2, 3], "ab</think>c", reward=0.0, entropies=ent)
    assert float(shaped("err", {}, [s2], tokenizer=tok)[0]) == pytest.approx(0.3 * 0.99 / 1.0986123, rel=1e-6)


def length_group(correct: bool):
    return [Sample("g", "p", [9], [5] * n, "t", reward=float(correct), correct=correct) for n in (2, 4, 6)]


def test_rrer_golden_correct_and_incorrect():
    # lengths 2,4,6: mean 4, population std 1.63299, z = -1.2247, 0, 1.2247, f = tanh(-z/2) = .545795, 0, -.545795
    approx = lambda t, e: torch.testing.assert_close(t.double(), torch.tensor(e, dtype=torch.float64), atol=1e-5,  # noqa: E731
                                                     rtol=0)
    approx(shaped("rrer", {}, length_group(True)), [1.163738, 1.0, 0.836262])
    approx(shaped("rrer", {}, length_group(False)), [0.0, 0.0, -0.163738])  # incorrect: only the penalty side
    approx(shaped("rrer", {"alpha": 1.0}, length_group(False)), [0.0, 0.0, -0.5])  # floor -0.5


def test_phase_switch():
    comp = build("reward_shaper", "err_plus", {"switch_step": 5})
    assert comp.phase(4) == "err" and comp.phase(5) == "rrer"
    err = shaped("err_plus", {"switch_step": 5}, length_group(True), step=4)
    rrer = shaped("err_plus", {"switch_step": 5}, length_group(True), step=5)
    assert torch.allclose(err, torch.ones(3))  # zero entropies: no relief bonus
    assert not torch.allclose(rrer, torch.ones(3))
