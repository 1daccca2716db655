"""Sparrow: the position schedule of sparse attention, sparse decoding in the engine, the per-token alignment read
from the trainer's forward, and the feedback rule that holds its tail at the threshold."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from test_grpo_trainer import fp32_hf_engine, strip, trainer

from agents.grpo.registry import build
from agents.methods.sparrow import bucket_of, token_alignment
from agents.policy import SamplingParams, load_policy
from agents.policy.engine import HFEngine
from agents.policy.sparse import SparsePattern, sparse_keep

PROMPTS = ["one two three four five six seven eight nine ten eleven twelve", "a b c"]


@pytest.fixture(scope="module")
def policy():
    return load_policy("tiny", seed=0)


def test_schedule_adds_its_share_of_the_middle_keys_per_query_golden():
    # 10 keys, causal: query q sees q + 1 keys. sinks 1 + window 2; the schedule adds nothing below 8 visible keys
    # and half of the middle ones from 8 on: query 9 sees 10 -> middle 7 -> ceil(3.5) = 4 more, query 7 sees 8 ->
    # middle 5 -> 3 more, query 8 sees 9 -> middle 6 -> 3 more, query 6 sees 7 -> none.
    pattern = SparsePattern(sinks=1, window=2, topk=0, schedule=((0, 0.0), (8, 0.5)))
    scores = torch.arange(10, dtype=torch.float32).flip(0).expand(10, 10)[None, None].clone()  # older keys score higher
    causal = torch.ones(10, 10, dtype=torch.bool).tril()[None, None]
    keep = sparse_keep(scores, causal, pattern)[0, 0]
    assert keep.sum(-1).tolist() == [min(q + 1, pattern.kept(q + 1)) for q in range(10)]
    assert keep.sum(-1).tolist() == [1, 2, 3, 3, 3, 3, 3, 6, 6, 7]
    # query 9: sink 0, window 8 and 9, then the best-scoring middle keys 1, 2, 3, 4
    assert keep[9].nonzero().flatten().tolist() == [0, 1, 2, 3, 4, 8, 9]
    assert keep[6].nonzero().flatten().tolist() == [0, 5, 6]
    # topk adds on top of the schedule's share
    both = sparse_keep(scores, causal, SparsePattern(sinks=1, window=2, topk=1, schedule=((8, 0.5),)))[0, 0]
    assert both.sum(-1).tolist()[6:] == [4, 7, 7, 8]


def test_schedule_validation_and_full_share_is_dense():
    with pytest.raises(ValueError, match="ascending"):
        SparsePattern(schedule=((8, 0.5), (4, 0.1)))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        SparsePattern(schedule=((0, 1.5),))
    assert SparsePattern(sinks=0, window=0, topk=0, schedule=((0, 1.0),)).kept(37) == 37
    assert SparsePattern(sinks=2, window=3, topk=0, schedule=((0, 0.25),)).kept(25) == 5 + math.ceil(0.25 * 20)


def test_full_share_decodes_as_dense_and_aggressive_sparsity_does_not(policy):
    sp = SamplingParams(temperature=1.0, max_new_tokens=24, seed=3)
    dense = HFEngine(policy, precision="fp32").generate(PROMPTS, 2, sp)
    full = HFEngine(policy, precision="fp32", sparse_decode=SparsePattern(sinks=1, window=1, topk=0,
                                                                          schedule=((0, 1.0),)))
    out = full.generate(PROMPTS, 2, sp)
    assert [r.response_ids for r in out] == [r.response_ids for r in dense]
    for a, b in zip(out, dense):
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4, rtol=0)
    assert full.sparse_decode_stats.kept_fraction == pytest.approx(1.0)
    tight = HFEngine(policy, precision="fp32", sparse_decode=SparsePattern(sinks=1, window=2, topk=0))
    greedy = SamplingParams(temperature=0, max_new_tokens=24)
    sparse_out = tight.generate(PROMPTS[:1], 1, greedy)[0]
    # the sparse log-probs of its own tokens differ from the dense policy's log-probs of the same tokens
    dense_lp = dense_logprobs(policy, sparse_out.prompt_ids, sparse_out.response_ids)
    assert float((dense_lp - torch.tensor(sparse_out.logprobs))[1:].abs().max()) > 1e-3
    assert float((dense_lp - torch.tensor(sparse_out.logprobs))[0].abs()) < 1e-4  # token 0: dense prefill
    assert tight.sparse_decode_stats.kept_fraction < 0.5
    with pytest.raises(ValueError, match="speculative"):
        HFEngine(policy, sparse_decode=SparsePattern(), speculative=object())


def dense_logprobs(policy, prompt_ids, response_ids) -> torch.Tensor:
    ids = torch.tensor([list(prompt_ids) + list(response_ids)])
    with torch.no_grad():
        logits = policy.model(input_ids=ids).logits[0, len(prompt_ids) - 1:-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(response_ids)[:, None])[:, 0]


def test_alignment_and_buckets_golden():
    dense = torch.tensor([[-1.0, -2.0, -0.5]])
    sparse = torch.tensor([[-1.0, -1.0, -1.0]])
    torch.testing.assert_close(token_alignment(dense, sparse), torch.tensor([[1.0, math.exp(-1.0), 1.0]]))
    assert bucket_of(torch.tensor([0, 63, 64, 127, 128, 500]), [0, 64, 128]).tolist() == [0, 0, 1, 1, 2, 2]


def fake_batch(dense: torch.Tensor, sparse: torch.Tensor, prompt_len: int, off_policy=None) -> SimpleNamespace:
    return SimpleNamespace(policy_logprobs=dense, behaviour_logprobs=sparse,
                           response_mask=torch.ones_like(dense, dtype=torch.bool),
                           prompt_ids=[[0] * prompt_len] * dense.shape[0], off_policy=off_policy)


def test_feedback_rule_moves_each_bucket_toward_the_threshold():
    ctrl = build("generation_controller", "sparrow", {"positions": [0, 10], "fractions": [0.2, 0.2], "gain": 0.5,
                                                      "min_tokens": 4, "threshold": 0.86})
    # prompt 4 tokens, 12 response tokens: token t was sampled seeing 4 + t keys -> tokens 1..5 in bucket 0
    # (5..9 keys), tokens 6..11 in bucket 1. Bucket 0 aligned perfectly, bucket 1 badly (a = e^-1 on every token).
    sparse = torch.zeros(2, 12)
    dense = torch.zeros(2, 12)
    dense[:, 6:] = -1.0
    dense[:, 0] = -5.0  # the first token is the dense prefill's: excluded, or bucket 0's tail would be e^-5
    ctrl.observe(fake_batch(dense, sparse, 4))
    m = ctrl.metrics()
    assert m["tail_0"] == pytest.approx(1.0) and m["tail_1"] == pytest.approx(math.exp(-1.0))
    assert m["fraction_0"] == pytest.approx(0.2 * math.exp(-0.5)) and m["fraction_1"] == pytest.approx(
        0.2 * math.exp(0.5))
    assert m["tokens"] == 22 and m["below_threshold"] == 1.0
    assert m["alignment_mean"] == pytest.approx((10 + 12 * math.exp(-1.0)) / 22)
    # a bucket with fewer than min_tokens tokens keeps its share; off-policy rows are not counted
    few = build("generation_controller", "sparrow", {"positions": [0, 10], "fractions": 0.2, "min_tokens": 50})
    few.observe(fake_batch(dense, sparse, 4, off_policy=torch.tensor([False, True])))
    m = few.metrics()
    assert m["fraction_0"] == m["fraction_1"] == 0.2 and m["tokens"] == 11
    # fixed mode never moves; shares are clipped to [min_fraction, 1]
    fixed = build("generation_controller", "sparrow", {"mode": "fixed", "fractions": 0.0, "positions": [0]})
    fixed.observe(fake_batch(dense, sparse, 4))
    assert fixed.metrics()["fraction_0"] == 0.0
    top = build("generation_controller", "sparrow", {"positions": [0], "fractions": 0.9, "gain": 1.0,
                                                     "min_tokens": 1})
    top.observe(fake_batch(dense, sparse, 4))
    assert top.metrics()["fraction_0"] == 1.0
    state = top.state_dict()
    again = build("generation_controller", "sparrow", {"positions": [0], "fractions": 0.9})
    again.load_state_dict(state)
    assert again.fractions == [1.0] and again.steps_below == 1


def run_full_and_resumed(tmp_path, settings) -> list[dict]:
    """A full run's records, after checking that one cut at step 3 and resumed from its checkpoint matches them."""
    full = trainer(tmp_path / "full", **settings).run(resume=False)
    trainer(tmp_path / "cut", **settings).run(resume=False, stop_after=3)
    resumed = trainer(tmp_path / "cut", **settings).run(resume=True)
    assert strip(resumed) == strip(full)
    return full


