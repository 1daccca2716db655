"""``rlvr leaderboard submit|publish|create|migrate|show|render``: verified boards, one per benchmark."""

from __future__ import annotations

import argparse
import json
import sys

from rlvr_envs.extras import require_extra
from rlvr_envs.harness.reproduce import DEFAULT_SAMPLE, evidence_text


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("leaderboard", help="submit results to a board, show a board, render the boards as HTML")
    configure(p)


def configure(p: argparse.ArgumentParser) -> None:
    """The leaderboard options; shared with ``python leaderboards/submit.py``."""
    boards_help = "where board files live (default: $RLVR_BOARDS_DIR, else leaderboards/boards of the checkout)"
    p.add_argument("--boards-dir", default=None, help=boards_help)
    # Accepted after the action too; SUPPRESS keeps a value given before the action.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--boards-dir", default=argparse.SUPPRESS, help=boards_help)
    actions = p.add_subparsers(dest="action", required=True)
    s = actions.add_parser("submit", help="re-verify a results file and append it to a board", parents=[common])
    s.add_argument("results", help="results JSON written by `rlvr eval`")
    s.add_argument("--board", required=True, help="board name (one per benchmark), e.g. arithmetic")
    s.add_argument("--label", default=None, help="a short label for this entry")
    s.add_argument("--reproduce", type=int, nargs="?", const=DEFAULT_SAMPLE, default=0, metavar="N",
                   help=f"ask for the reproduced tier: load the policy here, decode N records again (default "
                        f"{DEFAULT_SAMPLE}) and recount tokens; rejected if the policy cannot be loaded or disagrees. "
                        "Without it the entry's model name, responses and token counts are marked self-reported")
    s.set_defaults(func=run)
    pb = actions.add_parser("publish", help="evaluate a finished training run's final policy on its lane's held-out "
                            "tasks and submit it, with its training cost and learning curve", parents=[common])
    pb.add_argument("run_dir", help="a finished run's out_dir (holds checkpoints/ and metrics.jsonl)")
    pb.add_argument("--board", default=None, help="board name (default: lane-<the run's lane>)")
    pb.add_argument("--method", default=None, help="method name for the model label (default: the built-in recipe "
                    "whose stages and params the run used, else the run folder's name)")
    pb.add_argument("--label", default=None, help="a short label for this entry")
    pb.add_argument("--results-dir", default=None, help="where the results file goes (default: RUN_DIR/published)")
    pb.add_argument("--limit", type=int, default=None, help="held-out tasks (default: the run's eval_size; a board "
                    "pinned to another count rejects the entry)")
    pb.set_defaults(func=run)
    c = actions.add_parser("create", help="create an empty board pinned to the first --limit tasks of an env and "
                           "--samples samples per task (otherwise the first submission sets the pin)", parents=[common])
    c.add_argument("name", help="board name")
    c.add_argument("--env", required=True, help="env ID, e.g. rlvr/MATH500-v0")
    c.add_argument("--env-kwargs", default="{}", help="env kwargs as a JSON object (as given to `rlvr eval`)")
    c.add_argument("--limit", type=int, required=True, help="number of tasks (the first N, as `rlvr eval --limit N`)")
    c.add_argument("--samples", type=int, required=True, help="samples per task")
    c.set_defaults(func=run)
    m = actions.add_parser("migrate", help="pin a board made before task-set pins, from its entries' results files",
                           parents=[common])
    m.add_argument("name", help="board name")
    m.add_argument("results", nargs="+", help="the results files the board's entries were verified from")
    m.set_defaults(func=run)
    sh = actions.add_parser("show", help="print a board", parents=[common])
    sh.add_argument("name", nargs="?", default=None, help="board name (default: every board)")
    sh.add_argument("--per-seed", action="store_true", help="after the one-row-per-method summary, also print every "
                    "entry (one row per run/seed)")
    sh.set_defaults(func=run)
    r = actions.add_parser("render", help="write a static HTML page and PNG plots", parents=[common])
    r.add_argument("--out", default=None, help="output folder (default: leaderboards/site next to the boards)")
    r.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rlvr_envs.harness import leaderboard as lb

    try:
        if args.action == "submit":
            entry = lb.submit(args.results, args.board, boards_dir=args.boards_dir, label=args.label,
                              reproduce=args.reproduce)
            path = lb.board_path(args.board, args.boards_dir)
            m = entry["metrics"]
            print(f"accepted on board {args.board!r} ({path}): {entry['model']} accuracy={m['accuracy']:.4f} "
                  f"over {entry['n_tasks']} tasks x {entry['n_samples']} samples (entry {entry['id']}); "
                  f"{evidence_text(entry)}")
            return 0
        if args.action == "publish":
            require_extra("agents", "rlvr leaderboard publish")
            from agents.grpo.publish import describe_entry, publish_run

            entry = publish_run(args.run_dir, boards_dir=args.boards_dir, board=args.board, method=args.method,
                                label=args.label, results_dir=args.results_dir, limit=args.limit, progress=True)
            board = args.board or f"lane-{entry['training']['lane']}"
            print(f"accepted on board {board!r} ({lb.board_path(board, args.boards_dir)}), entry {entry['id']}: "
                  + describe_entry(entry))
            return 0
        if args.action == "create":
            env_kwargs = json.loads(args.env_kwargs)
            if not isinstance(env_kwargs, dict):
                raise ValueError(f"--env-kwargs must be a JSON object, got {args.env_kwargs!r}")
            board = lb.create_board(args.name, args.env, n_tasks=args.limit, n_samples=args.samples,
                                    env_kwargs=env_kwargs, boards_dir=args.boards_dir)
            print(f"created board {args.name!r} ({lb.board_path(args.name, args.boards_dir)}): {args.env}, "
                  f"{lb.pin_summary(board)}")
            return 0
        if args.action == "migrate":
            board = lb.migrate_board(args.name, args.results, boards_dir=args.boards_dir)
            print(f"migrated board {args.name!r}: {lb.pin_summary(board)}")
            return 0
        if args.action == "show":
            paths = [lb.board_path(args.name, args.boards_dir)] if args.name else lb.list_boards(args.boards_dir)
            if args.name and not paths[0].exists():
                print(f"no board {args.name!r} in {paths[0].parent}", file=sys.stderr)
                return 1
            if not paths:
                print("no boards yet")
            from rlvr_envs.harness.summary import format_summary

            for path in paths:
                board = lb.load_board(path)
                print(format_summary(board) + "\n")
                if args.per_seed:
                    print(lb.format_board(board) + "\n")
            if paths:
                print(lb.EVIDENCE_NOTE)
            return 0
        require_extra("plots", "rlvr leaderboard render")  # one PNG plot per board
        from rlvr_envs.harness.render import render_site

        index = render_site(args.boards_dir, args.out)
        print(f"wrote {index}")
        return 0
    except (lb.SubmissionRejected, ValueError, OSError) as exc:
        kind = "rejected" if isinstance(exc, lb.SubmissionRejected) else "error"
        print(f"rlvr leaderboard {args.action}: {kind}: {exc}", file=sys.stderr)
        return 1
