"""KV-cache compression in the hf engine (SnapKV-style prompt KV eviction): exactness where nothing is evicted, the
selection rule on golden values, the vote against a loop reference, memory accounting, and decoding over the
compressed cache."""

from __future__ import annotations

import random

import pytest
import torch

from agents.policy import SamplingParams, load_policy
from agents.policy.engine import HFEngine
from agents.policy.kv_compression import (
    KVCompression,
    compress_prompt_cache,
    kv_bytes_per_position,
    kv_cache_bytes,
    observation_scores,
    observe_queries,
    select_positions,
)
from agents.policy.s3r import S3RConfig


@pytest.fixture(scope="module", autouse=True)
def _fp32_decoding():
    with pytest.MonkeyPatch.context() as mp:  # exact comparisons need fp32 decoding (bf16 is tested elsewhere)
        mp.setenv("RLVR_CPU_BF16", "0")
        yield


@pytest.fixture(scope="module")
def policy():
    return load_policy("tiny", seed=0)


def long_prompts(lengths: tuple[int, ...], seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice("abcdefghij klmnop,.") for _ in range(n)) for n in lengths]


def test_config_validation(policy):
    with pytest.raises(ValueError, match="budget"):
        KVCompression(budget=16, sinks=4, window=32)
    with pytest.raises(ValueError, match="pool"):
        KVCompression(pool=4)
    with pytest.raises(ValueError, match="observe"):
        KVCompression(window=16, observe=32)  # the voting queries must be among the kept recent positions
    with pytest.raises(ValueError, match="observe"):
        KVCompression(observe=0)
    with pytest.raises(ValueError, match="cannot be combined"):
        HFEngine(policy, kv_compression=KVCompression(), speculative=S3RConfig())


def test_select_positions_golden():
    """Row 0: 10 valid positions (2..11) after 2 padding ones; sink 2 and window 10, 11 always kept, then the three
    best votes among 3..9 per head (padding's high votes ignored; ties go to the lower position). Row 1: 4 valid
    positions, fewer than the 6 kept: all of them plus the two lowest padding positions, for every head."""
    config = KVCompression(budget=6, sinks=1, window=2, observe=1, pool=1)
    votes = torch.tensor([
        [[9, 9, 0, .1, .5, .2, .9, .5, .5, .05, 0, 0],
         [0, 0, 0, 1., .8, 0, 0, 0, 0, .7, 0, 0]],
        [[5, 4, 3, 2, 1, 0, 0, 0, 0, 0, 0, 0],
         [0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4]],
    ])
    valid = torch.tensor([[0, 0] + [1] * 10, [0] * 8 + [1] * 4])
    kept = select_positions(votes, valid, config)
    assert kept.tolist() == [[[2, 4, 6, 7, 10, 11], [2, 3, 4, 9, 10, 11]],
                             [[0, 1, 8, 9, 10, 11], [0, 1, 8, 9, 10, 11]]]
    # budget >= length keeps every position, in order
    everything = select_positions(votes, valid, KVCompression(budget=12, sinks=1, window=2, observe=2))
    assert everything.tolist() == [[list(range(12))] * 2] * 2


def test_observation_scores_match_a_loop_reference():
    torch.manual_seed(0)
    b, heads, kv_heads, length, w, dim = 2, 4, 2, 9, 3, 5
    queries, keys = torch.randn(b, heads, w, dim), torch.randn(b, kv_heads, length, dim)
    valid = torch.ones(b, length, dtype=torch.long)
    valid[1, :7] = 0  # row 1 is left-padded, its first observation query on padding (it votes nothing)
    scale = dim ** -0.5
    expected = torch.zeros(b, kv_heads, length)
    for row in range(b):
        for h in range(heads):
            g = h // (heads // kv_heads)
            for i in range(w):
                at = length - w + i  # the query's own position
                if not valid[row, at]:
                    continue
                seen = [j for j in range(at + 1) if valid[row, j]]
                logits = torch.stack([queries[row, h, i] @ keys[row, g, j] * scale for j in seen])
                expected[row, g, seen] += torch.softmax(logits, 0)
    assert torch.allclose(observation_scores(queries, keys, valid, scale, pool=1), expected, atol=1e-6)
    # the vote is attention mass: one per real observation query and query head of the KV head
    groups = heads // kv_heads
    votes_per_head = torch.tensor([[w * groups] * kv_heads, [(w - 1) * groups] * kv_heads], dtype=torch.float)
    assert torch.allclose(expected.sum(-1), votes_per_head)
    pooled = observation_scores(queries, keys, valid, scale, pool=3)
    inner = (expected[..., :-2] + expected[..., 1:-1] + expected[..., 2:]) / 3
    assert torch.allclose(pooled[..., 1:-1], inner, atol=1e-6)
    assert torch.allclose(pooled[..., 0], (expected[..., 0] + expected[..., 1]) / 2, atol=1e-6)  # edges: no pad


