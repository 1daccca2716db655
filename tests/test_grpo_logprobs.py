"""The fused head (LinearTokenLogprob) and the bucketed ``response_logprobs`` against naive full-logits references."""

from __future__ import annotations

import random

import pytest
import torch
from grpo_toys import make_model

from agents.grpo.logprobs import (
    LinearTokenLogprob,
    _separable_head,
    length_buckets,
    linear_token_logprobs,
    response_logprobs,
)
from agents.policy.models import load_policy


def naive_head(h, w, b, t, temperature=1.0):
    logits = torch.nn.functional.linear(h, w, b)
    logp = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)) / temperature, -1)
    return logp.gather(1, t[:, None]).squeeze(1), -(logp.exp() * logp).sum(-1)


def naive_response_logprobs(model, prompts, responses, temperature=1.0):
    """One unpadded row at a time through the model's own forward, full fp32 log-softmax of logits / T."""
    width = max(1, max(len(r) for r in responses))
    lps, ents = torch.zeros(len(prompts), width), torch.zeros(len(prompts), width)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        if not r:
            continue
        logits = model(input_ids=torch.tensor([list(p) + list(r)])).logits[0].float()
        logp = torch.log_softmax(logits / temperature, -1)
        pos = torch.arange(len(p) - 1, len(p) - 1 + len(r))
        picked = logp[pos]
        lps[i, : len(r)] = picked.gather(1, torch.tensor(r)[:, None]).squeeze(1)
        ents[i, : len(r)] = -(picked.exp() * picked).sum(-1).detach()
    return lps, ents


def ragged_rows(vocab: int, n: int = 7, seed: int = 0):
    rng = random.Random(seed)
    prompts = [[rng.randrange(vocab) for _ in range(rng.randint(1, 9))] for _ in range(n)]
    responses = [[rng.randrange(vocab) for _ in range(rng.randint(1, 14))] for _ in range(n)]
    responses[2] = []  # a row with nothing to score
    return prompts, responses


def grads_of(loss, params):
    return torch.autograd.grad(loss, params)


def head_inputs(n=7, v=11, d=5, dtype=torch.float64, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, d, dtype=dtype, generator=g, requires_grad=True)
    w = torch.randn(v, d, dtype=dtype, generator=g, requires_grad=True)
    b = torch.randn(v, dtype=dtype, generator=g, requires_grad=True) if bias else None
    return h, w, b, torch.randint(0, v, (n,), generator=g)


@pytest.mark.parametrize("temperature", [1.0, 0.7, 2.5])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("store_probs", [True, False])
def test_head_gradcheck_fp64(bias, store_probs, temperature):
    h, w, b, t = head_inputs(bias=bias)
    inputs = (h, w) if b is None else (h, w, b)

    def f(h, w, b=None):  # chunk 3 does not divide 7
        return LinearTokenLogprob.apply(h, w, b, t, 3, store_probs, torch.float64, temperature)[0]

    assert torch.autograd.gradcheck(f, inputs)
    lp, ent = LinearTokenLogprob.apply(h, w, b, t, 3, store_probs, torch.float64, temperature)
    ref_lp, ref_ent = naive_head(h, w, b, t, temperature)  # the values are of logits / T too
    torch.testing.assert_close(lp, ref_lp, atol=1e-12, rtol=0)
    torch.testing.assert_close(ent, ref_ent.detach(), atol=1e-12, rtol=0)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("store_probs", [True, False])
def test_head_matches_full_logits_in_fp32(store_probs, temperature):
    h, w, b, t = head_inputs(n=50, v=300, d=16, dtype=torch.float32, seed=1)
    weights = torch.randn(50)
    lp, ent = linear_token_logprobs(h, w, b, t, chunk=16, store_probs=store_probs, temperature=temperature)
    ref_lp, ref_ent = naive_head(h, w, b, t, temperature)
    torch.testing.assert_close(lp, ref_lp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent, ref_ent.detach(), atol=1e-5, rtol=1e-5)
    assert not ent.requires_grad
    for got, want in zip(grads_of((lp * weights).sum(), (h, w, b)), grads_of((ref_lp * weights).sum(), (h, w, b))):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_head_supports_retain_graph_and_partial_grads():
    h, w, b, t = head_inputs(n=9, v=20, d=4, dtype=torch.float32)
    w.requires_grad_(False)
    lp, _ = linear_token_logprobs(h, w, b, t, chunk=4, store_probs=True)
    first = torch.autograd.grad(lp.sum(), (h, b), retain_graph=True)
    second = torch.autograd.grad(lp.sum(), (h, b))
    for x, y in zip(first, second):
        torch.testing.assert_close(x, y, atol=0, rtol=0)


