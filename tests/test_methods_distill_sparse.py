"""Sparrow's cost model (golden values of the schedule search) and DistillSparse (teacher-forced sparse log-probs equal
the engine's sparse decoding; the adapter starts as the identity, leaves the dense policy untouched, and lowers the
sparse-to-dense divergence it is trained on)."""

from __future__ import annotations

import math

import pytest
import torch

from agents.methods.distill_sparse import (
    DistillSparseConfig,
    _response_logits,
    alignment,
    distill_sparse,
    divergence,
    merged_actor,
    sample_sparse,
    sparse_logprobs,
)
from agents.methods.sparrow_schedule import (
    DecodeCost,
    choose_schedule,
    pattern_for,
    projection,
    schedule_cost,
    visible_histogram,
)
from agents.policy import SamplingParams, load_policy
from agents.policy.engine import HFEngine
from agents.policy.sparse import SparsePattern

PROMPTS = ["one two three four five six seven", "a b c d e"]
TIGHT = SparsePattern(sinks=1, window=2, topk=0, schedule=((0, 0.0),))


@pytest.fixture()
def policy():
    return load_policy("tiny", seed=0)


def test_decode_cost_fit_and_schedule_cost_golden():
    cost = DecodeCost.fit([100, 200, 400], [0.012, 0.014, 0.018])  # exactly 0.01 + 2e-5 * context
    assert cost.fixed == pytest.approx(0.01) and cost.per_key == pytest.approx(2e-5) and cost.unit == "s"
    assert DecodeCost.fit([1, 2], [5.0, 3.0]).per_key == 0.0  # a negative slope clips: keys never make it faster
    with pytest.raises(ValueError, match="two distinct"):
        DecodeCost.fit([5, 5], [1.0, 2.0])
    # a 3-token prompt and a 4-token response: tokens 1..3 decode at 4, 5, 6 visible keys
    hist = visible_histogram([3, 5], [4, 1])
    assert hist == {4: 1, 5: 1, 6: 1}
    cost = DecodeCost(fixed=1.0, per_key=0.5)
    assert schedule_cost(None, hist, cost) == pytest.approx(3 * 1.0 + 0.5 * (4 + 5 + 6))
    # sinks 1 + window 2, half of the middle from 5 visible keys on: kept(4) = 3, kept(5) = 3 + 1, kept(6) = 3 + 2
    pattern = pattern_for(SparsePattern(sinks=1, window=2, topk=0), [0, 5], [0.0, 0.5])
    assert [pattern.kept(v) for v in (4, 5, 6)] == [3, 4, 5]
    assert schedule_cost(pattern, hist, cost) == pytest.approx(3 * 1.0 + 0.5 * (3 + 4 + 5))
    proj = projection(SparsePattern(sinks=1, window=2, topk=0), [0, 5], [0.0, 0.5], hist, cost)
    assert proj["speedup"] == pytest.approx(10.5 / 9.0)
    assert proj["kept_fraction"] == pytest.approx(12 / 15)


def test_flop_cost_of_a_llama_config_golden():
    from types import SimpleNamespace

    from agents.policy.sparse import attention_cost

    cfg = SimpleNamespace(hidden_size=8, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                          intermediate_size=16, vocab_size=10)
    cost = DecodeCost.flops(cfg)
    # per layer: q, o 8x8 each, k, v 8x4 each = 192; MLP 3 x 8 x 16 = 384; logits 8 x 10 = 80
    assert cost.fixed == 2 * (2 * (192 + 384) + 80) and cost.unit == "flop"
    assert cost.per_key == 2 * 2 * 2 * 4 * 2
    dense = attention_cost(50, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=4, bytes_per_element=4)
    assert cost.per_key * 50 == dense["dense_flops"]


def test_choose_schedule_takes_the_smallest_feasible_share_per_bucket():
    tails = {0.0: [0.70, 0.90, math.nan], 0.25: [0.80, 0.95, math.nan], 0.5: [0.87, 0.97, math.nan],
             1.0: [0.99, 0.99, math.nan]}
    assert choose_schedule(tails, 0.86) == [0.5, 0.0, 0.0]
    assert choose_schedule({0.1: [0.5], 0.2: [0.6]}, 0.86) == [1.0]  # nothing feasible: dense in that bucket
    with pytest.raises(ValueError, match="one tail per bucket"):
        choose_schedule({0.1: [0.5], 0.2: [0.6, 0.7]}, 0.86)


