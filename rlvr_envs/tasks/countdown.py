"""``rlvr/Countdown-v0``: combine the given numbers with ``+ - * /`` (each exactly once) to reach the target.

Procedural (default): task ``i`` draws 3..6 numbers (``min_numbers``/``max_numbers``) in ``min_number..max_number``
from ``np.random.default_rng((seed_base, i))``, then combines them in a random order with random operations (integer
intermediates only) until one value is left; that value is the target, redrawn until it lies in
``min_target..max_target``. So every task is solvable by construction, and the construction (``metadata["solution"]``)
is the gold response. ``split="cd3_test"`` loads the 256 three-number tasks of ``countdown/cd3_test.jsonl`` (from the
d1 repository); their gold solutions are found by exhaustive search.

Answer format (one, documented in the prompt): ``<answer>EXPR</answer>``, e.g. ``<answer>(100 - 93) * 3 + 2</answer>``.
See ``rlvr_envs.verifiers.countdown`` for the grading rules.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from rlvr_envs.core import ListSource, Task, TaskSource, TextEnv, Verdict
from rlvr_envs.data import load_rows
from rlvr_envs.tasks.procedural import DEFAULT_SIZE, ProceduralSource
from rlvr_envs.verifiers.countdown import verify

DEFAULT_TEMPLATE = ("{question} Show your work, then give only the final expression (without '= target') in "
                    "<answer> </answer> tags, for example <answer>(1 + 2) / 3</answer>.")
SPLITS = ("procedural", "cd3_test")
_PREC = {"+": 1, "-": 1, "*": 2, "/": 2}
_ATOM = 3


def question_for(numbers: Sequence[int], target: int) -> str:
    return (f"Using the numbers {list(numbers)}, create an equation that equals {target}. You can use basic arithmetic "
            "operations (+, -, *, /) and each number must be used exactly once.")


def _join(op: str, left: tuple[str, int], right: tuple[str, int]) -> tuple[str, int]:
    """``left op right`` as text with only the parentheses precedence needs; returns (text, precedence)."""
    p = _PREC[op]
    ltext = f"({left[0]})" if left[1] < p else left[0]
    rtext = f"({right[0]})" if right[1] < p or (right[1] == p and op in "-/") else right[0]
    return f"{ltext} {op} {rtext}", p


def solve(numbers: Sequence[int], target: int) -> str | None:
    """An expression using every number once that equals ``target`` (exact rationals), or None. Exhaustive: fine for
    up to 5 numbers, slow beyond."""
    goal = Fraction(target)

    @functools.cache
    def search(state: tuple[tuple[Fraction, str, int], ...]) -> str | None:
        if len(state) == 1:
            return state[0][1] if state[0][0] == goal else None
        for i in range(len(state)):
            for j in range(len(state)):
                if i == j:
                    continue
                (a, at, ap), (b, bt, bp) = state[i], state[j]
                rest = [state[k] for k in range(len(state)) if k not in (i, j)]
                for op in "+-*/":
                    if op in "+*" and i > j:  # commutative: one order suffices
                        continue
                    if op == "/" and b == 0:
                        continue
                    value = {"+": a + b, "-": a - b, "*": a * b, "/": a / b if b else None}[op]
                    text, prec = _join(op, (at, ap), (bt, bp))
                    found = search(tuple(sorted([*rest, (value, text, prec)])))
                    if found is not None:
                        return found
        return None

    return search(tuple(sorted((Fraction(n), str(n), _ATOM) for n in numbers)))


class CountdownSource(ProceduralSource):
    prefix = "countdown"

    def __init__(self, *, min_numbers: int = 3, max_numbers: int = 4, min_number: int = 1, max_number: int = 100,
                 min_target: int = 1, max_target: int = 100, seed_base: int = 0, size: int = DEFAULT_SIZE,
                 max_attempts: int = 10_000):
        if not 3 <= min_numbers <= max_numbers <= 6:
            raise ValueError(f"need 3 <= min_numbers <= max_numbers <= 6, got {min_numbers}, {max_numbers}")
        if not 0 <= min_number <= max_number <= 10**6:
            raise ValueError(f"need 0 <= min_number <= max_number <= 10**6, got {min_number}, {max_number}")
        if min_target > max_target:
            raise ValueError(f"need min_target <= max_target, got {min_target}, {max_target}")
        self.min_numbers, self.max_numbers = min_numbers, max_numbers
        self.min_number, self.max_number = min_number, max_number
        self.min_target, self.max_target = min_target, max_target
        self.max_attempts = max_attempts
        super().__init__(seed_base=seed_base, size=size, config={
            "numbers": [min_numbers, max_numbers], "number_range": [min_number, max_number],
            "target_range": [min_target, max_target]})

    def _combine(self, numbers: list[int], rng: np.random.Generator) -> tuple[int, str]:
        """Fold the numbers in random order with random feasible operations (integer results only)."""
        pool: list[tuple[int, str, int]] = [(n, str(n), _ATOM) for n in numbers]
        draws = iter(rng.random(3 * (len(numbers) - 1)).tolist())  # one numpy call: per-draw calls dominate the cost
        while len(pool) > 1:
            i = int(next(draws) * len(pool))
            j = int(next(draws) * (len(pool) - 1))
            j += j >= i
            a, b = pool[i], pool[j]
            pool = [p for k, p in enumerate(pool) if k not in (i, j)]
            moves = [("+", a, b), ("*", a, b), ("-", a, b) if a[0] >= b[0] else ("-", b, a)]
            moves += [("/", x, y) for x, y in ((a, b), (b, a)) if y[0] not in (0, 1) and x[0] % y[0] == 0]
            op, x, y = moves[int(next(draws) * len(moves))]
            value = {"+": x[0] + y[0], "-": x[0] - y[0], "*": x[0] * y[0], "/": x[0] // max(y[0], 1)}[op]
            pool.append((value, *_join(op, x[1:], y[1:])))
        return pool[0][0], pool[0][1]

    def generate(self, index: int, rng: np.random.Generator) -> Task:
        count = int(rng.integers(self.min_numbers, self.max_numbers, endpoint=True))
        for _ in range(self.max_attempts):
            numbers = [int(x) for x in rng.integers(self.min_number, self.max_number, size=count, endpoint=True)]
            target, solution = self._combine(numbers, rng)
            if self.min_target <= target <= self.max_target:
                return Task(id=self.task_id(index), question=question_for(numbers, target), answer=str(target),
                            metadata={"numbers": numbers, "target": target, "solution": solution})
        raise RuntimeError(f"no target in [{self.min_target}, {self.max_target}] after {self.max_attempts} draws: "
                           "widen the target range or change the number range")


def _cd3_source(data_dir: str | None) -> ListSource:
    rows, digest, origin = load_rows("countdown/cd3_test.jsonl", data_dir=data_dir)
    tasks = []
    for i, row in enumerate(rows):
        try:
            numbers = [int(x) for x in str(row["input"]).split(",")]
            target = int(row["output"])
        except (KeyError, ValueError) as exc:
            raise ValueError(f"{origin}: row {i} is not a countdown task ({exc})") from None
        tasks.append(Task(id=f"cd3-{i}", question=question_for(numbers, target), answer=str(target),
                          metadata={"numbers": numbers, "target": target, "solution": solve(numbers, target)}))
    return ListSource(tasks, name="countdown/cd3_test", fingerprint=digest)


def gold_response(task: Task) -> str:
    solution = task.metadata.get("solution") or solve(task.metadata["numbers"], int(task.answer))
    if solution is None:
        raise ValueError(f"{task.id}: no solution exists")
    return f"{solution} = {task.answer}, so the answer is <answer>{solution}</answer>."


def score(task: Task, response: str) -> Verdict:
    return verify(task.metadata["numbers"], int(task.answer), response)


def make_env(*, split: str = "procedural", data_dir: str | None = None, min_numbers: int = 3, max_numbers: int = 4,
             min_number: int = 1, max_number: int = 100, min_target: int = 1, max_target: int = 100,
             seed_base: int = 0, size: int = DEFAULT_SIZE, prompt_template: str | None = DEFAULT_TEMPLATE,
             **env_kwargs: Any) -> TextEnv:
    source: TaskSource
    if split == "procedural":
        source = CountdownSource(min_numbers=min_numbers, max_numbers=max_numbers, min_number=min_number,
                                 max_number=max_number, min_target=min_target, max_target=max_target,
                                 seed_base=seed_base, size=size)
    elif split == "cd3_test":
        source = _cd3_source(data_dir)
    else:
        raise ValueError(f"unknown countdown split {split!r}; choose one of {SPLITS}")
    return TextEnv(source, score, prompt_template=prompt_template, verifier_name="countdown (ast whitelist)",
                   gold_formatter=gold_response, **env_kwargs)