def test_head_without_grad_keeps_no_graph():
    h, w, b, t = head_inputs(n=9, v=20, d=4, dtype=torch.float32)
    with torch.no_grad():
        lp, ent = linear_token_logprobs(h, w, b, t, chunk=4)
    assert lp.grad_fn is None and ent.grad_fn is None
    torch.testing.assert_close(lp, naive_head(h, w, b, t)[0].detach(), atol=1e-5, rtol=1e-5)


def test_head_under_bf16_autocast_returns_grads_in_input_dtypes():
    h, w, b, t = head_inputs(n=40, v=64, d=32, dtype=torch.float32, seed=2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lp, ent = linear_token_logprobs(h, w, b, t, chunk=16)
    assert lp.dtype == ent.dtype == torch.float32
    gh, gw, gb = grads_of(lp.sum(), (h, w, b))
    assert gh.dtype == gw.dtype == gb.dtype == torch.float32
    ref_lp, _ = naive_head(h, w, b, t)
    torch.testing.assert_close(lp, ref_lp.detach(), atol=0.1, rtol=0.02)
    for got, want in zip((gh, gw, gb), grads_of(ref_lp.sum(), (h, w, b))):
        assert torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0) > 0.99


def test_length_buckets_rule():
    assert length_buckets([10, 100, 80, 76, 50, 9], 0.25) == [[1, 2, 3], [4], [0, 5]]
    assert length_buckets([3, 1, 2], None) == [[0, 1, 2]]
    assert length_buckets([5, 5, 5], 0.0) == [[0, 1, 2]]
    with pytest.raises(ValueError, match="bucket_slack"):
        length_buckets([1], 1.0)


@pytest.fixture(scope="module")
def tiny():
    return load_policy("tiny", seed=0).model  # tied embeddings, vocab ~100


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_response_logprobs_match_naive_reference_with_all_gradients(tiny, temperature):
    prompts, responses = ragged_rows(tiny.config.vocab_size)
    params = [p for p in tiny.parameters()]
    weights = torch.randn(len(prompts), max(len(r) for r in responses), generator=torch.Generator().manual_seed(3))
    lp, ent = response_logprobs(tiny, prompts, responses, chunk=2, temperature=temperature)
    ref_lp, ref_ent = naive_response_logprobs(tiny, prompts, responses, temperature)
    torch.testing.assert_close(lp, ref_lp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent, ref_ent, atol=1e-5, rtol=1e-5)
    assert float(lp[2].detach().abs().sum()) == 0.0 and float(ent[2].abs().sum()) == 0.0
    got, want = grads_of((lp * weights).sum(), params), grads_of((ref_lp * weights).sum(), params)
    for g, r in zip(got, want):
        torch.testing.assert_close(g, r, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("store_probs", [True, False])
def test_bucketing_changes_nothing_but_the_batches(tiny, store_probs):
    prompts, responses = ragged_rows(tiny.config.vocab_size, n=9, seed=5)
    order = list(range(len(prompts)))
    random.Random(1).shuffle(order)
    prompts, responses = [prompts[i] for i in order], [responses[i] for i in order]
    assert len(length_buckets([len(p) + len(r) for p, r in zip(prompts, responses)], 0.1)) > 2
    params = list(tiny.parameters())
    weights = torch.randn(len(prompts), max(len(r) for r in responses), generator=torch.Generator().manual_seed(4))
    results = []
    for slack in (0.1, None):
        lp, ent = response_logprobs(tiny, prompts, responses, bucket_slack=slack, store_probs=store_probs)
        results.append((lp, ent, grads_of((lp * weights).sum(), params)))
    (lp_a, ent_a, g_a), (lp_b, ent_b, g_b) = results
    torch.testing.assert_close(lp_a, lp_b, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent_a, ent_b, atol=1e-5, rtol=0)
    for x, y in zip(g_a, g_b):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)


def test_bf16_autocast_agrees_with_fp32(tiny):
    prompts, responses = ragged_rows(tiny.config.vocab_size, seed=7)
    params = list(tiny.parameters())
    lp32, _ = response_logprobs(tiny, prompts, responses)
    lp16, ent16 = response_logprobs(tiny, prompts, responses, autocast_bf16=True)
    assert lp16.dtype == ent16.dtype == torch.float32
    torch.testing.assert_close(lp16, lp32, atol=0.1, rtol=0.02)
    g32, g16 = grads_of(lp32.sum(), params), grads_of(lp16.sum(), params)
    flat32, flat16 = torch.cat([g.flatten() for g in g32]), torch.cat([g.flatten() for g in g16])
    assert all(g.dtype == torch.float32 for g in g16)
    assert torch.nn.functional.cosine_similarity(flat16, flat32, dim=0) > 0.99


