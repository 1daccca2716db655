"""Solver-written Countdown search traces (Stream-of-Search style) and a checker that reads them back.

A trace is a depth-first search written out one operation per line. Each line is indented by its depth, states the
operation and its result, then either the numbers left (``[3 8]``), or, on the last operation of a branch, ``!`` when
it reaches the target and ``x`` when it does not (a dead end: the search backs up). The trace ends with the solution:

    9+7=16 [2 16]
     16+2=18 x
    7*2=14 [9 14]
     14+9=23 !
    <answer>7*2+9</answer>

The writer orders the moves of a node by closeness of their result to the target with seeded noise, so one task has
many traces (a warm-started policy keeps that spread: pass@k > pass@1), and a long search gives a long trace (the
length methods need lengths that vary). With two numbers left it writes only the move closest to the target: if any
move reaches the target, that one does. Moves keep every value a non-negative integer (``a - b`` with ``a >= b``,
``a / b`` only when exact and ``b > 1``), the same moves ``rlvr/Countdown-v0`` builds its tasks from, so the full search
always finds the construction's solution.

``write_mode_trace`` writes one of three response modes for ``rlvr/Modes-v0`` (seed 004's NoThink / Short / Long): the
mode's marker on the first line, then the bare answer (NoThink), the solution branch alone (Short: no dead ends), or
the full search (Long). A policy warm-started on a mix of them starts each response with a marker.

``check_trace`` parses a trace (a model's included) into steps with their depth and tells whether each is valid
arithmetic on the numbers available at that depth: what a strict accuracy, state-merging or first-move metrics read.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

_PREC = {"+": 1, "-": 1, "*": 2, "/": 2}
_ATOM = 3
_LINE = re.compile(r"^( *)(\d+)([-+*/])(\d+)=(\d+) ?(?:\[([\d ]*)\]|(!)|(x))\s*$")


@dataclass(frozen=True)
class Move:
    a: int
    op: str
    b: int
    result: int
    expr: str  # the expression of the result, in terms of the task's numbers
    prec: int


def _join(op: str, left: tuple[str, int], right: tuple[str, int]) -> tuple[str, int]:
    """``left op right`` without spaces, parenthesized only where precedence needs it."""
    p = _PREC[op]
    ltext = f"({left[0]})" if left[1] < p else left[0]
    rtext = f"({right[0]})" if right[1] < p or (right[1] == p and op in "-/") else right[0]
    return f"{ltext}{op}{rtext}", p


def moves(state: Sequence[tuple[int, str, int]]) -> list[tuple[Move, list[tuple[int, str, int]]]]:
    """Every move from ``state`` (values with their expressions) and the state it leads to."""
    out = []
    for i in range(len(state)):
        for j in range(i + 1, len(state)):
            x, y = (state[i], state[j]) if state[i][0] >= state[j][0] else (state[j], state[i])
            rest = [state[k] for k in range(len(state)) if k not in (i, j)]
            for op in "+-*/":
                if op == "/" and (y[0] <= 1 or x[0] % y[0]):
                    continue
                value = {"+": x[0] + y[0], "-": x[0] - y[0], "*": x[0] * y[0], "/": x[0] // max(y[0], 1)}[op]
                expr, prec = _join(op, x[1:], y[1:])
                out.append((Move(x[0], op, y[0], value, expr, prec), [*rest, (value, expr, prec)]))
    return out


def _numbers_left(state: Sequence[tuple[int, str, int]]) -> str:
    return " ".join(str(v) for v in sorted(s[0] for s in state))


def write_trace(numbers: Sequence[int], target: int, rng: np.random.Generator, *, noise: float = 0.6) -> str:
    """A search trace that ends in ``<answer>EXPR</answer>``; deterministic for ``rng``'s state.

    ``noise`` is the standard deviation of the Gaussian added to ``log1p(|result - target|)`` when ordering moves.
    Raises ``ValueError`` when the numbers cannot reach the target with these moves."""
    lines: list[str] = []

    def search(state: list[tuple[int, str, int]], depth: int) -> str | None:
        options = moves(state)
        if len(state) == 2:
            move, _ = min(options, key=lambda m: (abs(m[0].result - target), "+-*/".index(m[0].op)))
            hit = move.result == target
            lines.append(f"{' ' * depth}{move.a}{move.op}{move.b}={move.result} {'!' if hit else 'x'}")
            return move.expr if hit else None
        keys = [math.log1p(abs(m.result - target)) + noise * g for (m, _), g in
                zip(options, rng.standard_normal(len(options)))]
        for k in np.argsort(keys, kind="stable"):
            move, nxt = options[int(k)]
            lines.append(f"{' ' * depth}{move.a}{move.op}{move.b}={move.result} [{_numbers_left(nxt)}]")
            found = search(nxt, depth + 1)
            if found is not None:
                return found
        return None

    if len(numbers) < 2:
        raise ValueError(f"need at least two numbers, got {list(numbers)}")
    if any(int(n) < 0 for n in numbers):
        raise ValueError(f"numbers must be non-negative integers, got {list(numbers)}")
    solution = search([(int(n), str(int(n)), _ATOM) for n in numbers], 0)
    if solution is None:
        raise ValueError(f"{list(numbers)} cannot reach {target} with integer moves")
    return "\n".join([*lines, f"<answer>{solution}</answer>"])


TRACE_MODES = ("nothink", "short", "long")


def write_mode_trace(numbers: Sequence[int], target: int, rng: np.random.Generator, mode: str, *,
                     markers: dict[str, str] | None = None, noise: float = 0.6) -> str:
    """``write_trace`` in a response mode: ``"<marker>\n"`` then the answer only (``nothink``), the lines of the branch
    that reaches the target and the answer (``short``), or the whole trace (``long``). ``markers`` default to
    ``rlvr/Modes-v0``'s (``/nothink``, ``/short``, ``/long``). Raises ``ValueError`` for an unknown mode."""
    if mode not in TRACE_MODES:
        raise ValueError(f"mode must be one of {TRACE_MODES}, got {mode!r}")
    if markers is None:
        from rlvr_envs.modes import DEFAULT_MODES

        markers = {name: m.marker for name, m in DEFAULT_MODES.items()}
    trace = write_trace(numbers, target, rng, noise=noise)
    answer = trace[trace.rindex("<answer>"):]
    body = {"nothink": [], "short": solution_branch(trace), "long": trace.split("\n")[:-1]}[mode]
    return "\n".join([markers[mode], *body, answer])


