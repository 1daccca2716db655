"""Countdown solution coverage and entrances of policies side by side, on a lane's held-out tasks.

For each policy (a name for ``agents.policy.load_policy``, e.g. ``micro-countdown``, or a trained run directory,
rebuilt from its newest checkpoint as ``agents.grpo.publish.final_policy`` does) this samples ``k`` responses per task
for the first ``N`` held-out tasks of the lane (``env_kwargs`` + ``eval_env_kwargs``) at temperature 1 with the
harness (``rlvr_envs.harness.evaluate``: per-sample seeds, so every policy is asked the same tasks with the same
seeds), then reports per policy pass@1, pass@k, solution coverage (distinct correct solutions per task), distinct
entrances among correct samples, entrance entropy (bits; correct samples, and all samples) as defined in
``rlvr_envs.harness.coverage``, and for every policy after the first the paired difference from the first with a
bootstrap 95% interval over tasks (percentile; tasks resampled with replacement). The JSON also holds each task's
entrance distribution among correct samples.

    python benchmarks/countdown_coverage.py micro-countdown runs/micro/grpo-s0 --tasks 200 --k 16 \\
        --out /tmp/coverage.json

Sampling a 2M-parameter policy 16 times on 200 tasks takes minutes on two cores; pass ``--results-dir`` to keep the
harness results files (reused on a rerun with the same settings).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

if __name__ == "__main__" and __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

# Per-task quantities compared between policies (the JSON's names).
METRICS = ("pass@1", "pass@k", "coverage", "entrances", "entrance_entropy", "entrance_entropy_all")


def load(spec: str, *, dtype: str = "float32") -> Any:
    """A policy by name, or a trained run directory's final policy (a directory with ``checkpoints/latest``)."""
    path = Path(spec)
    if path.is_dir() and (path / "checkpoints").is_dir():
        from agents.grpo.publish import final_policy

        return final_policy(path)
    from agents.policy import load_policy

    return load_policy(spec, dtype=dtype)


