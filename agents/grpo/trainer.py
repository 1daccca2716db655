"""The GRPO trainer: a straight walk through the stages, one step at a time.

    select prompts -> allocate rollouts (rounds) -> generate + score -> group transform (refill) -> shape rewards
    -> advantages -> replay -> loss / backward (micro-batches) -> optimizer -> aggregate -> observe -> log, eval, save

Stages never call each other and never reach into the trainer; the trainer never knows which paper a component
comes from. Generation is seeded per (run seed, step, round), so a resumed run draws the same rollouts as an
uninterrupted one.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import resource
import time
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from agents.grpo import checkpoint
from agents.grpo.batch import GroupBatch, Sample, group_std
from agents.grpo.config import TrainConfig
from agents.grpo.distill import ContextStats, context_stats
from agents.grpo.flops import FlopModel
from agents.grpo.logprobs import response_logprobs
from agents.grpo.metrics import MetricsLog, plot_curves
from agents.grpo.multiturn import (
    ToolUseMonitor,
    episode_samples,
    episode_stats,
    is_multiturn,
    model_turn_lengths,
    play,
    remake,
)
from agents.grpo.registry import STAGES, Component, build, get
from agents.policy.fastpath import resolve_precision
from agents.policy.frozen_prefix import FrozenPrefixCache, frozen_layer_count
from rlvr_envs.core import step_single_turn
from rlvr_envs.harness.evaluate import EnvPool

# Keys a resumed run may change: how long it runs and how it reports, not what it computes.
RESUME_MAY_CHANGE = frozenset({"steps", "flop_budget", "out_dir", "progress", "plot", "eval_every", "checkpoint_every",
                               "tool_use_warn_below",
                               "keep_checkpoints", "description"})


def make_sampling(**kwargs: Any) -> Any:
    try:
        from agents.policy.engine import SamplingParams
    except ImportError:  # the trainer only reads attributes; tests may run before the policy package exists
        return SimpleNamespace(**{"top_p": 1.0, "seed": None, "stop": (), **kwargs})
    return SamplingParams(**kwargs)


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    base = getattr(model, "base_model", model)
    for attr in ("layers", "h", "blocks"):
        layers = getattr(base, attr, None)
        if isinstance(layers, torch.nn.ModuleList):
            return layers
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and name.split(".")[-1] in ("layers", "h", "blocks"):
            return module
    raise ValueError(f"cannot find the transformer layers of {type(model).__name__}")


def select_trainable(model: torch.nn.Module, last_n: int) -> list[str]:
    """Freeze everything but the last ``last_n`` transformer layers and the final norm (``-1``: train everything).
    Returns the trainable parameter names."""
    if last_n < 0:
        for p in model.parameters():
            p.requires_grad_(True)
        return [n for n, _ in model.named_parameters()]
    for p in model.parameters():
        p.requires_grad_(False)
    layers = decoder_layers(model)
    if last_n > len(layers):
        raise ValueError(f"train_layers={last_n} but the model has {len(layers)} layers")
    chosen = list(layers)[len(layers) - last_n:] if last_n else []
    for layer in chosen:
        for p in layer.parameters():
            p.requires_grad_(True)
    norm = getattr(getattr(model, "base_model", model), "norm", None)
    if last_n and isinstance(norm, torch.nn.Module):
        for p in norm.parameters():
            p.requires_grad_(True)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    if not names:
        raise ValueError("no trainable parameters (train_layers=0)")
    return names


def _build_component(stage: str, cfg: TrainConfig) -> Component:
    name = cfg.stages.get(stage)
    params = dict(cfg.params.get(stage, {}))
    cls_params = inspect.signature(get(stage, name)).parameters
    if "seed" in cls_params and "seed" not in params:
        params["seed"] = cfg.seed
    if "norm_len" in cls_params and params.get("norm_len") is None:  # Dr.GRPO's constant: the longest response allowed
        params["norm_len"] = cfg.max_new_tokens
    return build(stage, name, params)


class Trainer:
    def __init__(self, cfg: TrainConfig, *, policy: Any = None, engine: Any = None, env: Any = None,
                 eval_env: Any = None):
        cfg.validate()
        self.cfg = cfg
        self.out = Path(cfg.out_dir)
        if cfg.threads:  # a fixed thread count makes the run bit-exact across processes (see TrainConfig.threads)
            torch.set_num_threads(cfg.threads)
        torch.manual_seed(cfg.seed)
        np.random.seed(cfg.seed)
        import random

        random.seed(cfg.seed)
        if policy is None:
            try:
                from agents.policy import load_policy
            except ImportError:
                from agents.policy.models import load_policy

            policy = load_policy(cfg.model, dtype=cfg.dtype, seed=cfg.seed)
        if engine is None:
            from agents.policy.engine import make_engine

            engine = make_engine(policy, backend=cfg.engine, **({"precision": cfg.precision} if cfg.engine == "hf" else {}))
        if not callable(getattr(engine, "sync_weights", None)):
            raise TypeError(f"engine {type(engine).__name__} has no sync_weights(model): the trainer calls it after "
                            f"every update so that rollouts come from the new weights (a no-op for an engine that "
                            f"decodes from the model's own tensors)")
        if env is None or eval_env is None:
            import gymnasium as gym

            import rlvr_envs  # noqa: F401  (registers rlvr/ ids)

            env = env if env is not None else gym.make(cfg.env, **cfg.env_kwargs)
            eval_env = eval_env if eval_env is not None else gym.make(cfg.env, **{**cfg.env_kwargs,
                                                                                   **cfg.eval_env_kwargs})
        self.policy, self.engine, self.env, self.eval_env = policy, engine, env, eval_env
        # tool-call and search envs: episodes of several turns through the harness's loop (agents/grpo/multiturn.py)
        self.multiturn = is_multiturn(env)
        if self.multiturn:
            self.pool = EnvPool(env, lambda: remake(env))
            self.eval_pool = EnvPool(eval_env, lambda: remake(eval_env))
            self.tool_monitor = ToolUseMonitor(cfg.tool_use_warn_below)
        self.model = policy.model
        self.tokenizer = policy.tokenizer
        self.pad_id = int(getattr(self.tokenizer, "pad_token_id", None) or 0)
        self.trainable = select_trainable(self.model, cfg.train_layers)
        try:
            layers = decoder_layers(self.model)
        except ValueError:
            layers = None
        self.flop_model = FlopModel.of(self.model, layers)
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.autocast_bf16 = resolve_precision(cfg.precision, params[0].device) == "bf16" and params[0].dtype == torch.float32
        # fused: one kernel over all parameters instead of ~10 elementwise passes each (CPU and CUDA, fp32 or bf16)
        self.optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=tuple(cfg.betas),
                                           fused=params[0].device.type in ("cpu", "cuda"))
        # Frozen-prefix reuse (agents/policy/frozen_prefix.py): with the first layers frozen, the hf engine keeps the
        # states entering the first trained layer while it decodes, and the loss forward starts there. Not under
        # bf16 autocast, whose training forward would compute those states in another precision than decoding did.
        self.frozen_prefix = None
        frozen = frozen_layer_count(self.model)
        if frozen and not self.autocast_bf16 and hasattr(engine, "frozen_prefix"):
            self.frozen_prefix = engine.frozen_prefix = FrozenPrefixCache(self.model, frozen)
        self.components = {stage: _build_component(stage, cfg) for stage in STAGES}
        if self.multiturn and getattr(self.components["generation_controller"], "generate", None) is not None:
            raise ValueError(f"generation controller {cfg.stages.get('generation_controller')!r} runs the generation "
                             f"itself, which multi-turn envs ({cfg.env}) do not support")
        self.services = SimpleNamespace(cfg=cfg, logprobs=self.current_logprobs, generate=self.extra_generate,
                                        tokenizer=self.tokenizer, prompt_text=self.policy.prompt_text,
                                        context_logprobs=self.context_logprobs)
        for c in self.components.values():
            c.bind(self.services)
        self.ref_model = None
        if cfg.kl_reference or getattr(self.components["loss"], "kl_coef", 0.0):  # a KL term needs a reference
            self.ref_model = copy.deepcopy(self.model).eval()
            for p in self.ref_model.parameters():
                p.requires_grad_(False)
        # a distillation loss with a fixed teacher (``teacher = "initial"``) reads the privileged context with the
        # start policy's weights, frozen; "live" reads it with the policy being trained
        self.teacher_model = None
        teacher_kind = getattr(self.components["loss"], "teacher", None)
        if teacher_kind not in (None, "initial", "live"):
            raise ValueError(f"loss teacher must be 'initial' or 'live', got {teacher_kind!r}")
        if teacher_kind == "initial":
            self.teacher_model = self.ref_model or copy.deepcopy(self.model).eval()
            for p in self.teacher_model.parameters():
                p.requires_grad_(False)
        self.metrics = MetricsLog(self.out / "metrics.jsonl")
        self.step = 0
        self.rollouts_total = 0
        self.tokens_total = 0  # response tokens generated for training (the rollout cost a board reports)
        self.flops = {"generation": 0.0, "training": 0.0}  # cumulative, agents.grpo.flops
        self.extra_tokens = 0  # tokens components generated beside the rollouts (Monte-Carlo continuations)

    # -- rollouts --------------------------------------------------------------------------------------------------
    def _open_groups(self, indices: list[int], step: int, round_: int) -> dict[str, dict[str, Any]]:
        groups: dict[str, dict[str, Any]] = {}
        # a generation controller may rewrite a task's prompt (hint scaffolding); the rollouts train on what it wrote
        rewrite = getattr(self.components["generation_controller"], "prompt", None)
        for j, index in enumerate(indices):
            _, info = self.env.reset(options={"index": int(index)})
            task = getattr(self.env.unwrapped, "task", None)  # what a prompt rewrite may read: reference, metadata
            info = {**info, "answer": getattr(task, "answer", None),
                    "metadata": dict(getattr(task, "metadata", None) or {})}
            gid = f"{step}:{round_}:{j}:{info['task_id']}"
            prompt = self.policy.prompt_text(info["messages"])
            if rewrite is not None:
                prompt = rewrite(prompt, info, step)
            groups[gid] = {"task_id": info["task_id"], "prompt": prompt, "index": int(index),
                           "metadata": info["metadata"], "messages": info["messages"]}
        return groups

    def _generate(self, requests: dict[str, int], groups: dict[str, dict[str, Any]], seed: int) -> GroupBatch:
        if self.multiturn:
            return self._generate_episodes(requests, groups, seed)
        by_n: dict[int, list[str]] = defaultdict(list)
        for gid, n in requests.items():
            if n > 0:
                by_n[int(n)].append(gid)
        parts: list[GroupBatch] = []
        ctrl = self.components["generation_controller"]
        for call, n in enumerate(sorted(by_n)):
            gids = by_n[n]
            # folded into int64: a large run seed (call seeds grow ~8e12x faster) stays a valid torch / engine seed;
            # every seed below 2**63 is unchanged
            call_seed = (seed * 7919 + call) % 2**63
            sampling = ctrl.sampling(make_sampling(temperature=self.cfg.temperature, top_p=self.cfg.top_p,
                                                   max_new_tokens=self.cfg.max_new_tokens, seed=call_seed), self.step)
            torch.manual_seed(call_seed)  # engines without a per-call seed still draw reproducibly
            prompts = [groups[g]["prompt"] for g in gids]
            # a generation controller may run the generation itself (DUET's marker-gated abort)
            controlled = getattr(ctrl, "generate", None)
            rollouts = (controlled(self.engine, prompts, n, sampling) if controlled is not None
                        else self.engine.generate(prompts, n, sampling))
            if len(rollouts) != n * len(gids):
                raise RuntimeError(f"engine returned {len(rollouts)} rollouts for {len(gids)} prompts x {n}")
            self.flops["generation"] += self.flop_model.generation(
                [len(ro.prompt_ids) for ro in rollouts], [len(ro.response_ids) for ro in rollouts],
                [len(rollouts[k * n].prompt_ids) for k in range(len(gids))])
            samples: list[Sample] = []
            for k, ro in enumerate(rollouts):
                gid = gids[k // n]
                self.env.reset(options={"task_id": groups[gid]["task_id"]})
                reward, info = step_single_turn(self.env, ro.text)
                samples.append(Sample(
                    group_id=gid, prompt=groups[gid]["prompt"], prompt_ids=list(ro.prompt_ids),
                    response_ids=list(ro.response_ids), text=ro.text, reward=float(reward),
                    correct=bool(info.get("correct", reward > 0)), logprobs=ro.logprobs, entropies=ro.entropies,
                    finish_reason=ro.finish_reason,
                    info={"task_id": groups[gid]["task_id"], "index": groups[gid]["index"],
                          "parsed_answer": info.get("parsed_answer"), "verdict": info.get("verdict"),
                          "format_ok": info.get("format_ok"), "answer": info.get("answer"),
                          # what components that read the task need (Countdown's numbers and target, a reference;
                          # the chat messages, for a loss that renders a privileged context of the same prompt)
                          "metadata": groups[gid]["metadata"], "messages": groups[gid]["messages"]}))
            # Engines report log-probs of softmax(logits / T) (T = 1 when greedy); training takes the same T.
            part = GroupBatch.from_samples(samples, step=self.step, tokenizer=self.tokenizer,
                                           temperature=sampling.temperature or 1.0)
            # An engine without entropies (vLLM) would hand entropy-based shapers zeros: recompute those rows with
            # the weights that sampled them, of the same distribution.
            missing = [k for k, ro in enumerate(rollouts) if ro.response_ids and not ro.entropies]
            if missing:
                part.entropies[missing] = self._no_grad_stats(self.model, part, missing)[1][missing]
            parts.append(part)
        return GroupBatch.concat(parts)

    def _generate_episodes(self, requests: dict[str, int], groups: dict[str, dict[str, Any]], seed: int
                           ) -> GroupBatch:
        """Multi-turn rollouts: one episode per requested rollout, played by the harness's loop with a token-exact
        PolicyAgent; env tokens are masked out of the batch (agents/grpo/multiturn.py)."""
        from agents.policy.agent import PolicyAgent

        sampling = self.components["generation_controller"].sampling(
            make_sampling(temperature=self.cfg.temperature, top_p=self.cfg.top_p,
                          max_new_tokens=self.cfg.max_new_tokens, seed=seed), self.step)
        gids = [g for g, n in requests.items() if n > 0]
        items = [(u, j, groups[g]["index"]) for u, g in enumerate(gids) for j in range(int(requests[g]))]
        agent = PolicyAgent(self.policy, self.engine, sampling)
        episodes = play(agent, self.pool, items, run_seed=seed)
        samples = episode_samples(agent, items, episodes, lambda u: (gids[u], groups[gids[u]]))
        prefix, turn = model_turn_lengths(samples)
        self.flops["generation"] += self.flop_model.generation(prefix, turn, prefix)
        self._episode_samples += samples
        return GroupBatch.from_samples(samples, step=self.step, tokenizer=self.tokenizer,
                                       temperature=sampling.temperature or 1.0)

    def collect(self) -> tuple[GroupBatch | None, dict[str, float]]:
        """Prompts -> rollouts in allocator rounds -> group transform, refilled while groups are missing."""
        cfg, comp = self.cfg, self.components
        n_tasks = len(self.env.unwrapped.source)
        if cfg.train_pool:
            n_tasks = min(n_tasks, cfg.train_pool)
        batch: GroupBatch | None = None
        generated, refills, gen_reward, gen_tokens, unverifiable = 0, 0, 0.0, 0, 0
        rounds: list[dict[str, Any]] = []  # one entry per generation call: its wall-clock and what it produced
        self._episode_samples: list[Sample] = []  # multi-turn episodes of this step (collapse guards)
        groups_generated = groups_useful = 0
        for round_ in range(cfg.refill_rounds + 1):
            need = cfg.prompts_per_step - (batch.num_groups if batch is not None else 0)
            if need <= 0:
                break
            refills = round_
            groups = self._open_groups(comp["prompt_selector"].select(need, n_tasks, self.step), self.step, round_)
            requests = comp["rollout_allocator"].initial(list(groups))
            part: GroupBatch | None = None
            alloc_round = 0
            while requests:
                seed = (cfg.seed * 1_000_003 + self.step) * 1009 + round_ * 101 + alloc_round
                t0 = time.perf_counter()
                new = self._generate(requests, groups, seed)
                wall = time.perf_counter() - t0
                lengths = new.response_lengths
                rounds.append({"refill": round_, "round": alloc_round, "wall_s": wall, "rollouts": len(new),
                               "tokens": int(lengths.sum()), "max_len": int(lengths.max()),
                               "mean_len": float(lengths.float().mean())})
                for c in comp.values():
                    c.observe_rollouts(new, wall)
                generated += len(new)
                # the verifier could not decide (timeout, crash): reward 0 like a wrong answer, counted apart
                unverifiable += sum(1 for info in new.infos if info.get("verdict") == "unverifiable")
                gen_tokens += int(new.response_lengths.sum())
                gen_reward += float(new.base_rewards.sum())
                part = new if part is None else GroupBatch.concat([part, new])
                requests = comp["rollout_allocator"].more(part)
                alloc_round += 1
            if part is None:
                continue
            inverse, keys = part.group_index()
            spread = group_std(part.base_rewards.double(), inverse, len(keys), unbiased=False)
            groups_generated += len(keys)
            groups_useful += int((spread > 1e-12).sum())  # groups with any reward signal, before any filter
            part = comp["group_transform"](part)
            if part is not None:
                batch = part if batch is None else GroupBatch.concat([batch, part])
        if batch is not None and batch.num_groups > cfg.prompts_per_step:
            keep = set(list(dict.fromkeys(batch.group_ids))[: cfg.prompts_per_step])
            batch = batch.select([i for i, g in enumerate(batch.group_ids) if g in keep])
        self.rollouts_total += generated
        self.tokens_total += gen_tokens
        out = {"rollouts": generated, "refill_rounds": refills,
               "generated_reward_mean": gen_reward / max(1, generated), "gen_tokens": gen_tokens,
               "groups_generated": groups_generated, "groups_useful": groups_useful, "rounds": rounds,
               "unverifiable_rate": unverifiable / max(1, generated)}
        if self.multiturn and self._episode_samples:
            out.update(episode_stats(self._episode_samples))
            out["tool_use_warning"] = int(self.tool_monitor.update(self.step, out["tool_use_rate"]))
        return batch, out

    # -- update ----------------------------------------------------------------------------------------------------
    def _logprobs(self, model: torch.nn.Module, batch: GroupBatch, rows: list[int]) -> tuple[torch.Tensor, ...]:
        return response_logprobs(model, [batch.prompt_ids[i] for i in rows], [batch.response_ids[i] for i in rows],
                                 chunk=self.cfg.logprob_chunk, pad_id=self.pad_id, autocast_bf16=self.autocast_bf16,
                                 temperature=batch.temperature, frozen_prefix=self.frozen_prefix)

    def _no_grad_pass(self, model: torch.nn.Module, prompt_ids: list[list[int]], response_ids: list[list[int]],
                      width: int, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
        """``(logprobs, entropies)`` ``(len(prompt_ids), width)`` of each response after its prompt, no gradients, in
        micro-batches; counted in the run's training FLOPs as one forward pass."""
        self.flops["training"] += self.flop_model.training(
            [len(p) for p in prompt_ids], [len(r) for r in response_ids], passes=0, no_grad_passes=1)
        lp_out, ent_out = torch.zeros(len(prompt_ids), width), torch.zeros(len(prompt_ids), width)
        with torch.no_grad():
            for start in range(0, len(prompt_ids), self.cfg.micro_batch):
                part = slice(start, start + self.cfg.micro_batch)
                lp, ent = response_logprobs(model, prompt_ids[part], response_ids[part], chunk=self.cfg.logprob_chunk,
                                            pad_id=self.pad_id, autocast_bf16=self.autocast_bf16,
                                            temperature=temperature, frozen_prefix=self.frozen_prefix)
                lp_out[part, : lp.shape[1]] = lp.float()
                ent_out[part, : ent.shape[1]] = ent.float()
        return lp_out, ent_out

    def _no_grad_stats(self, model: torch.nn.Module, batch: GroupBatch, rows: list[int] | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(logprobs, entropies)`` (B, W) of ``rows`` (default: all) in micro-batches; other rows stay 0."""
        rows = list(range(len(batch))) if rows is None else rows
        lp_out, ent_out = torch.zeros_like(batch.behaviour_logprobs), torch.zeros_like(batch.entropies)
        lp, ent = self._no_grad_pass(model, [batch.prompt_ids[i] for i in rows],
                                     [batch.response_ids[i] for i in rows], lp_out.shape[1], batch.temperature)
        lp_out[rows], ent_out[rows] = lp, ent
        return lp_out, ent_out

    def current_logprobs(self, batch: GroupBatch, rows: list[int] | None = None) -> torch.Tensor:
        """The current policy's log-probs of ``rows`` of ``batch`` ``(len(rows), W)``, no gradients (a service for
        components, e.g. replay measuring how far the policy drifted from a stored group)."""
        rows = list(range(len(batch))) if rows is None else list(rows)
        return self._no_grad_stats(self.model, batch, rows)[0][rows]

    def context_logprobs(self, batch: GroupBatch, prompt_ids: list[list[int]], rows: list[int] | None = None
                         ) -> torch.Tensor:
        """Log-probs ``(len(rows), W)`` of ``rows``' response tokens under other prompts (``prompt_ids``, one per row:
        a hint, feedback), current policy, no gradients (a service; counted in the run's FLOPs)."""
        rows = list(range(len(batch))) if rows is None else list(rows)
        if len(prompt_ids) != len(rows):
            raise ValueError(f"context_logprobs: {len(prompt_ids)} prompts for {len(rows)} rows")
        return self._no_grad_pass(self.model, [list(p) for p in prompt_ids], [batch.response_ids[i] for i in rows],
                                  batch.response_mask.shape[1], batch.temperature)[0]

    def _context_stats(self, batch: GroupBatch, rows: list[int], teacher: list[list[int]], loss_fn: Any
                       ) -> ContextStats:
        """Student statistics of ``rows`` with gradients, and the teacher's under ``teacher`` prompts (a loss that
        distills from the policy reading a privileged context: ``loss.teacher_prompt_ids``)."""
        self.flops["training"] += self.flop_model.training(
            [len(p) for p in teacher], [len(batch.response_ids[i]) for i in rows], passes=0, no_grad_passes=1)
        return context_stats(self.model, [batch.prompt_ids[i] for i in rows], teacher,
                             [batch.response_ids[i] for i in rows], divergence=getattr(loss_fn, "divergence", "none"),
                             beta=getattr(loss_fn, "beta", 0.5), temperature=batch.temperature,
                             chunk=self.cfg.logprob_chunk, pad_id=self.pad_id, autocast_bf16=self.autocast_bf16,
                             teacher_model=self.teacher_model)

    def extra_generate(self, prompts: list[str] | list[list[int]], n: int, *, max_new_tokens: int | None = None,
                       temperature: float | None = None, seed: int = 0) -> list[Any]:
        """Rollouts a component asks for beside the step's own (a service: Monte-Carlo continuations from a prefix
        given as token ids). Sampled like the rollouts unless told otherwise; counted in the run's generation FLOPs
        and in ``extra_tokens``, never in the rollout or token totals that compare methods' data budgets."""
        sampling = make_sampling(temperature=self.cfg.temperature if temperature is None else temperature,
                                 top_p=self.cfg.top_p, max_new_tokens=max_new_tokens or self.cfg.max_new_tokens,
                                 seed=int(seed))
        rollouts = self.engine.generate(prompts, n, sampling)
        self.flops["generation"] += self.flop_model.generation(
            [len(ro.prompt_ids) for ro in rollouts], [len(ro.response_ids) for ro in rollouts],
            [len(rollouts[k * n].prompt_ids) for k in range(len(prompts))])
        self.extra_tokens += sum(len(ro.response_ids) for ro in rollouts)
        return rollouts

    def update(self, batch: GroupBatch) -> dict[str, float]:
        cfg, loss_fn = self.cfg, self.components["loss"]
        self.model.train()
        if self.ref_model is not None:
            batch.ref_logprobs = self._no_grad_stats(self.ref_model, batch)[0]
        if cfg.ppo_epochs > 1:
            batch.old_logprobs = self._no_grad_stats(self.model, batch)[0]
        totals: dict[str, float] = defaultdict(float)
        ent_sum = 0.0
        params = [p for p in self.model.parameters() if p.requires_grad]
        # a distillation loss names the teacher's prompt for each row; it then reads both contexts' statistics
        # (rendered once per update, not per micro-batch and epoch: rendering can run a solver)
        teacher_prompts = getattr(loss_fn, "teacher_prompt_ids", None)
        teacher = None if teacher_prompts is None else teacher_prompts(batch, list(range(len(batch))))
        if teacher is not None and len(teacher) != len(batch):
            raise ValueError(f"{loss_fn.name}: teacher_prompt_ids gave {len(teacher)} prompts for {len(batch)} rows")
        self.flops["training"] += self.flop_model.training(
            [len(p) for p in batch.prompt_ids], [len(r) for r in batch.response_ids], passes=cfg.ppo_epochs)
        batch.policy_logprobs = torch.zeros_like(batch.behaviour_logprobs, dtype=torch.float32)
        for epoch in range(cfg.ppo_epochs):
            self.optimizer.zero_grad(set_to_none=True)
            loss_total = 0.0
            for start in range(0, len(batch), cfg.micro_batch):
                rows = list(range(start, min(len(batch), start + cfg.micro_batch)))
                if teacher is None:
                    lp, ent = self._logprobs(self.model, batch, rows)
                    loss, m = loss_fn(batch, lp.float(), rows)
                else:
                    stats = self._context_stats(batch, rows, [teacher[i] for i in rows], loss_fn)
                    lp, ent = stats.logprobs, stats.entropies
                    loss, m = loss_fn(batch, lp.float(), rows, context=stats)
                if epoch == 0:  # no optimizer step yet: the policy the rollouts were sampled for
                    batch.policy_logprobs[rows, :lp.shape[1]] = lp.detach().float()
                loss.backward()
                loss_total += float(loss.detach())
                for k, v in m.items():
                    totals[k] += v
                ent_sum += float(ent.sum())
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm))
            self.optimizer.step()
        self.model.eval()
        tokens = max(1.0, totals.get("tokens", 1.0))
        out = {"loss": loss_total, "grad_norm": grad_norm, "policy_entropy": ent_sum / tokens,
               "clip_frac": totals.get("clipped_tokens", 0.0) / tokens}
        if "kl_sum" in totals:
            out["kl"] = totals["kl_sum"] / tokens
        return out

    # -- evaluation ------------------------------------------------------------------------------------------------
    def evaluate(self, *, final: bool = False) -> dict[str, float]:
        """The first ``eval_size`` tasks of the held-out env, ``eval_samples`` each at ``eval_temperature`` (greedy by
        default), scored by the env (base reward). Sampling draws from a seed fixed for the run, so every eval of a
        run, and the paired runs of two methods with one seed, use the same random numbers. ``final``: the run's last
        eval, which reads ``final_eval_size`` tasks when that is larger (``final_eval_*`` fields; the ``eval_*``
        fields keep covering the first ``eval_size``, so the curve stays one task set)."""
        size = len(self.eval_env.unwrapped.source)
        n_main = min(self.cfg.eval_size, size)
        n = max(n_main, min(self.cfg.final_eval_size, size)) if final and not self.multiturn else n_main
        if n == 0:
            return {}
        t0 = time.perf_counter()
        prompts, task_ids, messages = [], [], []
        for i in range(n):
            _, info = self.eval_env.reset(options={"index": i})
            prompts.append(self.policy.prompt_text(info["messages"]))
            task_ids.append(info["task_id"])
            messages.append(info["messages"])
        k = self.cfg.eval_samples

        def eval_sampling(chunk: int) -> Any:
            # chunk 0 (the curve's tasks) draws from the run's seed, as every eval does; a larger final set's later
            # chunks from seeds derived from it, so no two tasks of one eval share random numbers
            seed = self.cfg.seed if chunk == 0 else int(
                np.random.SeedSequence([self.cfg.seed, chunk]).generate_state(1, np.uint64)[0] >> 1)
            return make_sampling(temperature=self.cfg.eval_temperature,
                                 max_new_tokens=self.cfg.eval_max_new_tokens or self.cfg.max_new_tokens, seed=seed)

        sampling = eval_sampling(0)
        # A generation controller that shapes what a response is (per-mode hard caps) decodes the eval too through
        # its ``generate_eval`` hook, so that held-out lengths and verdicts are those of the policy as it is deployed;
        # training-only controllers (aborts, hints) never touch the eval.
        if self.multiturn:
            return self._evaluate_episodes(n, k, sampling, t0)
        controlled = getattr(self.components["generation_controller"], "generate_eval", None)
        # several policies deployed together (Agon's cascade) answer the eval as they are deployed, too
        cascade = getattr(self.components["orchestrator"], "generate_eval", None)
        # Decoded eval_size tasks at a time: one call with thousands of rows runs the engine's continuous batching
        # into an ever longer cache (a 1,000-task x 4 final eval of the micro policy took 522 s against ~16 s for
        # 200 tasks); chunks keep its cost linear in the number of tasks.
        rollouts = []
        for chunk, lo in enumerate(range(0, n, max(1, n_main))):
            hi, part = min(n, lo + max(1, n_main)), eval_sampling(chunk)
            if cascade is not None:
                rollouts += cascade(self, prompts[lo:hi], messages[lo:hi], k, part)
            elif controlled is not None:
                rollouts += controlled(self.engine, prompts[lo:hi], k, part)
            else:
                rollouts += self.engine.generate(prompts[lo:hi], k, part)
        correct, rewards, lengths, records = [], [], [], []
        for j, ro in enumerate(rollouts):
            self.eval_env.reset(options={"task_id": task_ids[j // k]})
            reward, info = step_single_turn(self.eval_env, ro.text)
            correct.append(bool(info.get("correct", reward > 0)))
            rewards.append(float(reward))
            lengths.append(len(ro.response_ids))
            records.append({"response": ro.text, "parsed_answer": info.get("parsed_answer"), "correct": correct[-1]})
        per_task = np.asarray(correct, dtype=int).reshape(n, k).sum(axis=1)
        final_fields: dict[str, Any] = {}
        if n > n_main:  # the final eval's larger set; the eval_* fields below read its first n_main tasks
            final_fields = {"final_eval_accuracy": float(np.mean(correct)), "final_eval_n": n,
                            "final_eval_len_mean": float(np.mean(lengths)),
                            "final_eval_correct": "".join(str(c) for c in per_task) if k == 1 else per_task.tolist()}
            n, per_task = n_main, per_task[:n_main]
            correct, rewards, lengths, records = (x[:n_main * k] for x in (correct, rewards, lengths, records))
        # eval_correct: per-task results in task order (a 0/1 string, or correct counts out of eval_samples), so two
        # runs on the same tasks can be compared pairwise
        out = {"eval_accuracy": float(np.mean(correct)), "eval_reward": float(np.mean(rewards)),
               "eval_len_mean": float(np.mean(lengths)), "eval_n": n, "eval_samples": k,
               "eval_s": time.perf_counter() - t0,
               "eval_correct": "".join(str(c) for c in per_task) if k == 1 else per_task.tolist(), **final_fields}
        task_meta = getattr(self.eval_env.unwrapped.source.task(0), "metadata", None) or {}
        if k > 1 and "numbers" in task_meta and "target" in task_meta:
            # Countdown: how many distinct correct solutions per problem, and how varied their first operations are
            # (rlvr_envs.harness.coverage), per task in task order too, so two runs compare pairwise
            from rlvr_envs.harness.coverage import task_stats

            stats = [task_stats(records[i * k:(i + 1) * k]) for i in range(n)]
            out.update(eval_coverage=float(np.mean([s["solutions"] for s in stats])),
                       eval_entrances=float(np.mean([s["entrances"] for s in stats])),
                       eval_entrance_entropy=float(np.mean([s["entrance_entropy_all"] for s in stats])),
                       eval_solutions=[s["solutions"] for s in stats])
        return out

    def _evaluate_episodes(self, n: int, k: int, sampling: Any, t0: float) -> dict[str, float]:
        """Multi-turn eval: the first ``n`` held-out tasks, ``k`` episodes each, seeded as ``rlvr eval --seed`` with
        the run's seed seeds them (the same episodes as the harness for the same weights)."""
        from agents.policy.agent import PolicyAgent

        items = [(i, j, i) for i in range(n) for j in range(k)]
        agent = PolicyAgent(self.policy, self.engine, sampling)
        episodes = play(agent, self.eval_pool, items, run_seed=self.cfg.seed)
        samples = episode_samples(agent, items, episodes, lambda u: ("eval", {"prompt": "", "task_id": u, "index": u,
                                                                              "metadata": {}, "messages": []}))
        correct = [s.correct for s in samples]
        per_task = np.asarray(correct, dtype=int).reshape(n, k).sum(axis=1)
        stats = episode_stats(samples)
        return {"eval_accuracy": float(np.mean(correct)), "eval_reward": float(np.mean([s.reward for s in samples])),
                "eval_len_mean": float(np.mean([sum(s.token_mask) for s in samples])), "eval_n": n, "eval_samples": k,
                "eval_s": time.perf_counter() - t0,
                "eval_correct": "".join(str(c) for c in per_task) if k == 1 else per_task.tolist(),
                **{f"eval_{key}": v for key, v in stats.items()}}

    # -- checkpoints -----------------------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        trainable = set(self.trainable)
        return {
            "step": self.step, "rollouts_total": self.rollouts_total, "tokens_total": self.tokens_total,
            "extra_tokens": self.extra_tokens, "flops": dict(self.flops), "config": self.cfg.to_dict(),
            "model": {k: v.detach().clone() for k, v in self.model.named_parameters() if k in trainable},
            "optimizer": self.optimizer.state_dict(),
            "components": {stage: c.state_dict() for stage, c in self.components.items()},
            "rng": checkpoint.rng_state(),
        }

    def save(self) -> Path:
        return checkpoint.save(self.out, self.step, self.state(), keep=self.cfg.keep_checkpoints)

    def resume(self) -> bool:
        """Load the newest checkpoint in ``out_dir`` if there is one; metrics past it are dropped."""
        path = checkpoint.latest(self.out)
        if path is None:
            return False
        state = checkpoint.load(path)
        mine, theirs = self.cfg.to_dict(), state.get("config", {})
        changed = sorted(k for k in mine if k not in RESUME_MAY_CHANGE and k in theirs and mine[k] != theirs[k])
        if changed:
            raise ValueError(f"{path} was written by a different recipe ({', '.join(changed)} differ); use another "
                             f"out_dir or start over with --fresh")
        params = dict(self.model.named_parameters())
        missing = set(state["model"]) - set(params)
        if missing or set(state["model"]) != set(self.trainable):
            raise ValueError(f"{path}: trainable parameters differ from this run's (train_layers changed?)")
        with torch.no_grad():
            for k, v in state["model"].items():
                params[k].copy_(v)
        self.optimizer.load_state_dict(state["optimizer"])
        for stage, c in self.components.items():
            c.load_state_dict(state["components"].get(stage, {}))
        checkpoint.set_rng_state(state["rng"])
        self.engine.sync_weights(self.model)  # the engine was built from the initial weights
        self.step, self.rollouts_total = int(state["step"]), int(state["rollouts_total"])
        self.tokens_total = int(state.get("tokens_total", 0))
        self.extra_tokens = int(state.get("extra_tokens", 0))
        self.flops = {k: float(v) for k, v in state.get("flops", {"generation": 0.0, "training": 0.0}).items()}
        self.metrics.truncate_after(self.step)
        return True

    # -- the loop --------------------------------------------------------------------------------------------------
    def train_step(self) -> dict[str, Any]:
        # A federating aggregator (FGRPO) runs the step as a round of its clients: they generate and train; this run
        # holds the server's weights, optimizer, evals and checkpoints.
        # An orchestrator of several policies (Agon) runs the step itself the same way: this run holds the first policy.
        for stage, hook in (("aggregator", "federated_step"), ("orchestrator", "orchestrated_step")):
            run_step = getattr(self.components[stage], hook, None)
            if run_step is not None:
                record = run_step(self)
                record.update({f"{stage}.{k}": v for k, v in self.components[stage].metrics().items()})
                return record
        t0 = time.perf_counter()
        capture = contextlib.nullcontext()
        if self.frozen_prefix is not None:  # only this step's rollouts are looked up
            self.frozen_prefix.clear()
            capture = self.frozen_prefix.capturing()
        with capture:
            batch, gen = self.collect()
        t_gen = time.perf_counter() - t0
        record: dict[str, Any] = {"kind": "train", "step": self.step, **gen, "rollouts_total": self.rollouts_total,
                                  "tokens_total": self.tokens_total}
        if batch is None:  # every group dropped and no refill left: nothing to learn from this step
            for stage, c in self.components.items():
                record.update({f"{stage}.{k}": v for k, v in c.metrics().items()})
            record.update(groups=0, skipped=True, **self.flop_record())
            return record
        comp = self.components
        batch.rewards = comp["reward_shaper"](batch).float()
        batch.advantages = comp["advantage"](batch)
        batch = comp["replay_buffer"](batch)
        upd = self.update(batch)
        if self.frozen_prefix is not None:
            upd["frozen_prefix_hits"] = self.frozen_prefix.hits
            self.frozen_prefix.clear()  # its states took the step's memory; the next step captures its own
        comp["aggregator"].after_update(self.model, batch)
        # After the update's last optimizer step (and any merge): the next rollouts and eval see the new weights.
        self.engine.sync_weights(self.model)
        for c in comp.values():
            c.observe(batch)
        for stage, c in comp.items():
            record.update({f"{stage}.{k}": v for k, v in c.metrics().items()})
        record.update(
            groups=batch.num_groups, samples=len(batch), reward_mean=float(batch.base_rewards.mean()),
            shaped_reward_mean=float(batch.rewards.mean()), accuracy=float(batch.correct.float().mean()),
            response_len_mean=float(batch.response_lengths.float().mean()),
            sampler_entropy=float((batch.entropies * batch.response_mask).sum() / batch.response_mask.sum().clamp(min=1)),
            adv_abs_mean=float(batch.advantages.abs().mean()), **upd,
            gen_s=t_gen, train_s=time.perf_counter() - t0 - t_gen, **self.flop_record(),
            peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
        return record

    def flop_record(self) -> dict[str, float]:
        """Cumulative FLOPs so far (``agents.grpo.flops``): generation, training and their sum."""
        gen, train = self.flops["generation"], self.flops["training"]
        out = {"flops_gen": gen, "flops_train": train, "flops_total": gen + train}
        if self.extra_tokens:  # only runs whose components generate beside the rollouts carry it
            out["extra_tokens"] = self.extra_tokens
        return out

    def over_flop_budget(self) -> bool:
        return bool(self.cfg.flop_budget) and self.flops["generation"] + self.flops["training"] >= self.cfg.flop_budget

    def run(self, *, resume: bool = True, stop_after: int | None = None) -> list[dict[str, Any]]:
        """Train to ``cfg.steps`` (resuming from ``out_dir`` unless ``resume=False``); ``stop_after`` ends the session
        early at that step, as a kill would, without the final eval or checkpoint."""
        cfg = self.cfg
        self.out.mkdir(parents=True, exist_ok=True)
        resumed = resume and self.resume()
        if not resumed:
            self.metrics.path.unlink(missing_ok=True)
            if cfg.eval_size:
                self.metrics.write({"kind": "eval", "step": 0, **self.evaluate()})
        bar = None
        if cfg.progress:
            from tqdm import tqdm

            bar = tqdm(total=cfg.steps, initial=self.step, desc=Path(cfg.out_dir).name, unit="step")
        while (self.step < cfg.steps and not self.over_flop_budget()
               and (stop_after is None or self.step < stop_after)):
            self.step += 1
            record = self.train_step()
            self.metrics.write(record)
            last = self.step == cfg.steps or self.over_flop_budget()
            if cfg.eval_size and (last or (cfg.eval_every and self.step % cfg.eval_every == 0)):
                ev = self.evaluate(final=last)
                self.metrics.write({"kind": "eval", "step": self.step, **ev})
                record.update(ev)
            if last or (cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0):
                self.save()
            if bar is not None:
                bar.update(1)
                bar.set_postfix(reward=f"{record.get('reward_mean', float('nan')):.3f}",
                                acc=f"{record.get('eval_accuracy', float('nan')):.3f}")
        if bar is not None:
            bar.close()
        records = self.metrics.read()
        if cfg.plot:
            plot_curves(records, self.out / "curves.png")
        return records