@dataclass(frozen=True)
class Step:
    depth: int
    a: int
    op: str
    b: int
    result: int
    left: tuple[int, ...] | None  # the numbers the line says are left; None on a leaf (``!``/``x``)
    mark: str  # "" (inner), "!" (claims the target), "x" (dead end)
    valid: bool  # the operands are available at this depth, the arithmetic is right and ``left`` is correct


@dataclass
class TraceCheck:
    steps: list[Step] = field(default_factory=list)
    malformed_lines: int = 0
    reached: bool = False  # some leaf reaches the target and every step on its branch is valid

    @property
    def all_valid(self) -> bool:
        return self.malformed_lines == 0 and all(s.valid for s in self.steps)

    @property
    def first_move(self) -> tuple[int, str, int] | None:
        return None if not self.steps else (self.steps[0].a, self.steps[0].op, self.steps[0].b)


def _apply(a: int, op: str, b: int) -> int | None:
    if op == "+":
        return a + b
    if op == "*":
        return a * b
    if op == "-":
        return a - b if a >= b else None
    return a // b if b > 1 and a % b == 0 else None


def check_trace(numbers: Sequence[int], target: int, text: str, *, max_lines: int = 512) -> TraceCheck:
    """Parse the search lines before ``<answer>`` and check each against the numbers available at its depth.

    Lines that are not search lines (blank, prose, the answer) count as malformed, except the answer line itself.
    A step at depth ``d`` uses the state left by the last valid step at depth ``d - 1`` (the task's numbers at 0)."""
    out = TraceCheck()
    states: dict[int, Counter | None] = {0: Counter(int(n) for n in numbers)}
    on_path: dict[int, bool] = {0: True}
    body = text.split("<answer>", 1)[0]
    for raw in body.splitlines()[:max_lines]:
        if not raw.strip():
            continue
        m = _LINE.match(raw)
        if m is None:
            out.malformed_lines += 1
            continue
        depth = len(m.group(1))
        a, op, b, result = int(m.group(2)), m.group(3), int(m.group(4)), int(m.group(5))
        left = tuple(sorted(int(v) for v in m.group(6).split())) if m.group(6) is not None else None
        mark = "!" if m.group(7) else ("x" if m.group(8) else "")
        state = states.get(depth)
        valid = state is not None and on_path.get(depth, False)
        rest: Counter | None = None
        if valid:
            need = Counter([a, b])
            valid = all(state[k] >= v for k, v in need.items()) and _apply(a, op, b) == result
            if valid:
                rest = state - need
                rest[result] += 1
                rest = +rest
                if left is not None:
                    valid = tuple(sorted(rest.elements())) == left
                else:  # a leaf: nothing may be left but the result
                    valid = sum(rest.values()) == 1
        out.steps.append(Step(depth, a, op, b, result, left, mark, bool(valid)))
        # deeper levels read the state this line leaves; an invalid line cuts its subtree off the path
        for d in [k for k in states if k > depth]:
            del states[d]
            on_path.pop(d, None)
        if left is not None:
            states[depth + 1] = rest if valid else None
            on_path[depth + 1] = bool(valid)
        if valid and mark == "!" and result == target:
            out.reached = True
    return out


def solution_branch(trace: str) -> list[str]:
    """The lines of a search trace on the branch that reaches the target (``!``), top-down with their indentation;
    ``[]`` when no line claims the target. Dead ends and abandoned siblings are left out."""
    stack: list[str] = []
    for raw in trace.split("<answer>", 1)[0].splitlines():
        m = _LINE.match(raw)
        if m is None:
            continue
        depth = len(m.group(1))
        stack = stack[:depth] + [raw]
        if m.group(7):  # "!"
            return stack
    return []