def held_out_env(lane: Mapping[str, Any], extra: Mapping[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
    """The lane's held-out env: its env id and ``env_kwargs`` + ``eval_env_kwargs`` (+ ``extra``)."""
    return lane["env"], {**lane.get("env_kwargs", {}), **lane.get("eval_env_kwargs", {}), **dict(extra or {})}


def sample(policy: Any, env_id: str, env_kwargs: Mapping[str, Any], *, tasks: int, k: int, seed: int,
           temperature: float, max_new_tokens: int, precision: str = "fp32", batch_size: int = 64,
           out: Path | None = None) -> Any:
    """``k`` samples per task of the first ``tasks`` tasks through the harness; the ``Results``."""
    from agents.policy import PolicyAgent, SamplingParams, make_engine
    from rlvr_envs.harness import evaluate

    agent = PolicyAgent(policy, make_engine(policy, "hf", precision=precision),
                        SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens))
    return evaluate(agent, env_id, env_kwargs=dict(env_kwargs), n_samples=k, seed=seed, limit=tasks,
                    batch_size=batch_size, out=out, resume=out is not None, progress=False)


def per_task(records: Sequence[Mapping[str, Any]], k: int) -> dict[str, Any]:
    """Per-task arrays of ``METRICS`` (task order) and each task's entrance distribution among correct samples."""
    from rlvr_envs.harness.coverage import task_stats

    groups: dict[int, list[Mapping[str, Any]]] = {}
    for r in records:
        groups.setdefault(int(r["task_index"]), []).append(r)
    values: dict[str, list[float]] = {m: [] for m in METRICS}
    tasks, sources = [], {"trace": 0, "expression": 0, "none": 0}
    for ti in sorted(groups):
        group = sorted(groups[ti], key=lambda r: int(r["sample_index"]))
        if len(group) != k:
            raise ValueError(f"task index {ti} has {len(group)} samples, expected {k}")
        st = task_stats(group)
        values["pass@1"].append(st["correct"] / k)
        values["pass@k"].append(float(st["correct"] > 0))  # n = k: the unbiased pass@k is this indicator
        values["coverage"].append(float(st["solutions"]))
        values["entrances"].append(float(st["entrances"]))
        values["entrance_entropy"].append(st["entrance_entropy"])
        values["entrance_entropy_all"].append(st["entrance_entropy_all"])
        for key, count in st["sources"].items():
            sources[key] = sources.get(key, 0) + count
        tasks.append({"task_id": group[0]["task_id"], "correct": st["correct"], "solutions": st["solutions"],
                      "entrance_counts": st["entrance_counts"]})
    return {"values": {m: np.asarray(v, dtype=float) for m, v in values.items()}, "tasks": tasks, "sources": sources}


def unselected_entrances(records: Sequence[Mapping[str, Any]], task_numbers: Any, *, seed: int = 0) -> dict[str, str]:
    """Per task, an entrance its samples did not start with: drawn (``default_rng((seed, task index))``) among the
    task's solvable entrances that none of its samples used; the least used one when every solvable entrance was
    used. ``task_numbers(task_id) -> (numbers, target)``. What the entrance intervention gives the policy
    (``entrances=`` + ``entrance_as="prefill"``)."""
    from collections import Counter

    from rlvr_envs.harness.coverage import response_entrance
    from rlvr_envs.tasks.countdown import solvable_entrances

    groups: dict[int, list[Mapping[str, Any]]] = {}
    for r in records:
        groups.setdefault(int(r["task_index"]), []).append(r)
    table = {}
    for ti, group in sorted(groups.items()):
        numbers, target = task_numbers(str(group[0]["task_id"]))
        options = sorted(solvable_entrances(numbers, int(target)), key=lambda e: e.text)
        if not options:
            continue
        used: Counter[tuple[int, str, int]] = Counter()
        for r in group:
            entrance, _ = response_entrance(r.get("response"), r.get("parsed_answer"))
            if entrance is not None:
                used[tuple(entrance)] += 1
        fresh = [e for e in options if used[(e.a, e.op, e.b)] == 0]
        pool = fresh or [min(options, key=lambda e: (used[(e.a, e.op, e.b)], e.text))]
        pick = pool[int(np.random.default_rng((seed, ti)).integers(len(pool)))]
        table[str(group[0]["task_id"])] = pick.text
    return table


def bootstrap_interval(diffs: Sequence[float], *, n_boot: int = 2000, seed: int = 0,
                       level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of paired per-task differences (tasks resampled with replacement)."""
    d = np.asarray(diffs, dtype=float)
    if d.size == 0:
        raise ValueError("no tasks to bootstrap over")
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, d.size, size=(n_boot, d.size))].mean(axis=1)
    alpha = (1.0 - level) / 2.0
    lo, hi = np.quantile(means, [alpha, 1.0 - alpha])
    return float(lo), float(hi)


def compare(policies: Mapping[str, Mapping[str, Any]], *, n_boot: int = 2000, seed: int = 0) -> dict[str, Any]:
    """``policies``: label -> ``per_task`` output (same tasks, same order). Means per policy and, for every policy
    after the first, the mean paired difference from the first with its bootstrap 95% interval."""
    labels = list(policies)
    if not labels:
        raise ValueError("no policies to compare")
    base = policies[labels[0]]
    base_ids = [t["task_id"] for t in base["tasks"]]
    out: dict[str, Any] = {"baseline": labels[0], "policies": {}, "differences": {}}
    for label in labels:
        p = policies[label]
        if [t["task_id"] for t in p["tasks"]] != base_ids:
            raise ValueError(f"{label}: not the same tasks as {labels[0]} (a paired comparison needs them)")
        out["policies"][label] = {**{m: float(p["values"][m].mean()) for m in METRICS},
                                  "entrance_sources": dict(p["sources"]), "tasks": p["tasks"]}
        if label == labels[0]:
            continue
        diffs = {}
        for m in METRICS:
            d = p["values"][m] - base["values"][m]
            lo, hi = bootstrap_interval(d, n_boot=n_boot, seed=seed)
            diffs[m] = {"difference": float(d.mean()), "ci95": [lo, hi]}
        out["differences"][label] = diffs
    return out


def format_report(report: Mapping[str, Any], k: int) -> str:
    """The side-by-side table: one row per metric, one column per policy (differences from the first beside)."""
    labels = list(report["policies"])
    names = {"pass@k": f"pass@{k}", "coverage": f"coverage@{k}", "entrances": f"entrances@{k}",
             "entrance_entropy": "entrance entropy (bits)", "entrance_entropy_all": "entrance entropy, all"}
    header = ["metric", *labels]
    rows = []
    for m in METRICS:
        row = [names.get(m, m), f"{report['policies'][labels[0]][m]:.3f}"]
        for label in labels[1:]:
            d = report["differences"][label][m]
            row.append(f"{report['policies'][label][m]:.3f} ({d['difference']:+.3f} "
                       f"[{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}])")
        rows.append(row)
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)) for r in [header, *rows]]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])


def run(specs: Sequence[str], *, lane: str = "micro", tasks: int = 100, k: int = 8, seed: int = 0,
        temperature: float = 1.0, max_new_tokens: int | None = None, n_boot: int = 2000,
        env_kwargs: Mapping[str, Any] | None = None, results_dir: Path | None = None, batch_size: int = 64,
        dtype: str = "float32", unselected: bool = False) -> dict[str, Any]:
    """Sample every policy and compare them (see the module docstring); the JSON report. ``unselected``: sample each
    policy again with, on every task, an entrance none of its own samples started with as the first line of the
    response (``unselected_entrances``; the entrance intervention), reported as ``<policy>+unselected``."""
    from agents.grpo.config import load_lane

    if tasks < 1 or k < 1:
        raise ValueError(f"tasks and k must be >= 1, got {tasks}, {k}")
    settings = load_lane(lane)
    env_id, kwargs = held_out_env(settings, env_kwargs)
    max_new = int(max_new_tokens or settings.get("eval_max_new_tokens") or settings.get("max_new_tokens", 192))
    per_policy: dict[str, Any] = {}
    described: dict[str, Any] = {}
    import gymnasium as gym

    import rlvr_envs  # noqa: F401  (registers the IDs)

    source = gym.make(env_id, **kwargs).unwrapped.source

    def task_numbers(task_id: str) -> tuple[list[int], int]:
        task = source.task(source.index_of(task_id))
        return task.metadata["numbers"], int(task.answer)

    for i, spec in enumerate(specs):
        label = spec if spec not in per_policy else f"{spec}#{i}"
        policy = load(spec, dtype=dtype)
        out = None if results_dir is None else Path(results_dir) / f"coverage-{i}-{Path(spec).name}.json"
        results = sample(policy, env_id, kwargs, tasks=tasks, k=k, seed=seed, temperature=temperature,
                         max_new_tokens=max_new, precision=settings.get("precision", "fp32"),
                         batch_size=batch_size, out=out)
        per_policy[label] = per_task(results.records, k)
        described[label] = {"spec": spec, "model": policy.name, "weights_hash": policy.weights_hash,
                            "source": getattr(policy, "source", None),
                            "results_file": None if out is None else str(out)}
        if unselected:
            table = unselected_entrances(results.records, task_numbers, seed=seed)
            out2 = None if out is None else out.with_name(out.stem + "-unselected.json")
            again = sample(policy, env_id, {**kwargs, "entrances": table, "entrance_as": "prefill"}, tasks=tasks, k=k,
                           seed=seed, temperature=temperature, max_new_tokens=max_new,
                           precision=settings.get("precision", "fp32"), batch_size=batch_size, out=out2)
            per_policy[f"{label}+unselected"] = per_task(again.records, k)
            described[f"{label}+unselected"] = {**described[label], "intervention": "unselected entrance prefilled",
                                                "results_file": None if out2 is None else str(out2)}
    report = compare(per_policy, n_boot=n_boot, seed=seed)
    for label, desc in described.items():
        report["policies"][label] = {**desc, **report["policies"][label]}
    report["settings"] = {"lane": lane, "env_id": env_id, "env_kwargs": kwargs, "tasks": tasks, "k": k, "seed": seed,
                          "temperature": temperature, "max_new_tokens": max_new, "bootstrap": n_boot,
                          "interval": "95% percentile bootstrap over tasks of the mean paired difference vs "
                                      f"{report['baseline']}",
                          "definitions": "rlvr_envs/harness/coverage.py"}
    return report


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("policies", nargs="+", help="policy names (load_policy) or trained run directories; the first "
                                                "is the baseline of the differences")
    ap.add_argument("--lane", default="micro", help="lane whose held-out env is sampled (default: micro)")
    ap.add_argument("--tasks", type=int, default=100, help="held-out tasks N (the first N)")
    ap.add_argument("--k", type=int, default=8, help="samples per task")
    ap.add_argument("--seed", type=int, default=0, help="run seed of the harness's per-sample seeds and the bootstrap")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--max-new-tokens", type=int, default=None, help="default: the lane's eval_max_new_tokens")
    ap.add_argument("--bootstrap", type=int, default=2000, help="bootstrap resamples")
    ap.add_argument("--env-kwargs", default="{}", help="JSON merged over the lane's held-out env kwargs, e.g. "
                                                       "'{\"entrance_hint\": \"task\"}'")
    ap.add_argument("--results-dir", default=None, help="keep each policy's harness results file here")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--unselected", action="store_true",
                    help="also sample each policy with an entrance it did not select prefilled (the intervention)")
    ap.add_argument("--out", default=None, help="write the JSON report here")
    args = ap.parse_args(argv)
    extra = json.loads(args.env_kwargs)
    if not isinstance(extra, dict):
        ap.error("--env-kwargs must be a JSON object")
    report = run(args.policies, lane=args.lane, tasks=args.tasks, k=args.k, seed=args.seed,
                 temperature=args.temperature, max_new_tokens=args.max_new_tokens, n_boot=args.bootstrap,
                 env_kwargs=extra, results_dir=None if args.results_dir is None else Path(args.results_dir),
                 batch_size=args.batch_size, dtype=args.dtype, unselected=args.unselected)
    print(f"{report['settings']['env_id']} held-out ({args.lane} lane): {args.tasks} tasks x {args.k} samples at "
          f"T={args.temperature}; differences vs {report['baseline']} with 95% bootstrap intervals over tasks")
    print(format_report(report, args.k))
    if args.out:
        from rlvr_envs.harness.results import atomic_write_json

        atomic_write_json(Path(args.out), report)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
