"""FLOP accounting (agents.grpo.flops): golden counts on a model of known shape, the trainer's running totals, the
FLOP budget, the finite training pool and the marker-gated abort that DUET's controller runs."""

from __future__ import annotations

import pytest
import torch
from grpo_toys import ToyEngine, make_env, make_policy
from test_grpo_trainer import fp32_hf_engine, strip, trainer
from transformers import LlamaConfig, LlamaForCausalLM

from agents.grpo.flops import FlopModel
from agents.grpo.trainer import decoder_layers, select_trainable
from agents.policy.engine import SamplingParams, generate_with_abort


def shaped_model() -> LlamaForCausalLM:
    # per layer: q 8x8 + k 8x4 + v 8x4 + o 8x8 + gate/up/down 3 x 8x16 = 576 weights; head 16x8 = 128
    cfg = LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, max_position_embeddings=32, tie_word_embeddings=False)
    return LlamaForCausalLM(cfg)


def test_golden_counts_full_fine_tuning():
    model = shaped_model()
    select_trainable(model, -1)
    fm = FlopModel.of(model, decoder_layers(model))
    assert (fm.n_linear, fm.n_head, fm.n_layers, fm.d_attn, fm.n_span, fm.span_layers) == (1280, 128, 2, 8, 1152, 2)
    assert fm.prefill(3) == 2 * 1152 * 3 + 2 * 128 + 4 * 2 * 8 * (3 * 4 / 2)  # 7552: head at the last position only
    assert fm.decode(3, 2) == 2 * 1280 * 2 + 4 * 2 * 8 * (3 * 2 + 3)  # contexts 4 and 5: 5696
    fwd = 2 * 1152 * 5 + 2 * 128 * 2 + 4 * 2 * 8 * 15  # 12992: 5 positions, logits at the 2 response positions
    assert fm.forward(3, 2) == fwd
    # every weight trainable: backward = 2x forward, so a training token costs 3 forwards (the 6N rule)
    assert fm.training([3], [2]) == 3 * fwd == 38976
    assert fm.training([3, 1], [2, 4], passes=2, no_grad_passes=1) == 7 * (fwd + fm.forward(1, 4))
    assert fm.generation([3, 3], [2, 1], [3]) == fm.prefill(3) + fm.decode(3, 2) + fm.decode(3, 1)


def test_golden_counts_last_layer_only():
    model = shaped_model()
    select_trainable(model, 1)
    fm = FlopModel.of(model, decoder_layers(model))
    assert (fm.n_span, fm.span_layers, fm.n_trainable) == (576, 1, 576)
    # activation grads through layer 1 and the head, weight grads of layer 1, attention backward of one layer
    bwd = (2 * 576 * 5 + 2 * 128 * 2) + 2 * 576 * 5 + 2 * (4 * 1 * 8 * 15)
    assert fm.backward(3, 2) == bwd == 12992
    assert fm.training([3], [2]) == fm.forward(3, 2) + bwd
    frozen_below = FlopModel.of(model, decoder_layers(model))
    select_trainable(model, -1)
    assert FlopModel.of(model, decoder_layers(model)).backward(3, 2) > frozen_below.backward(3, 2)


def test_trainer_counts_every_pass_and_resume_keeps_the_totals(tmp_path):
    t = trainer(tmp_path / "a", steps=3, ppo_epochs=2, kl_reference=True, eval_size=0)
    records = [r for r in t.run(resume=False) if r["kind"] == "train"]
    gens = [r["flops_gen"] for r in records]
    trains = [r["flops_train"] for r in records]
    assert all(b > a >= 0 for a, b in zip([0, *gens], gens)) and all(b > a >= 0 for a, b in zip([0, *trains], trains))
    assert all(r["flops_total"] == r["flops_gen"] + r["flops_train"] for r in records)
    # recompute the last step's training cost from its batch shape: 2 epochs fwd+bwd, old + reference no-grad passes
    t2 = trainer(tmp_path / "b", steps=1, ppo_epochs=2, kl_reference=True, eval_size=0)
    t2.step = 1
    batch, _ = t2.collect()
    batch.advantages = torch.zeros(len(batch))
    before = t2.flops["training"]
    t2.update(batch)
    p, r = [len(x) for x in batch.prompt_ids], [len(x) for x in batch.response_ids]
    assert t2.flops["training"] - before == pytest.approx(t2.flop_model.training(p, r, passes=2, no_grad_passes=2))
    # a killed-and-resumed run reports the same totals as an uninterrupted one
    t3 = trainer(tmp_path / "c", steps=3, ppo_epochs=2, kl_reference=True, eval_size=0, checkpoint_every=1)
    t3.run(resume=False, stop_after=2)
    t4 = trainer(tmp_path / "c", steps=3, ppo_epochs=2, kl_reference=True, eval_size=0, checkpoint_every=1)
    resumed = [x for x in t4.run(resume=True) if x["kind"] == "train"]
    assert strip(resumed) == strip(records)


