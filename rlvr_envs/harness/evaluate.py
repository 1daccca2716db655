"""``evaluate(agent, env_id, ...)``: run any agent on any registered text env and write one results file.

An agent is anything with ``act(observations: list[str], infos: list[dict]) -> list[str]``. Each ``infos[i]`` is the
env's reset info plus ``seed`` (this sample's seed), ``task_index``, ``sample_index`` and ``n_samples``; a sampling
agent must draw sample i with ``infos[i]["seed"]`` so results do not depend on batching history. Optional extras the
harness reads: ``describe() -> dict`` (model, weights_hash, n_params, sampling ...; goes into provenance), responses
returned as objects with ``.text`` and ``.response_ids`` (token counts), or ``agent.last_token_counts`` (list[int]).

Multi-turn envs (anything that is not a single-turn ``TextEnv``: tool and search envs) run their episodes in
lockstep, one env instance per episode of the batch: every act() call gets the still-running episodes' observations;
``infos[i]["turn_index"]`` counts turns and ``infos[i]["seed"]`` is a fresh seed per turn (turn 0: the sample's seed).
The record keeps every agent turn (``turns``) and the final turn as ``response``.

Durability: the units (task_index, sample_index) are cut into fixed batches of ``batch_size``; each finished batch is
appended as one JSON line to ``<out>.partial.jsonl`` and fsynced. Ctrl-C writes a partial results file and keeps the
sidecar; a SIGKILL keeps the sidecar. ``resume=True`` redoes only the batches that are not complete, with the same
composition and the same per-sample seeds, so the records equal an uninterrupted run's.
"""

from __future__ import annotations

import functools
import json
import math
import os
import sys
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from rlvr_envs.core import Task, TextEnv, verdict_status
from rlvr_envs.harness.metrics import AnswerEquivalence, answer_equivalence, compute_metrics
from rlvr_envs.harness.results import (
    SCHEMA,
    SCHEMA_VERSION,
    SEED_DERIVATION,
    Results,
    env_version,
    machine_info,
    now_iso,
    package_info,
)

# Procedural sources can be effectively unbounded; evaluating "all" of one needs an explicit limit.
MAX_TASKS_WITHOUT_LIMIT = 100_000
# A multi-turn episode that has not ended after this many agent turns is scored as failed (envs have their own caps).
MAX_TURNS = 64


class Agent(Protocol):
    def act(self, observations: list[str], infos: list[dict[str, Any]]) -> Sequence[Any]: ...


def sample_seed(seed: int, task_index: int, sample_index: int) -> int:
    """The seed of one sample: a function of (run seed, task index, sample index) only, never of call order."""
    return int(np.random.SeedSequence(int(seed), spawn_key=(int(task_index), int(sample_index))).generate_state(1)[0])


def sidecar_path(out: Path) -> Path:
    return out.with_name(out.name + ".partial.jsonl")