def test_observing_the_prefill_leaves_its_logits_unchanged(policy):
    model, tok = policy.model, policy.tokenizer
    ids = [tok(p, add_special_tokens=False)["input_ids"] for p in long_prompts((40, 25))]
    width = max(map(len, ids))
    input_ids = torch.tensor([[0] * (width - len(s)) + s for s in ids])
    mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in ids])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    implementation = model.config._attn_implementation
    with torch.inference_mode():
        dense = model(input_ids=input_ids, attention_mask=mask, position_ids=positions).logits
        with observe_queries(model, 8) as observed:
            seen = model(input_ids=input_ids, attention_mask=mask, position_ids=positions).logits
    assert torch.equal(dense, seen)
    assert model.config._attn_implementation == implementation  # restored
    cfg = model.config
    assert sorted(observed) == list(range(cfg.num_hidden_layers))
    queries, scale = observed[0]
    assert queries.shape == (2, cfg.num_attention_heads, 8, cfg.hidden_size // cfg.num_attention_heads)
    assert scale == pytest.approx(queries.shape[-1] ** -0.5)


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_budget_at_least_the_context_is_exactly_dense(policy, temperature):
    """Compression configured, nothing to evict (budget >= the longest prompt): the rollouts are the dense ones, bit
    for bit, through continuous batching refills too, and no compression is recorded."""
    prompts = long_prompts((120, 60, 90))
    sp = SamplingParams(temperature=temperature, max_new_tokens=12, seed=4)
    dense = HFEngine(policy, max_batch_size=4).generate(prompts, 2, sp)
    config = KVCompression(budget=120, sinks=4, window=16, observe=16)
    engine = HFEngine(policy, max_batch_size=4, kv_compression=config)
    compressed = engine.generate(prompts, 2, sp)
    assert [(r.response_ids, r.logprobs, r.entropies) for r in compressed] == [
        (r.response_ids, r.logprobs, r.entropies) for r in dense]
    assert engine.kv_compression_stats is None
    assert engine.describe()["kv_compression"]["budget"] == 120


def test_a_row_within_budget_is_untouched_while_its_batch_mate_is_compressed(policy):
    short, long = long_prompts((50, 400), seed=1)
    sp = SamplingParams(temperature=1.0, max_new_tokens=16)
    engine = HFEngine(policy, kv_compression=KVCompression(budget=64, sinks=4, window=16, observe=8))
    together = engine.generate([short, long], 2, sp, seeds=[7, 8])
    alone = HFEngine(policy).generate([short], 2, sp, seeds=[7])
    for x, y in zip(together[:2], alone):  # the short row keeps every position: same rollouts as dense (padding aside)
        assert x.response_ids == y.response_ids
        assert x.logprobs == pytest.approx(y.logprobs, abs=1e-5)
    dense_long = HFEngine(policy).generate([long], 2, sp, seeds=[8])
    assert [r.logprobs for r in together[2:]] != [r.logprobs for r in dense_long]  # the long row was compressed
    stats = engine.kv_compression_stats
    assert stats.prefills == 1 and stats.rows == 4 and stats.kept_positions == 4 * 64


def test_memory_accounting(policy):
    """Bytes per position from the model's shape (layers x K and V x KV heads x head dim x 4 bytes in fp32); the
    prefilled cache really holds ``budget`` positions (plus the preallocated decode room); the stats count per row."""
    cfg = policy.model.config
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    per_position = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * head_dim * 4
    prompts = long_prompts((300, 250), seed=2)
    config = KVCompression(budget=96, sinks=4, window=16, observe=16)
    engine = HFEngine(policy, precision="fp32", cache_block=8, kv_compression=config)
    model = engine.decode_model()
    from agents.policy.engine import _Row, encode_prompts

    prompt_ids = encode_prompts(policy.tokenizer, prompts)
    rows = [_Row(prompt=i, seed=0, gen=None) for i in (0, 0, 0, 1)]
    with torch.inference_mode():
        cache, logits, mask, _ = engine._prefill(model, prompt_ids, rows, max_new_tokens=100)
    assert kv_bytes_per_position(cache) == per_position
    assert kv_cache_bytes(cache) == 4 * 96 * per_position
    assert mask.shape == (4, 96) and bool(mask.all())
    assert all(layer.keys.shape[2] == 96 and layer._k.shape[2] == 96 + 8 for layer in cache.layers)
    stats = engine.kv_compression_stats
    assert stats.to_dict() == {"prefills": 1, "rows": 4, "prompt_positions": 4 * 300, "kept_positions": 4 * 96,
                               "dense_kv_bytes": 4 * 300 * per_position, "kept_kv_bytes": 4 * 96 * per_position,
                               "saved_kv_bytes": 4 * (300 - 96) * per_position}


def test_compressed_decode_logprobs_equal_a_forward_over_the_compressed_cache(policy):
    """The engine's log-probs under compression are those of the model reading the compressed prompt cache: a single
    teacher-forced forward of the response over that cache (true positions, no mask) reproduces them."""
    prompt = long_prompts((500,), seed=3)
    config = KVCompression(budget=80, sinks=4, window=16, observe=16)
    engine = HFEngine(policy, precision="fp32", kv_compression=config)
    sp = SamplingParams(temperature=1.0, max_new_tokens=10, seed=5)
    rollout = engine.generate(prompt, 1, sp)[0]
    from agents.policy.engine import _Row

    model = engine.decode_model()
    with torch.inference_mode():
        cache, logits, mask, last = engine._prefill(model, [rollout.prompt_ids], [_Row(0, 0, None)], 10)
        first = torch.log_softmax(logits.float(), -1)[0, rollout.response_ids[0]]
        tokens = torch.tensor([rollout.response_ids[:-1]])
        positions = last + 1 + torch.arange(tokens.shape[1])
        out = model(input_ids=tokens, position_ids=positions[None], use_cache=True, **{engine.cache_kw: cache})
        rest = torch.log_softmax(out.logits[0].float(), -1).gather(-1, torch.tensor(rollout.response_ids[1:])[:, None])
    assert rollout.logprobs == pytest.approx([float(first), *rest.squeeze(-1).tolist()], abs=1e-5)
    assert mask.shape[1] == 80


def test_compress_prompt_cache_keeps_the_selected_keys(policy):
    """Each layer's compressed keys are exactly the dense prefill's keys at the selected positions."""
    engine = HFEngine(policy, precision="fp32", preallocate=False)
    model = engine.decode_model()
    ids = policy.tokenizer(long_prompts((200,), seed=4)[0], add_special_tokens=False)["input_ids"]
    config = KVCompression(budget=48, sinks=2, window=12, observe=8, pool=3)
    from agents.policy.engine import new_cache

    cache = new_cache(None)
    mask = torch.ones(1, len(ids), dtype=torch.long)
    with torch.inference_mode(), observe_queries(model, config.observe) as observed:
        model(input_ids=torch.tensor([ids]), use_cache=True, **{engine.cache_kw: cache})
    dense_keys = [layer.keys.clone() for layer in cache.layers]
    expected = [select_positions(observation_scores(observed[i][0], dense_keys[i], mask, observed[i][1], 3),
                                 mask, config) for i in range(len(dense_keys))]
    new_mask = compress_prompt_cache(cache, observed, mask, config)
    assert new_mask.shape == (1, 48)
    for layer, keys, kept in zip(cache.layers, dense_keys, expected):
        assert torch.equal(layer.keys, keys.gather(2, kept[..., None].expand(*kept.shape, keys.shape[-1])))
        assert kept[0, :, :2].tolist() == [[0, 1]] * kept.shape[1]  # sinks
        assert kept[0, :, -12:].tolist() == [list(range(188, 200))] * kept.shape[1]  # recent window
    assert observed[0][0].shape[2] == 8  # the observation window: the last 8 queries voted
    assert not torch.equal(expected[0][0, 0], expected[0][0, 1])  # heads choose their own positions
