"""Precondition probe for Agon (issue 45, build item 5): can the solver use a draft at all? Agon's cascade beats a single
policy only if the policy answering *after reading a draft* does better than it does alone; a model that cannot read
its context is hurt by any text in front of its answer, and the cascade starts (and stays, on the micro lane) below the
single policy whatever the competition teaches.

    python benchmarks/mechanism_agon.py                          # both models, 64 held-out tasks x 2 samples
    python benchmarks/mechanism_agon.py --model smollm2 --tasks 16

Per model (``micro-countdown`` on the micro lane, ``smollm2`` on the smollm2 lane: the agon recipe resolved on the
lane), on the first ``--tasks`` held-out tasks, sampled at the lane's temperature with the trainer's hf engine in fp32,
the solver's accuracy:

(a) ``alone``: the bare prompt (what GRPO's single policy answers);
(b) ``correct_draft``: reading a verified solution as the draft (``agents.methods.opsd.reference_solution``: for
    Countdown the solver-written search branch that reaches the target and its ``<answer>`` line; for arithmetic
    "The answer is N.") through Agon's own ``with_draft`` and draft template;
(c) ``own_draft``: reading one of its own sampled drafts (the step-0 cascade, which is what Agon's held-out eval
    scores), with the accuracy split by whether that draft was right.

Precondition: (b) > (a), i.e. a right draft helps the solver. Writes ``benchmarks/results/mechanism_agon.json`` (one
entry per model, merged into the file, with the command).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agents.methods.agon import DRAFT_TEMPLATE, with_draft
from agents.methods.opsd import reference_solution

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))  # the distillation probe's task and scoring helpers, shared
from mechanism_distill import MODELS, accuracies, generate_scored, held_out_tasks, per_task, probe_config, score  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "mechanism_agon.json"


def probe(model: str, n_tasks: int = 64, samples: int = 2, seed: int = 0) -> dict[str, Any]:
    """(a), (b) and (c) of the module docstring for one model."""
    from agents.policy.engine import SamplingParams, make_engine
    from agents.policy.models import load_policy

    t0, c0 = time.perf_counter(), time.process_time()
    cfg = probe_config(model, "agon")
    template = dict(cfg.params.get("orchestrator") or {}).get("draft_template", DRAFT_TEMPLATE)
    policy = load_policy(cfg.model, dtype=cfg.dtype, seed=cfg.seed)
    # fp32 decoding: "auto" would pick bf16 on some CPUs, and the figures should not depend on the machine
    engine = make_engine(policy, backend="hf", precision="fp32")
    env, infos = held_out_tasks(cfg, n_tasks)
    n = len(infos)
    sampling = SamplingParams(temperature=cfg.temperature, top_p=cfg.top_p, max_new_tokens=cfg.max_new_tokens,
                              seed=seed)
    tasks = list(range(n))
    bare = [policy.prompt_text(i["messages"]) for i in infos]
    alone = accuracies(engine, env, infos, bare, samples, sampling, tasks, None)
    gold_prompts = [policy.prompt_text(with_draft(i["messages"], reference_solution(i), template)) for i in infos]
    gold = accuracies(engine, env, infos, gold_prompts, samples, sampling, tasks, None)
    # the step-0 cascade: one own draft per (task, sample), each read once
    drafts = engine.generate(bare, samples, sampling)
    draft_task = [j // samples for j in range(len(drafts))]
    draft_ok = [score(env, infos[t], d.text)[0] for t, d in zip(draft_task, drafts)]
    own_prompts = [policy.prompt_text(with_draft(infos[t]["messages"], d.text, template))
                   for t, d in zip(draft_task, drafts)]
    solved = np.array(generate_scored(engine, env, infos, own_prompts, 1, sampling, draft_task), dtype=bool)
    ok = np.array(draft_ok, dtype=bool)
    own = {"accuracy": float(solved.mean()), "per_task_correct": per_task(solved.tolist(), draft_task, n),
           "draft_accuracy": float(ok.mean()),
           "after_right_draft": float(solved[ok].mean()) if ok.any() else None,
           "after_wrong_draft": float(solved[~ok].mean()) if (~ok).any() else None,
           "right_drafts": int(ok.sum())}
    return {"model": model, "lane": MODELS[model], "weights_hash": policy.weights_hash, "env": cfg.env,
            "env_kwargs": {**cfg.env_kwargs, **cfg.eval_env_kwargs}, "tasks": n, "samples_per_task": samples,
            "temperature": cfg.temperature, "max_new_tokens": cfg.max_new_tokens, "seed": seed,
            "draft_template": template, "alone": alone, "correct_draft": gold, "own_draft": own,
            "precondition_met": bool(gold["accuracy"] > alone["accuracy"]),
            # wall time depends on what else runs on the machine; CPU time is this process's own
            "wall_s": round(time.perf_counter() - t0, 1), "cpu_s": round(time.process_time() - c0, 1)}


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def report(r: dict[str, Any]) -> str:
    own = r["own_draft"]
    return (f"{r['model']} ({r['lane']} lane): {r['tasks']} tasks x {r['samples_per_task']}, T = {r['temperature']}: "
            f"solver alone {r['alone']['accuracy']:.3f}, after a verified draft {r['correct_draft']['accuracy']:.3f}, "
            f"after its own draft {own['accuracy']:.3f} (drafts right {own['draft_accuracy']:.3f}; after a right one "
            f"{_fmt(own['after_right_draft'])}, after a wrong one {_fmt(own['after_wrong_draft'])}); precondition "
            f"{'met' if r['precondition_met'] else 'NOT met'}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--tasks", type=int, default=64, help="held-out tasks (the eval env's first N)")
    p.add_argument("--samples", type=int, default=2, help="sampled responses per task and condition")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    torch.set_num_threads(1)  # as the lanes pin it: kernels split reductions by thread count
    command = "python benchmarks/mechanism_agon.py " + " ".join(argv if argv is not None else sys.argv[1:])
    data = json.loads(args.out.read_text()) if args.out.is_file() else {}
    data["description"] = __doc__.strip().splitlines()[0]
    data["precondition"] = "the solver's sampled accuracy after reading a verified draft > its accuracy alone"
    models = data.setdefault("models", {})
    for model in args.model:
        res = probe(model, args.tasks, args.samples, args.seed)
        res["command"] = command.strip()
        models[model] = res
        print(report(res), flush=True)
    data["precondition_met"] = {m: r["precondition_met"] for m, r in models.items()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
