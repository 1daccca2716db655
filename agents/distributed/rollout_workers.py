"""``RayRolloutEngine``: a rollout engine whose requests are spread over Ray actors, each holding its own engine
(``hf`` on CPU, ``vllm`` on a GPU). The trainer uses it like any engine: ``generate`` and ``sync_weights``.

- Same rollouts for any worker count: each prompt gets its own seed (the caller's ``seeds``, else one drawn from
  ``sampling.seed`` and the prompt's index in the call), and every engine makes rollout ``j`` of a prompt depend only
  on ``(seed, j)``. Which worker decodes a prompt therefore changes nothing. (The seeds are not the in-process engine's
  own per-call streams: a run with a worker pool equals itself for any pool size, and samples the same distribution
  as a run without one.)
- Weights: ``sync_weights(model)`` puts the trainable tensors in Ray's object store once and every worker loads them
  before its next request (the trainer calls it after each update).
- A worker that dies stops the call with an error naming it; nothing restarts it silently.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from agents.policy.engine import Rollout, RolloutEngine, SamplingParams


def prompt_seeds(n_prompts: int, sampling: SamplingParams, seeds: Sequence[int] | None) -> list[int]:
    """One seed per prompt: ``seeds`` as given, else derived from ``sampling.seed`` and the prompt's index (from
    torch's global RNG when the call has no seed, so ``torch.manual_seed`` still makes a run repeatable)."""
    if seeds is not None:
        if len(seeds) != n_prompts:
            raise ValueError(f"seeds has {len(seeds)} entries for {n_prompts} prompts")
        return [int(s) for s in seeds]
    base = sampling.seed if sampling.seed is not None else int(torch.randint(0, 2**62, ()).item())
    return [int(np.random.SeedSequence(int(base), spawn_key=(i,)).generate_state(1, np.uint64)[0] >> 1)
            for i in range(n_prompts)]


def split_evenly(n_items: int, parts: int) -> list[range]:
    """``n_items`` indices in ``parts`` contiguous ranges whose sizes differ by at most one (empty ones dropped)."""
    base, extra = divmod(n_items, parts)
    out, start = [], 0
    for k in range(parts):
        size = base + (k < extra)
        if size:
            out.append(range(start, start + size))
        start += size
    return out


class RolloutWorker:
    """One Ray actor: a private copy of the policy and an engine over it."""

    def __init__(self, policy: Any, backend: str, engine_kwargs: dict[str, Any], threads: int):
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        if threads:
            torch.set_num_threads(threads)
        from agents.policy.engine import make_engine

        self.policy = policy
        self.engine = make_engine(policy, backend=backend, **engine_kwargs)

    def hello(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "engine": self.engine.describe()}

    def load_weights(self, state: dict[str, torch.Tensor]) -> None:
        params = dict(self.policy.model.named_parameters())
        unknown = sorted(set(state) - set(params))
        if unknown:
            raise KeyError(f"rollout worker: no parameters named {unknown[:3]}")
        with torch.no_grad():
            for name, value in state.items():
                params[name].copy_(value)
        self.engine.sync_weights(self.policy.model)

    def generate(self, prompts: list[Any], n: int, sampling: SamplingParams, seeds: list[int]) -> list[Rollout]:
        return self.engine.generate(prompts, n, sampling, seeds=seeds)


class RayRolloutEngine(RolloutEngine):
    """``workers`` Ray actors, each with its own ``backend`` engine over a copy of ``policy``. Starts a local Ray
    unless one is running (``ray.init(address=...)`` first to use a cluster). ``gpus_per_worker`` > 0 places each
    actor on its own GPU (the ``vllm`` backend needs one)."""

    backend = "ray"

    def __init__(self, policy: Any, workers: int = 2, *, backend: str = "hf", engine_kwargs: dict[str, Any] | None = None,
                 cpus_per_worker: float = 1, gpus_per_worker: float = 0, threads: int = 1,
                 start_timeout_s: float = 600):
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        import ray

        if not ray.is_initialized():
            ray.init(num_cpus=max(int(workers * cpus_per_worker), os.cpu_count() or 1), include_dashboard=False,
                     log_to_driver=False)
        self.ray = ray
        self.worker_backend = backend
        self.policy = policy
        actor = ray.remote(num_cpus=cpus_per_worker, num_gpus=gpus_per_worker, max_restarts=0)(RolloutWorker)
        # the model travels once through the object store; each actor deserializes its own copy
        policy_ref = ray.put(policy)
        self.workers = [actor.remote(policy_ref, backend, dict(engine_kwargs or {}), threads) for _ in range(workers)]
        try:
            self.hellos = self._get([w.hello.remote() for w in self.workers], timeout=start_timeout_s)
        except ray.exceptions.GetTimeoutError:
            self.shutdown()
            raise RuntimeError(
                f"{workers} rollout workers ({cpus_per_worker} CPU, {gpus_per_worker} GPU each) did not start within "
                f"{start_timeout_s:.0f} s; Ray has {ray.available_resources()} free of {ray.cluster_resources()}: "
                f"ask for fewer workers or less per worker") from None

    def _get(self, refs: list[Any], timeout: float | None = None) -> list[Any]:
        try:
            return self.ray.get(refs, timeout=timeout)
        except self.ray.exceptions.RayActorError as exc:
            raise RuntimeError(f"a rollout worker died ({exc.__class__.__name__}): {exc}") from exc

    def generate(self, prompts: Sequence[str] | Sequence[Sequence[int]], n: int, sampling: SamplingParams,
                 *, seeds: Sequence[int] | None = None) -> list[Rollout]:
        prompts = list(prompts)
        per_prompt = prompt_seeds(len(prompts), sampling, seeds)
        chunks = split_evenly(len(prompts), len(self.workers))
        refs = [w.generate.remote([prompts[i] for i in chunk], n, sampling, [per_prompt[i] for i in chunk])
                for w, chunk in zip(self.workers, chunks)]
        return [ro for part in self._get(refs) for ro in part]

    def sync_weights(self, model: Any) -> None:
        state = {k: v.detach().cpu() for k, v in model.named_parameters() if v.requires_grad}
        ref = self.ray.put(state)
        self._get([w.load_weights.remote(ref) for w in self.workers])

    def describe(self) -> dict[str, Any]:
        return {"backend": self.backend, "workers": len(self.workers), "worker_backend": self.worker_backend,
                "worker_pids": [h["pid"] for h in self.hellos]}

    def shutdown(self) -> None:
        for w in self.workers:
            self.ray.kill(w, no_restart=True)
        self.workers = []
