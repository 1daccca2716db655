"""LamPO: likelihood-weighted pairwise advantages and the ROUGE-L auxiliary reward."""

from __future__ import annotations

import pytest
import torch

from agents.grpo.batch import GroupBatch, Sample
from agents.grpo.registry import build
from agents.methods.lampo import rouge_l_f1


def group(rewards, seq_logprobs, lengths=None):
    lengths = lengths or [1] * len(rewards)
    return GroupBatch.from_samples([
        Sample("g", "p", [1], [2] * n, "", reward=r, logprobs=[lp / n] * n)
        for r, lp, n in zip(rewards, seq_logprobs, lengths)])


def test_lampo_golden():
    # r = [1,0,0], l = [-1,-2,-.5]: w01 = 2s(-1) = .537883, w02 = 2s(.5) = 1.244919 -> A0 = (.537883 + 1.244919)/2
    # A1 = -w10/2 = -s(-1), A2 = -w20/2 = -s(.5)
    adv = build("advantage", "lampo", {"kappa": 1.0})(group([1, 0, 0], [-1, -2, -0.5]))
    torch.testing.assert_close(adv.double(), torch.tensor([0.891401, -0.268941, -0.622459], dtype=torch.float64),
                               atol=1e-5, rtol=0)


def test_lampo_kappa_zero_is_scaled_dr_grpo():
    adv = build("advantage", "lampo", {"kappa": 0.0})(group([1, 0, 0], [-1, -2, -0.5]))
    torch.testing.assert_close(adv, torch.tensor([1.0, -0.5, -0.5]))  # G/(G-1) (r - mean)


def test_lampo_mean_vs_sum_logprob():
    # same per-token log-prob, different lengths: "mean" sees equal likelihoods (w = 1), "sum" does not
    b = group([1, 0], [-2, -4], lengths=[2, 4])
    torch.testing.assert_close(build("advantage", "lampo", {"logprob": "mean"})(b), torch.tensor([1.0, -1.0]))
    s = build("advantage", "lampo", {"logprob": "sum", "kappa": 1.0})(b)
    assert float(s[0]) == pytest.approx(2 * torch.sigmoid(torch.tensor(-2.0)).item(), rel=1e-5)


def test_rouge_l_golden_and_shaper():
    assert rouge_l_f1("the cat sat", "the cat on mat") == pytest.approx(4 / 7)
    assert rouge_l_f1("", "x") == 0.0
    b = GroupBatch.from_samples([Sample("g", "p", [1], [2], "the cat sat", reward=1.0, info={"answer": "the cat on mat"}),
                                 Sample("g", "p", [1], [2], "dog", reward=0.0, info={})])
    out = build("reward_shaper", "rouge_l", {"beta": 0.5})(b)
    torch.testing.assert_close(out, torch.tensor([1.0 + 0.5 * 4 / 7, 0.0]))
