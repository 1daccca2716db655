"""Data-parallel GRPO updates with ``torch.distributed``: one trainer process per rank, one code path for gloo (CPU)
and NCCL (GPU).

Rank 0 is the run. It collects each step's rollouts (with its own engine or a pool of rollout workers), runs every
stage on the whole batch, evaluates, writes metrics and checkpoints, exactly as a one-process run does. Every rank
holds the same weights and optimizer state. Each step rank 0 sends the staged batch to the other ranks; every rank
computes the loss and gradients of its share of the groups (a group never splits across ranks), the gradients are
summed over the ranks, and every rank clips and steps the same summed gradient.

Why a sum and not DDP's average: every loss in the registry is normalized by whole-batch constants (token-mean over
the batch's tokens, sequence-mean over its rows, Dr.GRPO's constant length; ``agents/grpo/baselines.py``), and each
rank computes its rows' terms against the *whole* batch, so the ranks' gradients add up to the one-process gradient;
only the order of float additions differs. DDP's wrapper also needs every rank to run the same number of backward
passes, which ragged shares of ragged groups do not; one flat all-reduce per step does what its buckets would.

What stays rank-0-local: rollouts, stages, component state, evals, metrics and checkpoints. Components that run the
step themselves (FGRPO's federated rounds, Agon's orchestration) or change weights after the update (an aggregator)
are refused: their work is not split here.
"""

from __future__ import annotations

import datetime
import hashlib
import os
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist

from agents.grpo.batch import GroupBatch
from agents.grpo.config import TrainConfig
from agents.grpo.trainer import Trainer
from agents.policy.engine import RolloutEngine

# Rank 0 may evaluate for a long time while the other ranks wait in a collective: gloo's default 30 minutes is short.
DEFAULT_TIMEOUT_S = 4 * 3600


def init_process_group(timeout_s: float | None = None) -> tuple[int, int]:
    """Join the process group torchrun describes (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``...); gloo on CPU, NCCL
    when CUDA is available. Returns ``(rank, world_size)``; a process started without torchrun is rank 0 of 1."""
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    if "RANK" not in os.environ:
        return 0, 1
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    timeout = datetime.timedelta(seconds=timeout_s or float(os.environ.get("RLVR_DIST_TIMEOUT_S", DEFAULT_TIMEOUT_S)))
    dist.init_process_group(backend, timeout=timeout)
    return dist.get_rank(), dist.get_world_size()


def rank_shares(batch: GroupBatch, world_size: int) -> list[list[int]]:
    """The batch's rows split into ``world_size`` shares of whole groups, contiguous in batch order, balanced by
    token count (prompt + response, what a forward costs). A share may be empty when there are fewer groups than
    ranks."""
    groups = list(batch.groups().values())
    cost = [sum(len(batch.prompt_ids[i]) + len(batch.response_ids[i]) for i in rows) for rows in groups]
    total = max(1, sum(cost))
    shares: list[list[int]] = [[] for _ in range(world_size)]
    done = 0
    for rows, c in zip(groups, cost):
        # a group goes to the rank whose slice of the cumulative cost holds the group's midpoint
        rank = min(world_size - 1, int((done + c / 2) * world_size / total))
        shares[rank].extend(rows)
        done += c
    return shares


def check_data_parallel(cfg: TrainConfig) -> None:
    """Refuse, before any rank starts, a recipe whose components run or change the step outside the update (FGRPO's
    federated rounds, Agon's orchestration, an aggregator that merges weights after it): their work is not split."""
    from agents.grpo.registry import get

    for stage, hooks in (("aggregator", ("federated_step", "after_update")), ("orchestrator", ("orchestrated_step",))):
        name = cfg.stages.get(stage)
        if name in (None, "none", "single"):
            continue
        found = [h for h in hooks if getattr(get(stage, name), h, None) is not None]
        if found:
            raise ValueError(f"{stage} {name!r} ({', '.join(found)}) is not data-parallel: it runs or changes the "
                             f"step outside the update; train it without --nproc")


