"""Continuous vs static batching in the hf engine on `rlvr eval` workloads with mixed response lengths.

For each workload the harness evaluates the same tasks, samples and seeds twice with one engine setting each:
static (chunks of ``--slots`` rows, each decoded until its longest row is done) and continuous (``--slots`` decode
slots; a queued row takes a freed slot with its own prefill). The harness hands the agent ``--batch-size`` samples
per call, so a call has more rows than slots. Reported: generated tokens / act seconds, the speed-up, and whether
the records are identical (they must be: per-row generators, masked padding).

    python benchmarks/continuous_batching.py [--model smollm2] [--slots 16] [--batch-size 64] [--repeats 1]
        [--out benchmarks/results/continuous_batching.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# (env id, env kwargs, tasks, samples per task, max new tokens)
WORKLOADS = (("rlvr/Arithmetic-v0", {}, 16, 4, 128), ("rlvr/GSM8K-v0", {}, 16, 2, 192))


def run_once(policy, env_id: str, env_kwargs: dict, tasks: int, samples: int, max_new: int, *, slots: int,
             batch_size: int, continuous: bool) -> dict:
    from agents.policy import PolicyAgent
    from agents.policy.engine import HFEngine, SamplingParams
    from rlvr_envs.harness import evaluate

    # fp32 decoding: bf16 matmuls round differently for different batch shapes, so under bf16 no batching scheme
    # (static chunks of another size included) reproduces another's samples exactly
    engine = HFEngine(policy, max_batch_size=slots, continuous=continuous, precision="fp32")
    agent = PolicyAgent(policy, engine, SamplingParams(temperature=1.0, max_new_tokens=max_new, seed=0))
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        res = evaluate(agent, env_id, n_samples=samples, limit=tasks, seed=0, env_kwargs=env_kwargs,
                       out=Path(tmp) / "r.json", progress=False, batch_size=batch_size)
        wall = time.perf_counter() - t0
    tokens = sum(int(r["tokens"] or 0) for r in res.records)
    act_s = res.data["timing"]["act_s"]
    return {"continuous": continuous, "tokens": tokens, "act_s": act_s, "wall_s": wall,
            "tokens_per_s": tokens / act_s, "accuracy": res.metrics.get("accuracy"),
            "records": [(r["task_index"], r["sample_index"], r["response"]) for r in res.records]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--slots", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "continuous_batching.json"))
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from agents.policy import load_policy

    policy = load_policy(args.model)
    rows = []
    for env_id, kwargs, tasks, samples, max_new in WORKLOADS:
        for rep in range(args.repeats):
            static = run_once(policy, env_id, kwargs, tasks, samples, max_new, slots=args.slots,
                              batch_size=args.batch_size, continuous=False)
            cont = run_once(policy, env_id, kwargs, tasks, samples, max_new, slots=args.slots,
                            batch_size=args.batch_size, continuous=True)
            row = {"env": env_id, "tasks": tasks, "samples": samples, "max_new_tokens": max_new, "repeat": rep,
                   "static_tokens_per_s": static["tokens_per_s"], "continuous_tokens_per_s": cont["tokens_per_s"],
                   "speedup": cont["tokens_per_s"] / static["tokens_per_s"], "tokens": cont["tokens"],
                   "identical_records": static["records"] == cont["records"],
                   "static_act_s": static["act_s"], "continuous_act_s": cont["act_s"]}
            rows.append(row)
            print(f"{env_id} x{samples} (rep {rep}): static {row['static_tokens_per_s']:.1f} tok/s, continuous "
                  f"{row['continuous_tokens_per_s']:.1f} tok/s, x{row['speedup']:.2f}, "
                  f"identical={row['identical_records']}", flush=True)
    doc = {"model": args.model, "slots": args.slots, "batch_size": args.batch_size,
           "command": "python benchmarks/continuous_batching.py " + " ".join(argv or sys.argv[1:]),
           "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
           "definition": "generated tokens / seconds inside agent.act (harness timing), temperature 1, seed 0, fp32; "
                         "static = chunks of `slots` rows, continuous = `slots` decode slots refilled from the call's "
                         "queue", "rows": rows}
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