def test_bad_hyper_parameters_raise():
    for params, match in [({"mode": "lazy"}, "mode"), ({"positions": [5, 10]}, "start at 0"),
                          ({"positions": [0, 10], "fractions": [0.1]}, "fractions"), ({"threshold": 1.5}, "threshold")]:
        with pytest.raises((ValueError, TypeError), match=match):
            build("generation_controller", "sparrow", params)


def test_in_the_trainer_alignment_is_read_from_the_training_forward_and_runs_resume(tmp_path):
    stages = {"generation_controller": "sparrow"}
    params = {"rollout_allocator": {"n": 4},
              "generation_controller": {"sinks": 1, "window": 1, "positions": [0, 6], "fractions": 0.1,
                                        "min_tokens": 1}}
    settings = dict(engine=fp32_hf_engine, stages=stages, params=params, steps=4, checkpoint_every=2, eval_every=0,
                    eval_size=2, prompts_per_step=2, max_new_tokens=6, temperature=1.0, precision="fp32")
    t = trainer(tmp_path / "one", **settings)
    t.step = 1
    batch, _ = t.collect()
    batch.rewards = batch.base_rewards.clone()
    batch.advantages = t.components["advantage"](batch)
    before = t._no_grad_stats(t.model, batch)[0]  # a plain dense teacher-forced pass of the pre-update weights
    t.update(batch)
    # the stored training log-probs are those dense ones, not the sparse sampler's (which differ after token 0)
    mask = batch.response_mask.bool()
    assert float((batch.policy_logprobs - before)[mask].abs().max()) < 2e-5
    assert float((batch.policy_logprobs - batch.behaviour_logprobs)[mask].abs().max()) > 1e-4
    train = [r for r in run_full_and_resumed(tmp_path, settings) if r["kind"] == "train"]
    assert all(0 < r["generation_controller.kept_fraction"] < 1 for r in train)
    assert all(0 <= r["generation_controller.tail"] <= 1 for r in train)
    assert any(r["generation_controller.fraction_1"] != 0.1 for r in train)


