"""The trainer end to end on a tiny model: learning, checkpoints, exact resume, DAPO refill, VIGOR's ragged groups."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from grpo_toys import ToyEngine, first_token_scorer, make_env, make_policy

from agents.grpo import checkpoint
from agents.grpo.batch import group_std
from agents.grpo.config import from_dict
from agents.grpo.metrics import without_timing
from agents.grpo.trainer import Trainer, select_trainable
from agents.policy.engine import HFEngine
from rlvr_envs.core import ListSource, Task, TextEnv


def trainer(out, *, engine=ToyEngine, env=None, eval_env=None, **overrides) -> Trainer:
    """A toy-sized trainer; ``engine`` is a factory called with the policy."""
    settings = dict(model="toy", steps=4, prompts_per_step=4, max_new_tokens=2, lr=1e-2, train_layers=-1,
                    eval_size=4, eval_every=0, out_dir=str(out), progress=False, plot=False, micro_batch=8,
                    params={"rollout_allocator": {"n": 8}})
    settings.update(overrides)
    policy = make_policy()
    return Trainer(from_dict(settings), policy=policy, engine=engine(policy), env=env or make_env(),
                   eval_env=eval_env or make_env())


def fp32_hf_engine(policy) -> HFEngine:
    return HFEngine(policy, precision="fp32")  # "auto" would decode in bf16 on AVX512-BF16 / AMX CPUs


class RecordingLoss:
    """Wraps the trainer's loss: keeps each call's PPO ratio and its ratio to the behaviour log-probs."""

    def __init__(self, inner):
        self.inner, self.ratios, self.behaviour_ratios = inner, [], []

    def __call__(self, batch, logprobs, rows):
        rows_t = torch.as_tensor(rows)
        width = logprobs.shape[1]
        mask = batch.response_mask[rows_t, :width]
        old = logprobs.detach() if batch.old_logprobs is None else batch.old_logprobs[rows_t, :width]
        self.ratios.append(torch.exp(logprobs.detach() - old)[mask])
        self.behaviour_ratios.append(torch.exp(logprobs.detach() - batch.behaviour_logprobs[rows_t, :width])[mask])
        return self.inner(batch, logprobs, rows)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_training_logprobs_are_the_samplers_at_temperature(tmp_path):
    """Rollouts sampled at T = 0.7: the trainer's log-probs (policy, old, reference) are of softmax(logits / T), the
    distribution the engine sampled from, so an untouched policy has importance ratio 1."""
    t = trainer(tmp_path, engine=fp32_hf_engine, temperature=0.7, max_new_tokens=6, precision="fp32", ppo_epochs=2,
                micro_batch=5, kl_reference=True, eval_size=0)
    t.step = 1
    batch, _ = t.collect()
    assert batch.temperature == 0.7
    mask = batch.response_mask
    assert int(mask.sum()) > 50
    trainer_lp = t._no_grad_stats(t.model, batch)[0]
    diff = float((trainer_lp - batch.behaviour_logprobs)[mask].abs().max())
    print(f"T=0.7: max |trainer log-prob - engine log-prob| = {diff:.3g} over {int(mask.sum())} tokens")
    assert diff < 2e-5
    batch.advantages = torch.linspace(-1.0, 1.0, len(batch))  # non-zero, so the first optimizer step moves the policy
    t.components["loss"] = loss = RecordingLoss(t.components["loss"])
    t.update(batch)
    torch.testing.assert_close(batch.old_logprobs[mask], batch.behaviour_logprobs[mask], atol=2e-5, rtol=0)
    torch.testing.assert_close(batch.ref_logprobs[mask], batch.behaviour_logprobs[mask], atol=2e-5, rtol=0)
    n_micro = -(-len(batch) // 5)
    first_epoch = torch.cat(loss.ratios[:n_micro])  # before the first optimizer step
    assert float((first_epoch - 1).abs().max()) <= 1e-6
    assert float((torch.cat(loss.behaviour_ratios[:n_micro]) - 1).abs().max()) < 2e-5
    assert float((torch.cat(loss.ratios[n_micro:]) - 1).abs().max()) > 1e-4  # the second epoch sees the update


def strip(records):
    return [without_timing(r) for r in records]


class RecordingEngine(ToyEngine):
    """Records every generate and sync_weights call with the weights at that moment (and, once ``trainer`` is set, the
    optimizer's step count at each sync)."""

    def __init__(self, policy):
        super().__init__(policy)
        self.events, self.trainer = [], None

    def weights(self):
        return torch.cat([p.detach().flatten() for p in self.policy.model.parameters()]).clone()

    def generate(self, prompts, n, sampling):
        self.events.append(("generate", self.weights(), None))
        return super().generate(prompts, n, sampling)

    def sync_weights(self, model):
        assert model is self.policy.model
        state = next(iter(self.trainer.optimizer.state.values()), {}) if self.trainer else {}
        self.events.append(("sync", self.weights(), int(state.get("step", 0))))


@pytest.mark.parametrize("ppo_epochs", [1, 2])
def test_engine_weights_are_synced_after_every_update(tmp_path, ppo_epochs):
    settings = dict(engine=RecordingEngine, steps=3, eval_size=2, eval_every=1, checkpoint_every=1,
                    weight_decay=0.1, ppo_epochs=ppo_epochs, params={"rollout_allocator": {"n": 4}})
    t = trainer(tmp_path, **settings)  # weight decay: every optimizer step moves the weights
    t.engine.trainer = t
    t.run(resume=False)
    events = t.engine.events
    syncs = [k for k, e in enumerate(events) if e[0] == "sync"]
    assert [events[k][2] for k in syncs] == [ppo_epochs, 2 * ppo_epochs, 3 * ppo_epochs]  # after each update's steps
    for k in syncs:
        assert not torch.equal(events[k - 1][1], events[k][1])  # the update happened before the sync
        later = [e for e in events[k + 1:] if e[0] == "generate"]
        assert later and torch.equal(later[0][1], events[k][1])  # eval and the next step sample synced weights
    resumed = trainer(tmp_path, **{**settings, "steps": 4})
    resumed.run(resume=True)
    first = resumed.engine.events[0]  # the checkpoint's weights reach the engine before it samples anything
    assert first[0] == "sync" and torch.equal(first[1], events[syncs[-1]][1])


def test_an_engine_without_sync_weights_is_refused(tmp_path):
    class Stale:
        def generate(self, prompts, n, sampling):
            raise AssertionError("never reached")

    with pytest.raises(TypeError, match="sync_weights"):
        trainer(tmp_path, engine=lambda policy: Stale())


class NoEntropyEngine:
    """The fp32 hf engine with the entropies of every other rollout removed (vLLM returns none); keeps what the hf
    engine reported."""

    def __init__(self, policy):
        self.inner, self.reported = fp32_hf_engine(policy), []

    def generate(self, prompts, n, sampling):
        rollouts = self.inner.generate(prompts, n, sampling)
        self.reported += [r.entropies for r in rollouts]
        return [dataclasses.replace(r, entropies=None) if k % 2 == 0 else r for k, r in enumerate(rollouts)]

    def sync_weights(self, model):
        self.inner.sync_weights(model)


def test_missing_entropies_are_recomputed_as_the_engine_reports_them(tmp_path):
    t = trainer(tmp_path, engine=NoEntropyEngine, temperature=0.7, max_new_tokens=6, precision="fp32", micro_batch=5,
                eval_size=0)
    t.step = 1
    batch, _ = t.collect()
    assert len(t.engine.reported) == len(batch) == 32
    for i, ent in enumerate(t.engine.reported):
        torch.testing.assert_close(batch.entropies[i, : len(ent)], torch.tensor(ent), atol=2e-5, rtol=0)
        assert len(ent) == int(batch.response_mask[i].sum()) and float(batch.entropies[i].abs().sum()) > 0


def multi_hop_env():
    import gymnasium as gym

    import rlvr_envs  # noqa: F401  (registers the ids)

    return gym.make("rlvr/MultiHopSynth-v0", corpus_size=40, num_tasks=8)


def test_multi_turn_envs_train_and_evaluate_through_episodes(tmp_path):
    """A search env answers a non-final response with reward 0 and terminated=False: one-response scoring would
    train and evaluate on those zeros, so the trainer plays whole episodes there (agents/grpo/multiturn.py)."""
    t = trainer(tmp_path / "train", env=multi_hop_env(), eval_env=multi_hop_env(), eval_size=2)
    assert t.multiturn
    # a chat rendering that keeps earlier turns (the toys' default shows only the last message, which no token-exact
    # episode can continue: the agent refuses it)
    t.policy.prompt_text = lambda messages: "".join(f"{m['role']}: {m['content']}\n" for m in messages)
    t.step = 1
    batch, gen = t.collect()
    assert batch is not None and gen["turns_per_episode"] >= 1 and "tool_use_rate" in gen
    assert all(len(info["turns"]) >= 1 for info in batch.infos)
    ev = t.evaluate()
    assert ev["eval_n"] == 2 and "eval_calls_per_episode" in ev


def test_mean_reward_rises_on_toy_task(tmp_path):
    records = trainer(tmp_path, steps=30, plot=True).run(resume=False)
    train = [r["reward_mean"] for r in records if r["kind"] == "train"]
    evals = [r["eval_accuracy"] for r in records if r["kind"] == "eval"]
    first, last = sum(train[:5]) / 5, sum(train[-5:]) / 5
    assert last >= first + 0.25, train
    assert evals[-1] > evals[0], evals
    assert (tmp_path / "curves.png").stat().st_size > 1000
    assert (tmp_path / "metrics.jsonl").is_file()


def test_a_large_run_seed_trains_and_an_out_of_range_one_is_refused(tmp_path):
    # the per-call seed grows ~8e12 x the run seed: 3e6 used to overflow torch.manual_seed's int64
    records = trainer(tmp_path, steps=1, seed=3_000_000).run(resume=False)
    assert [r["step"] for r in records if r["kind"] == "train"] == [1]
    for bad in (-1, 2**32, True, 1.5):
        with pytest.raises(ValueError, match="seed must be an integer"):
            trainer(tmp_path / "bad", steps=1, seed=bad)


def test_checkpoint_holds_everything_and_resume_is_exact(tmp_path):
    full = trainer(tmp_path / "full", steps=6, checkpoint_every=3).run(resume=False)
    first = trainer(tmp_path / "cut", steps=6, checkpoint_every=3)
    first.run(resume=False, stop_after=4)  # stopped past the step-3 checkpoint: step 4 must be redone identically
    state = checkpoint.load(checkpoint.latest(tmp_path / "cut"))
    assert state["step"] == 3 and set(state["rng"]) == {"python", "numpy", "torch"}
    assert set(state["components"]) >= {"prompt_selector", "rollout_allocator", "advantage", "loss"}
    assert state["components"]["prompt_selector"]["rng"]  # the selector's own generator is saved
    assert state["optimizer"]["state"] and set(state["model"]) == set(first.trainable)
    assert not list((tmp_path / "cut" / "checkpoints").glob(".*tmp*"))  # atomic: no temporary file left
    resumed = trainer(tmp_path / "cut", steps=6, checkpoint_every=3)
    records = resumed.run(resume=True)
    assert strip(records) == strip(full)
    for (name, p), q in zip(resumed.model.named_parameters(), trainer(tmp_path / "x").model.parameters()):
        assert p.shape == q.shape, name


def test_trainable_selection_last_layers():
    policy = make_policy(layers=3)
    names = select_trainable(policy.model, 1)
    assert names and all(n.startswith("model.layers.2.") or n == "model.norm.weight" for n in names)
    assert not policy.model.model.embed_tokens.weight.requires_grad
    assert len(select_trainable(policy.model, -1)) == len(list(policy.model.parameters()))


def test_micro_batches_give_the_same_update(tmp_path):
    a = trainer(tmp_path / "a", steps=1, micro_batch=32, eval_size=0)
    b = trainer(tmp_path / "b", steps=1, micro_batch=5, eval_size=0)
    a.run(resume=False)
    b.run(resume=False)
    for p, q in zip(a.model.parameters(), b.model.parameters()):
        assert torch.allclose(p, q, atol=1e-6)


def test_dapo_refill_and_vigor_ragged_groups(tmp_path):
    t = trainer(tmp_path / "dapo", steps=2, eval_size=0, refill_rounds=3,
                stages={"group_transform": "dapo", "loss": "dapo"})
    records = [r for r in t.run(resume=False) if r["kind"] == "train"]
    for r in records:  # a toy start has many all-wrong groups: they are dropped and replaced by fresh prompts
        assert r["refill_rounds"] >= 1 and r["rollouts"] > 32, r  # one round is 4 prompts x 8
        assert 1 <= r["groups"] <= 4
    assert t.components["group_transform"].dropped > 0
    t.step += 1
    batch, gen = t.collect()
    assert gen["refill_rounds"] >= 1 and gen["rollouts"] > 32
    inverse, keys = batch.group_index()
    assert 1 <= len(keys) <= 4 and any(not g.split(":")[1] == "0" for g in keys)  # groups from a refill round kept
    assert bool((group_std(batch.rewards, inverse, len(keys), unbiased=False) > 0).all())  # no zero-variance group
    v = trainer(tmp_path / "vigor", steps=2, eval_size=0, stages={"rollout_allocator": "vigor"},
                params={"rollout_allocator": {"n0": 2, "budget_per_prompt": 6, "per_round": 2, "top_k": 2}})
    vr = [r for r in v.run(resume=False) if r["kind"] == "train"]
    assert all(r["rollouts"] == 24 for r in vr)  # 4 prompts x 6: the budget, spent exactly


def test_kl_to_reference_is_zero_before_the_first_update(tmp_path):
    t = trainer(tmp_path, steps=2, eval_size=0, params={"rollout_allocator": {"n": 4}, "loss": {"kl_coef": 0.1}})
    assert t.ref_model is not None  # a KL coefficient brings a frozen reference with it
    kl = [r["kl"] for r in t.run(resume=False) if r["kind"] == "train"]
    assert abs(kl[0]) < 1e-6 and kl[1] > 0


@pytest.mark.parametrize("chunk", [1, 3, 64])
def test_chunked_logprobs_match_the_sampler(chunk):
    from agents.grpo.logprobs import response_logprobs
    from agents.grpo.trainer import make_sampling

    policy = make_policy()
    rollouts = ToyEngine(policy).generate(["p0", "p1 p2"], 3, make_sampling(temperature=1.0, max_new_tokens=5,
                                                                              seed=1))
    lp, ent = response_logprobs(policy.model, [r.prompt_ids for r in rollouts], [r.response_ids for r in rollouts],
                                chunk=chunk)
    for i, r in enumerate(rollouts):
        k = len(r.response_ids)
        torch.testing.assert_close(lp[i, :k], torch.tensor(r.logprobs), atol=1e-5, rtol=0)
        torch.testing.assert_close(ent[i, :k], torch.tensor(r.entropies), atol=1e-5, rtol=0)
        assert float(lp[i, k:].detach().abs().sum()) == 0.0
    # gradients flow through the checkpointed chunks
    lp, _ = response_logprobs(policy.model, [r.prompt_ids for r in rollouts], [r.response_ids for r in rollouts],
                              chunk=chunk)
    lp.sum().backward()
    assert policy.model.lm_head.weight.grad is not None and policy.model.lm_head.weight.grad.abs().sum() > 0


def test_logprobs_match_the_hf_engine_on_tiny():
    engine_mod = pytest.importorskip("agents.policy.engine")
    from agents.grpo.logprobs import response_logprobs
    from agents.policy.models import load_policy

    policy = load_policy("tiny", seed=0)
    engine = engine_mod.make_engine(policy, backend="hf", precision="fp32")  # "auto" decodes in bf16 on AMX/AVX512-BF16
    rollouts = engine.generate([policy.prompt_text([{"role": "user", "content": "1+1?"}])], 4,
                               engine_mod.SamplingParams(temperature=1.0, max_new_tokens=12, seed=3))
    with torch.no_grad():
        lp, _ = response_logprobs(policy.model, [r.prompt_ids for r in rollouts], [r.response_ids for r in rollouts],
                                  pad_id=policy.tokenizer.pad_token_id, chunk=5)
    for i, r in enumerate(rollouts):
        torch.testing.assert_close(lp[i, : len(r.logprobs)], torch.tensor(r.logprobs), atol=1e-4, rtol=0)


def test_resume_refuses_a_different_recipe(tmp_path):
    trainer(tmp_path, steps=1, eval_size=0, checkpoint_every=1).run(resume=False)
    with pytest.raises(ValueError, match="lr"):
        trainer(tmp_path, steps=2, eval_size=0, lr=0.5).run(resume=True)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_precision_setting_reaches_the_update(tmp_path, precision):
    t = trainer(tmp_path, steps=2, eval_size=0, precision=precision)
    assert t.autocast_bf16 is (precision == "bf16")
    assert next(iter(t.optimizer.param_groups))["fused"]  # fused AdamW on CPU
    train = [r for r in t.run(resume=False) if r["kind"] == "train"]
    assert len(train) == 2 and all(torch.isfinite(torch.tensor([r["loss"], r["grad_norm"]])).all() for r in train)


def test_sampled_eval_reports_mean_at_k_with_per_task_counts(tmp_path):
    t = trainer(tmp_path / "ev", steps=0, eval_size=4, eval_temperature=1.0, eval_samples=3)
    ev = t.evaluate()
    assert ev["eval_samples"] == 3 and len(ev["eval_correct"]) == 4
    assert all(0 <= c <= 3 for c in ev["eval_correct"])
    assert ev["eval_accuracy"] == pytest.approx(sum(ev["eval_correct"]) / 12)
    assert t.evaluate()["eval_correct"] == ev["eval_correct"]  # a fixed eval seed: the same draws every time
    greedy = trainer(tmp_path / "g", steps=0, eval_size=4).evaluate()
    assert greedy["eval_samples"] == 1 and set(greedy["eval_correct"]) <= {"0", "1"}


def test_greedy_eval_with_several_samples_is_refused(tmp_path):
    with pytest.raises(ValueError, match="greedy"):
        trainer(tmp_path / "x", eval_samples=4)


def test_component_hooks_see_every_generation_call_and_report_metrics(tmp_path):
    """``bind`` once, ``observe_rollouts`` after every generation call (DAPO's dropped groups included), ``metrics`` in
    the step's record under ``<stage>.<key>``, and a generation controller's ``prompt`` rewrite reaches the rollouts."""
    from agents.grpo import registry

    seen: dict[str, list] = {"rollouts": [], "bound": [], "prompts": []}

    @registry.register("probe", stage="generation_controller")
    class Probe(registry.Component):
        def bind(self, services):
            seen["bound"].append(services)

        def sampling(self, sampling, step):
            return sampling

        def prompt(self, prompt, info, step):
            return f"{prompt} a"  # one more toy word

        def observe_rollouts(self, batch, wall_s):
            seen["rollouts"].append((len(batch), batch.num_groups, wall_s))
            seen["prompts"].extend(batch.prompts)

        def metrics(self):
            return {"calls": float(len(seen["rollouts"]))}

    try:
        t = trainer(tmp_path, steps=2, eval_size=0, refill_rounds=2,
                    stages={"generation_controller": "probe", "group_transform": "dapo", "loss": "dapo"})
        records = [r for r in t.run(resume=False) if r["kind"] == "train"]
    finally:
        registry.unregister("probe", stage="generation_controller")
    assert len(seen["bound"]) == 1 and seen["bound"][0].cfg is t.cfg
    lp = seen["bound"][0].logprobs
    assert all(p.endswith(" a") for p in seen["prompts"])
    calls = sum(len(r["rounds"]) for r in records)
    assert calls == len(seen["rollouts"]) >= 2
    assert [sum(x["rollouts"] for x in r["rounds"]) for r in records] == [r["rollouts"] for r in records]
    assert all(x["wall_s"] > 0 and x["max_len"] >= x["mean_len"] for r in records for x in r["rounds"])
    assert records[-1]["generation_controller.calls"] == calls
    for r in records:  # every generated group counted; DAPO kept exactly the useful ones
        assert r["groups_generated"] * 8 == r["rollouts"] and r["groups_useful"] >= r["groups"]
    # the logprob service: the current policy's log-probs, as the training forward computes them
    t.step += 1
    batch, _ = t.collect()
    rows = [0, 3]
    assert torch.allclose(lp(batch, rows), t._logprobs(t.model, batch, rows)[0].float(), atol=1e-6)


def test_generate_service_and_task_metadata_reach_components(tmp_path):
    """``services.generate`` continues token-id prefixes with the current weights, counted in the generation FLOPs and
    ``extra_tokens`` (saved in checkpoints) but not in the rollout totals; every row's info carries its task's
    metadata, which components that read the task (numbers, target, a reference) rely on."""
    from agents.grpo import registry

    seen: dict[str, list] = {"services": [], "metadata": []}

    @registry.register("probe_gen", stage="reward_shaper")
    class Probe(registry.Component):
        def bind(self, services):
            seen["services"].append(services)

        def __call__(self, batch):
            seen["metadata"].extend(info["metadata"] for info in batch.infos)
            svc = seen["services"][0]
            prefix = [batch.prompt_ids[0] + batch.response_ids[0][:1]]
            ros = svc.generate(prefix, 3, max_new_tokens=2, seed=batch.step)
            assert len(ros) == 3 and all(ro.prompt_ids == prefix[0] for ro in ros)
            return batch.rewards

    tasks = [Task(id=f"toy-{k}", question=f"p{k}", answer=f"t{k}", metadata={"k": k}) for k in range(4)]
    try:
        t = trainer(tmp_path / "a", steps=2, eval_size=0, env=TextEnv(ListSource(tasks, name="toy"),
                                                                       first_token_scorer),
                    stages={"reward_shaper": "probe_gen"})
        records = [r for r in t.run(resume=False) if r["kind"] == "train"]
    finally:
        registry.unregister("probe_gen", stage="reward_shaper")
    assert seen["services"][0].tokenizer is t.tokenizer
    assert sorted({m["k"] for m in seen["metadata"]}) <= [0, 1, 2, 3] and len(seen["metadata"]) == 2 * 4 * 8
    assert 3 <= records[0]["extra_tokens"] <= 6 and records[1]["extra_tokens"] >= records[0]["extra_tokens"] + 3
    assert records[-1]["rollouts_total"] == 2 * 4 * 8  # the continuations are not rollouts
    assert t.state()["extra_tokens"] == records[-1]["extra_tokens"]
    # FLOPs: a run without the continuations counts less generation
    plain = trainer(tmp_path / "b", steps=2, eval_size=0, env=TextEnv(ListSource(tasks, name="toy"),
                                                                       first_token_scorer))
    base = [r for r in plain.run(resume=False) if r["kind"] == "train"]
    assert records[-1]["flops_gen"] > base[-1]["flops_gen"] and "extra_tokens" not in base[-1]


def test_countdown_evals_with_several_samples_record_solution_coverage(tmp_path):
    """A Countdown held-out eval with eval_samples > 1 records coverage and entrance statistics per task (what
    ``final_eval_coverage`` compares); other envs' evals do not."""
    import gymnasium as gym

    import rlvr_envs  # noqa: F401

    countdown = gym.make("rlvr/Countdown-v0", min_numbers=3, max_numbers=3, max_number=9, max_target=40)
    t = trainer(tmp_path / "cd", steps=0, eval_size=3, eval_samples=2, eval_temperature=1.0, eval_env=countdown)
    ev = t.evaluate()
    assert ev["eval_samples"] == 2 and len(ev["eval_solutions"]) == 3
    assert ev["eval_coverage"] == sum(ev["eval_solutions"]) / 3 and 0 <= ev["eval_entrance_entropy"]
    plain = trainer(tmp_path / "toy", steps=0, eval_size=3, eval_samples=2, eval_temperature=1.0).evaluate()
    assert "eval_coverage" not in plain and plain["eval_samples"] == 2


def test_train_records_count_unverifiable_verdicts_apart(tmp_path):
    """A scorer that cannot decide (here: it raises) gives reward 0 like a wrong answer; the step record says how
    many rollouts that was, so a verifier outage is not mistaken for a policy that got worse."""

    def flaky(task, response):
        if task.id.endswith("1"):
            raise TimeoutError("verifier unavailable")
        return first_token_scorer(task, response)

    env = TextEnv(ListSource([Task(id=f"toy-{k}", question=f"p{k}", answer=f"t{k}") for k in range(4)], name="toy"),
                  flaky)
    t = trainer(tmp_path, env=env, eval_size=0, prompts_per_step=4)
    t.step = 1
    batch, gen = t.collect()
    flagged = [info["verdict"] == "unverifiable" for info in batch.infos]
    assert gen["unverifiable_rate"] == pytest.approx(sum(flagged) / len(flagged)) and 0 < sum(flagged) < len(flagged)
    assert all(r == 0 for r, f in zip(batch.base_rewards.tolist(), flagged) if f)


def test_the_final_eval_reads_a_larger_set_whose_first_chunk_is_the_curves_eval(tmp_path):
    """final_eval_size: the last eval scores more tasks (final_eval_* fields) while its eval_* fields cover the
    curve's eval_size tasks with the same draws as every other eval of the run; decoded eval_size tasks at a time."""
    t = trainer(tmp_path, eval_size=3, final_eval_size=10, eval_samples=2, eval_temperature=1.0,
                eval_env=make_env(12))
    calls = []
    generate = t.engine.generate
    t.engine.generate = lambda prompts, n, sampling: calls.append(len(prompts)) or generate(prompts, n, sampling)
    curve, final = t.evaluate(), t.evaluate(final=True)
    assert calls == [3, 3, 3, 3, 1]  # the curve's eval, then the final set in chunks of eval_size
    assert final["eval_n"] == 3 and final["final_eval_n"] == 10 and len(final["final_eval_correct"]) == 10
    assert final["eval_correct"] == curve["eval_correct"] == final["final_eval_correct"][:3]
    assert final["final_eval_accuracy"] == pytest.approx(sum(final["final_eval_correct"]) / 20)
    assert "final_eval_n" not in curve
    records = trainer(tmp_path / "run", steps=2, eval_every=1, eval_size=2, final_eval_size=4,
                      eval_env=make_env(6)).run(resume=False)
    evals = [r for r in records if r["kind"] == "eval"]
    assert [("final_eval_n" in r) for r in evals] == [False, False, True]  # only the run's last eval
