"""``rlvr/Arithmetic-v0``: procedurally generated integer arithmetic, graded by exact integer comparison.

Task ``i`` is ``operand op operand op ...`` drawn from ``np.random.default_rng((seed_base, i))``. Knobs: the operand
range (``min_operand``/``max_operand``), ``num_operations`` (operands = operations + 1) and ``operators`` (any of
``+ - *``; ``*`` binds tighter, as usual). The default, two operands in 0..50 with ``+``/``-``, suits a 135M model:
greedy SmolLM2-135M-Instruct solved 14/48 (29%) of the first 48 tasks, a usable RL signal, against 6/48 (12.5%) with
operands in 0..99 (measured with ``rlvr eval --limit 48``).

Grading: the final answer (``\\boxed{}``, ``<answer>``, ``####`` or "The answer is", see ``rlvr_envs.extract``) must be
an integer equal to the result; ``1,234`` and ``89.0`` are accepted. A response with none of those markers is graded
by its last integer (``format_ok=False``, so a format reward can still tell the two apart); ``strict_format=True``
turns that fallback off.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from rlvr_envs.core import Task, TextEnv, Verdict
from rlvr_envs.extract import extract_answer
from rlvr_envs.tasks.procedural import DEFAULT_SIZE, ProceduralSource

OPERATORS = "+-*"
DEFAULT_TEMPLATE = "{question} Put your final answer within \\boxed{{}}."

_INTEGER = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.0*)?|[+-]?\d+(?:\.0*)?")
_LAST_INTEGER = re.compile(r"-?\d+(?:,\d{3})*")
_MAX_DIGITS = 200  # a response integer longer than this cannot be any task's answer; never convert it


def evaluate_chain(operands: list[int], operators: list[str]) -> int:
    """The value of ``a0 o1 a1 o2 a2 ...`` with ``*`` before ``+``/``-`` (exact integers, no ``eval``)."""
    total, term = 0, operands[0]
    sign = 1
    for op, x in zip(operators, operands[1:]):
        if op == "*":
            term *= x
        else:
            total += sign * term
            sign, term = (1 if op == "+" else -1), x
    return total + sign * term


def parse_integer(text: str) -> int | None:
    """An integer written as ``89``, ``-12``, ``1,234``, ``89.0`` (with optional ``$``, spaces, ``\\,``), else None."""
    s = text.strip().strip("$").strip().replace("\\,", "").replace("\\!", "")
    s = re.sub(r"^\\text\{(.*)\}$", r"\1", s)
    if len(s) > _MAX_DIGITS + 10 or not _INTEGER.fullmatch(s):
        return None
    return int(s.split(".")[0].replace(",", ""))


def score_integer(gold: int, response: str, *, strict_format: bool = False) -> Verdict:
    """Exact integer grading of ``response`` against ``gold``."""
    answer, style = extract_answer(response)
    format_ok = answer is not None
    if answer is None:
        if strict_format:
            return Verdict.failed("no final answer found (expected \\boxed{...})")
        found = _LAST_INTEGER.findall(response[-10_000:])  # the last number is near the end; bound the scan
        if not found:
            return Verdict.failed("no final answer found")
        answer = found[-1]
    value = parse_integer(answer)
    if value is None:
        return Verdict.failed(f"final answer is not an integer: {answer[:80]!r}", parsed=answer[:200],
                              format_ok=format_ok)
    correct = value == int(gold)
    return Verdict(correct=correct, reward=float(correct), parsed=str(value), format_ok=format_ok)


def gold_response(task: Task) -> str:
    return f"{task.metadata['expression']} = {task.answer}. The answer is \\boxed{{{task.answer}}}."


class ArithmeticSource(ProceduralSource):
    prefix = "arith"

    def __init__(self, *, min_operand: int = 0, max_operand: int = 50, num_operations: int = 1,
                 operators: str = "+-", seed_base: int = 0, size: int = DEFAULT_SIZE):
        if not (isinstance(min_operand, int) and isinstance(max_operand, int)) or min_operand > max_operand:
            raise ValueError(f"need integers min_operand <= max_operand, got {min_operand!r}, {max_operand!r}")
        if max(abs(min_operand), abs(max_operand)) > 10**12:
            raise ValueError("operands are limited to |x| <= 10**12")
        if not isinstance(num_operations, int) or not 1 <= num_operations <= 20:
            raise ValueError(f"num_operations must be an integer in [1, 20], got {num_operations!r}")
        ops = "".join(dict.fromkeys(operators))  # unique, order kept
        if not ops or any(o not in OPERATORS for o in ops):
            raise ValueError(f"operators must be a non-empty string of {OPERATORS!r}, got {operators!r}")
        self.min_operand, self.max_operand = min_operand, max_operand
        self.num_operations, self.operators = num_operations, ops
        super().__init__(seed_base=seed_base, size=size, config={
            "min_operand": min_operand, "max_operand": max_operand, "num_operations": num_operations,
            "operators": ops})

    def generate(self, index: int, rng: np.random.Generator) -> Task:
        operands = [int(x) for x in rng.integers(self.min_operand, self.max_operand, size=self.num_operations + 1,
                                                 endpoint=True)]
        ops = [self.operators[int(k)] for k in rng.integers(len(self.operators), size=self.num_operations)]
        expr = str(operands[0]) + "".join(f" {o} {x if x >= 0 else f'({x})'}" for o, x in zip(ops, operands[1:]))
        value = evaluate_chain(operands, ops)
        return Task(id=self.task_id(index), question=f"What is {expr}?", answer=str(value),
                    metadata={"expression": expr, "operands": operands, "operators": ops})


def make_env(*, min_operand: int = 0, max_operand: int = 50, num_operations: int = 1, operators: str = "+-",
             seed_base: int = 0, size: int = DEFAULT_SIZE, strict_format: bool = False,
             prompt_template: str | None = DEFAULT_TEMPLATE, **env_kwargs: Any) -> TextEnv:
    source = ArithmeticSource(min_operand=min_operand, max_operand=max_operand, num_operations=num_operations,
                              operators=operators, seed_base=seed_base, size=size)

    def scorer(task: Task, response: str) -> Verdict:
        return score_integer(int(task.answer), response, strict_format=strict_format)

    return TextEnv(source, scorer, prompt_template=prompt_template, verifier_name="exact integer",
                   gold_formatter=gold_response, **env_kwargs)
