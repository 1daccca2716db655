"""``rlvr audit``: re-check a results file with an independent second verifier and list the disagreements."""

from __future__ import annotations

import argparse
import sys


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("audit", help="re-check a results file with a second verifier; list the disagreements",
                       description="Re-check every record of a results file with an independent second verifier "
                                   "(math: SymPy equivalence, not Math-Verify; Countdown: an ast-free re-reading) "
                                   "and list the records whose two verdicts differ.")
    p.add_argument("results", help="results file written by rlvr eval")
    p.add_argument("--out", default=None, help="also write the disagreements and counts to this JSON file")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds per second-verifier check (hard limit)")
    p.add_argument("--max-rows", type=int, default=200, help="print at most this many disagreement rows")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rlvr_envs.audit import TABLE_HEADER, audit, format_rows
    from rlvr_envs.commands.list import format_table
    from rlvr_envs.harness.results import Results, SchemaError, atomic_write_json

    try:
        results = Results.load(args.results)
    except (OSError, SchemaError) as exc:
        print(f"rlvr audit: {exc}", file=sys.stderr)
        return 2
    report = audit(results, timeout=args.timeout)
    rows = report.disagreements
    if rows:
        print(format_table(format_rows(rows[: args.max_rows]), TABLE_HEADER))
        if len(rows) > args.max_rows:
            print(f"... {len(rows) - args.max_rows} more (see --out)")
        print()
    print(report.summary())
    if args.out:
        doc = {"results": args.results, **report.to_json()}
        atomic_write_json(args.out, doc)
        print(f"disagreements: {args.out}")
    return 0
