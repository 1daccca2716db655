"""Sparrow's cost model and DistillSparse on the micro lane's policy: which sparsity schedule holds the alignment tail
at the threshold, what it would save, and whether a distilled LoRA adapter lets a sparser schedule hold it.

1. **Calibration**: training-stream prompts of the lane's env, ``--n`` sparse rollouts each at every share of
   ``--shares`` (one share for every position); per position bucket, the 5th percentile of
   ``a_t = min(1, pi_dense / pi_sparse)`` (``agents.methods.distill_sparse.alignment``).
2. **Cost model** (``agents.methods.sparrow_schedule``): ``fixed + per_key * keys`` per decoded token, from the
   model's FLOPs and from dense decode steps timed at several contexts (``benchmarks/s3r_decoding.py``'s account,
   batch ``--batch``); the schedule chosen is the smallest feasible share per bucket; its projected decode cost
   against dense on the calibration workload (an ideal kernel that reads only kept keys: a projection, not a
   measured time).
3. **Validation**: other prompts decoded with the chosen schedule; the tails it actually gets; held-out reward of
   those sparse rollouts beside dense rollouts of the same prompts and seeds.
4. **DistillSparse**: for each share of ``--distill-shares``, a fresh LoRA adapter distilled on sparse rollouts at
   that share; the calibration sweep again with the adapter-merged actor against the unchanged dense policy; the
   schedule and projection after, and the held-out reward and tails at that share before and after.

    python benchmarks/sparrow_schedule.py [--model micro-countdown] [--lane micro] [--prompts 64] [--n 4]
        [--shares 0,0.05,0.1,0.2,0.35,0.5,0.75,1] [--distill-steps 60] [--out benchmarks/results/sparrow_schedule.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def lane_tasks(lane: str, count: int, *, start: int, eval_stream: bool = False) -> tuple[Any, list[dict[str, Any]]]:
    """``count`` tasks of the lane's env from index ``start`` (training stream, or the held-out one): the env and,
    per task, its index and chat messages."""
    import gymnasium as gym

    import rlvr_envs  # noqa: F401  (registers the envs)
    from agents.grpo.config import load_recipe

    cfg = load_recipe("grpo", [], lane=lane)
    kwargs = {**cfg.env_kwargs, **(cfg.eval_env_kwargs if eval_stream else {})}
    env = gym.make(cfg.env, **kwargs)
    tasks = []
    for i in range(start, start + count):
        _, info = env.reset(options={"index": i})
        tasks.append({"index": i, "messages": info["messages"]})
    return env, tasks


def rewards(env: Any, tasks: list[dict[str, Any]], rollouts: list[Any], n: int) -> list[float]:
    out = []
    for k, r in enumerate(rollouts):
        env.reset(options={"index": tasks[k // n]["index"]})
        out.append(float(env.step(r.text)[1]))
    return out


def sweep(dense_model: Any, policy: Any, actor: Any, prompts: list[str], n: int, shares: list[float],
          base: Any, positions: list[int], seed: int, max_new_tokens: int, pad_id: int,
          keep: dict[float, Any] | None = None) -> dict[float, Any]:
    """Alignment statistics of ``actor``'s sparse rollouts at each share (``keep``, when given, collects the
    rollouts by share)."""
    from agents.methods.distill_sparse import alignment, sample_sparse
    from agents.methods.sparrow_schedule import pattern_for
    from agents.policy import SamplingParams

    out = {}
    for share in shares:
        pattern = pattern_for(base, [0], [share])
        sp = SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens, seed=seed)
        t0 = time.perf_counter()
        rolls = sample_sparse(policy, actor, prompts, n, sp, pattern)
        stats = alignment(dense_model, rolls, positions, pad_id=pad_id)
        stats["seconds"] = time.perf_counter() - t0
        stats["mean_len"] = sum(r.n_tokens for r in rolls) / len(rolls)
        out[share] = stats
        if keep is not None:
            keep[share] = rolls
        print(f"  share {share:.2f}: tail {stats['tail']:.3f} mean {stats['mean']:.3f} buckets "
              f"{[round(b['tail'], 3) if not math.isnan(b['tail']) else None for b in stats['buckets']]} "
              f"({stats['tokens']} tokens, {stats['seconds']:.1f} s)", flush=True)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="micro-countdown")
    ap.add_argument("--lane", default="micro")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--shares", default="0,0.05,0.1,0.2,0.35,0.5,0.75,1")
    ap.add_argument("--sinks", type=int, default=4)
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--positions", default="0,64,128")
    ap.add_argument("--threshold", type=float, default=0.86)
    ap.add_argument("--max-new-tokens", type=int, default=192)
    ap.add_argument("--contexts", default="32,64,128,192,256")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--distill-shares", default="0,0.05", help="one fresh adapter distilled at each share")
    ap.add_argument("--distill-steps", type=int, default=60)
    ap.add_argument("--distill-rank", type=int, default=8)
    ap.add_argument("--distill-lr", type=float, default=1e-3)
    ap.add_argument("--divergence", default="forward")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "sparrow_schedule.json"))
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import torch
    from s3r_decoding import account

    from agents.methods.distill_sparse import (
        DistillSparseConfig,
        alignment,
        distill_sparse,
        merged_actor,
        sample_sparse,
    )
    from agents.methods.sparrow_schedule import DecodeCost, choose_schedule, pattern_for, projection, visible_histogram
    from agents.policy import SamplingParams, load_policy
    from agents.policy.sparse import SparsePattern

    started = time.perf_counter()
    shares = [float(s) for s in args.shares.split(",")]
    distill_shares = [float(s) for s in args.distill_shares.split(",")] if args.distill_shares else []
    positions = [int(p) for p in args.positions.split(",")]
    base = SparsePattern(sinks=args.sinks, window=args.window, topk=0)
    policy = load_policy(args.model)
    pad_id = getattr(policy.tokenizer, "pad_token_id", None) or 0
    env, calib_tasks = lane_tasks(args.lane, args.prompts, start=0)
    _, distill_tasks = lane_tasks(args.lane, 4 * args.prompts, start=args.prompts)
    held_env, held_tasks = lane_tasks(args.lane, args.prompts, start=0, eval_stream=True)
    prompts = [policy.prompt_text(t["messages"]) for t in calib_tasks]
    held_prompts = [policy.prompt_text(t["messages"]) for t in held_tasks]
    distill_prompts = [policy.prompt_text(t["messages"]) for t in distill_tasks]
    result: dict[str, Any] = {
        "benchmark": "sparrow_schedule", "args": vars(args),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "load_average_at_start": list(os.getloadavg())},
        "definitions": {
            "a_t": "min(1, pi_dense(y_t) / pi_sparse(y_t)) per sampled token, token 0 (dense prefill) left out",
            "tail": "5th percentile of a_t over a bucket's tokens",
            "bucket": "position by visible keys (prompt + response so far), from_keys edges",
            "cost_model": "fixed + per_key * kept_keys per decoded token, from the model's FLOPs ('flops') or fitted "
                          "to dense decode steps timed over contexts ('timed'); an ideal kernel reading only kept "
                          "keys (a projection, not a measured time)"}}

    print(f"calibration: {len(prompts)} prompts x {args.n}, shares {shares}", flush=True)
    with torch.no_grad():
        calibration_rollouts: dict[float, Any] = {}
        before = sweep(policy.model, policy, policy.model, prompts, args.n, shares, base, positions, args.seed,
                       args.max_new_tokens, pad_id, keep=calibration_rollouts)
    result["calibration_before"] = {str(s): v for s, v in before.items()}

    print("cost model: the model's FLOPs per token, and dense decode steps timed at several contexts", flush=True)
    steps = account(policy, [int(c) for c in args.contexts.split(",")], [args.batch], base, 5, "fp32", 4)
    costs = {"flops": DecodeCost.flops(policy.model.config),
             "timed": DecodeCost.fit([r["context"] for r in steps], [r["dense_s"] for r in steps])}
    result["cost_model"] = {name: dataclasses.asdict(c) for name, c in costs.items()}
    result["cost_model"]["timed_steps"] = {
        "batch": args.batch, "load_average": list(os.getloadavg()),
        "steps": [{k: r[k] for k in ("context", "dense_s", "no_attention_s", "attention_share")} for r in steps]}
    # the workload: the visible-key counts dense rollouts of the calibration prompts go through
    # (share 1.0 keeps every key: the calibration already decoded them when it swept that share)
    dense_rolls = calibration_rollouts.get(1.0) or sample_sparse(policy, policy.model, prompts, args.n, SamplingParams(
        temperature=1.0, max_new_tokens=args.max_new_tokens, seed=args.seed), pattern_for(base, [0], [1.0]))
    hist = visible_histogram([len(r.prompt_ids) for r in dense_rolls], [r.n_tokens for r in dense_rolls])
    result["workload"] = {"rollouts": len(dense_rolls), "decoded_tokens": sum(hist.values()),
                          "visible_keys_histogram": {str(k): v for k, v in sorted(hist.items())}}

    def schedule_block(tails_by_share: dict[float, Any]) -> dict[str, Any]:
        tails = {s: [b["tail"] for b in v["buckets"]] for s, v in tails_by_share.items()}
        chosen = choose_schedule(tails, args.threshold)
        uniform = [s for s, v in tails_by_share.items() if v["tail"] >= args.threshold]
        smallest = min(uniform) if uniform else None
        return {"chosen_shares": chosen, "smallest_uniform_share_at_threshold": smallest,
                **{f"projection_{name}": projection(base, positions, chosen, hist, c) for name, c in costs.items()},
                **{f"uniform_projection_{name}": projection(base, positions, [smallest] * len(positions), hist, c)
                   if uniform else None for name, c in costs.items()}}

    result["schedule_before"] = schedule_block(before)
    print(f"schedule before: {result['schedule_before']}", flush=True)

    # validation on the held-out stream: the chosen schedule's real tails, and reward vs dense (same seeds)
    def validate(dense_policy: Any, actor: Any, shares_: list[float]) -> dict[str, Any]:
        sp = SamplingParams(temperature=1.0, max_new_tokens=args.max_new_tokens, seed=args.seed + 1)
        pattern = pattern_for(base, positions, shares_)
        rolls = sample_sparse(dense_policy, actor, held_prompts, args.n, sp, pattern)
        with torch.no_grad():
            stats = alignment(dense_policy.model, rolls, positions, pad_id=pad_id)
        r = rewards(held_env, held_tasks, rolls, args.n)
        stats["shares"] = list(shares_)
        stats["reward_mean"] = sum(r) / len(r)
        stats["mean_len"] = sum(x.n_tokens for x in rolls) / len(rolls)
        return stats

    def report(label: str, stats: dict[str, Any]) -> None:
        print(f"  {label}: shares {stats['shares']} reward {stats['reward_mean']:.3f} tail {stats['tail']:.3f} "
              f"mean a_t {stats['mean']:.3f}", flush=True)

    dense_held = sample_sparse(policy, policy.model, held_prompts, args.n, SamplingParams(
        temperature=1.0, max_new_tokens=args.max_new_tokens, seed=args.seed + 1), pattern_for(base, [0], [1.0]))
    dense_reward = rewards(held_env, held_tasks, dense_held, args.n)
    result["held_out_dense"] = {"reward_mean": sum(dense_reward) / len(dense_reward),
                                "mean_len": sum(x.n_tokens for x in dense_held) / len(dense_held)}
    print(f"held-out: dense reward {result['held_out_dense']['reward_mean']:.3f}", flush=True)
    result["validation_before"] = validate(policy, policy.model, result["schedule_before"]["chosen_shares"])
    report("chosen schedule", result["validation_before"])

    result["distill"] = []
    for share in distill_shares:
        block: dict[str, Any] = {"share": share}
        block["held_out_before"] = validate(policy, policy.model, [share] * len(positions))
        report(f"share {share} before DistillSparse", block["held_out_before"])
        print(f"DistillSparse at share {share}: {args.distill_steps} steps", flush=True)
        fresh = load_policy(args.model)  # the adapter wraps the model in place: one fresh copy per share
        dcfg = DistillSparseConfig(rank=args.distill_rank, alpha=2.0 * args.distill_rank, lr=args.distill_lr,
                                   steps=args.distill_steps, prompts_per_step=8, n=args.n,
                                   divergence=args.divergence, seed=args.seed)
        t0 = time.perf_counter()
        model, history = distill_sparse(fresh, pattern_for(base, [0], [share]), distill_prompts,
                                        SamplingParams(temperature=1.0, max_new_tokens=args.max_new_tokens), dcfg,
                                        log=lambda r: print(f"  {r}", flush=True) if r["step"] % 10 == 0 else None)
        actor = merged_actor(model)
        block.update(config=dataclasses.asdict(dcfg), seconds=time.perf_counter() - t0, history=history,
                     trainable_parameters=sum(p.numel() for p in model.parameters() if p.requires_grad))
        with model.disable_adapter(), torch.no_grad():  # the dense policy: the base weights, adapter off
            dense_policy = dataclasses.replace(fresh, model=model.get_base_model())
            after = sweep(dense_policy.model, dense_policy, actor, prompts, args.n, shares, base, positions,
                          args.seed, args.max_new_tokens, pad_id)
            block["calibration_after"] = {str(s): v for s, v in after.items()}
            block["schedule_after"] = schedule_block(after)
            print(f"schedule after: {block['schedule_after']}", flush=True)
            block["validation_after"] = validate(dense_policy, actor, block["schedule_after"]["chosen_shares"])
            report("chosen schedule after", block["validation_after"])
            block["held_out_after"] = validate(dense_policy, actor, [share] * len(positions))
            report(f"share {share} after DistillSparse", block["held_out_after"])
        result["distill"].append(block)
    result["machine"]["load_average_at_end"] = list(os.getloadavg())
    result["wall_s"] = time.perf_counter() - started
    result["command"] = "python benchmarks/sparrow_schedule.py " + " ".join(argv if argv is not None else sys.argv[1:])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1, default=float))
    print(f"wrote {args.out} ({result['wall_s']:.0f} s)")
    return result


if __name__ == "__main__":
    main()
