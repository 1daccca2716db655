"""Submit a results file to a board: ``python leaderboards/submit.py results.json --board NAME``.

The same code as ``rlvr leaderboard submit`` (validate, re-verify every record with the env's verifier, recompute the
metrics, append atomically under a lock). ``show`` and ``render`` work here too: ``python leaderboards/submit.py show``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __name__ == "__main__" and __package__ in (None, ""):
    # Run from a checkout without installing: make the repository root importable.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    from rlvr_envs.commands.leaderboard import configure, run

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and not {"submit", "publish", "create", "migrate", "show", "render", "-h", "--help"} & set(argv):
        argv.insert(0, "submit")  # the default action: `submit.py results.json --board NAME`
    parser = argparse.ArgumentParser(prog="leaderboards/submit.py", description=__doc__.splitlines()[0])
    configure(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