def test_flop_budget_ends_the_run_with_its_final_eval_and_checkpoint(tmp_path):
    full = [r for r in trainer(tmp_path / "full", steps=6).run(resume=False) if r["kind"] == "train"]
    budget = (full[1]["flops_total"] + full[2]["flops_total"]) / 2  # crossed during step 3
    t = trainer(tmp_path / "b", steps=6, flop_budget=budget)
    records = t.run(resume=False)
    train = [r for r in records if r["kind"] == "train"]
    assert [r["step"] for r in train] == [1, 2, 3]
    assert train[-1]["flops_total"] >= budget > train[-2]["flops_total"]
    assert [r["step"] for r in records if r["kind"] == "eval"] == [0, 3]
    assert t.save().name == "step-3.pt"
    assert not [r for r in trainer(tmp_path / "b", steps=6, flop_budget=budget).run() if r["step"] > 3]
    with pytest.raises(ValueError, match="flop_budget"):
        trainer(tmp_path / "x", flop_budget=-1)


def test_train_pool_restricts_prompts_to_the_first_tasks(tmp_path):
    t = trainer(tmp_path, steps=5, prompts_per_step=2, train_pool=2, eval_size=0, env=make_env(16))
    tasks = set()
    for step in range(1, 6):
        t.step = step
        batch, _ = t.collect()
        tasks |= {g.split(":", 3)[3] for g in batch.group_ids}
    assert tasks == {"toy-0", "toy-1"}


class ScriptedEngine(ToyEngine):
    """The toy engine, recording each call (prompt token counts and max_new_tokens)."""

    def __init__(self, policy):
        super().__init__(policy)
        self.calls = []

    def generate(self, prompts, n, sampling, *, seeds=None):
        self.calls.append((prompts, n, sampling.max_new_tokens, seeds))
        return super().generate(prompts, n, sampling, seeds=seeds)


@pytest.mark.parametrize("seed", range(3))
def test_marker_gated_abort(seed):
    """Past ``abort_after`` tokens a rollout goes on only if it already wrote a marker; the continuation decodes from
    its own token ids, and the joined rollout's log-probs match a teacher-forced pass."""
    policy = make_policy(seed)
    engine = HFEngineFp32(policy)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=8, seed=seed)
    markers = ("a", "b", "c")
    out = generate_with_abort(engine, ["p0", "p1"], 6, sampling, abort_after=3, markers=markers)
    assert len(out) == 12
    for ro in out:
        head = policy.tokenizer.decode(ro.response_ids[:3], skip_special_tokens=True)
        if ro.finish_reason == "abort":
            assert len(ro.response_ids) == 3 and not any(m in head for m in markers)
        elif len(ro.response_ids) > 3:
            assert any(m in head for m in markers)  # only a committed rollout runs past the gate
            assert ro.meta["continued_at"] == 3 and len(ro.logprobs) == len(ro.response_ids)
            ids = torch.tensor([ro.prompt_ids + ro.response_ids])
            with torch.no_grad():
                logp = torch.log_softmax(policy.model(input_ids=ids).logits[0].float(), -1)
            k = len(ro.prompt_ids)
            forced = logp[k - 1:-1].gather(1, torch.tensor(ro.response_ids)[:, None])[:, 0]
            assert torch.allclose(forced, torch.tensor(ro.logprobs), atol=2e-5)
    assert {ro.finish_reason for ro in out} <= {"stop", "length", "abort"}
    with pytest.raises(ValueError, match="markers"):
        generate_with_abort(engine, ["p0"], 1, sampling, abort_after=3, markers=())


def HFEngineFp32(policy):
    return fp32_hf_engine(policy)


def test_abort_continuation_is_a_token_id_call():
    policy = make_policy(0)
    engine = ScriptedEngine(policy)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=6, seed=1)
    out = generate_with_abort(engine, ["p0"], 16, sampling, abort_after=2, markers=tuple("abcdefgh"))
    assert engine.calls[0][2] == 2
    if len(engine.calls) > 1:  # some rollout committed: continued on its own ids, for the remaining 4 tokens
        prompts, n, max_new, seeds = engine.calls[1]
        assert n == 1 and max_new == 4 and all(isinstance(p, list) for p in prompts) and len(seeds) == len(prompts)
    assert any(ro.finish_reason != "abort" for ro in out) or len(engine.calls) == 1
