"""Frozen-prefix reuse: the states the engine keeps while decoding are those a training forward computes, the loss
forward that starts from them gives the same log-probs and gradients, and anything that could make them stale or
different (a written frozen weight, an edited row, another model, sparse or compressed decoding) is not served."""

from __future__ import annotations

import pytest
import torch
from grpo_toys import make_policy
from test_grpo_trainer import fp32_hf_engine, trainer

from agents.grpo.logprobs import response_logprobs
from agents.grpo.trainer import select_trainable
from agents.policy.engine import HFEngine, SamplingParams, engine_options
from agents.policy.frozen_prefix import FrozenPrefixCache, frozen_layer_count, tail_forward

PROMPTS = ["p0 a b c d", "p1", "p2 e f", "p3 g h a b c d e"]


def frozen_policy(layers: int = 3, trained: int = 1):
    policy = make_policy(seed=1, layers=layers)
    select_trainable(policy.model, trained)
    return policy


def decode(policy, cache, *, slots: int = 3, n: int = 3, **options):
    engine = HFEngine(policy, precision="fp32", max_batch_size=slots)  # fewer slots than rows: continuous refills
    engine.frozen_prefix = cache
    with cache.capturing(), engine_options(engine, **options):
        return engine.generate(PROMPTS, n, SamplingParams(temperature=0.9, max_new_tokens=9, seed=4))


def test_kept_states_are_the_teacher_forced_ones():
    policy = frozen_policy()
    model = policy.model
    cache = FrozenPrefixCache(model, 2)
    rollouts = decode(policy, cache)
    assert len({r.n_tokens for r in rollouts}) > 1  # mixed lengths: rows leave and join the batch
    for r in rollouts:
        fed = r.prompt_ids + r.response_ids[:-1]
        kept = cache.get(fed)
        assert kept is not None and kept.shape == (len(fed), model.config.hidden_size)
        with torch.no_grad():
            states = model(input_ids=torch.tensor([fed]), output_hidden_states=True).hidden_states[2][0]
        torch.testing.assert_close(kept, states, atol=1e-5, rtol=1e-5)
    assert cache.hits == len(rollouts)


def test_loss_forward_from_kept_states_matches_the_whole_forward():
    policy = frozen_policy()
    model = policy.model
    cache = FrozenPrefixCache(model, frozen_layer_count(model))
    rollouts = decode(policy, cache)
    prompts, responses = [r.prompt_ids for r in rollouts], [r.response_ids for r in rollouts]
    responses.append([])  # a row with nothing to score, and one the engine never decoded: both run as before
    prompts.append(prompts[0])
    prompts.append([3, 4])
    responses.append([5, 6, 7])
    params = [p for p in model.parameters() if p.requires_grad]
    weights = torch.randn(len(prompts), max(len(r) for r in responses), generator=torch.Generator().manual_seed(0))
    first_layer_calls = []
    handle = model.model.layers[0].register_forward_hook(lambda *_: first_layer_calls.append(1))
    try:
        lp, ent = response_logprobs(model, prompts, responses, temperature=0.9, frozen_prefix=cache, share_prompts=False)
    finally:
        handle.remove()
    assert cache.hits == len(rollouts) and cache.misses == 1
    assert len(first_layer_calls) == 1  # only the row the engine never decoded ran the frozen layers
    ref_lp, ref_ent = response_logprobs(model, prompts, responses, temperature=0.9)
    torch.testing.assert_close(lp, ref_lp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent, ref_ent, atol=1e-5, rtol=1e-5)
    got = torch.autograd.grad((lp * weights).sum(), params)
    want = torch.autograd.grad((ref_lp * weights).sum(), params)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)
    engine_lp = torch.zeros_like(ref_lp)
    for i, r in enumerate(rollouts):
        engine_lp[i, : r.n_tokens] = torch.tensor(r.logprobs)
    torch.testing.assert_close(lp[: len(rollouts)].detach(), engine_lp[: len(rollouts)], atol=1e-5, rtol=1e-5)


def test_stale_edited_or_foreign_rows_are_not_served():
    policy = frozen_policy()
    model = policy.model
    cache = FrozenPrefixCache(model, 2)
    rollouts = decode(policy, cache)
    fed = rollouts[0].prompt_ids + rollouts[0].response_ids[:-1]
    assert cache.get(fed) is not None
    assert cache.get(fed[:-1] + [(fed[-1] + 1) % model.config.vocab_size]) is None  # an edited token
    other = frozen_policy().model
    lp, _ = response_logprobs(other, [rollouts[0].prompt_ids], [rollouts[0].response_ids], frozen_prefix=cache)
    ref, _ = response_logprobs(other, [rollouts[0].prompt_ids], [rollouts[0].response_ids])
    torch.testing.assert_close(lp, ref)  # another model never reads this cache
    with torch.no_grad():
        model.model.layers[0].mlp.up_proj.weight.mul_(1.5)  # a frozen weight written to: every state is stale
    assert not cache.valid() and cache.get(fed) is None


