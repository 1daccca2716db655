"""Sparse attention (sinks + recent window + top-k keys) on HF models: dense when it keeps every key, the kept set
itself, the attention it computes, switching the model's implementation in and out, and the cost account."""

from __future__ import annotations

import contextlib
import inspect

import pytest
import torch

from agents.policy import load_policy
from agents.policy.engine import new_cache
from agents.policy.sparse import (
    SparsePattern,
    SparseStats,
    attention_cost,
    sparse_attention,
    sparse_attention_forward,
    sparse_keep,
)


@pytest.fixture(scope="module")
def policy():
    return load_policy("tiny", seed=0)


def _ids(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(5, 90, (batch, length), generator=torch.Generator().manual_seed(seed))


def test_sparse_equals_dense_when_every_key_is_kept(policy):
    model = policy.model
    ids = _ids(2, 40)
    mask = torch.ones_like(ids)
    mask[1, :9] = 0  # left padding on the second row
    with torch.no_grad():
        dense = model(input_ids=ids, attention_mask=mask).logits
        stats = SparseStats()
        with sparse_attention(model, SparsePattern(sinks=0, window=0, topk=40), stats):
            sparse = model(input_ids=ids, attention_mask=mask).logits
        with sparse_attention(model, SparsePattern(sinks=1, window=2, topk=2)):
            pruned = model(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(sparse[0], dense[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(sparse[1, 9:], dense[1, 9:], atol=1e-5, rtol=1e-5)
    assert stats.kept == stats.visible > 0
    assert (pruned[0, -1] - dense[0, -1]).abs().max() > 1e-2  # a small pattern does change the output


def test_sparse_decode_over_a_dense_cache_equals_dense_decode(policy):
    """The draft's use: prefill densely, then one-token forwards over the cache with a ready-made 4D boolean mask."""
    model = policy.model
    ids = _ids(2, 30, seed=1)
    steps = _ids(2, 4, seed=2)
    kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    outs = {}
    for mode in ("dense", "sparse"):
        cache = new_cache(64)
        with torch.no_grad():
            model(input_ids=ids, use_cache=True, **{kw: cache})
            valid = torch.ones((2, 30), dtype=torch.bool)
            logits = []
            for t in range(steps.shape[1]):
                valid = torch.cat([valid, valid.new_ones((2, 1))], 1)
                ctx = sparse_attention(model, SparsePattern(2, 4, 64)) if mode == "sparse" else contextlib.nullcontext()
                with ctx:
                    out = model(input_ids=steps[:, t:t + 1], attention_mask=valid[:, None, None, :],
                                position_ids=torch.full((2, 1), 30 + t), use_cache=True, **{kw: cache})
                logits.append(out.logits[:, -1])
        outs[mode] = torch.stack(logits, 1)
    torch.testing.assert_close(outs["sparse"], outs["dense"], atol=1e-5, rtol=1e-5)


def test_kept_keys_are_sinks_window_and_top_scores():
    scores = torch.tensor([[[[0.0, 0.0, 5.0, -1.0, 3.0, 9.0, -2.0, 0.0, 0.0, 0.0]]]])
    keep = sparse_keep(scores, torch.ones((1, 1, 1, 10), dtype=torch.bool), SparsePattern(sinks=2, window=3, topk=2))
    assert keep[0, 0, 0].nonzero().flatten().tolist() == [0, 1, 2, 5, 7, 8, 9]
    # the first two positions are padding: sinks are the first two *visible* keys; top-2 of the rest by score
    visible = torch.tensor([[[[False, False] + [True] * 8]]])
    keep = sparse_keep(scores, visible, SparsePattern(sinks=2, window=3, topk=2))
    assert keep[0, 0, 0].nonzero().flatten().tolist() == [2, 3, 4, 5, 7, 8, 9]
    # causal (no mask given): the first of two queries sees keys 0..8 only
    two = scores.expand(1, 1, 2, 10)
    causal = torch.arange(10)[None, :] <= torch.tensor([8, 9])[:, None]
    keep = sparse_keep(two, causal[None, None], SparsePattern(sinks=1, window=1, topk=1))
    assert keep[0, 0, 0].nonzero().flatten().tolist() == [0, 5, 8]
    assert keep[0, 0, 1].nonzero().flatten().tolist() == [0, 5, 9]


def test_attention_is_a_softmax_over_the_kept_keys_only(policy):
    module = policy.model.model.layers[0].self_attn  # 4 query heads over 2 key/value heads
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(1, 4, 1, 16, generator=gen)
    k = torch.randn(1, 2, 12, 16, generator=gen)
    v = torch.randn(1, 2, 12, 16, generator=gen)
    pattern = SparsePattern(sinks=1, window=2, topk=3)
    with sparse_attention(policy.model, pattern):
        out, _ = sparse_attention_forward(module, q, k, v, None, scaling=0.25)
    for h in range(4):
        kv = h // 2
        s = (q[0, h, 0] @ k[0, kv].T) * 0.25
        middle = s[1:10]
        kept = sorted({0, 10, 11} | {1 + int(i) for i in middle.topk(3).indices})
        expected = torch.softmax(s[kept], -1) @ v[0, kv, kept]
        torch.testing.assert_close(out[0, 0, h], expected, atol=1e-5, rtol=1e-5)


def test_implementation_is_restored_and_required(policy):
    model = policy.model
    before = model.config._attn_implementation
    with pytest.raises(RuntimeError, match="boom"), sparse_attention(model, SparsePattern()):
        assert model.config._attn_implementation != before
        raise RuntimeError("boom")
    assert model.config._attn_implementation == before
    with pytest.raises(RuntimeError, match="outside a sparse_attention"):
        sparse_attention_forward(model.model.layers[0].self_attn, torch.zeros(1, 4, 1, 16), torch.zeros(1, 2, 3, 16),
                                 torch.zeros(1, 2, 3, 16), None)
    with pytest.raises(ValueError):
        SparsePattern(sinks=0, window=0, topk=0)


def test_attention_cost_account():
    # SmolLM2-135M's shape: 30 layers, 9 query heads over 3 KV heads of 64, fp32
    cost = attention_cost(4096, n_layers=30, n_heads=9, n_kv_heads=3, head_dim=64, bytes_per_element=4,
                          pattern=SparsePattern(sinks=4, window=60, topk=192))
    row = 3 * 64 * 4 * 30  # bytes of one position's keys, all layers
    assert cost["dense_kv_bytes"] == 2 * 4096 * row
    assert cost["kept_keys"] == 256
    assert cost["exact_topk_kv_bytes"] == (4096 + 256) * row
    assert cost["block_select_kv_bytes"] == 2 * 256 * row
    assert cost["dense_flops"] == 2 * 4096 * 2 * 9 * 64 * 30
    short = attention_cost(100, n_layers=1, n_heads=1, n_kv_heads=1, head_dim=1, bytes_per_element=1,
                           pattern=SparsePattern(sinks=4, window=60, topk=192))
    assert short["kept_keys"] == 100 and short["block_select_kv_bytes"] == short["dense_kv_bytes"]
