"""Answer rewrites for the math-verifier benchmarks (benchmarks/test_bench_verifier.py, benchmarks/verify_cache.py):
the same value written another way, and a reference solution with its final box replaced."""

from __future__ import annotations

import re

_FRAC = re.compile(r"^\\frac\{(\d+)\}\{(\d+)\}$")


def equivalent_form(answer: str) -> str:
    """The same value written differently (what a model might write instead of the reference form)."""
    a = answer.strip()
    if re.fullmatch(r"-?\d+", a):
        n = int(a)
        return f"{n:,}" if abs(n) >= 1000 else f"{n}.0"
    if m := _FRAC.match(a):
        return f"{m.group(1)}/{m.group(2)}"
    if "\\frac" in a:
        return a.replace("\\frac", "\\dfrac")
    return a.replace(",", ", ").replace("(", "\\left(").replace(")", "\\right)") if "(" in a else f"{{{a}}}"


def replace_last_box(solution: str, new: str | None) -> str:
    """``solution`` with its last ``\\boxed{...}`` holding ``new`` (``None``: the box is cut off, no final answer)."""
    i = solution.rfind("\\boxed{")
    if i < 0:
        return solution if new is None else f"{solution}\n\nThe final answer is $\\boxed{{{new}}}$."
    depth, j = 0, i + len("\\boxed")
    while j < len(solution):
        depth += {"{": 1, "}": -1}.get(solution[j], 0)
        j += 1
        if depth == 0:
            break
    if new is None:
        return solution[:i].rstrip()
    return solution[:i] + f"\\boxed{{{new}}}" + solution[j:]