def test_distill_sparse_in_the_controller_decodes_with_dense_plus_adapter_and_resumes(tmp_path):
    from agents.methods.distill_sparse import actor_with_adapter, sparse_logprobs

    stages = {"generation_controller": "sparrow"}
    params = {"rollout_allocator": {"n": 4},
              "generation_controller": {"sinks": 1, "window": 1, "positions": [0], "fractions": 0.0, "mode": "fixed",
                                        "distill_every": 2,
                                        "distill": {"rank": 4, "alpha": 8, "lr": 1e-2, "steps": 2, "n": 2,
                                                    "prompts_per_step": 2}}}
    settings = dict(engine=fp32_hf_engine, stages=stages, params=params, steps=4, checkpoint_every=2, eval_every=0,
                    eval_size=2, prompts_per_step=2, max_new_tokens=6, temperature=1.0, precision="fp32")
    t = trainer(tmp_path / "one", **settings)
    ctrl = t.components["generation_controller"]
    t.step = 1
    batch, _ = t.collect()
    assert ctrl.adapter is not None and ctrl.adapter_step == 1
    assert any(float(v.abs().max()) > 0 for k, v in ctrl.adapter.items() if "lora_B" in k)  # distilled: B left 0
    assert not any("lora" in name for name, _ in t.model.named_parameters())  # the trainer's model stays plain
    # the step's rollouts were sampled by dense + adapter under the pattern, not by the dense weights' own sparse pass
    actor = actor_with_adapter(t.model, ctrl.adapter, ctrl.distill_cfg)
    gaps_actor, gaps_dense = [], []
    with torch.no_grad():
        for prompt, response, sampled in zip(batch.prompt_ids, batch.response_ids, batch.behaviour_logprobs):
            n = len(response)
            if n:
                actor_lp = sparse_logprobs(actor, prompt, [response], ctrl.pattern())[0]
                dense_lp = sparse_logprobs(t.model, prompt, [response], ctrl.pattern())[0]
                gaps_actor.append(float((actor_lp - sampled[:n]).abs().max()))
                gaps_dense.append(float((dense_lp - sampled[:n]).abs().max()))
    assert gaps_actor
    assert max(gaps_actor) < 2e-4 and max(gaps_dense) > 1e-3, (max(gaps_actor), max(gaps_dense))
    # over a run: distilled on steps 1 and 3 (every 2), the actor rebuilt every step, and a resumed run is identical
    train = [r for r in run_full_and_resumed(tmp_path, settings) if r["kind"] == "train"]
    distilled = [r["step"] for r in train if "generation_controller.distill_loss_last" in r]
    assert distilled == [1, 3], distilled
    assert all(math.isfinite(r["generation_controller.distill_loss_first"]) for r in train
               if r["step"] in distilled)


