"""Step time and memory of each objective against GRPO's on the micro lane (issue: objectives and self-distillation).

Each recipe trains a few steps on the micro lane in a fresh process (so peak RSS is its own), same seed, same prompts
and rollouts budget; the table reports the mean update time (``train_s``: the loss's forward/backward and optimizer,
plus any teacher pass), the mean generation time and the process's peak RSS, each beside GRPO's.

    python benchmarks/loss_cost.py [--steps 4] [--recipes grpo opsd ...] [--out benchmarks/results/loss_cost.json]

Steps after the first are averaged (the first pays one-time costs). Numbers are of this machine (2 CPU cores here);
compare the ratios, not the seconds, across machines.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ("grpo", "garl", "paft", "opsd", "dash_opsd", "distil", "rlcsd")


def _one(recipe: str, steps: int, out_dir: str, queue: mp.Queue) -> None:
    sys.path.insert(0, str(ROOT))
    from agents.grpo.config import load_recipe
    from agents.grpo.trainer import Trainer

    cfg = load_recipe(recipe, [f"steps={steps}", "eval_size=0", "checkpoint_every=0", "progress=false", "plot=false",
                               f"out_dir={out_dir}/{recipe}"], lane="micro")
    records = [r for r in Trainer(cfg).run(resume=False) if r.get("kind") == "train"]
    queue.put({"recipe": recipe, "records": records})


def measure(recipe: str, steps: int, out_dir: str) -> dict:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_one, args=(recipe, steps, out_dir, queue))
    t0 = time.perf_counter()
    proc.start()
    result = queue.get()
    proc.join()
    later = result["records"][1:] or result["records"]
    return {"recipe": recipe, "steps": steps, "wall_s": round(time.perf_counter() - t0, 1),
            "train_s": sum(r["train_s"] for r in later) / len(later),
            "gen_s": sum(r["gen_s"] for r in later) / len(later),
            "peak_rss_mb": max(r["peak_rss_mb"] for r in result["records"]),
            "samples": sum(r.get("samples", 0) for r in later) / len(later)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--recipes", nargs="+", default=list(RECIPES))
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "loss_cost.json"))
    p.add_argument("--work", default="/tmp/rlvr-loss-cost")
    args = p.parse_args(argv)
    if args.steps < 2:
        p.error("--steps must be >= 2 (the first step is not averaged)")
    recipes = ["grpo", *[r for r in args.recipes if r != "grpo"]]
    rows = []
    for recipe in recipes:
        row = measure(recipe, args.steps, args.work)
        rows.append(row)
        print(f"{recipe:<10} update {row['train_s']:.2f} s  generation {row['gen_s']:.2f} s  "
              f"peak RSS {row['peak_rss_mb']:.0f} MB", flush=True)
    base = rows[0]
    for row in rows:
        row["train_vs_grpo"] = row["train_s"] / base["train_s"]
        row["rss_vs_grpo"] = row["peak_rss_mb"] / base["peak_rss_mb"]
    doc = {"lane": "micro", "command": "python benchmarks/loss_cost.py " + " ".join(argv or sys.argv[1:]),
           "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
           "definition": "mean per-step update time (train_s) and generation time over steps 2..N, peak process RSS",
           "rows": rows}
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print("| objective | update s | x GRPO | generation s | peak RSS MB | x GRPO |\n|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['recipe']} | {r['train_s']:.2f} | {r['train_vs_grpo']:.2f} | {r['gen_s']:.2f} | "
              f"{r['peak_rss_mb']:.0f} | {r['rss_vs_grpo']:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
