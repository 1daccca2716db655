"""The hf rollout engine on a tiny from-config model: shapes, order, seeds, logprobs, stops, padding, pruning."""

from __future__ import annotations

import pytest
import torch

from agents.policy import SamplingParams, load_policy, make_engine
from agents.policy.engine import HFEngine, cut_at_stop, new_cache, pick_tokens, rollout_seeds


@pytest.fixture(scope="module", autouse=True)
def _fp32_decoding():
    # These tests compare decoding with fp32 teacher-forced passes to fp32 tolerances. On a CPU with bf16 hardware
    # precision="auto" decodes with bf16 weights; that path is tested in test_policy_fastpath.py.
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RLVR_CPU_BF16", "0")
        yield


PROMPTS = ["hello world", "a", "The quick brown fox jumps over the lazy dog. " * 2, "2+2="]


@pytest.fixture(scope="module")
def policy():
    return load_policy("tiny", seed=0)


@pytest.fixture(scope="module")
def engine(policy):
    return make_engine(policy, "hf")


def teacher_forced(policy, prompt_ids, response_ids, temperature):
    ids = torch.tensor([prompt_ids + response_ids])
    with torch.no_grad():
        logits = policy.model(input_ids=ids).logits[0, len(prompt_ids) - 1:-1].float()
    logp = torch.log_softmax(logits / (temperature or 1.0), dim=-1)
    ent = -(logp.exp() * logp).sum(-1)
    return logp.gather(-1, torch.tensor(response_ids).unsqueeze(-1)).squeeze(-1), ent


def test_shapes_and_prompt_major_order(policy, engine):
    sp = SamplingParams(max_new_tokens=10, seed=3)
    rs = engine.generate(PROMPTS, 3, sp)
    assert len(rs) == len(PROMPTS) * 3
    for i, p in enumerate(PROMPTS):
        expected = policy.tokenizer(p, add_special_tokens=False)["input_ids"]
        for j in range(3):
            r = rs[i * 3 + j]
            assert r.prompt_ids == expected
            assert 1 <= len(r.response_ids) <= 10
            assert len(r.logprobs) == len(r.entropies) == len(r.response_ids)
            assert r.finish_reason in ("stop", "length")
            if r.finish_reason == "length":
                assert len(r.response_ids) == 10
            else:
                assert r.response_ids[-1] == policy.tokenizer.eos_token_id
            assert r.text == policy.tokenizer.decode(r.response_ids, skip_special_tokens=True)
            assert all(lp <= 0 for lp in r.logprobs) and all(e >= 0 for e in r.entropies)
    assert len({tuple(r.response_ids) for r in rs}) > len(PROMPTS)  # samples within a group differ


