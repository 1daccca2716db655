"""What RREDCoT's value pays for on the smollm2 lane: V = log pi(a* | prompt, response) for fixed kinds of response.

RREDCoT (``agents/methods/rredcot.py``) credits a segment with dV, the change in the model's own teacher-forced
log-probability of the gold continuation a* ("\\nThe answer is N" on Arithmetic). This probe scores one-line responses
of four kinds on the lane's Arithmetic tasks, with no training:

- ``start``: the empty prefix (V before any segment, the same for every row of a group);
- ``empty_box``: ``\\boxed{}`` (commits to nothing);
- ``wrong``: ``a - b = N+7`` (commits to a wrong number);
- ``right``: ``a - b = N``.

It reports mean dV = V(kind) - V(start) and the paired difference empty_box - wrong with a 95% percentile bootstrap
over tasks. When a group has no correct answer its group advantage is 0 and only the z-scored dV is left, so a
positive empty_box - wrong means the credit prefers not answering over a wrong answer.

    python benchmarks/rredcot_probe.py [--model smollm2] [--tasks 40] [--json benchmarks/results/rredcot_probe.json]
    python benchmarks/rredcot_probe.py --model RUN_DIR      # a trained run's final weights
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

KINDS = ("start", "empty_box", "wrong", "right")


def responses(expression: str, answer: int) -> dict[str, str]:
    return {"start": "", "empty_box": "\\boxed{}", "wrong": f"{expression} = {answer + 7}",
            "right": f"{expression} = {answer}"}


@torch.no_grad()
def values(policy: Any, prefixes: list[str], continuation: str) -> list[float]:
    """log pi(continuation | prefix) for each prefix, teacher-forced through the trainer's log-prob path
    (``response_logprobs``); the continuation is tokenized on its own, as RREDCoT does."""
    from agents.grpo.logprobs import response_logprobs

    tok = policy.tokenizer
    a = tok(continuation, add_special_tokens=False)["input_ids"]
    prompts = [tok(p, add_special_tokens=False)["input_ids"] for p in prefixes]
    lp, _ = response_logprobs(policy.model, prompts, [a] * len(prompts), pad_id=tok.pad_token_id or 0)
    return lp.sum(dim=1).tolist()


def probe(policy: Any, *, tasks: int, env_id: str = "rlvr/Arithmetic-v0", seed: int = 0,
          bootstrap: int = 2000) -> dict[str, Any]:
    import gymnasium as gym

    import rlvr_envs  # noqa: F401  (registers the IDs)
    from agents.methods.rredcot import GENERIC_TEMPLATE, gold_continuation
    from benchmarks.countdown_coverage import bootstrap_interval

    env = gym.make(env_id)
    scores: dict[str, list[float]] = {k: [] for k in KINDS}
    for i in range(tasks):
        _, info = env.reset(options={"index": i})
        task = env.unwrapped.task
        prompt = policy.prompt_text(info["messages"])
        gold = gold_continuation({"answer": task.answer}, GENERIC_TEMPLATE)
        kinds = responses(task.metadata["expression"], int(task.answer))
        for kind, score in zip(kinds, values(policy, [prompt + text for text in kinds.values()], gold)):
            scores[kind].append(score)
    v = {k: np.asarray(x) for k, x in scores.items()}
    gap = v["empty_box"] - v["wrong"]
    lo, hi = bootstrap_interval(gap, n_boot=bootstrap, seed=seed)
    return {
        "env_id": env_id, "tasks": tasks, "template": GENERIC_TEMPLATE,
        "mean_value": {k: float(x.mean()) for k, x in v.items()},
        "mean_dv": {k: float((x - v["start"]).mean()) for k, x in v.items() if k != "start"},
        "empty_box_minus_wrong": {"mean": float(gap.mean()), "ci95": [lo, hi],
                                  "share_positive": float((gap > 0).mean())},
        "interval": "95% percentile bootstrap over tasks",
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2", help="a model name for load_policy, or a training run's folder")
    p.add_argument("--tasks", type=int, default=40)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.tasks < 2:
        p.error("--tasks must be at least 2 (the interval is over tasks)")
    if Path(args.model).is_dir():
        from agents.grpo.publish import final_policy

        policy = final_policy(args.model)
    else:
        from agents.policy import load_policy

        policy = load_policy(args.model)
    policy.model.eval()
    out = {"model": args.model, **probe(policy, tasks=args.tasks),
           "command": "python benchmarks/rredcot_probe.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    text = json.dumps(out, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