def test_inference_and_untrainable_weights(tiny):
    prompts, responses = ragged_rows(tiny.config.vocab_size, seed=8)
    ref_lp, _ = naive_response_logprobs(tiny, prompts, responses)
    with torch.no_grad():
        lp, _ = response_logprobs(tiny, prompts, responses)
    assert lp.grad_fn is None
    torch.testing.assert_close(lp, ref_lp.detach(), atol=1e-5, rtol=1e-5)
    tiny.requires_grad_(False)  # frozen reference model, grad mode on
    try:
        lp, _ = response_logprobs(tiny, prompts, responses)
    finally:
        tiny.requires_grad_(True)
    assert not lp.requires_grad
    torch.testing.assert_close(lp, ref_lp.detach(), atol=1e-5, rtol=1e-5)


class WithoutHead(torch.nn.Module):
    """A model exposing only its forward: response_logprobs must fall back to the full logits."""

    def __init__(self, model):
        super().__init__()
        self.inner = model

    def forward(self, **kwargs):
        return self.inner(**kwargs)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_fallback_without_a_separable_head_and_empty_responses(temperature):
    model = make_model(seed=2)
    params = list(model.parameters())
    prompts, responses = ragged_rows(model.config.vocab_size, seed=9)
    lp, ent = response_logprobs(WithoutHead(model), prompts, responses, temperature=temperature)
    ref_lp, ref_ent = naive_response_logprobs(model, prompts, responses, temperature)
    torch.testing.assert_close(lp, ref_lp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent, ref_ent, atol=1e-5, rtol=1e-5)
    for g, r in zip(grads_of(lp.sum(), params), grads_of(ref_lp.sum(), params)):
        torch.testing.assert_close(g, r, atol=1e-5, rtol=1e-4)
    lp, ent = response_logprobs(model, [[3], [4, 5]], [[], []])  # nothing to score: zeros, still backpropagates
    assert lp.shape == (2, 1) and float(lp.detach().abs().sum()) == 0.0
    lp.sum().backward()
    model.config.final_logit_softcapping = 30.0  # heads that transform the logits take the model's forward
    assert _separable_head(model) is None


def test_bad_input_is_refused(tiny):
    with pytest.raises(ValueError, match="prompt token"):
        response_logprobs(tiny, [[]], [[1]])
    with pytest.raises(ValueError, match="as many"):
        response_logprobs(tiny, [[1]], [[1], [2]])
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="temperature"):
            response_logprobs(tiny, [[1]], [[1]], temperature=bad)


def test_shared_prompts_run_once_and_change_nothing_but_the_work(tiny):
    """Rows with one prompt (GRPO groups; here of 4, 3 and 1 rows, with an empty and a one-token response) run that
    prompt through the backbone once: the same log-probs, entropies and gradients, for fewer fed positions."""
    rng = random.Random(11)
    vocab = tiny.config.vocab_size
    prompts, responses = [], []
    for size in (4, 3, 1):
        prompt = [rng.randrange(vocab) for _ in range(rng.randint(5, 9))]
        for _ in range(size):
            prompts.append(prompt)
            responses.append([rng.randrange(vocab) for _ in range(rng.randint(2, 12))])
    responses[1], responses[5] = [], [rng.randrange(vocab)]
    params = list(tiny.parameters())
    weights = torch.randn(len(prompts), max(len(r) for r in responses), generator=torch.Generator().manual_seed(6))
    fed, results = [], []
    handle = tiny.get_input_embeddings().register_forward_hook(lambda _m, args, _o: fed.append(args[0].numel()))
    try:
        for share in (True, False):
            fed.clear()
            lp, ent = response_logprobs(tiny, prompts, responses, temperature=0.7, share_prompts=share)
            results.append((lp, ent, grads_of((lp * weights).sum(), params), sum(fed)))
    finally:
        handle.remove()
    (lp_s, ent_s, g_s, fed_s), (lp_w, ent_w, g_w, fed_w) = results
    torch.testing.assert_close(lp_s, lp_w, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent_s, ent_w, atol=1e-5, rtol=0)
    for x, y in zip(g_s, g_w):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)
    ref_lp, _ = naive_response_logprobs(tiny, prompts, responses, temperature=0.7)
    torch.testing.assert_close(lp_s, ref_lp, atol=1e-5, rtol=1e-5)
    assert float(lp_s[1].detach().abs().sum()) == 0.0
    # shared: each group's prompt once plus its responses less their last token (the lone row runs whole)
    groups = [range(0, 4), range(4, 7)]
    want = sum(len(prompts[g[0]]) + sum(max(0, len(responses[i]) - 1) for i in g if responses[i]) for g in groups)
    want += len(prompts[7]) + len(responses[7])
    assert want <= fed_s <= want / 0.75  # right padding in response buckets: at most bucket_slack (0.25) of a row
    assert fed_s < fed_w