@pytest.mark.parametrize("option", ["sparse_decode", "kv_compression", "bf16"])
def test_decoding_that_changes_the_states_captures_nothing(option):
    policy = frozen_policy()
    cache = FrozenPrefixCache(policy.model, 2)
    if option == "bf16":
        engine = HFEngine(policy, precision="bf16")  # decodes a bf16 copy, not the policy's weights
        engine.frozen_prefix = cache
        with cache.capturing():
            engine.generate(PROMPTS, 2, SamplingParams(max_new_tokens=4, seed=0))
    elif option == "sparse_decode":
        from agents.policy.sparse import SparsePattern

        decode(policy, cache, sparse_decode=SparsePattern(sinks=1, window=2, topk=1))
    else:
        from agents.policy.kv_compression import KVCompression

        decode(policy, cache, kv_compression=KVCompression(budget=3, sinks=1, window=1, observe=1))
    assert len(cache) == 0
    engine = HFEngine(policy, precision="fp32")
    engine.frozen_prefix = cache
    engine.generate(PROMPTS, 2, SamplingParams(max_new_tokens=4, seed=0))
    assert len(cache) == 0  # not capturing outside the trainer's collection


def test_only_frozen_leading_layers_of_known_models_split():
    policy = make_policy(layers=3)
    select_trainable(policy.model, -1)
    assert frozen_layer_count(policy.model) == 0
    with pytest.raises(ValueError, match="must be frozen"):
        FrozenPrefixCache(policy.model, 1)
    select_trainable(policy.model, 1)
    assert frozen_layer_count(policy.model) == 2
    with pytest.raises(ValueError, match="layer must be in"):
        FrozenPrefixCache(policy.model, 3)
    policy.model.config.model_type = "gemma"  # scales its input embeddings: a tail forward would not be exact
    assert frozen_layer_count(policy.model) == 0


def test_tail_forward_restores_the_model_on_error():
    policy = frozen_policy()
    layers = policy.model.model.layers
    with pytest.raises(RuntimeError):
        tail_forward(policy.model, 1, torch.zeros(1, 3, 7))  # wrong hidden size
    assert policy.model.model.layers is layers and len(layers) == 3


def test_trainer_update_is_the_same_with_and_without_reuse(tmp_path):
    settings = dict(engine=fp32_hf_engine, train_layers=1, steps=2, max_new_tokens=6, temperature=0.8,
                    eval_size=0, precision="fp32", micro_batch=5, lr=1e-2)
    reused = trainer(tmp_path / "reused", **settings)
    whole = trainer(tmp_path / "whole", **settings)
    assert reused.frozen_prefix is not None and reused.frozen_prefix.layer == 1
    whole.frozen_prefix = whole.engine.frozen_prefix = None
    records = reused.run(resume=False)
    whole.run(resume=False)
    steps = [r for r in records if r.get("kind") == "train"]
    assert [r["frozen_prefix_hits"] for r in steps] == [r["samples"] for r in steps]
    assert len(reused.frozen_prefix) == 0  # states are dropped after each update
    for p, q in zip(reused.model.parameters(), whole.model.parameters()):
        torch.testing.assert_close(p, q, atol=1e-5, rtol=1e-4)


def test_a_byte_budget_bounds_what_is_kept():
    policy = frozen_policy()
    hidden = policy.model.config.hidden_size
    cache = FrozenPrefixCache(policy.model, 2, max_bytes=10 * hidden * 4)  # room for 10 positions of fp32 states
    cache.put([1, 2, 3, 4], torch.zeros(4, hidden))
    cache.put([1, 2, 3, 4], torch.zeros(4, hidden))  # the same tokens again replace, not add
    assert cache.nbytes == 4 * hidden * 4 and not cache.full
    cache.put([5] * 7, torch.zeros(7, hidden))  # would pass the budget: kept out, and the cache counts as full
    assert cache.get([5] * 7) is None and cache.dropped == 1 and cache.full
    assert cache.get([1, 2, 3, 4]) is not None
    rollouts = decode(policy, cache)  # a full cache captures nothing more
    assert len(cache) == 1 and rollouts
    with pytest.raises(ValueError, match="states for 2 tokens"):
        cache.put([1, 2], torch.zeros(3, hidden))
    cache.clear()
    assert not cache.full and len(cache) == 0
