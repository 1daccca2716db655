"""``rlvr bisim``: the certified ANN bisimulation metric on a tabular testbed (rlvr_envs/mdp).

Prints and writes (``--json``): coverage, sweeps, pair backups, sandwich width on C, rho / enclosure / identity gap
(when the exact metric is computed), the certificate, ARI against true groups, aggregation error, seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from rlvr_envs.extras import require_extra


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bisim", help="certified ANN bisimulation metric on a tabular testbed")
    p.add_argument("--env", default="rlvr/Grouped64-v0", help="a tabular env id (rlvr/Grouped64-v0, rlvr/Taxi-v0, ...)")
    p.add_argument("--env-kwargs", default="{}", help='JSON kwargs for gym.make, e.g. \'{"rainy": true}\'')
    p.add_argument("--k", type=int, default=15, help="neighbours per state")
    p.add_argument("--index", default="hnsw", choices=["flat", "hnsw", "ivf"])
    p.add_argument("--embedding", default="informative", choices=["informative", "uninformative"])
    p.add_argument("--seed", type=int, default=0, help="embedding noise and tie-breaking jitter")
    p.add_argument("--gamma", type=float, default=0.9)
    p.add_argument("--l0", default="zero", choices=["zero", "reward"], help="lower arm start: 0 or d_R = F(0)")
    p.add_argument("--max-sweeps", type=int, default=500)
    p.add_argument("--tol", type=float, default=1e-9)
    p.add_argument("--tau", type=float, default=1e-6, help="edge threshold of the clustering certificate")
    p.add_argument("--clusters", type=int, default=4, help="K for the aggregation error")
    p.add_argument("--exact", default="auto", choices=["auto", "yes", "no"],
                   help="compute d* for rho / enclosure checks (auto: up to 4096 states)")
    p.add_argument("--json", default=None, help="also write the report here")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    require_extra("bisim", "rlvr bisim")
    import gymnasium as gym
    import numpy as np

    import rlvr_envs  # noqa: F401  (registers the ids)
    from agents.bisim import (
        RestrictedRuns,
        adjusted_rand_index,
        aggregation_error,
        certify,
        components,
        exact_metric,
        knn_pairs,
        merge_to_k,
    )
    from agents.bisim.ann import against_exact

    try:
        env_kwargs = json.loads(args.env_kwargs)
        env = gym.make(args.env, **env_kwargs).unwrapped
    except (json.JSONDecodeError, gym.error.Error, TypeError) as e:
        print(f"error: cannot make {args.env!r}: {e}", file=sys.stderr)
        return 2
    if not hasattr(env, "to_tensors"):
        print(f"error: {args.env} is not a tabular MDP env (no to_tensors())", file=sys.stderr)
        return 2
    idx, prob, R = env.to_tensors()
    n = idx.shape[0]
    emb = env.embedding(args.embedding, args.seed)
    t0 = time.perf_counter()
    pairs = knn_pairs(emb, args.k, args.index, args.seed)
    index_s = time.perf_counter() - t0
    runs = RestrictedRuns(idx, prob, R, args.gamma, pairs, l0=args.l0)
    setup_s = time.perf_counter() - t0 - index_s
    d_star = None
    if args.exact == "yes" or (args.exact == "auto" and n <= 4096):
        d_star = exact_metric(idx, prob, R, args.gamma, tol=args.tol).d
    worst = {"lower_violation": 0.0, "upper_violation": 0.0}

    def check(_k: int, r: RestrictedRuns) -> None:
        c = against_exact(r, d_star)
        for key in worst:
            worst[key] = max(worst[key], c[key])

    res = runs.run(args.max_sweeps, args.tol, check if d_star is not None else None)
    cert = certify(n, pairs, res.lower, res.upper, args.tau)
    report: dict[str, Any] = {
        "env": args.env, "env_kwargs": env_kwargs, "n_states": n, "k": args.k, "index": args.index,
        "embedding": args.embedding, "seed": args.seed, "gamma": args.gamma, "l0": args.l0,
        "covered_pairs": len(pairs), "coverage": len(pairs) / (n * (n - 1) / 2), "sweeps": res.sweeps,
        "pair_backups": res.pair_backups, "width": res.width, "certificate": cert["certificate"],
        "seconds": {"index": index_s, "setup": setup_s, "sweeps": res.seconds,
                    "total": index_s + setup_s + res.seconds},
    }
    groups = env.true_groups()
    if groups is not None and len(groups) == n:
        report["ari"] = adjusted_rand_index(cert["part_upper"], groups)
    report["aggregation_error"] = aggregation_error(idx, prob, R, args.gamma,
                                                    merge_to_k(n, pairs, res.lower, args.clusters, emb))
    if d_star is not None:
        tol = args.gamma / (1 - args.gamma) * args.tol + 1e-9
        final = against_exact(runs, d_star)
        report.update(rho=final["rho"], identity_gap=final["identity_gap"],
                      enclosure_ok=bool(max(worst.values()) <= tol), enclosure_max_violation=max(worst.values()))
        if cert["certificate"] == "certified":
            truth = components(n, pairs, d_star[pairs[:, 0], pairs[:, 1]], args.tau)
            report["certificate_correct"] = bool(np.array_equal(truth, cert["labels"]))
    for key, value in report.items():
        print(f"{key:>24}: {value}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0
