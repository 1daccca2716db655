"""Shared helpers of the bisimulation benchmarks: markdown tables, log-log slopes, timers."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

GAMMA = 0.9


def md_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    fmt = lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


def write(out: Path, name: str, title: str, intro: str, table: str, notes: str = "") -> str:
    text = f"# {title}\n\n{intro.strip()}\n\n{table}\n" + (f"\n{notes.strip()}\n" if notes else "")
    (out / f"{name}.md").write_text(text)
    print(text)
    return text


def loglog_slope(n: Sequence[float], t: Sequence[float]) -> float:
    return float(np.polyfit(np.log(n), np.log(t), 1)[0])


def timed(fn: Callable[[], object], repeat: int = 1) -> tuple[float, object]:
    """Best of ``repeat`` wall-clock runs (the machine is shared; the minimum is the least disturbed)."""
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out