def test_teacher_forced_sparse_logprobs_equal_the_engines_sparse_decoding(policy):
    sp = SamplingParams(temperature=1.0, max_new_tokens=20, seed=5)
    out = HFEngine(policy, precision="fp32", sparse_decode=TIGHT).generate(PROMPTS, 3, sp)
    pad = policy.tokenizer.pad_token_id
    for i in range(len(PROMPTS)):
        rows = out[3 * i:3 * i + 3]
        with torch.no_grad():
            lp = sparse_logprobs(policy.model, rows[0].prompt_ids, [r.response_ids for r in rows], TIGHT, pad_id=pad)
            dense = sparse_logprobs(policy.model, rows[0].prompt_ids, [r.response_ids for r in rows], None,
                                    pad_id=pad)
        for j, r in enumerate(rows):
            torch.testing.assert_close(lp[j, :r.n_tokens], torch.tensor(r.logprobs), atol=2e-4, rtol=0)
            assert float(lp[j, r.n_tokens:].abs().sum()) == 0.0  # padding
        # the dense teacher-forced pass differs from the sparse one past token 0 (the sparsity matters here)
        longest = max(range(3), key=lambda j: rows[j].n_tokens)
        assert float((dense - lp)[longest, 1:].abs().max()) > 1e-3
        assert float((dense - lp)[:, 0].abs().max()) < 1e-5


def test_distill_sparse_adapter_starts_as_identity_keeps_dense_and_lowers_the_divergence(policy):
    sp = SamplingParams(temperature=1.0, max_new_tokens=16, seed=0)
    pad = policy.tokenizer.pad_token_id
    before = {k: v.clone() for k, v in policy.model.state_dict().items()}
    held = sample_sparse(policy, policy.model, PROMPTS, 4, SamplingParams(temperature=1.0, max_new_tokens=16,
                                                                           seed=99), TIGHT)

    def held_divergence(model) -> float:
        total, count = 0.0, 0
        with torch.no_grad():
            for i in range(len(PROMPTS)):
                rows = [r.response_ids for r in held[4 * i:4 * i + 4]]
                with model.disable_adapter():
                    t, _, mask = _response_logits(model, held[4 * i].prompt_ids, rows, None, pad)
                s, _, _ = _response_logits(model, held[4 * i].prompt_ids, rows, TIGHT, pad)
                total += float((divergence(t, s, "forward") * mask).sum())
                count += int(mask.sum())
        return total / count

    cfg = DistillSparseConfig(rank=4, alpha=8, lr=1e-2, steps=10, prompts_per_step=2, n=4, seed=0)
    from agents.methods.distill_sparse import add_adapter

    start = held_divergence(add_adapter(load_policy("tiny", seed=0).model, cfg))  # B = 0: the identity
    model, history = distill_sparse(policy, TIGHT, PROMPTS, sp, cfg)
    assert len(history) == 10 and all(math.isfinite(h["loss"]) for h in history)
    end = held_divergence(model)
    print(f"held-out divergence {start:.4f} -> {end:.4f}")
    assert end < 0.8 * start, (start, end)
    # the dense policy (adapter off) is exactly the weights it started from
    with model.disable_adapter():
        for name, value in model.get_base_model().state_dict().items():
            key = name.replace(".base_layer", "")
            if key in before:
                torch.testing.assert_close(value, before[key], atol=0, rtol=0)
    # the merged actor decodes as the adapter model does
    actor = merged_actor(model)
    ids = torch.tensor([held[0].prompt_ids + held[0].response_ids])
    with torch.no_grad():
        torch.testing.assert_close(actor(input_ids=ids).logits, model(input_ids=ids).logits, atol=1e-4, rtol=0)
    # alignment of the actor's sparse rollouts against the dense weights: a tail per bucket, in [0, 1]
    with model.disable_adapter():
        stats = alignment(model, sample_sparse(policy, actor, PROMPTS, 2, sp, TIGHT), [0, 12], pad_id=pad)
    assert stats["tokens"] > 0 and 0.0 <= stats["tail"] <= 1.0
    assert sum(b["tokens"] for b in stats["buckets"]) == stats["tokens"]


def test_distill_sparse_config_validation():
    with pytest.raises(ValueError, match="divergence"):
        DistillSparseConfig(divergence="sideways")
    with pytest.raises(ValueError, match="steps"):
        DistillSparseConfig(steps=0)


def test_adapter_state_round_trips_onto_new_dense_weights_and_rejects_a_misfit(policy):
    from agents.methods.distill_sparse import actor_with_adapter, adapter_state, add_adapter

    cfg = DistillSparseConfig(rank=4, alpha=8, seed=0)
    dense = load_policy("tiny", seed=0).model
    peft_model = add_adapter(load_policy("tiny", seed=0).model, cfg)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)  # a trained-looking adapter (B = 0 would be the identity)
    state = adapter_state(peft_model)
    ids = torch.tensor([[3, 4, 5, 6]])
    actor = actor_with_adapter(dense, state, cfg)
    with torch.no_grad():
        torch.testing.assert_close(actor(input_ids=ids).logits, peft_model(input_ids=ids).logits, atol=1e-4, rtol=0)
        # the dense model it was built from is untouched and differs from the actor
        assert not any("lora" in n for n, _ in dense.named_parameters())
        assert float((dense(input_ids=ids).logits - actor(input_ids=ids).logits).abs().max()) > 1e-3
    with pytest.raises((ValueError, RuntimeError)):
        actor_with_adapter(dense, state, DistillSparseConfig(rank=8, seed=0))  # another rank: a misfit
    with pytest.raises(ValueError, match="does not fit"):
        actor_with_adapter(dense, {k: v for k, v in list(state.items())[1:]}, cfg)  # one tensor missing
