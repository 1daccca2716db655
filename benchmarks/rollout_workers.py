"""Wall time of one training step's rollouts: the in-process ``hf`` engine against a Ray pool of 1 and 2 rollout
workers (agents/distributed/rollout_workers.py), on this machine's cores.

The micro lane's generation (micro-countdown, Countdown-3 prompts, ``--prompts`` x ``--samples`` rollouts, T = 1, up
to 192 tokens, fp32, one torch thread per engine). Each setting decodes the same prompts with the same per-prompt
seeds (so the pools' rollouts are identical); the time is the median of ``--repeats`` calls after one warm-up call.
Reported with the machine's core count: on 2 cores a 2-worker pool can at best halve the time, and the trainer's own
process then has no core of its own.

    python benchmarks/rollout_workers.py [--prompts 32] [--samples 8] [--repeats 3] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="micro-countdown")
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=192)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--workers", default="1,2")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "rollout_workers.json"))
    args = p.parse_args()
    import gymnasium as gym
    import ray

    import rlvr_envs  # noqa: F401
    from agents.distributed.rollout_workers import RayRolloutEngine, prompt_seeds
    from agents.grpo.config import load_recipe
    from agents.policy.engine import HFEngine, SamplingParams
    from agents.policy.models import load_policy

    torch.set_num_threads(1)
    cfg = load_recipe("grpo", [f"model={args.model}"], lane="micro")
    env = gym.make(cfg.env, **cfg.env_kwargs)
    policy = load_policy(cfg.model, dtype=cfg.dtype, seed=0)
    prompts = []
    for i in range(args.prompts):
        _, info = env.reset(options={"index": i})
        prompts.append(policy.prompt_text(info["messages"]))
    sampling = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=args.max_new_tokens, seed=0)
    seeds = prompt_seeds(len(prompts), sampling, None)

    def timed(engine) -> tuple[float, list, list[float]]:
        engine.generate(prompts, args.samples, sampling, seeds=seeds)  # warm-up
        walls, out = [], None
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            out = engine.generate(prompts, args.samples, sampling, seeds=seeds)
            walls.append(time.perf_counter() - t0)
        return statistics.median(walls), out, walls

    rows = {}
    local_s, local_out, walls = timed(HFEngine(policy, precision="fp32"))
    tokens = sum(len(r.response_ids) for r in local_out)
    rows["in-process"] = {"wall_s": local_s, "walls": walls, "tokens": tokens}
    print(f"in-process: {local_s:.2f} s ({tokens} tokens)", flush=True)
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    for w in [int(x) for x in args.workers.split(",")]:
        pool = RayRolloutEngine(policy, w, engine_kwargs={"precision": "fp32"}, cpus_per_worker=min(1, os.cpu_count() / w))
        wall, out, walls = timed(pool)
        same = [r.response_ids for r in out] == [r.response_ids for r in local_out]
        rows[f"ray x{w}"] = {"wall_s": wall, "walls": walls, "tokens": sum(len(r.response_ids) for r in out),
                             "same_tokens_as_in_process": same, "speedup_vs_in_process": local_s / wall}
        print(f"ray x{w}: {wall:.2f} s, {local_s / wall:.2f}x in-process, same tokens: {same}", flush=True)
        pool.shutdown()
    ray.shutdown()
    result = {"definition": f"median wall time of generate({args.prompts} prompts x {args.samples}, T=1, "
                            f"max_new_tokens={args.max_new_tokens}, fp32, 1 torch thread per engine) over "
                            f"{args.repeats} calls after a warm-up; same per-prompt seeds in every setting",
              "model": args.model, "cpu_count": os.cpu_count(), "machine": platform.processor() or platform.machine(),
              "torch": torch.__version__, "ray": ray.__version__, "settings": rows,
              "command": "python benchmarks/rollout_workers.py"}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
