"""``evaluate_ray(agent_factory, env_id, ...)``: the harness's evaluation sharded over Ray actors (``rlvr eval --ray``).

Each actor builds the agent once (``agent_factory()``: loads the policy) and its own env, then plays whole batches
(shards) that the driver hands it: the same batches ``evaluate`` would cut (``batch_size`` units, same composition),
seeded by ``sample_seed(seed, task_index, sample_index)``, through the same ``_run_batch``. The driver keeps every
actor busy with one shard, writes each finished shard to the sidecar as it arrives (progress, ``--resume``) and writes
the results file with ``run_evaluation``'s code, so the records and metrics equal a single-process run's.

What differs from a single-process file, by nature: ``timing`` (per-batch times are measured on the actors, and the
sum is not the elapsed time), ``provenance.created_at`` / ``argv`` / ``resumed_at``, and ``provenance.ray`` (only in
Ray runs: address, workers, nodes, worker deaths, re-run shards, shards per worker, actor startup and elapsed seconds). ``provenance.machine`` is the first actor's (the machine
that ran the agent, as in a single-process run); ``provenance.agent`` must be the same on every actor, else the run
stops (workers that loaded different weights cannot make one results file).

An actor that dies (process killed, node lost) has its shard re-run on a freshly started actor; a shard that has
killed ``max_attempts`` actors stops the run. An exception raised by the agent is a bug, not a lost worker: it
propagates as in a single-process run.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Generator, Mapping
from pathlib import Path
from typing import Any

from rlvr_envs.extras import require
from rlvr_envs.harness.evaluate import Agent, Results, _run_batch, describe_agent, run_evaluation, sidecar_path

# A shard that has killed this many actors is not retried again: it would most likely kill the next one too.
DEFAULT_MAX_ATTEMPTS = 3


class EvalWorker:
    """The actor: one agent and one env pool; ``run_batch`` plays one shard exactly as ``evaluate`` would."""

    def __init__(self, driver_sys_path: list[str], agent_factory_pickle: bytes, env_id: str,
                 env_kwargs: dict[str, Any], config: dict[str, Any], remote: str | None = None):
        # The driver's import path first, then the factory: it may name modules (--agent module:attr) that only the
        # driver's path reaches. Paths missing on a remote node are skipped by the import system.
        sys.path.extend(p for p in driver_sys_path if p not in sys.path)
        import gymnasium as gym
        from ray import cloudpickle

        import rlvr_envs  # noqa: F401  (registers the IDs)
        from rlvr_envs.core import TextEnv
        from rlvr_envs.harness.evaluate import EnvPool

        self.agent = cloudpickle.loads(agent_factory_pickle)()
        env = gym.make(env_id, **env_kwargs)
        self.source = env.unwrapped.source
        if remote is None:
            self.pool = EnvPool(env, lambda: gym.make(env_id, **env_kwargs))
        else:  # as evaluate(remote=...): the local env gives the tasks, served sessions play the episodes
            from rlvr_envs.remote import RemoteEnv

            def play() -> Any:
                return RemoteEnv(remote, env_id, env_kwargs=env_kwargs)

            self.pool = EnvPool(play(), play, single_turn=isinstance(env.unwrapped, TextEnv), owns_first=True)
            env.close()
        self.config = config

    def hello(self) -> dict[str, Any]:
        """What the driver checks before trusting this actor: agent provenance, data fingerprint, machine."""
        import ray

        from rlvr_envs.harness.results import machine_info

        return {"agent": describe_agent(self.agent), "fingerprint": self.source.fingerprint, "machine": machine_info(),
                "node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}

    def run_batch(self, batch: int, units: list[tuple[int, int]]) -> dict[str, Any]:
        return _run_batch(self.agent, self.pool, self.source, self.config, batch, [tuple(u) for u in units])


def _worker_name(hello: Mapping[str, Any]) -> str:
    return f"{hello['node_id'][:8]}:{hello['pid']}"


class ShardedRunner:
    """Starts the actors, checks they agree, and plays pending batches on them (a ``BatchRunner``)."""

    def __init__(self, ray: Any, agent_factory: Callable[[], Agent], env_id: str, env_kwargs: dict[str, Any],
                 n_workers: int, cpus_per_worker: float, gpus_per_worker: float, max_attempts: int,
                 log: Callable[[str], None], remote: str | None = None):
        self.ray, self.env_id, self.env_kwargs, self.remote = ray, env_id, env_kwargs, remote
        self.n_workers, self.max_attempts, self.log = n_workers, max_attempts, log
        self.actor_class = ray.remote(num_cpus=cpus_per_worker, num_gpus=gpus_per_worker, max_restarts=0,
                                      max_task_retries=0)(EvalWorker)
        # Pickled here, unpickled in the actor after its sys.path is extended (see EvalWorker).
        self.factory_pickle = ray.cloudpickle.dumps(agent_factory)
        self.actors: list[Any] = []
        self.unchecked: set[Any] = set()  # replacement actors whose hello has not been checked yet
        self.idle: list[Any] = []  # started actors with no shard in flight
        self.hello: dict[str, Any] | None = None  # the first actor's, which every other must match
        self.config: dict[str, Any] = {}
        self.fingerprint = ""
        # provenance.ray of the results file: the same dict, so deaths during the run show in the file
        self.stats: dict[str, Any] = {"workers": n_workers, "worker_deaths": 0, "rerun_batches": [],
                                      "shards_per_worker": {}}
        self.names: dict[Any, str] = {}  # actor -> "node:pid", from its hello

    def _start(self, config: Mapping[str, Any]) -> Any:
        actor = self.actor_class.remote(list(sys.path), self.factory_pickle, self.env_id, self.env_kwargs,
                                        dict(config), self.remote)
        self.actors.append(actor)
        return actor

    def _check(self, hello: dict[str, Any], fingerprint: str) -> None:
        if hello["fingerprint"] != fingerprint:
            raise RuntimeError(f"a Ray worker (node {hello['node_id']}) sees other task data than the driver "
                               f"(fingerprint {hello['fingerprint']} vs {fingerprint})")
        if self.hello is not None and hello["agent"] != self.hello["agent"]:
            raise RuntimeError(f"Ray workers built different agents: {hello['agent']} vs {self.hello['agent']}")

    def start(self, config: Mapping[str, Any], fingerprint: str) -> None:
        """Start ``n_workers`` actors and wait until each has built its agent (the policy loads in parallel)."""
        self.config = dict(config)
        t0 = time.perf_counter()
        actors = [self._start(config) for _ in range(self.n_workers)]
        hellos = self.ray.get([a.hello.remote() for a in actors])  # a failing agent factory raises here, once
        for actor, hello in zip(actors, hellos):
            self._check(hello, fingerprint)
            self.hello = self.hello or hello
            self.names[actor] = _worker_name(hello)
        self.stats["nodes"] = len({h["node_id"] for h in hellos})
        self.stats["startup_s"] = round(time.perf_counter() - t0, 3)  # actors up, agents built
        self.fingerprint = fingerprint
        self.idle = list(actors)

    def _replace(self, dead: Any) -> None:
        """Start a new actor for a dead one; its hello is checked with its first shard's result, so the driver does
        not wait for it to load the policy."""
        self.ray.kill(dead, no_restart=True)  # already gone in the usual case; releases its resources otherwise
        self.actors.remove(dead)
        self.unchecked.discard(dead)
        fresh = self._start(self.config)
        self.unchecked.add(fresh)
        self.idle.append(fresh)

    def __call__(self, env: Any, make_env: Callable[[], Any], source: Any, config: Mapping[str, Any],
                 pending: list[tuple[int, list[tuple[int, int]]]]) -> Generator[dict[str, Any], None, None]:
        ray = self.ray
        t0 = time.perf_counter()
        queue = list(pending)
        attempts = {b: 0 for b, _ in pending}
        in_flight: dict[Any, tuple[Any, int, list[tuple[int, int]], Any]] = {}  # ref -> (actor, batch, units, hello)
        while queue or in_flight:
            while queue and self.idle:
                actor = self.idle.pop()
                batch, units = queue.pop(0)
                attempts[batch] += 1
                hello_ref = actor.hello.remote() if actor in self.unchecked else None
                in_flight[actor.run_batch.remote(batch, units)] = (actor, batch, units, hello_ref)
            done, _ = ray.wait(list(in_flight), num_returns=1)
            ref = done[0]
            actor, batch, units, hello_ref = in_flight.pop(ref)
            try:
                line = ray.get(ref)
                hello = ray.get(hello_ref) if hello_ref is not None else None
            except ray.exceptions.RayActorError as exc:
                # The worker process is gone (killed, out of memory, node lost): its shard goes back to the queue
                # and a new actor takes the dead one's place. An exception raised by the agent is a RayTaskError
                # instead and propagates from ray.get, as it would in a single-process run.
                self.stats["worker_deaths"] += 1
                self.stats["rerun_batches"].append(batch)
                if attempts[batch] >= self.max_attempts:
                    raise RuntimeError(f"shard {batch} killed {attempts[batch]} Ray workers; giving up "
                                       f"(last: {exc})") from exc
                self.log(f"Ray worker died on shard {batch} ({type(exc).__name__}); re-running it on a new worker")
                queue.insert(0, (batch, units))
                self._replace(actor)
                continue
            if hello is not None:
                self._check(hello, self.fingerprint)
                self.unchecked.discard(actor)
                self.names[actor] = _worker_name(hello)
            shards = self.stats["shards_per_worker"]
            shards[self.names[actor]] = shards.get(self.names[actor], 0) + 1
            # the driver's elapsed time over the shards (timing.wall_time_s sums per-shard times over all workers)
            self.stats["elapsed_s"] = round(time.perf_counter() - t0, 3)
            self.idle.append(actor)
            yield line

    def close(self) -> None:
        for actor in self.actors:
            self.ray.kill(actor, no_restart=True)
        self.actors = []


def _log(message: str) -> None:
    # Worker deaths are always reported; --no-progress only hides the bar and the startup line.
    print(f"rlvr eval --ray: {message}", file=sys.stderr, flush=True)


def init_ray(address: str | None, num_cpus: int | None) -> bool:
    """Start a local Ray (``address`` None or "local") or connect to a cluster; join one that is already initialized.
    Returns whether this call initialized it (the caller shuts it down then)."""
    ray = require("ray", "ray", "rlvr eval --ray")
    if ray.is_initialized():
        return False
    if address in (None, "local"):
        ray.init(num_cpus=num_cpus or os.cpu_count(), include_dashboard=False)
    else:
        ray.init(address=address)
    return True


def evaluate_ray(
    agent_factory: Callable[[], Agent],
    env_id: str,
    *,
    n_samples: int = 1,
    seed: int = 0,
    limit: int | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
    out: str | os.PathLike | None = None,
    resume: bool = False,
    progress: bool = True,
    batch_size: int = 8,
    address: str | None = None,
    num_cpus: int | None = None,
    workers: int | None = None,
    cpus_per_worker: float = 1.0,
    gpus_per_worker: float = 0.0,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    remote: str | None = None,
) -> Results:
    """``evaluate`` over Ray actors, each with its own ``agent_factory()`` agent; the same results for the same seeds.

    ``address``: None or "local" starts a local Ray with ``num_cpus`` CPUs (default: all), anything else is passed
    to ``ray.init(address=...)``; an already initialized Ray is joined as it is. ``workers`` (default: as many as
    the cluster's CPUs / GPUs allow for ``cpus_per_worker`` / ``gpus_per_worker``, at most one per shard; on a shared
    cluster pass fewer: actors wait for their resources). ``remote``: an ``rlvr serve`` URL; every actor then plays
    its episodes on served sessions (as ``evaluate(remote=...)``), and ``provenance["remote"]`` records it."""
    ray = require("ray", "ray", "rlvr eval --ray")
    import gymnasium as gym

    import rlvr_envs  # noqa: F401  (registers the IDs)

    if min(n_samples, batch_size, max_attempts, workers or 1, limit or 1) < 1:
        raise ValueError("n_samples, batch_size, limit, workers and max_attempts must be >= 1")
    out_path = Path(out) if out is not None else None
    if out_path is not None and not resume:  # before starting Ray and loading the policy on every worker
        existing = [p for p in (out_path, sidecar_path(out_path)) if p.exists()]
        if existing:
            raise FileExistsError(f"{existing[0]} exists; pass resume=True (--resume) to continue it, or remove it")
    env_kwargs = dict(env_kwargs or {})
    probe = gym.make(env_id, **env_kwargs)
    try:
        source = getattr(probe.unwrapped, "source", None)
        if source is None:
            raise TypeError(f"{env_id} has no task source (env.unwrapped.source); the harness evaluates text envs")
        fingerprint = source.fingerprint
        n_tasks = len(source) if limit is None else min(limit, len(source))
    finally:
        probe.close()
    n_shards = -(-n_tasks * n_samples // batch_size)  # evaluate's batches: one shard each
    if remote is not None:  # an unreachable server or an env it does not serve fails here, before any actor starts
        from rlvr_envs.remote import RemoteEnv

        RemoteEnv(remote.rstrip("/"), env_id, env_kwargs=env_kwargs).close()

    started = init_ray(address, num_cpus)
    runner = None
    try:
        if workers is None:
            # The cluster's totals, not what is free this instant: resources of actors just killed (a previous run
            # in this Ray) come back asynchronously, and a new actor simply waits for them.
            total = ray.cluster_resources()
            fits = [total.get("CPU", 0) // cpus_per_worker if cpus_per_worker > 0 else n_shards]
            if gpus_per_worker > 0:
                fits.append(total.get("GPU", 0) // gpus_per_worker)
            workers = max(1, int(min(fits)))
        url = remote.rstrip("/") if remote is not None else None
        runner = ShardedRunner(ray, agent_factory, env_id, env_kwargs, min(workers, n_shards), cpus_per_worker,
                               gpus_per_worker, max_attempts, _log, remote=url)
        config = {"env_id": env_id, "env_kwargs": env_kwargs, "n_samples": int(n_samples), "seed": int(seed)}
        runner.start(config, fingerprint)
        if progress:
            _log(f"{runner.n_workers} workers ready on {runner.stats['nodes']} node(s); {n_shards} shards")
        runner.stats["address"] = address or "local"
        return run_evaluation(env_id, describe=lambda: runner.hello["agent"], run_batches=runner,
                              n_samples=n_samples, seed=seed, limit=limit, env_kwargs=env_kwargs, out=out,
                              resume=resume, progress=progress, batch_size=batch_size,
                              provenance_extra={"machine": runner.hello["machine"], "ray": runner.stats,
                                                **({"remote": {"url": url}} if url is not None else {})})
    finally:
        if runner is not None:
            runner.close()
        if started:
            ray.shutdown()
