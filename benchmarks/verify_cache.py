"""The math verifier's verification cache on GRPO-like rollout batches: hit rate and verifications/s, with and without.

Rollouts are built from real MATH-500 tasks (``RLVR_DATA_DIR/math/math500.jsonl``, loaded by
``rlvr_envs.tasks.math.load_tasks("math500")``). Each task gets a group of ``--group`` responses (8, as in GRPO); each
response is the task's reference solution (a real chain of thought) with its final ``\\boxed{}`` replaced by a sampled
answer, so the texts are long and realistic and the answers repeat within a group the way a policy's do:

- each task draws a solve rate ``p ~ U(0, 1)`` (seeded); a rollout is right with probability ``p``: the gold answer as
  written (3 in 4) or an equivalent rewrite of it (``\\dfrac`` for ``\\frac``, ``1,000``, ``a/b``, ``\\left( \\right)``);
- otherwise it is one of two wrong answers (a digit of the gold changed, 60%, or the next task's gold, 40%), or, 5% of
  all rollouts, has no final answer at all (a cut-off response).

A batch is ``--prompts`` groups (8 x 8 = 64 responses, one GRPO step), graded with ``verify_many`` (the pool's two
workers busy at once), for every task of MATH-500 in order. Each configuration is timed on a freshly started and
warmed worker pool (``close_pool(); pool().wait_warm()``), so neither run inherits the other's worker-side parse
caches; configurations alternate ``--repeats`` times and the median time is reported. Two grading modes:

- ``fast_path=True``, what ``rlvr/MATH-v0`` uses: plain numbers and identical strings never reach Math-Verify (nor the
  cache, which sits in front of Math-Verify only);
- ``fast_path=False``: every extracted answer goes to Math-Verify (the worst case for the verifier).

Verdicts with and without the cache are compared field by field (correct, status, parsed, error); a disagreement
that is not a timeout under load would be a bug. ``per_check_latency`` times single Math-Verify-bound checks on one
thread: the first check of a pair, a repeat without the cache (the worker's own parse cache still helps) and a
repeat served by the cache; it explains how much a hit saves.

    RLVR_DATA_DIR=../shared/data python benchmarks/verify_cache.py --out benchmarks/results/verify_cache.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

if __name__ == "__main__" and __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from math_variants import equivalent_form, replace_last_box  # noqa: E402  (benchmarks/, the script's folder)

FILLERS = ("", "Let me double-check this. ", "Checking the arithmetic once more, everything is consistent. ",
           "So, putting it all together: ")


def perturbed(gold: str) -> str:
    """A near miss: the gold with its last digit changed (or a sign flipped where it has no digit)."""
    digits = [i for i, c in enumerate(gold) if c.isdigit()]
    if not digits:
        return f"-{gold}" if not gold.startswith("-") else gold[1:]
    i = digits[-1]
    return gold[:i] + str((int(gold[i]) + 1) % 10) + gold[i + 1:]


def build_rollouts(tasks: list[Any], group: int, seed: int) -> list[list[tuple[str, str, str]]]:
    """Per task, ``group`` ``(gold, response, kind)`` triples sampled as the module docstring says."""
    rng = np.random.default_rng(seed)
    out = []
    for i, task in enumerate(tasks):
        gold = task.answer
        solution = task.metadata.get("solution") or f"We compute the answer. The final answer is $\\boxed{{{gold}}}$."
        wrong = [perturbed(gold), tasks[(i + 1) % len(tasks)].answer]
        p = float(rng.uniform())
        rows = []
        for k in range(group):
            u = rng.uniform()
            if rng.uniform() < 0.05:
                answer, kind = None, "no answer"
            elif u < p:
                answer, kind = (gold, "gold") if rng.uniform() < 0.75 else (equivalent_form(gold), "equivalent")
            else:
                answer, kind = (wrong[0], "near miss") if rng.uniform() < 0.6 else (wrong[1], "other task's gold")
            rows.append((gold, FILLERS[k % len(FILLERS)] + replace_last_box(solution, answer), kind))
        out.append(rows)
    return out


def run(groups: list[list[tuple[str, str, str]]], prompts: int, *, cache: bool, fast_path: bool,
        timeout: float) -> dict[str, Any]:
    """Grade every group, ``prompts`` groups per ``verify_many`` call, on a fresh warmed pool; timings and counts."""
    from rlvr_envs.verifiers import math as mv

    mv.close_pool()  # fresh workers: no parse cache left over from the previous configuration
    if not mv.pool().wait_warm():
        raise RuntimeError("the math verifier's workers did not finish warming up")
    mv.configure_cache(mv.CACHE_SIZE if cache else 0)
    mv.cache_clear()
    verdicts = []
    start = time.perf_counter()
    for b in range(0, len(groups), prompts):
        pairs = [(gold, response) for g in groups[b:b + prompts] for gold, response, _ in g]
        verdicts.extend(mv.verify_many(pairs, timeout=timeout, fast_path=fast_path))
    elapsed = time.perf_counter() - start
    info = mv.cache_info()
    lookups = info.hits + info.misses
    return {"seconds": elapsed, "verifications": len(verdicts), "hits": info.hits, "misses": info.misses,
            "hit_rate": info.hits / lookups if lookups else None, "cached_entries": info.currsize,
            "unverifiable": sum(v.status == "unverifiable" for v in verdicts),
            "verdicts": [(v.correct, v.status, v.parsed, v.error) for v in verdicts]}


def latency(groups: list[list[tuple[str, str, str]]], n_pairs: int, timeout: float) -> dict[str, Any]:
    """Why the batch speedup is what it is: the cost of one Math-Verify-bound check, on one thread, the first time a
    (gold, answer) pair is seen and again later, without the cache (the worker still has its own parse cache) and
    with it (a hit), over the first ``n_pairs`` distinct pairs of the rollouts."""
    from rlvr_envs.verifiers import math as mv

    pairs: dict[tuple[str, str], None] = {}
    for g in groups:
        for gold, response, _ in g:
            answer, _ = mv._extract(response)
            if answer is not None and mv._fast(gold, answer) is None:
                pairs.setdefault((gold, answer), None)
    pairs_list = list(pairs)[:n_pairs]

    def per_check_ms() -> float:
        start = time.perf_counter()
        for gold, answer in pairs_list:
            mv.verify_answer(gold, answer, timeout=timeout)
        return (time.perf_counter() - start) * 1000.0 / len(pairs_list)

    mv.close_pool()
    if not mv.pool().wait_warm():
        raise RuntimeError("the math verifier's workers did not finish warming up")
    mv.configure_cache(0)
    first = per_check_ms()
    repeat_uncached = per_check_ms()
    mv.configure_cache(mv.CACHE_SIZE)
    mv.cache_clear()
    per_check_ms()  # fills the cache
    repeat_cached = per_check_ms()
    return {"pairs": len(pairs_list), "first_check_ms": round(first, 3),
            "repeat_without_cache_ms": round(repeat_uncached, 3), "repeat_with_cache_ms": round(repeat_cached, 4)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=500, help="first N MATH-500 tasks (default: all 500)")
    parser.add_argument("--group", type=int, default=8, help="responses per task (GRPO group size)")
    parser.add_argument("--prompts", type=int, default=8, help="groups per batch (one GRPO step)")
    parser.add_argument("--repeats", type=int, default=2, help="timed runs per configuration (median reported)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=5.0, help="verifier timeout per response (s), the env's")
    parser.add_argument("--data-dir", default=None, help="default: RLVR_DATA_DIR")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "verify_cache.json")
    args = parser.parse_args(argv)

    from rlvr_envs.harness.results import atomic_write_json
    from rlvr_envs.tasks.math import load_tasks
    from rlvr_envs.verifiers import math as mv
    from rlvr_envs.verifiers.math import _extract, _fast

    tasks = load_tasks("math500", data_dir=args.data_dir)[: args.tasks]
    groups = build_rollouts(tasks, args.group, args.seed)
    kinds: dict[str, int] = {}
    fast_settled = distinct = 0
    for g in groups:
        seen = set()
        for gold, response, kind in g:
            kinds[kind] = kinds.get(kind, 0) + 1
            answer, _ = _extract(response)
            if answer is not None:
                fast_settled += _fast(gold, answer) is not None
                seen.add(answer.strip())
        distinct += len(seen)
    n = sum(len(g) for g in groups)
    print(f"{len(tasks)} tasks x {args.group} responses = {n}; {distinct} distinct (task, answer) pairs; "
          f"{fast_settled} settled by the fast path", flush=True)

    results: dict[str, Any] = {}
    agreement: dict[str, Any] = {}
    for fast_path in (True, False):
        runs: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
        for _ in range(args.repeats):
            for cache in (False, True):
                r = run(groups, args.prompts, cache=cache, fast_path=fast_path, timeout=args.timeout)
                runs[cache].append(r)
                print(f"fast_path={fast_path} cache={cache}: {r['seconds']:.2f} s, "
                      f"{r['verifications'] / r['seconds']:.1f} verifications/s, hits={r['hits']} "
                      f"misses={r['misses']} unverifiable={r['unverifiable']}", flush=True)
        name = "fast_path" if fast_path else "math_verify_only"
        summary = {}
        for cache, rs in runs.items():
            secs = statistics.median(r["seconds"] for r in rs)
            summary["with_cache" if cache else "without_cache"] = {
                "median_seconds": round(secs, 3), "verifications_per_s": round(n / secs, 1),
                "seconds_per_run": [round(r["seconds"], 3) for r in rs],
                "hits": rs[-1]["hits"], "misses": rs[-1]["misses"],
                "hit_rate": None if rs[-1]["hit_rate"] is None else round(rs[-1]["hit_rate"], 4),
                "hits_per_verification": round(rs[-1]["hits"] / n, 4),
                "cached_entries": rs[-1]["cached_entries"],
                "unverifiable_per_run": [r["unverifiable"] for r in rs]}
        summary["speedup"] = round(summary["without_cache"]["median_seconds"] /
                                   summary["with_cache"]["median_seconds"], 3)
        results[name] = summary
        # Same verdicts with and without the cache, except where a run timed out (unverifiable) under load.
        base, cached = runs[False][0]["verdicts"], runs[True][0]["verdicts"]
        differ = [i for i, (a, b) in enumerate(zip(base, cached)) if a != b]
        timeouts = [i for i in differ if "unverifiable" in (base[i][1], cached[i][1])]
        agreement[name] = {"compared": len(base), "differ": len(differ), "differ_by_timeout": len(timeouts),
                           "examples": [{"without": base[i], "with": cached[i]} for i in differ[:5]]}
    per_check = latency(groups, 300, args.timeout)
    print(f"one check, one thread: {per_check}", flush=True)
    mv.close_pool()

    doc = {
        "benchmark": "math verifier verification cache on GRPO-like MATH-500 rollout batches",
        "config": {"tasks": len(tasks), "group": args.group, "prompts_per_batch": args.prompts,
                   "responses": n, "repeats": args.repeats, "seed": args.seed, "timeout_s": args.timeout,
                   "workers": int(os.environ.get("RLVR_MATH_WORKERS", mv.POOL_SIZE)), "cache_size": mv.CACHE_SIZE, "data": "math/math500.jsonl"},
        "rollouts": {"kinds": kinds, "distinct_task_answer_pairs": distinct, "settled_by_fast_path": fast_settled},
        "results": results,
        "agreement": agreement,
        "per_check_latency": per_check,
        "machine": {"cpu_count": os.cpu_count(), "python": platform.python_version(),
                    "load_avg_at_end": list(os.getloadavg()) if hasattr(os, "getloadavg") else None},
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join(["python", "benchmarks/verify_cache.py", *(argv if argv is not None else sys.argv[1:])]),
    }
    atomic_write_json(args.out, doc)
    print(json.dumps({"results": results, "agreement": {k: {kk: vv for kk, vv in v.items() if kk != "examples"}
                                                        for k, v in agreement.items()}}, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
