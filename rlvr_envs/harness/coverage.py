"""Countdown solution coverage and entrances: how many different correct solutions a policy finds per problem, and
where its solutions start.

RLVR narrows the set of solutions a policy finds on Countdown, mostly at the *entrance*, the first arithmetic
operation (paper seed 003: coverage drops 67% at the entrance). These functions measure both from per-sample records;
they read only ``response``, ``parsed_answer`` and ``correct``, so a leaderboard recomputes them exactly.

Canonical solution (``canonical_expression``). The answer expression is parsed with ``ast`` (never evaluated) under
the verifier's whitelist and bounds (integers, binary ``+ - * /``, parentheses), then written fully parenthesized,
without spaces, with the two operands of every ``+`` and ``*`` in sorted (string) order; ``-`` and ``/`` keep theirs.
Only commutativity is normalized, not associativity: ``2+3*4``, ``4*3+2`` and ``(2+(4*3))`` are one solution,
``((3*4)+2)``, but ``(1+2)+3`` and ``1+(2+3)`` are two (they start differently). A bare literal is itself.

Entrance (``response_entrance``), the canonical triple ``(a, op, b)`` with ``a >= b`` for ``+`` and ``*``, written
``"a op b"``:

* a search trace (the micro lane's format, ``agents.policy.countdown_traces``): its first search line
  ``a<op>b=c [...]``/``!``/``x`` before ``<answer>``, exactly ``check_trace(...).first_move``;
* otherwise the answer expression: the first binary operation whose operands are both literals, in Python's
  evaluation order (left to right, operands before their operation) of the expression *as written*: ``2+3*4`` and
  ``4*3+2`` both enter with ``4 * 3``; ``(1+2)*(3+4)`` enters with ``2 + 1`` and ``(3+4)*(1+2)`` with ``4 + 3``
  (one solution, two entrances: the written order is the model's choice).

Per problem over its ``n`` samples (``task_stats``): ``solutions`` = distinct canonical correct expressions,
``entrances`` = distinct entrances among correct samples, ``entrance_entropy`` = Shannon entropy (bits) of the correct
samples' entrances (0 with fewer than two), ``entrance_entropy_all`` = the same over every sample with a readable
entrance (what the policy starts with, right or wrong). A problem with no correct sample scores 0 on the first three;
a correct sample whose entrance cannot be read counts for ``solutions`` only. ``coverage_metrics`` averages each over
problems as ``coverage@n``, ``entrances@n``, ``entrance_entropy@n`` and ``entrance_entropy_all@n``, and counts where
the entrances came from (``entrance_sources``: trace / expression / none). Malformed text never raises: it has no
entrance and no solution.
"""

from __future__ import annotations

import ast
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rlvr_envs.verifiers.countdown import (
    MAX_LITERAL_DIGITS,
    MAX_NODES,
    ExpressionError,
    _check_bounds,
    normalize_expression,
)

Entrance = tuple[int, str, int]
# The micro lane's search-trace line (agents/policy/countdown_traces._LINE; the harness imports nothing from agents).
TRACE_LINE = re.compile(r"^( *)(\d+)([-+*/])(\d+)=(\d+) ?(?:\[([\d ]*)\]|(!)|(x))\s*$")
MAX_TRACE_LINES = 512  # check_trace's default
_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}
# Metric keys (suffixed with @n) added by coverage_metrics, and the one without a suffix.
METRIC_PREFIXES = ("coverage@", "entrances@", "entrance_entropy@", "entrance_entropy_all@")
SOURCES_KEY = "entrance_sources"