class NoRollouts(RolloutEngine):
    """The engine of a rank other than 0: it never generates (rank 0 collects every rollout), so it holds no model
    copy, no vLLM instance and no GPU memory."""

    backend = "none"

    def generate(self, prompts: Any, n: int, sampling: Any, *, seeds: Any = None) -> list:
        raise RuntimeError("only rank 0 generates rollouts in a data-parallel run")

    def sync_weights(self, model: Any) -> None:
        """Nothing decodes here: nothing to copy."""


class DataParallelTrainer(Trainer):
    """``Trainer`` whose update runs on every rank of the process group, each on its share of the groups. Build one
    per rank with the same config; call ``run()`` on every rank."""

    def __init__(self, cfg: TrainConfig, **kwargs: Any):
        self.rank, self.world_size = init_process_group()
        if self.rank != 0 and kwargs.get("engine") is None:
            kwargs["engine"] = NoRollouts()
        self.comm_device = torch.device("cpu")
        if dist.is_initialized() and dist.get_backend() == "nccl":
            self.comm_device = torch.device("cuda", torch.cuda.current_device())
        super().__init__(cfg, **kwargs)
        check_data_parallel(cfg)
        self.params = [p for p in self.model.parameters() if p.requires_grad]

    # -- messages from rank 0 ----------------------------------------------------------------------------------------
    def _broadcast(self, message: Any = None) -> Any:
        box = [message if self.rank == 0 else None]
        dist.broadcast_object_list(box, src=0, device=self.comm_device)
        return box[0]

    def _all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """Sum over ranks, on the backend's device (NCCL reduces CUDA tensors only), returned where ``t`` was."""
        on = t.to(self.comm_device)
        dist.all_reduce(on)
        return on.to(t.device)

    def _share_state(self) -> None:
        """Rank 0 sends its trainable weights and optimizer state to every rank (at start, and after a resume, so a
        run resumed with another rank count starts every rank from the checkpoint)."""
        trainable = set(self.trainable)
        self._broadcast(("state", {"model": {k: v.detach().cpu() for k, v in self.model.named_parameters()
                                             if k in trainable},
                                   "optimizer": self.optimizer.state_dict(), "step": self.step}))

    def _apply_state(self, state: dict[str, Any]) -> None:
        params = dict(self.model.named_parameters())
        with torch.no_grad():
            for k, v in state["model"].items():
                params[k].copy_(v)
        self.optimizer.load_state_dict(state["optimizer"])
        self.step = int(state["step"])

    def resume(self) -> bool:
        resumed = super().resume()  # only rank 0 runs the loop that calls this
        self._share_state()
        return resumed

    # -- the update ---------------------------------------------------------------------------------------------------
    def update(self, batch: GroupBatch) -> dict[str, float]:
        if self.rank == 0:
            self._broadcast(("update", replace(batch, tokenizer=None)))
        return self._update_share(batch)

    def _sum(self, values: list[float]) -> list[float]:
        return self._all_reduce(torch.tensor(values, dtype=torch.float64)).tolist()

    def _fill(self, partial: torch.Tensor) -> torch.Tensor:
        """A (B, W) tensor each rank filled on its own rows (zeros elsewhere), completed on every rank."""
        return self._all_reduce(partial.float()).to(partial.dtype)

    def _update_share(self, batch: GroupBatch) -> dict[str, float]:
        cfg, loss_fn = self.cfg, self.components["loss"]
        mine = rank_shares(batch, self.world_size)[self.rank]
        flops_before = self.flops["training"]
        self.model.train()
        if self.ref_model is not None:
            batch.ref_logprobs = self._fill(self._no_grad_stats(self.ref_model, batch, mine)[0])
        if cfg.ppo_epochs > 1:
            batch.old_logprobs = self._fill(self._no_grad_stats(self.model, batch, mine)[0])
        teacher_prompts = getattr(loss_fn, "teacher_prompt_ids", None)
        teacher = None if teacher_prompts is None or not mine else dict(zip(mine, teacher_prompts(batch, mine)))
        self.flops["training"] += self.flop_model.training(
            [len(batch.prompt_ids[i]) for i in mine], [len(batch.response_ids[i]) for i in mine], passes=cfg.ppo_epochs)
        policy_lp = torch.zeros_like(batch.behaviour_logprobs, dtype=torch.float32)
        loss_sum = ent_sum = 0.0
        totals: dict[str, float] = {}
        for epoch in range(cfg.ppo_epochs):
            self.optimizer.zero_grad(set_to_none=False)  # every rank all-reduces every parameter, used or not
            loss_sum = 0.0
            for start in range(0, len(mine), cfg.micro_batch):
                rows = mine[start:start + cfg.micro_batch]
                if teacher is None:
                    lp, ent = self._logprobs(self.model, batch, rows)
                    loss, m = loss_fn(batch, lp.float(), rows)
                else:
                    stats = self._context_stats(batch, rows, [teacher[i] for i in rows], loss_fn)
                    lp, ent = stats.logprobs, stats.entropies
                    loss, m = loss_fn(batch, lp.float(), rows, context=stats)
                if epoch == 0:
                    policy_lp[rows, :lp.shape[1]] = lp.detach().float()
                loss.backward()
                loss_sum += float(loss.detach())
                for k, v in m.items():
                    totals[k] = totals.get(k, 0.0) + v
                ent_sum += float(ent.sum())
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
            flat = self._all_reduce(torch.cat([g.reshape(-1) for g in grads]))
            offset = 0
            for p, g in zip(self.params, grads):
                p.grad = flat[offset:offset + g.numel()].view_as(p).to(p.dtype)
                offset += g.numel()
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, cfg.max_grad_norm))
            self.optimizer.step()
        self.model.eval()
        batch.policy_logprobs = self._fill(policy_lp)
        gathered: list[Any] = [None] * self.world_size  # a rank with an empty share has no loss metrics
        dist.all_gather_object(gathered, sorted(totals))
        keys = sorted(set().union(*gathered))
        summed = self._sum([loss_sum, ent_sum, self.flops["training"] - flops_before, *[totals.get(k, 0.0) for k in keys]])
        loss_total, ent_total, flops = summed[:3]
        totals = dict(zip(keys, summed[3:]))
        self.flops["training"] = flops_before + flops
        tokens = max(1.0, totals.get("tokens", 1.0))
        out = {"loss": loss_total, "grad_norm": grad_norm, "policy_entropy": ent_total / tokens,
               "clip_frac": totals.get("clipped_tokens", 0.0) / tokens, "ranks": float(self.world_size)}
        if "kl_sum" in totals:
            out["kl"] = totals["kl_sum"] / tokens
        self._check_in_step()
        return out

    def _check_in_step(self) -> None:
        """Every rank's weights hash the same after each step; a rank that drifted (another torch build, a kernel
        that is not deterministic) stops the run instead of training a silent ensemble."""
        h = hashlib.sha256()
        for p in self.params:
            h.update(p.detach().cpu().contiguous().numpy().tobytes())
        digests: list[Any] = [None] * self.world_size
        dist.all_gather_object(digests, h.hexdigest()[:16])
        if len(set(digests)) != 1:
            raise RuntimeError(f"ranks hold different weights after step {self.step}: {digests}")

    # -- the loop -----------------------------------------------------------------------------------------------------
    def run(self, *, resume: bool = True, stop_after: int | None = None) -> list[dict[str, Any]]:
        """Rank 0 runs the one-process loop (its updates are shared); the other ranks follow its messages until it
        stops. Every rank returns once the run has ended; only rank 0 returns the records."""
        if self.rank != 0:
            self._follow()
            return []
        if not resume:  # the loop does not call resume(): start every rank from rank 0's weights
            self._share_state()
        # on an exception rank 0 just raises: torchrun's agent then stops the ranks waiting for its next message
        records = super().run(resume=resume, stop_after=stop_after)
        self._broadcast(("stop", None))
        return records

    def _follow(self) -> None:
        while True:
            kind, payload = self._broadcast()
            if kind == "stop":
                return
            if kind == "state":
                self._apply_state(payload)
            elif kind == "update":
                payload.tokenizer = self.tokenizer
                self.step = payload.step
                self._update_share(payload)
            else:
                raise RuntimeError(f"rank {self.rank}: unknown message {kind!r} from rank 0")
