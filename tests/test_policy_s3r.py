"""S3R self-speculative decoding in the hf engine: greedy equals dense greedy, sampled continuations follow the dense
distribution (and a biased acceptance rule is caught), dense log-probs, stops, the KV-budget scheduler, the cache
roll-back and compaction, and the ``s3r`` GenerationController."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from scipy.stats import chi2_contingency

import agents.policy.s3r as s3r
from agents.policy import SamplingParams, load_policy
from agents.policy.engine import HFEngine, new_cache, pick_tokens
from agents.policy.models import Policy, tiny_model, tiny_tokenizer
from agents.policy.s3r import S3RConfig, sample_from, sampling_probs, speculative_accept


@pytest.fixture(scope="module", autouse=True)
def _fp32_decoding():
    # fp32 decoding on every CPU: the comparisons with dense decoding below are to fp32 tolerances
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RLVR_CPU_BF16", "0")
        yield


PROMPTS = ["hello world", "a", "The quick brown fox jumps over the lazy dog. " * 2, "2+2="]
AGGRESSIVE = S3RConfig(k=4, sinks=1, window=2, topk=2)  # drafts often wrong: exercises rejections and holes


@pytest.fixture(scope="module")
def policy():
    return load_policy("tiny", seed=0)


def teacher_forced(policy, prompt_ids, response_ids, temperature):
    ids = torch.tensor([prompt_ids + response_ids])
    with torch.no_grad():
        logits = policy.model(input_ids=ids).logits[0, len(prompt_ids) - 1:-1].float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return logp.gather(-1, torch.tensor(response_ids).unsqueeze(-1)).squeeze(-1), -(logp.exp() * logp).sum(-1)


@pytest.mark.parametrize("config", [AGGRESSIVE, S3RConfig(k=3, sinks=4, window=8, topk=8, compact_fraction=0.05)])
def test_greedy_s3r_equals_greedy_dense(policy, config):
    sp = SamplingParams(temperature=0, max_new_tokens=30)
    dense = HFEngine(policy).generate(PROMPTS, 1, sp)
    engine = HFEngine(policy, speculative=config, max_batch_size=3)
    spec = engine.generate(PROMPTS, 2, sp)
    for i, d in enumerate(dense):
        for s in spec[2 * i:2 * i + 2]:
            assert s.response_ids == d.response_ids and s.text == d.text and s.finish_reason == d.finish_reason
            np.testing.assert_allclose(s.logprobs, d.logprobs, atol=1e-5)
            np.testing.assert_allclose(s.entropies, d.entropies, atol=1e-5)
    stats = engine.speculative_stats
    assert 0 < stats.accepted < stats.drafted  # both verdicts happened
    if config.compact_fraction < 0.1:
        assert stats.compactions > 0


def test_sampled_logprobs_are_the_dense_ones(policy):
    sp = SamplingParams(temperature=0.8, top_p=0.9, max_new_tokens=20, seed=4)
    engine = HFEngine(policy, speculative=AGGRESSIVE)
    for r in engine.generate(PROMPTS, 2, sp):
        logp, ent = teacher_forced(policy, r.prompt_ids, r.response_ids, 0.8)
        np.testing.assert_allclose(r.logprobs, logp.numpy(), atol=1e-4)
        np.testing.assert_allclose(r.entropies, ent.numpy(), atol=1e-4)
    again = engine.generate(PROMPTS, 2, sp)
    assert [r.response_ids for r in again] == [r.response_ids for r in engine.generate(PROMPTS, 2, sp)]


def test_acceptance_rule_preserves_the_target_distribution():
    """One position, integrated over the draft's sample and the acceptance test: the emitted token is ~ p."""
    n, gen = 200_000, torch.Generator().manual_seed(0)
    p = torch.tensor([0.5, 0.3, 0.2, 0.0], dtype=torch.float64)
    q = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    drafted = sample_from(q.expand(n, 4), torch.rand(n, generator=gen, dtype=torch.float64))
    target = torch.stack([p, torch.tensor([0.0, 0.0, 0.0, 1.0], dtype=torch.float64)]).expand(n, 2, 4)
    m, following = speculative_accept(target, q.expand(n, 1, 4), drafted[:, None],
                                      torch.rand(n, 1, generator=gen, dtype=torch.float64),
                                      torch.rand(n, generator=gen, dtype=torch.float64))
    first = torch.where(m == 1, drafted, following)
    freq = torch.bincount(first, minlength=4).double() / n
    assert (freq - p).abs().max() < 0.005
    assert not bool(((m == 1) & (drafted == 3)).any())  # p(x) = 0: never accepted
    # a bonus token (all drafts accepted) comes from the next target distribution
    assert bool((following[m == 1] == 3).all())
    # a row's limit caps the drafts that count: with limit 0 nothing is accepted and the token is ~ p
    m0, f0 = speculative_accept(target, q.expand(n, 1, 4), drafted[:, None], torch.zeros(n, 1, dtype=torch.float64),
                                torch.rand(n, generator=gen, dtype=torch.float64), torch.zeros(n, dtype=torch.long))
    assert int(m0.sum()) == 0
    assert (torch.bincount(f0, minlength=4).double() / n - p).abs().max() < 0.005


