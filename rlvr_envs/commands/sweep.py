"""``rlvr sweep``: the gold-vs-random sanity sweep over every registered text env.

The reference answer rendered as a response must get reward 1 and a random response ~0: this catches verifier and
data bugs before any model is involved.
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sweep", help="gold-vs-random sanity sweep over every registered text env")
    p.add_argument("--tasks", type=int, default=20, help="tasks per environment")
    p.add_argument("--filter", default="", help="only env IDs containing this text")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run)


def gold_vs_random(env_id: str, n_tasks: int, seed: int) -> tuple[float, float, int]:
    """(mean gold reward, mean random reward, tasks) over the first ``n_tasks`` tasks of ``env_id``."""
    import gymnasium as gym

    env = gym.make(env_id)
    base = env.unwrapped
    if not hasattr(base, "gold_response"):
        env.close()
        raise NotImplementedError("no reference responses (not a text task env)")
    rng = np.random.default_rng(seed)
    n = min(n_tasks, len(base.source))
    gold, rand = [], []
    for i in range(n):
        _, info = env.reset(seed=seed + i, options={"index": i})
        task = base.task
        gold.append(env.step(base.gold_response(task))[1])
        env.reset(options={"index": i})
        rand.append(env.step(base.action_space.sample() + f" \\boxed{{{rng.integers(-10**6, 10**6)}}}")[1])
    env.close()
    return float(np.mean(gold)), float(np.mean(rand)), n


def run(args: argparse.Namespace) -> int:
    import rlvr_envs  # noqa: F401  (registers the IDs)
    from rlvr_envs.commands.list import format_table
    from rlvr_envs.registration import all_entries

    rows, bad = [], 0
    for e in all_entries():
        if args.filter not in e.id:
            continue
        t0 = time.perf_counter()
        try:
            g, r, n = gold_vs_random(e.id, args.tasks, args.seed)
        except NotImplementedError as exc:
            rows.append((e.id, "-", "-", "-", "-", f"n/a ({str(exc)[:60]})"))
            continue
        except Exception as exc:  # one broken env must not hide the others
            rows.append((e.id, "-", "-", "-", "-", f"ERROR {type(exc).__name__}: {str(exc)[:80]}"))
            bad += 1
            continue
        ok = g == 1.0 and r < 0.2
        bad += not ok
        rows.append((e.id, n, f"{g:.2f}", f"{r:.2f}", f"{time.perf_counter() - t0:.1f}s", "ok" if ok else "CHECK"))
    print(format_table(rows, ("env", "tasks", "gold reward", "random reward", "time", "status")))
    print(f"\n{len(rows) - bad}/{len(rows)} environments: gold answers score 1 and random responses ~0")
    return 1 if bad else 0