def _json_safe(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def _metadata(task: Any) -> dict[str, Any]:
    meta = getattr(task, "metadata", None) or {}
    return {str(k): v for k, v in meta.items() if isinstance(v, (str, int, float, bool)) or v is None}


def describe_agent(agent: Any) -> dict[str, Any]:
    desc: dict[str, Any] = {}
    if callable(getattr(agent, "describe", None)):
        got = agent.describe()
        if not isinstance(got, Mapping):
            raise TypeError(f"{type(agent).__name__}.describe() must return a dict, got {type(got).__name__}")
        desc.update(_json_safe(dict(got)))
    desc.setdefault("class", f"{type(agent).__module__}.{type(agent).__qualname__}")
    return desc


def _unpack_responses(raw: Any, agent: Any, n: int) -> tuple[list[str], list[int | None]]:
    if isinstance(raw, (str, bytes)) or not isinstance(raw, Sequence):
        raise TypeError(f"agent.act must return a list of {n} responses, got {type(raw).__name__}")
    if len(raw) != n:
        raise ValueError(f"agent.act returned {len(raw)} responses for {n} observations")
    texts: list[str] = []
    tokens: list[int | None] = []
    for r in raw:
        if isinstance(r, str):
            texts.append(r)
            tokens.append(None)
        elif hasattr(r, "text"):
            texts.append(str(r.text))
            ids = getattr(r, "response_ids", None)
            tokens.append(len(ids) if ids is not None else getattr(r, "tokens", None))
        else:
            raise TypeError(f"agent.act returned a {type(r).__name__}; expected str or an object with .text")
    counts = getattr(agent, "last_token_counts", None)
    if counts is not None and len(counts) == n:
        tokens = [t if t is not None else int(c) for t, c in zip(tokens, counts)]
    return texts, [int(t) if t is not None else None for t in tokens]


class _State:
    """What a run has finished: records by (task_index, sample_index) and per-batch timings."""

    def __init__(self) -> None:
        self.records: dict[tuple[int, int], dict[str, Any]] = {}
        self.batches: dict[int, dict[str, float]] = {}

    def add_batch(self, line: Mapping[str, Any]) -> None:
        for r in line["records"]:
            self.records[(int(r["task_index"]), int(r["sample_index"]))] = dict(r)
        self.batches[int(line["batch"])] = {k: float(line.get(k, 0.0)) for k in ("wall_s", "act_s", "verify_s")}


def _config_diff(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    return [f"{k}: {a.get(k)!r} (file) vs {b.get(k)!r} (now)" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def _check_same_run(where: Path, old_config: Mapping, old_prov: Mapping, config: Mapping, prov: Mapping) -> None:
    diffs = _config_diff(old_config, config)
    if old_prov.get("data", {}).get("fingerprint") != prov["data"]["fingerprint"]:
        diffs.append("data fingerprint differs (the task data changed)")
    diffs += [f"agent.{d}" for d in _config_diff(old_prov.get("agent", {}), prov["agent"])]
    if diffs:
        raise ValueError(f"cannot resume {where}: it is a different run ({'; '.join(diffs)})")


def _read_sidecar(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Header and batch lines; a torn last line (killed mid-write) is dropped, a bad line elsewhere is an error."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    parsed = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            parsed.append(json.loads(line))
        except json.JSONDecodeError:
            if i >= len(lines) - 2:  # the last non-empty line: a write cut short by a kill
                break
            raise ValueError(f"{path}:{i + 1}: corrupt line in the partial results; delete the file to start over") from None
    if not parsed or parsed[0].get("kind") != "header":
        raise ValueError(f"{path}: no header line; delete the file to start over")
    return parsed[0], [p for p in parsed[1:] if p.get("kind") == "batch"]


# Runs the pending batches ``[(batch index, units), ...]`` of a run and yields each finished batch line
# ({"kind": "batch", "batch", "wall_s", "act_s", "verify_s", "records"}) in any order; called with the driver's env,
# a factory for more instances, the task source and the run's config. In-process: ``_run_batch`` one after another;
# Ray: shards on actors (rlvr_envs/harness/ray_eval.py).
BatchRunner = Callable[[Any, Callable[[], Any], Any, Mapping[str, Any], list[tuple[int, list[tuple[int, int]]]]],
                       Generator[dict[str, Any], None, None]]


def evaluate(
    agent: Agent,
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
    remote: str | None = None,
) -> Results:
    """Evaluate ``agent`` on the first ``limit`` tasks of ``env_id`` (index order), ``n_samples`` samples each.

    ``remote``: the base URL of an ``rlvr serve`` server; the episodes are then played on ``RemoteEnv(remote,
    env_id)`` sessions instead of in-process envs (the local env still gives the task list, its fingerprint and the
    provenance, so the records equal an in-process run's), and ``provenance["remote"]`` records the URL."""
    play: Callable[[], Any] | None = None
    extra: dict[str, Any] = {}
    if remote is not None:
        from rlvr_envs.remote import RemoteEnv

        url = remote.rstrip("/")
        play = functools.partial(RemoteEnv, url, env_id, env_kwargs=dict(env_kwargs or {}))
        extra["remote"] = {"url": url}

    def run_in_process(env: Any, make_env: Callable[[], Any], source: Any, config: Mapping[str, Any],
                       pending: list[tuple[int, list[tuple[int, int]]]]) -> Generator[dict[str, Any], None, None]:
        # remote: ``env`` (in-process) only says whether the env is single-turn; the pool plays on served sessions
        pool = (EnvPool(env, make_env) if play is None
                else EnvPool(play(), play, single_turn=isinstance(env.unwrapped, TextEnv), owns_first=True))
        try:
            for batch, units in pending:
                yield _run_batch(agent, pool, source, config, batch, units)
        finally:
            pool.close()

    return run_evaluation(env_id, describe=lambda: describe_agent(agent), run_batches=run_in_process,
                          n_samples=n_samples, seed=seed, limit=limit, env_kwargs=env_kwargs, out=out, resume=resume,
                          progress=progress, batch_size=batch_size, provenance_extra=extra)


def run_evaluation(
    env_id: str,
    *,
    describe: Callable[[], dict[str, Any]],
    run_batches: BatchRunner,
    n_samples: int = 1,
    seed: int = 0,
    limit: int | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
    out: str | os.PathLike | None = None,
    resume: bool = False,
    progress: bool = True,
    batch_size: int = 8,
    provenance_extra: Mapping[str, Any] | None = None,
) -> Results:
    """``evaluate`` with the agent abstracted away: ``describe()`` gives the agent's provenance (called once, after the
    arguments are checked) and ``run_batches`` plays the pending batches wherever it likes. Config, batch composition,
    seeds, the sidecar, resume and the results file are this function's, so every runner writes the same records.
    ``provenance_extra`` is merged into the provenance (the same dict object, so a runner may fill it in as it goes)."""
    import gymnasium as gym
    from tqdm.auto import tqdm

    import rlvr_envs  # noqa: F401  (registers the IDs)

    if n_samples < 1 or batch_size < 1:
        raise ValueError(f"n_samples and batch_size must be >= 1 (got {n_samples}, {batch_size})")
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    env_kwargs = dict(env_kwargs or {})
    try:
        json.dumps(env_kwargs)
    except TypeError as exc:
        raise TypeError(f"env_kwargs must be JSON-serialisable (they go into provenance): {exc}") from None
    out_path = Path(out) if out is not None else None
    if resume and out_path is None:
        raise ValueError("resume=True needs out= (the results file to continue)")

    env = gym.make(env_id, **env_kwargs)
    try:
        base = env.unwrapped
        source = getattr(base, "source", None)
        if source is None:
            raise TypeError(f"{env_id} has no task source (env.unwrapped.source); the harness evaluates text envs")
        if limit is None and len(source) > MAX_TASKS_WITHOUT_LIMIT:
            raise ValueError(f"{env_id} has {len(source)} tasks; pass limit= to evaluate a prefix")
        n_tasks = len(source) if limit is None else min(limit, len(source))
        config = {"env_id": env_id, "env_kwargs": env_kwargs, "n_samples": int(n_samples), "seed": int(seed),
                  "n_tasks": int(n_tasks), "batch_size": int(batch_size), "seed_derivation": SEED_DERIVATION}
        agent_desc = describe()
        spec = env.spec
        provenance = {
            "package": package_info(),
            "env": {"id": env_id, "version": env_version(env_id), "kwargs": env_kwargs,
                    "entry_point": str(spec.entry_point) if spec is not None else None,
                    "verifier": getattr(base, "verifier_name", "") or None},
            "data": {"source": getattr(source, "name", None), "size": len(source), "fingerprint": source.fingerprint,
                     "origin": getattr(source, "origin", None)},
            "agent": agent_desc,
            "machine": machine_info(),
            "created_at": now_iso(),
            "argv": list(sys.argv),
        }
        provenance.update(provenance_extra or {})
        return _run(run_batches, env, lambda: gym.make(env_id, **env_kwargs), source, config, provenance, out_path,
                    resume, progress, tqdm)
    finally:
        env.close()


def _run(run_batches: BatchRunner, env: Any, make_env: Callable[[], Any], source: Any, config: dict[str, Any],
         provenance: dict[str, Any], out_path: Path | None, resume: bool, progress: bool, tqdm: Any) -> Results:
    n, batch_size, n_tasks = config["n_samples"], config["batch_size"], config["n_tasks"]
    units = [(ti, si) for ti in range(n_tasks) for si in range(n)]
    n_batches = math.ceil(len(units) / batch_size)
    state = _State()
    side = sidecar_path(out_path) if out_path is not None else None

    if out_path is not None:
        existing = [p for p in (out_path, side) if p.exists()]
        if existing and not resume:
            raise FileExistsError(f"{existing[0]} exists; pass resume=True (--resume) to continue it, or remove it")
        if out_path.exists():
            old = Results.load(out_path)
            _check_same_run(out_path, old.config, old.provenance, config, provenance)
            if old.complete:
                return old
            provenance["created_at"] = old.provenance.get("created_at", provenance["created_at"])
            for b, tm in old.data["timing"].get("batches", {}).items():
                recs = [r for r in old.records if _batch_of(r, n, batch_size) == int(b)]
                state.add_batch({"batch": int(b), "records": recs, **tm})
        if side is not None and side.exists():
            header, lines = _read_sidecar(side)
            _check_same_run(side, header["config"], header["provenance"], config, provenance)
            provenance["created_at"] = header["provenance"].get("created_at", provenance["created_at"])
            for line in lines:
                state.add_batch(line)
    if resume:
        provenance["resumed_at"] = now_iso()

    # Only whole batches count as done: a batch is redone with its original composition.
    done = {b for b in range(n_batches)
            if all((ti, si) in state.records for ti, si in units[b * batch_size:(b + 1) * batch_size])}
    state.records = {k: r for k, r in state.records.items() if _batch_of(r, n, batch_size) in done}
    state.batches = {b: t for b, t in state.batches.items() if b in done}

    sink = None
    if side is not None:
        # Rewrite the sidecar with only the finished batches (drops a torn tail), then append to it.
        tmp = side.with_name(side.name + ".tmp")
        side.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(json.dumps({"kind": "header", "config": config, "provenance": provenance}) + "\n")
            for b in sorted(done):
                recs = [r for r in state.records.values() if _batch_of(r, n, batch_size) == b]
                f.write(json.dumps({"kind": "batch", "batch": b, **state.batches.get(b, {}), "records": recs}) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, side)
        sink = open(side, "a", encoding="utf-8")  # noqa: SIM115  (closed in finally)

    pending = [(b, units[b * batch_size:(b + 1) * batch_size]) for b in range(n_batches) if b not in done]
    lines = run_batches(env, make_env, source, config, pending)
    n_correct = sum(r["correct"] for r in state.records.values())
    bar = tqdm(total=len(units), initial=len(state.records), disable=not progress, unit="sample",
               desc=config["env_id"], dynamic_ncols=True)
    try:
        for line in lines:
            if sink is not None:
                sink.write(json.dumps(line, ensure_ascii=False) + "\n")
                sink.flush()
                os.fsync(sink.fileno())
            state.add_batch(line)
            n_correct += sum(r["correct"] for r in line["records"])
            bar.update(len(line["records"]))
            bar.set_postfix(acc=f"{n_correct / len(state.records):.3f}", refresh=False)
    except KeyboardInterrupt:
        if out_path is not None:
            _document(config, provenance, state, complete=False).save(out_path)
            bar.write(f"interrupted: kept {len(state.records)} of {len(units)} samples in {out_path} "
                      f"(continue with resume=True / --resume)")
        raise
    finally:
        bar.close()
        if sink is not None:
            sink.close()
        lines.close()  # a generator runner releases its envs / workers here, also on Ctrl-C

    if len(state.records) != len(units):  # a runner that dropped a batch must not produce a "complete" file
        raise RuntimeError(f"the batch runner returned {len(state.records)} of {len(units)} samples")
    results = _document(config, provenance, state, complete=True, same_answer=answer_equivalence(env))
    if out_path is not None:
        results.save(out_path)
        side.unlink(missing_ok=True)
    return results


def _batch_of(record: Mapping[str, Any], n_samples: int, batch_size: int) -> int:
    return (int(record["task_index"]) * n_samples + int(record["sample_index"])) // batch_size


def turn_seed(seed: int, task_index: int, sample_index: int, turn: int) -> int:
    """Turn 0 uses the sample's seed; later turns of a multi-turn episode get their own, derived the same way."""
    if turn == 0:
        return sample_seed(seed, task_index, sample_index)
    key = (int(task_index), int(sample_index), int(turn))
    return int(np.random.SeedSequence(int(seed), spawn_key=key).generate_state(1)[0])


class EnvPool:
    """The env instances a batch needs: one for single-turn envs (reset, act, reset, step), one per episode otherwise
    (``make()`` builds another instance of the same env; instances are kept and reused by later batches).
    ``single_turn`` overrides the check of ``env`` (a ``RemoteEnv`` over a single-turn env is one); ``owns_first``:
    ``close()`` closes ``env`` too (the caller made it for this pool)."""

    def __init__(self, env: Any, make: Any, *, single_turn: bool | None = None, owns_first: bool = False):
        self.first = env
        self.single_turn = isinstance(env.unwrapped, TextEnv) if single_turn is None else bool(single_turn)
        self._make = make
        self._envs = [env]
        self._owns_first = owns_first

    def get(self, k: int) -> Any:
        if self.single_turn:
            return self.first
        while len(self._envs) <= k:
            self._envs.append(self._make())
        return self._envs[k]

    def close(self) -> None:
        for e in self._envs if self._owns_first else self._envs[1:]:
            e.close()


@dataclass
class Episode:
    """One unit's episode as ``run_episodes`` played it."""

    seed: int  # the sample's seed (turn 0)
    reset_info: dict[str, Any]
    task: Any  # the env's task after reset (None where the env does not expose one)
    turns: list[str] = field(default_factory=list)  # every agent turn, in order
    tokens: int | None = 0  # response tokens over all turns (None when the agent does not report them)
    final: tuple[float, dict[str, Any]] | None = None  # (reward, step info) of the step that ended the episode
    last_info: dict[str, Any] = field(default_factory=dict)  # the info the agent saw last (task_id, counts)


def run_episodes(agent: Any, pool: EnvPool, units: Sequence[tuple[int, int]], *, run_seed: int, n_samples: int,
                 reset_options: Sequence[Mapping[str, Any]] | None = None, max_turns: int = MAX_TURNS,
                 timing: dict[str, float] | None = None) -> list[Episode]:
    """Play one episode per unit ``(task_index, sample_index)`` in lockstep: every ``agent.act`` call gets the
    still-running episodes' observations and infos (the reset info plus ``seed``, ``task_index``, ``sample_index``,
    ``n_samples`` and ``turn_index``). The one rollout loop of the harness and of the trainer (agents/grpo/multiturn.py),
    so both play identical episodes for the same agent and seeds. ``reset_options``: one per unit (default
    ``{"index": task_index}``). ``timing`` (if given) gets ``act_s`` and ``verify_s`` added."""
    if reset_options is not None and len(reset_options) != len(units):
        raise ValueError(f"{len(reset_options)} reset options for {len(units)} units")
    episodes: list[Episode] = []
    observations, infos = [], []
    for k, (ti, si) in enumerate(units):
        seed = sample_seed(run_seed, ti, si)
        env = pool.get(k)
        options = dict(reset_options[k]) if reset_options is not None else {"index": ti}
        obs, info = env.reset(seed=seed, options=options)
        episodes.append(Episode(seed=seed, reset_info=dict(info), task=getattr(env.unwrapped, "task", None)))
        observations.append(obs)
        infos.append({**info, "seed": seed, "task_index": ti, "sample_index": si, "n_samples": n_samples,
                      "turn_index": 0})
    act_s = verify_s = 0.0
    active = list(range(len(units)))
    for turn in range(max_turns):
        if not active:
            break
        ta = time.perf_counter()
        raw = agent.act([observations[k] for k in active], [infos[k] for k in active])
        texts, toks = _unpack_responses(raw, agent, len(active))
        tv = time.perf_counter()
        act_s += tv - ta
        still = []
        for k, text, tok in zip(active, texts, toks):
            (ti, si), env, ep = units[k], pool.get(k), episodes[k]
            ep.turns.append(text)
            ep.last_info = infos[k]
            ep.tokens = None if ep.tokens is None or tok is None else ep.tokens + tok
            if pool.single_turn:
                options = dict(reset_options[k]) if reset_options is not None else {"index": ti}
                env.reset(seed=ep.seed, options=options)
            obs, reward, terminated, truncated, step_info = env.step(text)
            if terminated or truncated:
                ep.final = (float(reward), dict(step_info))
            else:
                observations[k] = obs
                infos[k] = {**step_info, "seed": turn_seed(run_seed, ti, si, turn + 1), "task_index": ti,
                            "sample_index": si, "n_samples": n_samples, "turn_index": turn + 1}
                still.append(k)
        verify_s += time.perf_counter() - tv
        active = still
    if timing is not None:
        timing["act_s"] = timing.get("act_s", 0.0) + act_s
        timing["verify_s"] = timing.get("verify_s", 0.0) + verify_s
    return episodes


def _run_batch(agent: Any, pool: EnvPool, source: Any, config: Mapping[str, Any], batch: int,
               units: list[tuple[int, int]]) -> dict[str, Any]:
    t0 = time.perf_counter()
    timing: dict[str, float] = {}
    episodes = run_episodes(agent, pool, units, run_seed=config["seed"], n_samples=config["n_samples"],
                            timing=timing)
    records = []
    for (ti, si), ep in zip(units, episodes):
        # the task just reset to; saves regenerating procedural tasks
        metadata = _metadata(ep.task if isinstance(ep.task, Task) else source.task(ti))
        reward, info = ep.final or (0.0, {"correct": False, "error": f"no final answer within {MAX_TURNS} turns"})
        correct = bool(info.get("correct", reward > 0))
        rec = {
            "task_index": ti, "task_id": str(ep.last_info.get("task_id", ti)), "sample_index": si, "seed": ep.seed,
            "response": ep.turns[-1],
            "parsed_answer": None if info.get("parsed_answer") is None else str(info["parsed_answer"]),
            "correct": correct,
            # the env's info["verdict"]; envs that do not report one get it derived from correct
            "status": verdict_status(correct, info.get("verdict")),
            "reward": reward,
            "format_ok": bool(info.get("format_ok", False)),
            "error": None if info.get("error") is None else str(info["error"]),
            "truncated_response": bool(info.get("truncated_response", False)),
            "tokens": ep.tokens,
            "answer": None if info.get("answer") is None else str(info["answer"]),
            "metadata": metadata,
        }
        if len(ep.turns) > 1 or not pool.single_turn:
            rec["turns"] = ep.turns  # every agent turn; the leaderboard replays them through the env
        records.append(rec)
    return {"kind": "batch", "batch": batch, "wall_s": time.perf_counter() - t0, "act_s": timing["act_s"],
            "verify_s": timing["verify_s"], "records": records}


def _document(config: dict[str, Any], provenance: dict[str, Any], state: _State, *, complete: bool,
              same_answer: AnswerEquivalence | None = None) -> Results:
    records = [state.records[k] for k in sorted(state.records)]
    timing = {
        "wall_time_s": sum(t["wall_s"] for t in state.batches.values()),
        "act_s": sum(t["act_s"] for t in state.batches.values()),
        "verify_s": sum(t["verify_s"] for t in state.batches.values()),
        "batches": {str(b): t for b, t in sorted(state.batches.items())},
    }
    doc: dict[str, Any] = {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "complete": complete,
                           "config": config, "provenance": provenance, "timing": timing}
    if complete:
        doc["metrics"] = compute_metrics(records, config["n_samples"], n_params=provenance["agent"].get("n_params"),
                                         same_answer=same_answer)
    doc["records"] = records
    return Results(doc)