def test_sampling_probs_are_what_pick_tokens_samples_from():
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, -3.0]])
    sp = SamplingParams(temperature=0.7, top_p=0.95)
    probs = sampling_probs(logits, sp)[0]
    full = torch.softmax(logits[0].double() / 0.7, -1)
    assert probs[3] == 0 and probs[4] == 0 and probs[2] > 0  # mass before the 4th token is 0.99 >= top_p
    torch.testing.assert_close(probs[:3], full[:3] / full[:3].sum())
    n = 100_000
    tokens, _, _ = pick_tokens(logits.expand(n, 5), sp, torch.rand(n, generator=torch.Generator().manual_seed(0)))
    assert (torch.bincount(tokens, minlength=5).double() / n - probs).abs().max() < 0.005
    assert sampling_probs(logits, SamplingParams(temperature=0)).tolist() == [[1.0, 0.0, 0.0, 0.0, 0.0]]


# -- exactness of sampled continuations -------------------------------------------------------------------------
VOCAB = 5  # a tiny vocabulary: 5**4 continuations of 4 tokens, most of the mass in cells 3000 samples fill


@pytest.fixture(scope="module")
def small_vocab_policy():
    tokenizer = tiny_tokenizer()
    model = tiny_model(tokenizer, seed=0, vocab_size=VOCAB)
    return Policy(model, tokenizer, "tiny-v5", "-")


def _continuations(policy, speculative, seed: int, n: int = 3000) -> Counter:
    """``n`` continuations of 4 tokens of one 48-token prompt: the first from the prefill, the rest from rounds of
    up to 2 drafts (S3R) or single-token steps (dense)."""
    prompt = torch.randint(0, VOCAB, (48,), generator=torch.Generator().manual_seed(1)).tolist()
    engine = HFEngine(policy, max_batch_size=n, ignore_eos=True, precision="fp32", speculative=speculative)
    rollouts = engine.generate([prompt], n, SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=4, seed=seed))
    if speculative is not None and s3r.speculative_accept is speculative_accept:
        assert engine.speculative_stats.acceptance_rate < 0.8  # the drafts differ from the dense policy
    return Counter(tuple(r.response_ids) for r in rollouts)


def _chi2_p(a: Counter, b: Counter) -> float:
    """Two-sample chi-square on the continuations; cells with fewer than 10 samples in both pooled into one."""
    keys = sorted(set(a) | set(b))
    big = [k for k in keys if a[k] + b[k] >= 10]
    rest = [k for k in keys if k not in big]
    table = np.array([[c[k] for k in big] + [sum(c[k] for k in rest)] for c in (a, b)])
    return float(chi2_contingency(table[:, table.sum(0) > 0])[1])


def _always_accept(target, draft, drafted, accept_uniforms, resample_uniforms, limit=None):
    k = drafted.shape[1]
    limit = torch.full((target.shape[0],), k) if limit is None else limit
    return limit, sample_from(target[torch.arange(target.shape[0]), limit], resample_uniforms)


def _resample_from_target(target, draft, drafted, accept_uniforms, resample_uniforms, limit=None):
    m, _ = speculative_accept(target, draft, drafted, accept_uniforms, resample_uniforms, limit)
    return m, sample_from(target[torch.arange(target.shape[0]), m], resample_uniforms)  # not the residual


def test_s3r_samples_follow_the_dense_distribution_and_biased_rules_fail(small_vocab_policy, monkeypatch):
    draft = S3RConfig(k=2, sinks=1, window=1, topk=0)
    dense = _continuations(small_vocab_policy, None, seed=0)
    assert _chi2_p(dense, _continuations(small_vocab_policy, draft, seed=1)) > 1e-3
    assert _chi2_p(dense, _continuations(small_vocab_policy, None, seed=2)) > 1e-3  # the test's own calibration
    monkeypatch.setattr(s3r, "speculative_accept", _always_accept)
    assert _chi2_p(dense, _continuations(small_vocab_policy, draft, seed=1)) < 1e-3
    monkeypatch.setattr(s3r, "speculative_accept", _resample_from_target)
    assert _chi2_p(dense, _continuations(small_vocab_policy, draft, seed=1)) < 1e-3


