"""``rlvr list``: every registered ID with its package (and pip extra), source, size and verifier."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("list", help="list every registered environment")
    p.add_argument("--filter", default="", help="only IDs containing this text")
    p.set_defaults(func=run)


def format_table(rows: list[tuple[str, ...]], header: tuple[str, ...]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    return "\n".join([line(header), line(tuple("-" * w for w in widths)), *map(line, rows)])


def package_label(package: str, extra: str | None) -> str:
    """``rlvr-envs``, ``rlvr-envs[search]`` (what to pip install for it) or a plugin's distribution name."""
    return f"{package}[{extra}]" if extra else package


def run(args: argparse.Namespace) -> int:
    import rlvr_envs  # noqa: F401  (registers the IDs and loads the env plugins)
    from rlvr_envs.registration import all_entries

    rows = [(e.id, package_label(e.package, e.extra), e.source, e.size, e.verifier) for e in all_entries()
            if args.filter in e.id]
    print(format_table(rows, ("id", "package", "source", "size", "verifier")))
    print(f"\n{len(rows)} environments")
    return 0
