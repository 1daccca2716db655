"""Our GRPO step against TRL's ``GRPOTrainer`` on the same workload, in one run (issue 17's step-time comparison).

``python benchmarks/grpo_vs_trl.py [--steps 4] [--rounds 2] [--out benchmarks/results/grpo_vs_trl.json]``

Workload (both sides): SmolLM2-135M-Instruct, fp32 on the CPU, ``rlvr/Arithmetic-v0`` prompts, 4 prompts x 8 rollouts
per step, at most 64 new tokens at T = 0.7, only the last two decoder layers trained (AdamW, lr 2e-5), no KL reference
and no eval. A step is everything from sampling the rollouts to the optimizer step: ours is ``Trainer.train_step``
(timed around the call), TRL's the time between its ``on_step_begin`` and ``on_step_end`` callbacks (generation,
reward, log-probs, backward and the optimizer inside). The sides alternate in ``rounds`` blocks (ours, TRL, ours,
TRL, ...), each block a fresh trainer of ``steps`` steps, so a drift in the shared machine's speed reaches both sides;
the first step of every block is a warm-up and is left out, and each side's figure is the median of its other steps.
Each side also reports the response tokens it generated per step, since the two sample different completions (a step
that writes longer answers costs more); ours also splits its steps into generation and the rest.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

ENV = "rlvr/Arithmetic-v0"


def run_ours(args: argparse.Namespace, out_dir: Path) -> dict[str, Any]:
    from agents.grpo.config import load_recipe
    from agents.grpo.trainer import Trainer

    cfg = load_recipe("grpo", [f"model={args.model}", f"env={ENV}", f"prompts_per_step={args.prompts}",
                               f"max_new_tokens={args.max_new_tokens}", f"train_layers={args.train_layers}",
                               f"steps={args.steps}", f"temperature={args.temperature}", f"lr={args.lr}",
                               "precision=fp32", "eval_size=0", "eval_every=0", "checkpoint_every=0",
                               "progress=false", "plot=false", f"out_dir={out_dir}", f"seed={args.seed}",
                               f"params.rollout_allocator.n={args.n}"])
    trainer = Trainer(cfg)
    seconds, tokens, rollouts, gen_s = [], [], [], []
    for _ in range(args.steps):
        trainer.step += 1
        t0 = time.perf_counter()
        record = trainer.train_step()
        seconds.append(time.perf_counter() - t0)
        tokens.append(int(record.get("gen_tokens", 0)))
        rollouts.append(int(record.get("rollouts", 0)))
        gen_s.append(float(record.get("gen_s", 0.0)))
    return {"step_s": seconds, "response_tokens": tokens, "rollouts": rollouts, "generation_s": gen_s}


def run_trl(args: argparse.Namespace, out_dir: Path) -> dict[str, Any]:
    import trl
    from transformers import TrainerCallback

    from agents.grpo.trainer import select_trainable
    from agents.policy.models import load_policy
    from rlvr_envs.integrations.trl import dataset, reward_fn

    policy = load_policy(args.model, seed=args.seed)
    trainable = set(select_trainable(policy.model, args.train_layers))
    for name, p in policy.model.named_parameters():
        p.requires_grad_(name in trainable)
    seconds: list[float] = []
    tokens: list[int] = []

    class StepClock(TrainerCallback):
        def on_step_begin(self, *a: Any, **k: Any) -> None:
            self.t0 = time.perf_counter()

        def on_step_end(self, *a: Any, **k: Any) -> None:
            seconds.append(time.perf_counter() - self.t0)

    score = reward_fn(ENV)

    def counted(prompts: list[Any], completions: list[Any], **kw: Any) -> list[float]:
        texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
        tokens.append(sum(len(policy.tokenizer(t, add_special_tokens=False).input_ids) for t in texts))
        return score(prompts=prompts, completions=completions, **kw)

    counted.__name__ = "verifier"
    config = trl.GRPOConfig(
        output_dir=str(out_dir), per_device_train_batch_size=args.prompts * args.n, num_generations=args.n,
        max_completion_length=args.max_new_tokens, temperature=args.temperature, learning_rate=args.lr, beta=0.0,
        max_steps=args.steps, use_cpu=True, bf16=False, report_to="none", logging_steps=1, save_strategy="no",
        seed=args.seed, dataloader_num_workers=0)
    trainer = trl.GRPOTrainer(model=policy.model, reward_funcs=counted, args=config,
                              train_dataset=dataset(ENV, args.prompts * (args.steps + 1)),
                              processing_class=policy.tokenizer, callbacks=[StepClock()])
    trainer.train()
    return {"step_s": seconds, "response_tokens": tokens[:len(seconds)]}


def summarize(blocks: list[dict[str, Any]]) -> dict[str, Any]:
    """One side's blocks: every list kept per block, the figures over all blocks' steps but each block's first (it
    warms caches and allocators)."""
    def timed(key: str) -> list[float]:
        return [x for b in blocks for x in (b[key][1:] or b[key])]

    out: dict[str, Any] = {"blocks": blocks, "median_step_s": statistics.median(timed("step_s")),
                           "mean_response_tokens": statistics.mean(timed("response_tokens"))}
    if all("generation_s" in b for b in blocks):
        out["median_generation_s"] = statistics.median(timed("generation_s"))
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--steps", type=int, default=4, help="steps per block (the first is left out of the median)")
    p.add_argument("--rounds", type=int, default=2, help="blocks per side, alternating ours and TRL")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--n", type=int, default=8, help="rollouts per prompt")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--train-layers", type=int, default=2)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--lr", type=float, default=2e-5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write the JSON here (default: print only)")
    args = p.parse_args(argv)
    if args.steps < 2:
        p.error("--steps must be at least 2 (the first step is a warm-up)")
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    if args.n < 2:
        p.error("--n must be at least 2 (a group of one has no advantage)")
    if args.prompts < 1 or args.max_new_tokens < 1:
        p.error("--prompts and --max-new-tokens must be positive")
    import torch

    torch.set_num_threads(args.threads)
    ours_blocks: list[dict[str, Any]] = []
    trl_blocks: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            ours_blocks.append(run_ours(args, Path(tmp) / f"ours{r}"))
            print(f"round {r + 1}/{args.rounds} ours: steps {[round(x, 2) for x in ours_blocks[-1]['step_s']]} s",
                  flush=True)
            trl_blocks.append(run_trl(args, Path(tmp) / f"trl{r}"))
            print(f"round {r + 1}/{args.rounds} TRL GRPOTrainer: steps "
                  f"{[round(x, 2) for x in trl_blocks[-1]['step_s']]} s", flush=True)
    ours, theirs = summarize(ours_blocks), summarize(trl_blocks)
    import transformers
    import trl

    result = {
        "benchmark": "grpo_vs_trl", "definition": __doc__.split("\n\n", 2)[2].strip(),
        "workload": {k: getattr(args, k) for k in ("model", "prompts", "n", "max_new_tokens", "train_layers",
                                                    "temperature", "lr", "steps", "rounds", "seed")} | {"env": ENV},
        "machine": {"cpus": os.cpu_count(), "threads": args.threads, "platform": platform.platform(),
                    "torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__,
                    "load_average_at_end": os.getloadavg()},
        "ours": ours, "trl": theirs, "speedup": theirs["median_step_s"] / ours["median_step_s"],
        "command": "python benchmarks/grpo_vs_trl.py " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    print(f"ours: median step {ours['median_step_s']:.2f} s; TRL GRPOTrainer: {theirs['median_step_s']:.2f} s; "
          f"speed-up {result['speedup']:.2f}x (medians over steps 2..{args.steps} of {args.rounds} blocks per side)")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
