"""``rlvr export``: write an env's tasks as another trainer's dataset (``--format verl``: verl's RLHF parquet)."""

from __future__ import annotations

import argparse
import sys

from rlvr_envs.commands import json_object

FORMATS = ("verl",)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="write an env's tasks as a trainer's dataset (verl parquet)",
                       description="Write tasks start .. start+n-1 of an env as a dataset another trainer reads. "
                                   "verl: parquet with prompt (chat messages), data_source, ability, "
                                   "reward_model {style: rule, ground_truth} and extra_info; score it with "
                                   "rlvr_envs/integrations/verl.py:compute_score.")
    p.add_argument("--format", choices=FORMATS, required=True)
    p.add_argument("--env", required=True, help="env ID, e.g. rlvr/Countdown-v0 (multi-turn envs need --env-url)")
    p.add_argument("--n", type=int, required=True, help="number of tasks")
    p.add_argument("--start", type=int, default=0, help="first task index (default 0)")
    p.add_argument("--split", default="train", help="extra_info.split label (default train)")
    p.add_argument("--ability", default=None, help="verl's ability label (default: from the env's family)")
    p.add_argument("--env-kwargs", default="{}", help="JSON object of keyword arguments for gym.make")
    p.add_argument("--env-url", default=None, metavar="URL",
                   help="an `rlvr serve` server: rows name verl's rlvr_env agent loop, which plays whole episodes "
                        "there (tool-use and search envs need it)")
    p.add_argument("--out", required=True, help="output file (.parquet)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rlvr_envs.integrations import verl

    env_kwargs = json_object(args.env_kwargs, "--env-kwargs")
    try:
        count = verl.export(args.env, args.n, args.out, start=args.start, split=args.split, env_kwargs=env_kwargs,
                            ability=args.ability, env_url=args.env_url)
    except (ValueError, NotImplementedError, ImportError) as exc:
        print(f"rlvr export: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {count} {args.env} tasks to {args.out} ({args.format})")
    return 0