def _parse(expr: str) -> ast.expr | None:
    """The whitelisted syntax tree of ``expr``, or None (the verifier's bounds; nothing is evaluated)."""
    try:
        text = normalize_expression(expr)
        _check_bounds(text)
        if any(len(m) > MAX_LITERAL_DIGITS for m in re.findall(r"\d+", text)):
            return None
        tree = ast.parse(text, mode="eval")
    except (ExpressionError, SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        return None
    return tree.body if _whitelisted(tree.body) else None


def _whitelisted(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return type(node.value) is int
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _whitelisted(node.left) and _whitelisted(node.right)
    return False


def _canonical(node: ast.expr) -> str:
    if isinstance(node, ast.Constant):
        return str(node.value)
    assert isinstance(node, ast.BinOp)
    op = _OPS[type(node.op)]
    left, right = _canonical(node.left), _canonical(node.right)
    if op in "+*" and right < left:  # commutative: one operand order
        left, right = right, left
    return f"({left}{op}{right})"


def canonical_expression(expr: Any) -> str | None:
    """The canonical form of a Countdown answer expression (module docstring), or None when it does not parse."""
    if not isinstance(expr, str):
        return None
    node = _parse(expr)
    return None if node is None else _canonical(node)


def _canonical_entrance(a: int, op: str, b: int) -> Entrance:
    return (b, op, a) if op in "+*" and a < b else (a, op, b)


def expression_entrance(expr: Any) -> Entrance | None:
    """The first operation of ``expr`` on two literals in evaluation order (module docstring), or None."""
    if not isinstance(expr, str):
        return None
    node = _parse(expr)
    stack: list[tuple[ast.expr, bool]] = [] if node is None else [(node, False)]
    while stack:  # iterative post-order: left subtree, right subtree, then the operation
        current, expanded = stack.pop()
        if not isinstance(current, ast.BinOp):
            continue
        if expanded:
            if isinstance(current.left, ast.Constant) and isinstance(current.right, ast.Constant):
                return _canonical_entrance(int(current.left.value), _OPS[type(current.op)], int(current.right.value))
            continue
        stack.extend([(current, True), (current.right, False), (current.left, False)])
    return None


def trace_entrance(response: Any, *, max_lines: int = MAX_TRACE_LINES) -> Entrance | None:
    """The first search-trace line of ``response`` before ``<answer>`` as ``(a, op, b)`` (``check_trace``'s
    ``first_move``, canonicalized), or None when the response has no trace line."""
    if not isinstance(response, str):
        return None
    for raw in response.split("<answer>", 1)[0].splitlines()[:max_lines]:
        m = TRACE_LINE.match(raw)
        if m is not None:
            return _canonical_entrance(int(m.group(2)), m.group(3), int(m.group(4)))
    return None


def response_entrance(response: Any, parsed_answer: Any) -> tuple[Entrance | None, str]:
    """``(entrance, source)``: the trace's first line (``"trace"``), else the answer's (``"expression"``), else
    ``(None, "none")``."""
    found = trace_entrance(response)
    if found is not None:
        return found, "trace"
    found = expression_entrance(parsed_answer)
    return (found, "expression") if found is not None else (None, "none")


def entrance_text(entrance: Entrance | None) -> str | None:
    """``"a op b"`` (the key entrance counts use), None for None."""
    return None if entrance is None else f"{entrance[0]} {entrance[1]} {entrance[2]}"


def entropy_bits(counts: Iterable[int]) -> float:
    """Shannon entropy in bits of a distribution given by counts (0 for an empty or single-outcome one)."""
    values = [c for c in counts if c > 0]
    total = sum(values)
    if total == 0:
        return 0.0
    return float(max(0.0, -sum(c / total * math.log2(c / total) for c in values)))


def task_stats(samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Coverage and entrance statistics of one problem's samples (records with ``response``, ``parsed_answer``,
    ``correct``): counts, the correct samples' entrance distribution (``entrance_counts``) and the sources."""
    solutions: set[str] = set()
    correct_entrances: Counter[str] = Counter()
    all_entrances: Counter[str] = Counter()
    sources: Counter[str] = Counter()
    n_correct = 0
    for r in samples:
        entrance, source = response_entrance(r.get("response"), r.get("parsed_answer"))
        sources[source] += 1
        key = entrance_text(entrance)
        if key is not None:
            all_entrances[key] += 1
        if not r.get("correct"):
            continue
        n_correct += 1
        canonical = canonical_expression(r.get("parsed_answer"))
        if canonical is not None:
            solutions.add(canonical)
        if key is not None:
            correct_entrances[key] += 1
    return {
        "n": len(samples), "correct": n_correct, "solutions": len(solutions), "entrances": len(correct_entrances),
        "entrance_entropy": entropy_bits(correct_entrances.values()),
        "entrance_entropy_all": entropy_bits(all_entrances.values()),
        "entrance_counts": dict(sorted(correct_entrances.items(), key=lambda kv: (-kv[1], kv[0]))),
        "sources": dict(sources),
    }


def is_countdown(records: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the records come from ``rlvr/Countdown-v0``: every record's metadata holds the task's integer
    ``target`` and its ``solution`` (the keys Countdown tasks carry into records; no other env has both)."""
    if not records:
        return False
    for r in records:
        meta = r.get("metadata")
        if not isinstance(meta, Mapping) or "solution" not in meta:
            return False
        target = meta.get("target")
        if isinstance(target, bool) or not isinstance(target, int):
            return False
    return True


def coverage_metrics(groups: Sequence[Sequence[Mapping[str, Any]]], n_samples: int) -> dict[str, Any]:
    """Per-problem ``task_stats`` averaged over problems (``groups``: each problem's samples); module docstring."""
    stats = [task_stats(g) for g in groups]
    if not stats:
        raise ValueError("no problems to compute coverage over")
    n = int(n_samples)
    sources: Counter[str] = Counter()
    for s in stats:
        sources.update(s["sources"])
    return {
        f"coverage@{n}": float(sum(s["solutions"] for s in stats) / len(stats)),
        f"entrances@{n}": float(sum(s["entrances"] for s in stats) / len(stats)),
        f"entrance_entropy@{n}": float(sum(s["entrance_entropy"] for s in stats) / len(stats)),
        f"entrance_entropy_all@{n}": float(sum(s["entrance_entropy_all"] for s in stats) / len(stats)),
        SOURCES_KEY: {k: int(sources.get(k, 0)) for k in ("trace", "expression", "none")},
    }


def is_coverage_key(key: str) -> bool:
    """Whether a metric key is one ``coverage_metrics`` adds (results written before it existed lack them)."""
    return key == SOURCES_KEY or key.startswith(METRIC_PREFIXES)
