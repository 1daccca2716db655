"""The ``rlvr`` command. Each subcommand lives in ``rlvr_envs/commands/<name>.py`` with ``add_parser`` and ``run``."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from rlvr_envs.extras import MissingExtraError

# Subcommand modules; each adds its own parser. Keep this list the only place that names them.
COMMANDS = ["list", "demo", "sweep", "eval", "leaderboard", "bisim", "train", "audit", "serve", "export"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlvr", description="RLVR environments, agents, evaluation and leaderboards")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        module = importlib.import_module(f"rlvr_envs.commands.{name.replace('-', '_')}")
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # 2 threads under contention run far slower without it
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except MissingExtraError as exc:  # an optional dependency is not installed: the message names the extra
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