def test_token_id_prompts_equal_string_prompts(policy, engine):
    sp = SamplingParams(max_new_tokens=8, seed=1)
    ids = [policy.tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    a = engine.generate(PROMPTS, 2, sp)
    b = engine.generate(ids, 2, sp)
    assert [r.response_ids for r in a] == [r.response_ids for r in b]


def test_seed_determinism(engine):
    sp = SamplingParams(max_new_tokens=12, seed=7)
    a = engine.generate(PROMPTS, 2, sp)
    b = engine.generate(PROMPTS, 2, sp)
    c = engine.generate(PROMPTS, 2, SamplingParams(max_new_tokens=12, seed=8))
    assert [r.response_ids for r in a] == [r.response_ids for r in b]
    assert [r.logprobs for r in a] == [r.logprobs for r in b]
    assert [r.response_ids for r in a] != [r.response_ids for r in c]


def test_rollout_does_not_depend_on_batch_mates_or_chunking(policy, engine):
    """Per-rollout generators + one prefill per distinct prompt: the same seeds give the same samples whether a
    prompt is alone, in a batch, or split across max_batch_size chunks (also across pruning and cache settings)."""
    sp = SamplingParams(max_new_tokens=12)
    together = engine.generate(PROMPTS[:2], 3, sp, seeds=[11, 12])
    alone = engine.generate(PROMPTS[:1], 3, sp, seeds=[11]) + engine.generate(PROMPTS[1:2], 3, sp, seeds=[12])
    chunked = HFEngine(policy, max_batch_size=2).generate(PROMPTS[:2], 3, sp, seeds=[11, 12])
    unpruned = HFEngine(policy, prune_fraction=10.0).generate(PROMPTS[:2], 3, sp, seeds=[11, 12])
    concat_cache = HFEngine(policy, preallocate=False).generate(PROMPTS[:2], 3, sp, seeds=[11, 12])
    growing_cache = HFEngine(policy, cache_block=2).generate(PROMPTS[:2], 3, sp, seeds=[11, 12])
    for other in (alone, chunked, unpruned, concat_cache, growing_cache):
        assert [r.response_ids for r in together] == [r.response_ids for r in other]
        for x, y in zip(together, other):
            assert x.logprobs == pytest.approx(y.logprobs, abs=1e-4)


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_continuous_batching_gives_the_static_rollouts(policy, temperature):
    """Rows of mixed lengths (stop strings end them early) through 4 slots: queued rows take freed slots with their
    own prefill, merged into the running cache; every rollout equals static chunking's and one big batch's."""
    sp = SamplingParams(max_new_tokens=16, temperature=temperature, stop=("e", "o"))
    prompts, seeds = PROMPTS, [3, 4, 5, 6]
    static = HFEngine(policy, max_batch_size=4, continuous=False).generate(prompts, 3, sp, seeds=seeds)
    one_batch = HFEngine(policy, max_batch_size=64).generate(prompts, 3, sp, seeds=seeds)
    engines = {"prealloc": HFEngine(policy, max_batch_size=4, refill_fraction=0.25),
               "concat": HFEngine(policy, max_batch_size=4, preallocate=False),
               "growing": HFEngine(policy, max_batch_size=3, cache_block=2, refill_fraction=1.0)}
    lengths = {len(r.response_ids) for r in static}
    assert len(lengths) > 2  # the test needs rows of mixed lengths
    for name, eng in engines.items():
        prefills: list[int] = []

        def counting(*a, _original=eng._prefill, _seen=prefills, **k):
            _seen.append(len(a[2]))
            return _original(*a, **k)

        eng._prefill = counting
        cont = eng.generate(prompts, 3, sp, seeds=seeds)
        assert sum(prefills) == 12 and len(prefills) > 2, (name, prefills)  # refills happened
        for other in (static, one_batch):
            assert [r.response_ids for r in cont] == [r.response_ids for r in other], name
            assert [r.finish_reason for r in cont] == [r.finish_reason for r in other], name
            for x, y in zip(cont, other):
                assert x.logprobs == pytest.approx(y.logprobs, abs=1e-4)
    with pytest.raises(ValueError, match="refill_fraction"):
        HFEngine(policy, refill_fraction=0.0)


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9), (0.0, 1.0)])
def test_logprobs_and_entropies_match_teacher_forcing(policy, engine, temperature, top_p):
    sp = SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=16, seed=5)
    for r in engine.generate(PROMPTS, 2, sp):
        lp, ent = teacher_forced(policy, r.prompt_ids, r.response_ids, temperature)
        assert torch.allclose(torch.tensor(r.logprobs), lp, atol=1e-4)
        assert torch.allclose(torch.tensor(r.entropies), ent, atol=1e-4)


def test_left_padding_matches_alone_greedy(engine):
    sp = SamplingParams(temperature=0.0, max_new_tokens=16)
    batch = engine.generate(PROMPTS, 1, sp)
    for p, r in zip(PROMPTS, batch):
        alone = engine.generate([p], 1, sp)[0]
        assert alone.response_ids == r.response_ids
        assert alone.logprobs == pytest.approx(r.logprobs, abs=1e-4)


def test_greedy_matches_argmax_of_teacher_forcing(policy, engine):
    r = engine.generate(PROMPTS[2:3], 1, SamplingParams(temperature=0.0, max_new_tokens=12))[0]
    ids = torch.tensor([r.prompt_ids + r.response_ids])
    with torch.no_grad():
        logits = policy.model(input_ids=ids).logits[0, len(r.prompt_ids) - 1:-1]
    assert logits.argmax(-1).tolist() == r.response_ids


def test_tiny_top_p_is_greedy(engine):
    greedy = engine.generate(PROMPTS, 1, SamplingParams(temperature=0.0, max_new_tokens=10))
    nucleus = engine.generate(PROMPTS, 2, SamplingParams(top_p=1e-6, max_new_tokens=10, seed=0))
    for i, g in enumerate(greedy):
        assert nucleus[2 * i].response_ids == g.response_ids == nucleus[2 * i + 1].response_ids