# -- engine plumbing ---------------------------------------------------------------------------------------------
def test_kv_budget_caps_concurrent_rows_without_changing_samples(policy):
    # topk=0: sinks + window only. With a top-k, a near-tie between two keys' scores can select the other key when
    # the batch (and so float rounding) differs; the samples are then other exact draws, not the same ones.
    sp = SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=25, seed=0)
    free = HFEngine(policy, speculative=S3RConfig(k=3, sinks=2, window=4, topk=0))
    reserve = len(PROMPTS[2]) + 25 + 3 + 1  # the longest prompt's reservation
    capped = HFEngine(policy, speculative=S3RConfig(k=3, sinks=2, window=4, topk=0, kv_budget_tokens=reserve + 1))
    a, b = free.generate(PROMPTS, 3, sp), capped.generate(PROMPTS, 3, sp)
    assert [r.response_ids for r in a] == [r.response_ids for r in b]
    assert free.speculative_stats.peak_rows == 12
    assert capped.speculative_stats.peak_rows < 12 and capped.speculative_stats.prefills > 1
    one = HFEngine(policy, speculative=S3RConfig(k=3, sinks=2, window=4, topk=0, kv_budget_tokens=1))
    assert [r.response_ids for r in one.generate(PROMPTS, 3, sp)] == [r.response_ids for r in a]
    assert one.speculative_stats.peak_rows == 1  # a budget below one row still runs one row at a time


def test_stop_strings_and_eos(policy):
    sp = SamplingParams(temperature=0, max_new_tokens=40, stop=("e",))
    dense = HFEngine(policy).generate(PROMPTS, 1, sp)
    spec = HFEngine(policy, speculative=AGGRESSIVE).generate(PROMPTS, 1, sp)
    assert [(r.response_ids, r.text, r.finish_reason) for r in spec] == [
        (r.response_ids, r.text, r.finish_reason) for r in dense]
    sampled = HFEngine(policy, speculative=AGGRESSIVE).generate(PROMPTS, 4, SamplingParams(max_new_tokens=40, seed=1))
    eos = policy.tokenizer.eos_token_id
    for r in sampled:
        assert eos not in r.response_ids[:-1]  # nothing is emitted after an EOS inside an accepted run
        assert r.finish_reason == ("stop" if r.response_ids[-1] == eos else "length")
        assert len(r.response_ids) <= 40


def test_prealloc_cache_crop_rolls_back_the_write_position():
    cache = new_cache(8)
    k = torch.arange(2 * 5 * 4, dtype=torch.float32).reshape(1, 2, 5, 4)
    cache.update(k, k + 1, 0)
    cache.crop(-2)
    assert cache.get_seq_length() == 3 and cache.layers[0].keys.shape[2] == 3
    cache.update(-torch.ones(1, 2, 1, 4), -torch.ones(1, 2, 1, 4), 0)
    assert cache.get_seq_length() == 4
    assert torch.equal(cache.layers[0].keys[:, :, 3], -torch.ones(1, 2, 4))  # overwrote the dropped position
    assert torch.equal(cache.layers[0].keys[:, :, :3], k[:, :, :3])


def test_compaction_keeps_each_rows_valid_positions_in_order():
    cache = new_cache(4)
    keys = torch.arange(2 * 6, dtype=torch.float32).reshape(2, 1, 6, 1)
    cache.update(keys, keys.clone(), 0)
    valid = torch.tensor([[True, False, True, True, False, True], [False, False, True, False, True, False]])
    new_valid = s3r.compact_cache(cache, valid, extra=4)
    assert new_valid.tolist() == [[True] * 4, [False, False, True, True]]
    assert cache.layers[0].keys[0, 0, :, 0].tolist() == [0.0, 2.0, 3.0, 5.0]
    assert cache.layers[0].keys[1, 0, 2:, 0].tolist() == [8.0, 10.0]
    assert cache.get_seq_length() == 4


def test_generation_controller_switches_the_engine_for_one_call(policy):
    from agents.grpo.registry import build

    ctrl = build("generation_controller", "s3r", {"k": 3, "sinks": 1, "window": 2, "topk": 2})
    engine = HFEngine(policy)
    sp = SamplingParams(temperature=0, max_new_tokens=16)
    out = ctrl.generate(engine, PROMPTS, 2, sp)
    assert engine.speculative is None and engine.speculative_stats is None
    assert [r.response_ids for r in out] == [r.response_ids for r in engine.generate(PROMPTS, 2, sp)]
    metrics = ctrl.metrics()
    assert 0 < metrics["acceptance_rate"] < 1 and metrics["tokens_per_row_round"] > 1
    assert ctrl.metrics()["acceptance_rate"] == 0.0  # per step: reset by metrics()
    state = ctrl.state_dict()
    assert state["drafted"] > state["accepted"] > 0
    with pytest.raises(TypeError, match="hf engine"):
        ctrl.generate(object(), PROMPTS, 1, sp)
