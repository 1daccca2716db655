"""Step time of a micro-lane GRPO run in 1 process against 2 data-parallel ranks (``--nproc 2``) on this machine.

Runs ``rlvr train grpo --lane micro`` (micro-countdown, 32 prompts x 8 rollouts a step, 1 torch thread per process)
for ``--steps`` steps each way and reads the runs' own per-step ``gen_s`` (rank 0's rollouts, the same work in both)
and ``train_s`` (stages and the update, which 2 ranks split by groups). Reports medians and the whole-command wall
time. On 2 cores the second rank takes the core the first leaves idle during the update; generation is not split
(``--rollout-workers`` does that).

    python benchmarks/data_parallel_step.py [--steps 4] [--out benchmarks/results/data_parallel_step.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(nproc: int, steps: int, out_dir: Path) -> dict:
    cmd = [sys.executable, "-m", "rlvr_envs.cli", "train", "grpo", "--lane", "micro", "--fresh",
           *[a for kv in (f"steps={steps}", "eval_size=0", "final_eval_size=0", "checkpoint_every=0", "progress=false",
                          f"out_dir={out_dir}") for a in ("--set", kv)], "--nproc", str(nproc)]
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})
    wall = time.perf_counter() - t0
    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r.get("kind") == "train"]
    return {"nproc": nproc, "wall_s": round(wall, 2), "gen_s": [round(r["gen_s"], 3) for r in train],
            "train_s": [round(r["train_s"], 3) for r in train],
            "gen_s_median": round(statistics.median(r["gen_s"] for r in train), 3),
            "train_s_median": round(statistics.median(r["train_s"] for r in train), 3)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "data_parallel_step.json"))
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        one, two = run(1, args.steps, Path(tmp) / "one"), run(2, args.steps, Path(tmp) / "two")
    result = {"definition": "rlvr train grpo --lane micro, per-step gen_s and train_s from the runs' metrics "
                            "(medians over the steps), 1 process vs --nproc 2, 1 torch thread each",
              "cpu_count": os.cpu_count(), "steps": args.steps, "one_process": one, "two_ranks": two,
              "update_speedup": round(one["train_s_median"] / two["train_s_median"], 2),
              "step_speedup": round((one["gen_s_median"] + one["train_s_median"])
                                    / (two["gen_s_median"] + two["train_s_median"]), 2),
              "command": "python benchmarks/data_parallel_step.py"}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("update_speedup", "step_speedup")}), f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