def test_stop_strings_cut_text_and_tokens(policy, engine):
    base_sp = SamplingParams(max_new_tokens=24, seed=2)
    samples = engine.generate(PROMPTS, 1, base_sp)
    i = max(range(len(samples)), key=lambda k: len(samples[k].text))
    base = samples[i]
    assert len(base.text) >= 8, "need a long enough sample to pick a stop string from"
    stop = base.text[4:6]
    cut = base.text.find(stop)
    # Same seeds -> same tokens as the base sample until the stop string cuts them.
    r = engine.generate(PROMPTS, 1, SamplingParams(max_new_tokens=24, seed=2, stop=(stop, "never-seen")))[i]
    assert r.finish_reason == "stop"
    assert r.text == base.text[:cut]
    assert r.response_ids == base.response_ids[: len(r.response_ids)]
    assert stop in policy.tokenizer.decode(r.response_ids)
    assert stop not in policy.tokenizer.decode(r.response_ids[:-1])
    assert len(r.logprobs) == len(r.entropies) == len(r.response_ids)


def test_cut_at_stop_picks_earliest_and_minimal_prefix(policy):
    tok = policy.tokenizer
    ids = tok("abcXYdefXY", add_special_tokens=False)["input_ids"]
    k, text = cut_at_stop(tok, ids, ["def", "XY"])
    assert text == "abc" and tok.decode(ids[:k]) == "abcXY"
    assert cut_at_stop(tok, ids, ["zzz"]) is None


def test_pick_tokens_matches_distribution():
    torch.manual_seed(0)
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, -30.0]]).repeat(20000, 1)
    u = torch.rand(20000)
    for temperature, top_p in [(1.0, 1.0), (0.5, 1.0), (1.0, 0.8)]:
        sp = SamplingParams(temperature=temperature, top_p=top_p)
        tokens, lps, _ = pick_tokens(logits, sp, u)
        p = torch.softmax(logits[0] / temperature, -1)
        if top_p < 1:
            order = p.argsort(descending=True)
            keep = (p[order].cumsum(0) - p[order]) < top_p
            q = torch.zeros_like(p)
            q[order[keep]] = p[order[keep]]
            p = q / q.sum()
        freq = torch.bincount(tokens, minlength=5).float() / len(tokens)
        assert torch.allclose(freq, p, atol=0.015), (temperature, top_p, freq, p)
        assert torch.allclose(lps, torch.log_softmax(logits / temperature, -1).gather(-1, tokens[:, None])[:, 0])
        if top_p < 1:
            assert set(tokens.tolist()) <= set(order[keep].tolist())


def test_preallocated_cache_grows_and_selects_rows():
    cache = new_cache(3)
    for i in range(5):
        step = torch.full((2, 1, 2, 4), float(i))
        step[1] += 100
        keys, values = cache.update(step, step.clone(), 0)
    assert keys.shape == (2, 1, 10, 4) and cache.get_seq_length() == 10
    assert keys[0, 0, :, 0].tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    cache.batch_select_indices(torch.tensor([1, 1, 0]))
    assert cache.layers[0].keys[:, 0, -1, 0].tolist() == [104, 104, 4]


def test_rollout_seeds():
    sp = SamplingParams(seed=1)
    a = rollout_seeds(2, 3, sp, None)
    assert a == rollout_seeds(2, 3, sp, None) and len({s for row in a for s in row}) == 6
    assert rollout_seeds(1, 2, sp, [5]) == rollout_seeds(1, 2, SamplingParams(seed=99), [5])
    with pytest.raises(ValueError):
        rollout_seeds(2, 1, sp, [1])


def test_bad_input_is_rejected(engine):
    with pytest.raises(ValueError):
        engine.generate([], 1, SamplingParams())
    with pytest.raises(ValueError):
        engine.generate(["x"], 0, SamplingParams())
    with pytest.raises(ValueError):
        engine.generate([""], 1, SamplingParams())
    with pytest.raises(ValueError):
        engine.generate([[1, "a"]], 1, SamplingParams())
    with pytest.raises(ValueError, match="positions"):
        engine.generate(["x" * 10], 1, SamplingParams(max_new_tokens=5000))
    for bad in (dict(temperature=-1), dict(top_p=0), dict(top_p=1.5), dict(max_new_tokens=0), dict(stop=("",))):
        with pytest.raises(ValueError):
            SamplingParams(**bad)
    with pytest.raises(ValueError):
        make_engine(None, backend="nope")
