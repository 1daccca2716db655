"""One lane run, trained twice in fresh processes that differ in everything a key does not cover (Python's hash seed,
the thread count), must end at one weights hash: a run key then pins weights, and a baseline cannot move between two
builds of the same key.

    python benchmarks/determinism.py                       # micro lane GRPO, 3 steps, threads 1 vs 2
    python benchmarks/determinism.py --steps 60 --out F    # the whole lane run

Each process trains with ``agents.grpo.regression.train_run`` into its own folder (the micro warm start is built first
if it is not cached, in the first process: it is keyed, so the second reuses it unless --rebuild-warmstart, which
builds it in both). Writes ``benchmarks/results/determinism.json``: both processes' warm-start and final hashes, the
final loss, the thread counts and hash seeds, and the command.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, sys, torch
torch.set_num_threads(int(sys.argv[1]))
from pathlib import Path
from agents.grpo.config import load_recipe
from agents.grpo.regression import run_code_hash, train_run
overrides = json.loads(sys.argv[3])
cfg = load_recipe(sys.argv[4], [*overrides, "progress=false"], lane=sys.argv[5])
records, key, done = train_run(cfg, Path(sys.argv[2]), run_code_hash(cfg))
train = [r for r in records if r.get("kind") == "train"]
print(json.dumps({"key": key, "warmstart": done["warmstart_weights_hash"], "final": done["final_weights_hash"],
                  "threads": done["threads"], "last_loss": train[-1]["loss"] if train else None,
                  "wall_s": round(done["wall_s"], 1)}))
"""


def train_in_process(threads: int, hash_seed: str, runs_dir: Path, overrides: list[str], recipe: str, lane: str,
                     cache: str | None) -> dict:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed, "OMP_WAIT_POLICY": "PASSIVE"}
    if cache:
        env["RLVR_CACHE_DIR"] = cache
    out = subprocess.run([sys.executable, "-c", CHILD, str(threads), str(runs_dir), json.dumps(overrides), recipe,
                          lane], cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if out.returncode:
        raise RuntimeError(f"training process failed:\n{out.stderr[-3000:]}")
    return {**json.loads(out.stdout.strip().splitlines()[-1]), "hash_seed": hash_seed}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recipe", default="grpo")
    p.add_argument("--lane", default="micro")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--eval-size", type=int, default=16, help="held-out tasks per eval (the lane's own with 0)")
    p.add_argument("--rebuild-warmstart", action="store_true",
                   help="build the micro warm start in each process (a fresh cache each): ~6 min per process")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "determinism.json"))
    args = p.parse_args(argv)
    overrides = [f"steps={args.steps}", "checkpoint_every=0"]
    if args.eval_size:
        overrides += [f"eval_size={args.eval_size}", f"final_eval_size={args.eval_size}"]
    t0 = time.perf_counter()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (threads, hash_seed) in enumerate(((1, "1"), (2, "2"))):
            cache = str(Path(tmp) / f"cache{i}") if args.rebuild_warmstart else None
            runs.append(train_in_process(threads, hash_seed, Path(tmp) / f"runs{i}", overrides, args.recipe,
                                         args.lane, cache))
            print(json.dumps(runs[-1]), flush=True)
    same = len({r["final"] for r in runs}) == 1 and len({r["warmstart"] for r in runs}) == 1
    result = {"recipe": args.recipe, "lane": args.lane, "overrides": overrides, "runs": runs,
              "rebuilt_warmstart": args.rebuild_warmstart, "identical": same,
              "wall_s": round(time.perf_counter() - t0, 1),
              "command": "python benchmarks/determinism.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"identical weights: {same} -> {args.out}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