def test_distill_sparse_settings_are_checked_up_front():
    with pytest.raises(ValueError, match="distill_every"):
        build("generation_controller", "sparrow", {"distill_every": -1})
    with pytest.raises(ValueError, match="distill_every = 0"):
        build("generation_controller", "sparrow", {"distill": {"steps": 3}})
    with pytest.raises(ValueError, match="divergence"):
        build("generation_controller", "sparrow", {"distill_every": 1, "distill": {"divergence": "sideways"}})
    with pytest.raises(TypeError):
        build("generation_controller", "sparrow", {"distill_every": 1, "distill": {"ranks": 3}})


def test_dense_training_logprobs_are_stored_for_plain_grpo(tmp_path):
    t = trainer(tmp_path, engine=fp32_hf_engine, temperature=1.0, max_new_tokens=6, precision="fp32", eval_size=0)
    t.step = 1
    batch, _ = t.collect()
    batch.rewards = batch.base_rewards.clone()
    batch.advantages = t.components["advantage"](batch)
    t.update(batch)
    mask = batch.response_mask.bool()
    assert batch.policy_logprobs.shape == batch.behaviour_logprobs.shape
    # dense sampler: the training forward reproduces the sampled log-probs (before the update)
    assert float((batch.policy_logprobs - batch.behaviour_logprobs)[mask].abs().max()) < 2e-5


def test_engine_options_restores_the_engine_also_on_error_and_rejects_unknown_options():
    from agents.policy.engine import engine_options

    engine = SimpleNamespace(sparse_decode=None, sparse_decode_stats="old")
    with engine_options(engine, sparse_decode="pattern", sparse_decode_stats="new") as e:
        assert (e.sparse_decode, e.sparse_decode_stats) == ("pattern", "new")
    assert (engine.sparse_decode, engine.sparse_decode_stats) == (None, "old")
    with pytest.raises(RuntimeError, match="boom"), engine_options(engine, sparse_decode="pattern"):
        raise RuntimeError("boom")
    assert engine.sparse_decode is None
    with pytest.raises(AttributeError, match="sparse_decod"), engine_options(engine, sparse_decod="typo"):
        pass
