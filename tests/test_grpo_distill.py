"""Two-context statistics (agents/grpo/distill.py) against a plain teacher-forced pass with full-vocabulary logits."""

from __future__ import annotations

import math
import random

import pytest
import torch

from agents.grpo.distill import context_stats, token_divergence
from agents.policy.models import load_policy


@pytest.fixture(scope="module")
def tiny():
    return load_policy("tiny", seed=0).model


def rows(vocab: int, n: int = 6, seed: int = 0):
    rng = random.Random(seed)
    student = [[rng.randrange(vocab) for _ in range(rng.randint(1, 7))] for _ in range(n)]
    # the teacher's context: a privileged prefix of its own length before the student's prompt
    teacher = [[rng.randrange(vocab) for _ in range(rng.randint(1, 9))] + p for p in student]
    responses = [[rng.randrange(vocab) for _ in range(rng.randint(1, 12))] for _ in range(n)]
    responses[1] = []  # a row with nothing to score
    return student, teacher, responses


def naive(model, student, teacher, responses, divergence, beta, temperature):
    """One unpadded row at a time through the model's own forward; the teacher's logits detached."""
    width = max(1, max(len(r) for r in responses))
    out = {k: torch.zeros(len(responses), width) for k in ("lp", "ent", "tlp", "div")}
    for i, (p, q, r) in enumerate(zip(student, teacher, responses)):
        if not r:
            continue
        z_s = model(input_ids=torch.tensor([p + r])).logits[0, len(p) - 1:len(p) - 1 + len(r)].float() / temperature
        with torch.no_grad():
            z_t = model(input_ids=torch.tensor([q + r])).logits[0, len(q) - 1:len(q) - 1 + len(r)].float() / temperature
        log_s, log_t = torch.log_softmax(z_s, -1), torch.log_softmax(z_t, -1)
        idx = torch.tensor(r)[:, None]
        out["lp"][i, :len(r)] = log_s.gather(1, idx).squeeze(1)
        out["ent"][i, :len(r)] = -(log_s.exp() * log_s).sum(-1).detach()
        out["tlp"][i, :len(r)] = log_t.gather(1, idx).squeeze(1)
        out["div"][i, :len(r)] = token_divergence(z_s, z_t, divergence, beta)
    return out


@pytest.mark.parametrize("divergence,beta,temperature", [("jsd", 0.5, 1.0), ("jsd", 0.0, 0.7), ("jsd", 1.0, 1.0),
                                                         ("jsd", 0.3, 1.0), ("forward_ce", 0.5, 0.7)])
def test_context_stats_match_a_plain_teacher_forced_pass_with_gradients(tiny, divergence, beta, temperature):
    student, teacher, responses = rows(tiny.config.vocab_size)
    params = list(tiny.parameters())
    got = context_stats(tiny, student, teacher, responses, divergence=divergence, beta=beta,
                        temperature=temperature, chunk=1)  # one row of every response per chunk: many chunks
    want = naive(tiny, student, teacher, responses, divergence, beta, temperature)
    for key, value in (("lp", got.logprobs), ("ent", got.entropies), ("tlp", got.teacher_logprobs),
                       ("div", got.divergence)):
        torch.testing.assert_close(value, want[key], atol=1e-5, rtol=1e-5, msg=key)
    assert not got.teacher_logprobs.requires_grad and not got.entropies.requires_grad
    assert float(got.divergence[1].detach().abs().sum()) == 0.0
    w = torch.randn(got.logprobs.shape, generator=torch.Generator().manual_seed(2))
    loss, ref = (got.divergence * w).sum() + got.logprobs.sum(), (want["div"] * w).sum() + want["lp"].sum()
    for g, r in zip(torch.autograd.grad(loss, params), torch.autograd.grad(ref, params)):
        torch.testing.assert_close(g, r, atol=1e-5, rtol=1e-4)


def test_same_context_gives_zero_divergence_and_equal_logprobs(tiny):
    student, _, responses = rows(tiny.config.vocab_size, seed=3)
    got = context_stats(tiny, student, student, responses, divergence="jsd", beta=0.5)
    torch.testing.assert_close(got.teacher_logprobs, got.logprobs.detach(), atol=1e-6, rtol=0)
    assert float(got.divergence.detach().abs().max()) < 1e-6


def test_no_grad_and_none_divergence(tiny):
    student, teacher, responses = rows(tiny.config.vocab_size, seed=4)
    with torch.no_grad():
        got = context_stats(tiny, student, teacher, responses, divergence="none")
    assert got.divergence is None and not got.logprobs.requires_grad
    want = naive(tiny, student, teacher, responses, "jsd", 0.5, 1.0)
    torch.testing.assert_close(got.teacher_logprobs, want["tlp"], atol=1e-5, rtol=1e-5)


def test_divergence_golden_values():
    s, q = torch.tensor([[0.5, 0.5]]).log(), torch.tensor([[0.9, 0.1]]).log()
    # M = 0.5 Q + 0.5 S = (0.7, 0.3): 0.5 KL(Q || M) + 0.5 KL(S || M)
    kl_qm = 0.9 * math.log(0.9 / 0.7) + 0.1 * math.log(0.1 / 0.3)
    kl_sm = 0.5 * math.log(0.5 / 0.7) + 0.5 * math.log(0.5 / 0.3)
    assert float(token_divergence(s, q, "jsd", 0.5)) == pytest.approx(0.5 * kl_qm + 0.5 * kl_sm, abs=1e-7)
    assert float(token_divergence(s, q, "jsd", 0.5)) == pytest.approx(0.1017492, abs=1e-6)
    kl_qs = 0.9 * math.log(0.9 / 0.5) + 0.1 * math.log(0.1 / 0.5)  # beta = 0: forward KL(Q || S)
    kl_sq = 0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1)  # beta = 1: reverse KL(S || Q)
    assert float(token_divergence(s, q, "jsd", 0.0)) == pytest.approx(kl_qs, abs=1e-6)
    assert float(token_divergence(s, q, "jsd", 1.0)) == pytest.approx(kl_sq, abs=1e-6)
    assert float(token_divergence(s, q, "forward_ce")) == pytest.approx(-math.log(0.5), abs=1e-6)  # H(Q, S)
    # the mixture form tends to the ends' KLs scaled: beta -> 0 gives beta * (1 - beta) ~ small, never negative
    assert 0 < float(token_divergence(s, q, "jsd", 1e-3)) < float(token_divergence(s, q, "jsd", 0.5))


def test_bad_inputs_are_clear_errors(tiny):
    student, teacher, responses = rows(tiny.config.vocab_size)
    with pytest.raises(ValueError, match="one student prompt, one teacher prompt"):
        context_stats(tiny, student, teacher[:-1], responses)
    with pytest.raises(ValueError, match="divergence must be one of"):
        context_stats(tiny, student, teacher, responses, divergence="kl")
    with pytest.raises(ValueError, match="beta must be"):
        context_stats(tiny, student, teacher, responses, beta=1.5)
    with pytest.raises(ValueError, match="at least one prompt token"):
        context_stats(tiny, student, [[]] + teacher[1:], responses)
