"""The micro lane's warm-started policy: held-out accuracy (greedy, strict trace check, pass@1 / pass@8 at the lane's
temperature) and response lengths. Builds ``micro-countdown`` first if it is not cached (about 5 minutes on 2 cores).

    python benchmarks/micro_lane.py [--tasks 200] [--sampled-tasks 100] [--k 8]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=200)
    ap.add_argument("--sampled-tasks", type=int, default=100)
    ap.add_argument("--k", type=int, default=8)
    args = ap.parse_args()

    import gymnasium as gym

    import rlvr_envs  # noqa: F401
    from agents.grpo.config import load_lane
    from agents.policy import SamplingParams, load_policy, make_engine
    from agents.policy.countdown_traces import check_trace
    from agents.policy.micro import micro_dir, parse_name

    lane = load_lane("micro")
    t0 = time.perf_counter()
    policy = load_policy(lane["model"])
    report = json.loads((micro_dir(parse_name(lane["model"])) / "warmstart.json").read_text())
    engine = make_engine(policy, "hf", precision=lane["precision"])
    env = gym.make(lane["env"], **{**lane["env_kwargs"], **lane["eval_env_kwargs"]})
    prompts, tasks = [], []
    for i in range(args.tasks):
        _, info = env.reset(options={"index": i})
        prompts.append(policy.prompt_text(info["messages"]))
        tasks.append(env.unwrapped.task)
    max_new = lane["eval_max_new_tokens"]

    def scored(rollouts, k):
        return np.array([env.unwrapped.score(tasks[j // k], r.text).correct for j, r in enumerate(rollouts)])

    greedy = engine.generate(prompts, 1, SamplingParams(temperature=0.0, max_new_tokens=max_new))
    strict = np.mean([check_trace(t.metadata["numbers"], int(t.answer), r.text).reached for r, t in zip(greedy, tasks)])
    m, k = args.sampled_tasks, args.k
    sampled = engine.generate(prompts[:m], k, SamplingParams(temperature=lane["temperature"], max_new_tokens=max_new,
                                                             seed=0))
    hits = scored(sampled, k).reshape(m, k)
    print(json.dumps({
        "warm_start_s": report["wall_s"], "warm_start_steps": report["config"]["steps"],
        "final_loss": round(report["final_loss"], 4), "n_params": report["n_params"],
        "greedy_accuracy": float(scored(greedy, 1).mean()), "strict_accuracy": float(strict),
        "temperature": lane["temperature"], "pass@1": float(hits.mean()), f"pass@{k}": float(hits.any(1).mean()),
        "greedy_len_p10_p50_p90": np.percentile([len(r.response_ids) for r in greedy], [10, 50, 90]).tolist(),
        "sampled_len_p10_p50_p90": np.percentile([len(r.response_ids) for r in sampled], [10, 50, 90]).tolist(),
        "wall_s": round(time.perf_counter() - t0, 1)}, indent=1))


if __name__ == "__main__":
    main()
