"""Step time and memory of a multi-turn training step against a single-turn one of the same token count.

Episodes: the ToolUse oracle's trajectories as token-exact streams (agents/grpo/sft.py), so both variants see real
multi-turn lengths without needing a policy that already calls tools. For the same rows:

- multi-turn: each model turn is generated after the stream so far (a prefill of the whole stream, the previous turns
  and the env's tokens, then the turn's tokens decoded), turn by turn in lockstep across the batch; the update reads
  the full stream with the env tokens masked out.
- single-turn: the same number of model tokens decoded after the prompt in one call; the update reads a sequence of
  the same length with every token a model token.

Decoding ignores EOS and uses each turn's (each row's) recorded length as the cap, so both variants decode the same
tokens' worth of steps; the update is one GRPO loss forward/backward and AdamW step over all parameters. Each variant
runs in a fresh process (its own peak RSS).

    python benchmarks/multiturn_cost.py [--model smollm2] [--episodes 8] [--out benchmarks/results/multiturn_cost.json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import queue as queue_mod
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _worker(mode: str, model: str, episodes: int, queue: mp.Queue) -> None:
    sys.path.insert(0, str(ROOT))
    import gymnasium as gym
    import torch

    import rlvr_envs  # noqa: F401
    from agents.grpo.batch import GroupBatch, Sample
    from agents.grpo.logprobs import response_logprobs
    from agents.grpo.registry import build
    from agents.grpo.sft import demonstrations
    from agents.policy.engine import HFEngine, SamplingParams
    from agents.policy.episodes import turn_spans
    from agents.policy.models import load_policy

    policy = load_policy(model)
    env_kwargs = {"tools_in_prompt": False} if model == "tiny" else {}
    streams, _ = demonstrations(policy, gym.make("rlvr/ToolUse-v0", **env_kwargs), episodes)
    engine = HFEngine(policy, ignore_eos=True, precision="fp32")
    t0 = time.perf_counter()
    if mode == "multi":
        spans = [turn_spans(s.mask) for s in streams]
        for t in range(max(len(sp) for sp in spans)):
            rows = [k for k, sp in enumerate(spans) if t < len(sp)]
            prompts = [streams[k].prompt_ids + streams[k].ids[: spans[k][t][0]] for k in rows]
            cap = max(spans[k][t][1] - spans[k][t][0] for k in rows)
            engine.generate(prompts, 1, SamplingParams(max_new_tokens=cap, seed=0))
    else:
        cap = max(s.model_tokens for s in streams)
        engine.generate([s.prompt_ids for s in streams], 1, SamplingParams(max_new_tokens=cap, seed=0))
    gen_s = time.perf_counter() - t0
    samples = [Sample(f"g{k // 2}", "", s.prompt_ids, s.ids, "", float(k % 2),
                      token_mask=s.mask if mode == "multi" else None) for k, s in enumerate(streams)]
    batch = GroupBatch.from_samples(samples)
    batch.advantages = build("advantage", "grpo")(batch)
    loss_fn = build("loss", "grpo")
    params = [p for p in policy.model.parameters()]
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=1e-6)
    policy.model.train()
    t1 = time.perf_counter()
    lp, _ = response_logprobs(policy.model, batch.prompt_ids, batch.response_ids,
                              pad_id=int(policy.tokenizer.pad_token_id or 0))
    loss, _ = loss_fn(batch, lp)
    loss.backward()
    opt.step()
    update_s = time.perf_counter() - t1
    queue.put({"mode": mode, "rows": len(streams), "gen_s": gen_s, "update_s": update_s,
               "model_tokens": int(batch.response_mask.sum()), "sequence_tokens": sum(len(s.stream) for s in streams),
               "env_tokens": sum(len(s.ids) - s.model_tokens for s in streams),
               "turns": sum(s.turns for s in streams),
               "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024})


def measure(mode: str, model: str, episodes: int) -> dict:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_worker, args=(mode, model, episodes, queue))
    proc.start()
    while True:  # a worker killed by the kernel (out of memory) never puts its result: say so instead of waiting
        try:
            out = queue.get(timeout=5)
            break
        except queue_mod.Empty:
            if not proc.is_alive():
                code = proc.exitcode
                hint = " (killed: most likely out of memory; try fewer --episodes)" if code == -9 else ""
                raise RuntimeError(f"the {mode}-turn worker exited with code {code} before reporting{hint}") from None
    proc.join()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--episodes", type=int, default=8)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "multiturn_cost.json"))
    args = p.parse_args(argv)
    rows = [measure(mode, args.model, args.episodes) for mode in ("single", "multi")]
    single, multi = rows
    doc = {"model": args.model, "command": "python benchmarks/multiturn_cost.py " + " ".join(argv or sys.argv[1:]),
           "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
           "definition": "ToolUse oracle streams; generation = decoding the same model tokens (EOS ignored) turn by "
                         "turn after the growing stream vs in one call after the prompt; update = one GRPO "
                         "forward/backward + AdamW step over all parameters on sequences of equal length",
           "rows": rows, "gen_ratio": multi["gen_s"] / single["gen_s"],
           "update_ratio": multi["update_s"] / single["update_s"],
           "rss_ratio": multi["peak_rss_mb"] / single["peak_rss_mb"]}
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print("| step | generation s | update s | peak RSS MB | model tokens | sequence tokens |\n|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['mode']}-turn | {r['gen_s']:.2f} | {r['update_s']:.2f} | {r['peak_rss_mb']:.0f} | "
              f"{r['model_tokens']} | {r['sequence_tokens']} |")
    print(f"multi / single: generation x{doc['gen_ratio']:.2f}, update x{doc['update_ratio']:.2f}, "
          f"peak RSS x{doc['rss_ratio']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
