"""Credit quality of cheap step credit against Monte-Carlo step values, on one batch sampled from a lane's env.

Samples a batch as the trainer's first step would (the lane's env, sampling and length cap), computes the MC step
values of ``mc_step`` (the reference: continuations from step boundaries, scored by the verifier), then the per-token
advantages of each cheap estimator on the same batch (RREDCoT raw dV and its recipe's z-scored form, the ``dash``
estimator, GRPO as the no-credit floor) and prints each one's agreement with MC: Spearman rank correlation over
segments and sign agreement (agents/grpo/credit_quality.py).

    python benchmarks/credit_quality.py [--model micro-countdown] [--lane micro] [--prompts 8] [--n 4]
        [--boundaries 4] [--rollouts-per-boundary 8] [--max-new-tokens N] [--seeds 0,1,2] [--json PATH]
    python benchmarks/credit_quality.py --combine s0.json s1.json s2.json --json PATH   (summarize earlier runs)

With several seeds (one batch each) the summary gives each estimator's mean agreement and a 95% t-interval over
the batches.

On the micro lane's policy this costs prompts x n x boundaries x rollouts continuations (8 x 4 x 4 x 8 = 1024 by
default); ``--model tiny`` checks the script end to end in seconds (its random weights give no signal).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from types import SimpleNamespace
from typing import Any


def build_trainer(model: str, lane: str, *, prompts: int, n: int, seed: int, max_new_tokens: int | None,
                  out_dir: str) -> Any:
    """A GRPO trainer on ``lane`` with ``model``: only its sampling, scoring and services are used."""
    from agents.grpo.config import load_recipe
    from agents.grpo.trainer import Trainer

    overrides = [f"model={model}", f"prompts_per_step={prompts}", f"params.rollout_allocator.n={n}", f"seed={seed}",
                 "progress=false", "plot=false", f"out_dir={json.dumps(out_dir)}", "eval_size=0"]
    if max_new_tokens:
        overrides.append(f"max_new_tokens={max_new_tokens}")
    return Trainer(load_recipe("grpo", overrides, lane=lane))


def measure(trainer: Any, *, boundaries: int = 4, rollouts_per_boundary: int = 8, rredcot: dict[str, Any] | None = None,
            mc: dict[str, Any] | None = None, eta: float = 0.5, step: int = 1) -> dict[str, Any]:
    """Sample one batch with ``trainer`` and return each estimator's agreement with the MC reference (``rredcot`` and
    ``mc``: extra hyper-parameters of those estimators, e.g. a splitter or a verifier for another env)."""
    from agents.grpo.credit_quality import compare
    from agents.grpo.registry import build

    trainer.step = step
    batch, _ = trainer.collect()
    if batch is None:
        return {"error": "no batch (every group dropped)"}
    batch.rewards = trainer.components["reward_shaper"](batch).float()
    services = SimpleNamespace(cfg=trainer.cfg, logprobs=trainer.current_logprobs, generate=trainer.extra_generate,
                               tokenizer=trainer.tokenizer)
    grpo = build("advantage", "grpo")
    base = grpo(batch)

    def bound(name: str, params: dict[str, Any]) -> Any:
        c = build("advantage", name, params)
        c.bind(services)
        return c

    ref = bound("mc_step", {**(mc or {}), "boundaries": boundaries, "rollouts_per_boundary": rollouts_per_boundary,
                            "beta": 1.0, "seed": trainer.cfg.seed})
    extra0 = trainer.extra_tokens
    ref(batch)
    estimates = {"grpo": base}
    estimates["rredcot_raw"] = bound("rredcot", {**(rredcot or {}), "beta": 1.0, "normalize": "none"})(batch)
    estimates["rredcot"] = bound("rredcot", {**(rredcot or {}), "beta": 1.0})(batch)
    estimates["dash"] = bound("dash", {"eta": eta})(batch)
    result = compare(ref.last_bounds, ref.last_values, estimates, base)
    m = ref.metrics()
    return {"rows": len(batch), "groups": batch.num_groups, "accuracy": float(batch.correct.float().mean()),
            "mc": {**m, "extra_tokens_counted": trainer.extra_tokens - extra0}, "agreement": result}


def _fmt(x: float) -> str:
    return "   nan" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:+.3f}"


def summarize(per_seed: list[dict[str, Any]]) -> dict[str, Any]:
    """Per estimator, the mean Spearman and sign agreement over the seeds' batches with 95% t-intervals (NaN
    batches, e.g. GRPO's constant credit, are left out of the Spearman mean)."""
    from agents.grpo.comparisons import t_interval

    names = sorted({n for out in per_seed for n in out.get("agreement", {})})
    summary: dict[str, Any] = {}
    for name in names:
        row: dict[str, Any] = {}
        for key in ("spearman", "sign_agreement"):
            values = [float(out["agreement"][name][key]) for out in per_seed if name in out.get("agreement", {})]
            values = [v for v in values if not math.isnan(v)]
            row[key] = {"mean": sum(values) / len(values) if values else math.nan, "batches": len(values),
                        "interval95": list(t_interval(values)) if values else [math.nan, math.nan]}
        row["segments"] = sum(int(out["agreement"][name]["segments"]) for out in per_seed
                              if name in out.get("agreement", {}))
        summary[name] = row
    return summary


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="micro-countdown")
    ap.add_argument("--lane", default="micro")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--boundaries", type=int, default=4)
    ap.add_argument("--rollouts-per-boundary", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=None)
    ap.add_argument("--eta", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=None, help="one batch (same as --seeds N)")
    ap.add_argument("--seeds", default="0", help="comma-separated: one batch per seed, summarized together")
    ap.add_argument("--combine", nargs="+", default=None, metavar="JSON",
                    help="summarize the outputs of earlier runs instead of sampling")
    ap.add_argument("--json", default=None, help="also write the result here")
    args = ap.parse_args(argv)
    if args.combine:
        per_seed = []
        for path in args.combine:
            with open(path) as f:
                loaded = json.load(f)
            per_seed.extend(loaded.get("per_seed", [loaded]))
    else:
        seeds = [args.seed] if args.seed is not None else [int(x) for x in args.seeds.split(",")]
        per_seed = []
        for seed in seeds:
            with tempfile.TemporaryDirectory(prefix="credit-quality-") as tmp:
                trainer = build_trainer(args.model, args.lane, prompts=args.prompts, n=args.n, seed=seed,
                                        max_new_tokens=args.max_new_tokens, out_dir=tmp)
                one = measure(trainer, boundaries=args.boundaries, rollouts_per_boundary=args.rollouts_per_boundary,
                              eta=args.eta)
            one["args"] = {**vars(args), "seed": seed}
            per_seed.append(one)
            print(f"{args.model} on {args.lane}, seed {seed}: {one.get('rows', 0)} rows, accuracy "
                  f"{one.get('accuracy', float('nan')):.3f}, MC: {one.get('mc', {})}", flush=True)
    out = per_seed[0] if len(per_seed) == 1 else {"per_seed": per_seed}
    out["summary"] = summarize(per_seed)
    out["command"] = "python benchmarks/credit_quality.py " + " ".join(argv if argv is not None else sys.argv[1:])
    print(f"{'estimator':>16} {'spearman':>9} {'95% interval':>18} {'sign agr':>9} {'95% interval':>18} "
          f"{'segments':>9}")
    for name, a in out["summary"].items():
        sp, sg = a["spearman"], a["sign_agreement"]
        print(f"{name:>16} {_fmt(sp['mean']):>9} {_fmt(sp['interval95'][0]):>8},{_fmt(sp['interval95'][1]):>8} "
              f"{_fmt(sg['mean']):>9} {_fmt(sg['interval95'][0]):>8},{_fmt(sg['interval95'][1]):>8} "
              f"{a['segments']:>9}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2, default=float)
    return out


if __name__ == "__main__":
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's agents, not an installed copy
    main()
