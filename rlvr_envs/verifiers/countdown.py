"""Countdown verifier: is the response's final expression, using each given number exactly once, equal to the target?

The expression is parsed with ``ast`` and walked over a whitelist: integer literals, binary ``+ - * /`` and
parentheses (which leave no node). Everything else (names, calls, attributes, ``**``, ``//``, ``%``, unary minus,
floats, strings...) is rejected; nothing is ever ``eval``-ed. Arithmetic is exact (``fractions.Fraction``), so
``(1 / 3) * 3`` is 1 and division by zero is an error, not a crash. Before parsing, a character whitelist and caps on
length, parenthesis depth, node count, literal size and intermediate magnitude bound the work for any input.

Answer format: the last ``<answer>EXPR</answer>`` (``format_ok=True``); a last ``\\boxed{EXPR}`` is graded too but is
not the requested format (``format_ok=False``). ``EXPR = target`` (or ``target = EXPR``) is accepted; ``\\times``,
``\\cdot``, ``\\div``, ``×``, ``÷`` and ``−`` are read as the ASCII operators.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

from rlvr_envs.core import Verdict
from rlvr_envs.extract import extract_answer

MAX_EXPR_CHARS = 300
MAX_PAREN_DEPTH = 20
MAX_NODES = 64
MAX_LITERAL_DIGITS = 12
MAX_MAGNITUDE = 10**60  # bound on |numerator| and denominator of every intermediate value

_ALLOWED_CHARS = re.compile(r"[0-9+\-*/()\s]*")
_REPLACEMENTS = (("\\left(", "("), ("\\right)", ")"), ("\\times", "*"), ("\\cdot", "*"), ("\\div", "/"),
                 ("×", "*"), ("·", "*"), ("∗", "*"), ("÷", "/"), ("−", "-"), ("–", "-"),
                 ("\\,", " "), ("\\ ", " "))
_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}


class ExpressionError(ValueError):
    """The expression is not a valid Countdown answer (the message says why)."""


def normalize_expression(text: str) -> str:
    s = text.strip()
    if len(s) > 4 * MAX_EXPR_CHARS:
        raise ExpressionError(f"expression too long ({len(s)} characters; limit {MAX_EXPR_CHARS})")
    s = s.strip("$").strip()
    for old, new in _REPLACEMENTS:
        s = s.replace(old, new)
    return s.strip().rstrip(".").strip()


def _split_equation(expr: str, target: int) -> str:
    """``EXPR = target`` or ``target = EXPR`` -> ``EXPR``; any other equation is an error."""
    if "=" not in expr:
        return expr
    parts = [p.strip() for p in expr.split("=")]
    if len(parts) == 2:
        for side, other in ((0, 1), (1, 0)):
            if re.fullmatch(r"\d{1,20}", parts[other]) and int(parts[other]) == target:
                return parts[side]
    raise ExpressionError("an equation is accepted only as 'EXPR = target'")


def _check_bounds(expr: str) -> None:
    if not expr:
        raise ExpressionError("empty expression")
    if len(expr) > MAX_EXPR_CHARS:
        raise ExpressionError(f"expression too long ({len(expr)} characters; limit {MAX_EXPR_CHARS})")
    if not _ALLOWED_CHARS.fullmatch(expr):
        bad = sorted({c for c in expr if not _ALLOWED_CHARS.fullmatch(c)})[:5]
        raise ExpressionError(f"characters not allowed: {bad!r} (only digits, + - * / and parentheses)")
    depth = 0
    for c in expr:
        depth += (c == "(") - (c == ")")
        if depth > MAX_PAREN_DEPTH:
            raise ExpressionError(f"parentheses nested deeper than {MAX_PAREN_DEPTH}")
        if depth < 0:
            raise ExpressionError("unbalanced parentheses")
    if depth:
        raise ExpressionError("unbalanced parentheses")


def _bounded(x: Fraction) -> Fraction:
    if abs(x.numerator) > MAX_MAGNITUDE or x.denominator > MAX_MAGNITUDE:
        raise ExpressionError("intermediate value too large")
    return x


def _evaluate(node: ast.AST, literals: list[int]) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        literals.append(node.value)
        return Fraction(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left = _evaluate(node.left, literals)
        right = _evaluate(node.right, literals)
        if isinstance(node.op, ast.Add):
            return _bounded(left + right)
        if isinstance(node.op, ast.Sub):
            return _bounded(left - right)
        if isinstance(node.op, ast.Mult):
            return _bounded(left * right)
        if right == 0:
            raise ExpressionError("division by zero")
        return _bounded(left / right)
    if isinstance(node, ast.UnaryOp):
        raise ExpressionError("unary operators are not allowed (use each given number as it is)")
    if isinstance(node, ast.BinOp):
        raise ExpressionError(f"operator {type(node.op).__name__} not allowed (only + - * /)")
    raise ExpressionError(f"{type(node).__name__} not allowed (only integers, + - * / and parentheses)")


def evaluate_expression(expr: str, numbers: Sequence[int]) -> Fraction:
    """The exact value of ``expr`` if well-formed and using each of ``numbers`` exactly once; else ExpressionError."""
    _check_bounds(expr)
    if any(len(m) > MAX_LITERAL_DIGITS for m in re.findall(r"\d+", expr)):
        raise ExpressionError(f"a number longer than {MAX_LITERAL_DIGITS} digits")
    try:
        tree = ast.parse(expr, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise ExpressionError(f"not a valid expression ({type(exc).__name__})") from None
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        raise ExpressionError(f"expression has more than {MAX_NODES} syntax nodes")
    literals: list[int] = []
    value = _evaluate(tree.body, literals)
    if Counter(literals) != Counter(int(n) for n in numbers):
        given = sorted(int(n) for n in numbers)
        raise ExpressionError(f"must use each of {given} exactly once; used {sorted(literals)}")
    return value


def _task_error(numbers: Any, target: Any) -> str | None:
    """Why the task itself cannot be graded (numbers or target that are not integers, no numbers), or None: what
    ``verify`` would otherwise fail on while reading the task rather than the response."""
    try:
        int(target)
        given = [int(n) for n in numbers]
    except (TypeError, ValueError):
        given = []
    if given:
        return None
    return f"the task is malformed (numbers {numbers!r:.80}, target {target!r:.40}): nothing to grade against"


def verify(numbers: Sequence[int], target: int, response: str) -> Verdict:
    """Grade ``response``'s final expression (see the module docstring). Never raises for any response text; a
    malformed task (non-integer numbers or target) is unverifiable, not a wrong answer."""
    task_error = _task_error(numbers, target)
    if task_error:
        return Verdict.could_not_verify(task_error)
    try:
        answer, style = extract_answer(response, styles=("answer_tag", "boxed"))
    except RecursionError:  # extraction is iterative; this is belt and braces for pathological text
        return Verdict.failed("could not read the response")
    if answer is None:
        return Verdict.failed("no final answer found (expected <answer>EXPR</answer>)")
    format_ok = style == "answer_tag"
    parsed = answer[:MAX_EXPR_CHARS]
    try:
        expr = _split_equation(normalize_expression(answer), int(target))
        parsed = expr[:MAX_EXPR_CHARS]
        value = evaluate_expression(expr, numbers)
    except ExpressionError as exc:
        return Verdict.failed(str(exc), parsed=parsed, format_ok=format_ok)
    correct = value == int(target)
    return Verdict(correct=correct, reward=float(correct), parsed=parsed, format_ok=format_ok,
                   error=None if correct else f"expression equals {value}, not {target}")
