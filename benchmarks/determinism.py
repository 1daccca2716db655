"""One lane run, trained twice in fresh processes that differ in everything a key does not cover (Python's hash seed,
the thread count), must end at one weights hash: a run key then pins weights, and a baseline cannot move between two
builds of the same key.

    python benchmarks/determinism.py                       # micro lane GRPO, 3 steps, threads 1 vs 2
    python benchmarks/determinism.py --steps 60 --out F    # the whole lane run
    python benchmarks/determinism.py --against-archive --seed 0 --steps 0 --eval-size 0
                     # retrain a committed suite run (benchmarks/results/runs/) in a fresh process and compare

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
if sys.argv[6:]:  # the suite's own resolution of a comparison's run (the same key as the committed archive)
    from agents.grpo.comparisons import comparisons
    from agents.grpo.regression import resolve
    cfg = resolve(comparisons()[sys.argv[6]], sys.argv[4], int(sys.argv[7]))
records, key, done = train_run(cfg, Path(sys.argv[2]), run_code_hash(cfg))
train = [r for r in records if r.get("kind") == "train"]
print(json.dumps({"key": key, "warmstart": done["warmstart_weights_hash"], "final": done["final_weights_hash"],
                  "threads": done["threads"], "last_loss": train[-1]["loss"] if train else None,
                  "wall_s": round(done["wall_s"], 1)}))
"""


def train_in_process(threads: int, hash_seed: str, runs_dir: Path, overrides: list[str], recipe: str, lane: str,
                     cache: str | None, suite_run: tuple[str, int] | None = None) -> dict:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed, "OMP_WAIT_POLICY": "PASSIVE"}
    if cache:
        env["RLVR_CACHE_DIR"] = cache
    extra = [suite_run[0], str(suite_run[1])] if suite_run else []
    out = subprocess.run([sys.executable, "-c", CHILD, str(threads), str(runs_dir), json.dumps(overrides), recipe,
                          lane, *extra], cwd=ROOT, env=env, capture_output=True, text=True, check=False)
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
    p.add_argument("--against-archive", action="store_true",
                   help="retrain --comparison's --recipe run of --seed as the suite resolves it, once, in a fresh "
                        "process (hash seed 3, 2 process threads), and compare with its committed archive")
    p.add_argument("--comparison", default="dr_grpo_vs_grpo")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="default: benchmarks/results/determinism[_archive_<recipe>_s<seed>].json")
    args = p.parse_args(argv)
    if args.against_archive:
        return against_archive(args, argv)
    args.out = args.out or str(ROOT / "benchmarks" / "results" / "determinism.json")
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


def against_archive(args: argparse.Namespace, argv: list[str] | None) -> int:
    from agents.grpo.regression import ARCHIVE_DIR, read_archive

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        run = train_in_process(2, "3", Path(tmp), [], args.recipe, args.lane, None, (args.comparison, args.seed))
    name = f"{args.recipe}-s{args.seed}-{run['key']}"
    archived = read_archive(name, run["key"])
    if archived is None:
        raise SystemExit(f"no committed archive {ARCHIVE_DIR / name}.jsonl.gz for this key: run the suite first")
    info = archived[2]
    same = info["final_weights_hash"] == run["final"] and info["warmstart_weights_hash"] == run["warmstart"]
    result = {"comparison": args.comparison, "recipe": args.recipe, "seed": args.seed, "key": run["key"],
              "archive": {k: info.get(k) for k in ("warmstart_weights_hash", "final_weights_hash", "threads",
                                                   "cpu_flags", "wall_s")},
              "retrained": run, "identical": same, "wall_s": round(time.perf_counter() - t0, 1),
              "command": "python benchmarks/determinism.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    out = Path(args.out or ROOT / "benchmarks" / "results" / f"determinism_archive_{args.recipe}_s{args.seed}.json")
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{name}: archive {info['final_weights_hash'][:16]} vs retrained {run['final'][:16]}: identical {same}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
