"""``rlvr/Countdown-v0``: combine the given numbers with ``+ - * /`` (each exactly once) to reach the target.

Procedural (default): task ``i`` draws 3..6 numbers (``min_numbers``/``max_numbers``) in ``min_number..max_number``
from ``np.random.default_rng((seed_base, i))``, then combines them in a random order with random operations (integer
intermediates only) until one value is left; that value is the target, redrawn until it lies in
``min_target..max_target``. So every task is solvable by construction, and the construction (``metadata["solution"]``)
is the gold response. ``split="cd3_test"`` loads the 256 three-number tasks of ``countdown/cd3_test.jsonl`` (from the
d1 repository); their gold solutions are found by exhaustive search.

Answer format (one, documented in the prompt): ``<answer>EXPR</answer>``, e.g. ``<answer>(100 - 93) * 3 + 2</answer>``.
See ``rlvr_envs.verifiers.countdown`` for the grading rules.

Entrance option (the "entrance" of a solution is its first arithmetic operation; RLVR narrows Countdown's solutions
mainly there, and giving the model an entrance it would not have chosen restores coverage). ``reset(options=
{"entrance": "a op b"})`` (or ``"a op b = c"``), or the env kwarg ``entrance_hint`` (``True``/``"sample"``: drawn per
episode with the env's ``np_random``, so deterministic under the reset seed; ``"task"``: drawn per task from
``default_rng((entrance_seed, task index))``, the same for every episode of a task), appends
``entrance_template`` (default ``"Start with a op b = c."``) to the question, so any ``prompt_template`` containing
``{question}`` renders it, and puts ``entrance`` (``"a op b = c"``) in the reset and step infos. A valid entrance is a
move of the micro lane's search traces on two of the task's numbers: ``+`` and ``*`` (any order, written larger
first), ``-`` with ``a >= b``, ``/`` when exact with ``b > 1``; anything else raises ``ValueError`` listing the valid
ones. Drawn entrances are ones from which the target is still reachable (``solvable_entrances``). The entrance changes
the prompt only: grading is unchanged, and without the option prompts and infos are exactly as before.

``entrances={task_id: "a op b", ...}`` gives chosen tasks their own entrance (for instance one the policy under test
did not select on those tasks). ``entrance_as="prefill"`` gives it as the start of the response instead of an
instruction: the prompt is unchanged and ``info["response_prefix"]`` holds the entrance as the first line of a search
trace (``9+2=11 [2 11]``); agents that honour it (``agents.policy.PolicyAgent``) continue from that line and return
prefix + continuation, which the env grades whole. A policy that never reads instructions (the micro lane's) can only
take an entrance this way.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from rlvr_envs.core import ListSource, Task, TaskSource, TextEnv, Verdict, render_messages
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


# -- the entrance option -----------------------------------------------------------------------------------------------
DEFAULT_ENTRANCE_TEMPLATE = "Start with {entrance}."
ENTRANCE_AS = ("prompt", "prefill")
HINT_MODES = ("sample", "task")
_ENTRANCE = re.compile(r"\s*(\d{1,12})\s*([-+*/])\s*(\d{1,12})\s*(?:=\s*(\d{1,24})\s*)?\.?\s*")


@dataclasses.dataclass(frozen=True)
class Entrance:
    """A first operation ``a op b = result`` on two of a task's numbers (``a >= b``: see ``entrances``)."""

    a: int
    op: str
    b: int
    result: int

    @property
    def text(self) -> str:
        """``"a op b = result"``: what the prompt and the infos show."""
        return f"{self.a} {self.op} {self.b} = {self.result}"

    @property
    def key(self) -> str:
        """``"a op b"``: the entrance as ``rlvr_envs.harness.coverage`` names it."""
        return f"{self.a} {self.op} {self.b}"

    def rest(self, numbers: Sequence[int]) -> list[int]:
        """The numbers left after this operation: ``numbers`` without ``a`` and ``b``, plus the result."""
        left = Counter(int(n) for n in numbers)
        left.subtract([self.a, self.b])
        if min(left.values(), default=0) < 0:
            raise ValueError(f"{self.key} uses a number not in {list(numbers)}")
        return sorted([*left.elements(), self.result])

    def trace_line(self, numbers: Sequence[int], target: int) -> str:
        """The entrance as the first line of a micro-lane search trace (``agents.policy.countdown_traces``):
        ``a<op>b=c [left]``, or ``a<op>b=c !``/``x`` when it uses the last two numbers. A response prefilled with
        this line continues the search from the entrance."""
        left = self.rest(numbers)
        head = f"{self.a}{self.op}{self.b}={self.result}"
        if len(left) == 1:
            return f"{head} {'!' if self.result == int(target) else 'x'}"
        return f"{head} [{' '.join(str(v) for v in left)}]"


def _apply_move(a: int, op: str, b: int) -> int | None:
    """The result of a trace move (non-negative integers only), None when the move is not allowed."""
    if op == "+":
        return a + b
    if op == "*":
        return a * b
    if op == "-":
        return a - b if a >= b else None
    return a // b if b > 1 and a % b == 0 else None


def entrances(numbers: Sequence[int]) -> list[Entrance]:
    """Every valid first operation on ``numbers``, each once, in (a, op, b) order (op order ``+ - * /``).

    The moves of ``rlvr/Countdown-v0``'s construction and of the micro lane's traces: ``+ *`` and ``-`` written
    larger-first, ``/`` only exact and by a number > 1, so every intermediate is a non-negative integer."""
    values = sorted((int(n) for n in numbers), reverse=True)
    out: set[Entrance] = set()
    for i in range(len(values)):
        for j in range(i + 1, len(values)):
            a, b = values[i], values[j]  # a >= b
            for op in "+-*/":
                result = _apply_move(a, op, b)
                if result is not None:
                    out.add(Entrance(a, op, b, result))
    return sorted(out, key=lambda e: (e.a, "+-*/".index(e.op), e.b))


def _values(state: tuple[Fraction, ...], memo: dict[tuple[Fraction, ...], frozenset[Fraction]]
            ) -> frozenset[Fraction]:
    """Every value an expression using each of ``state`` (sorted) exactly once can take (exact rationals)."""
    if len(state) == 1:
        return frozenset(state)
    if state in memo:
        return memo[state]
    out: set[Fraction] = set()
    for left, right in _splits(state, memo):
        for x in left:
            for y in right:
                out.update((x + y, x - y, y - x, x * y))
                if y:
                    out.add(x / y)
                if x:
                    out.add(y / x)
    memo[state] = frozenset(out)
    return memo[state]


def _splits(state: tuple[Fraction, ...], memo: dict) -> Any:
    """The value sets of each unordered split of ``state`` into two non-empty parts."""
    n = len(state)
    for mask in range(1, (1 << n) - 1, 2):  # masks holding state[0]: each unordered split once
        yield (_values(tuple(state[i] for i in range(n) if mask >> i & 1), memo),
               _values(tuple(state[i] for i in range(n) if not mask >> i & 1), memo))


def reachable(numbers: Sequence[int], target: int, memo: dict | None = None) -> bool:
    """Whether some expression using each of ``numbers`` once equals ``target`` (the verifier's rules: ``+ - * /``
    on exact rationals). Splits the numbers in two and looks the partner value up in the other part's value set, so
    only parts of at most ``len(numbers) - 1`` numbers are enumerated; ``memo`` shares those across calls."""
    state = tuple(sorted(Fraction(int(v)) for v in numbers))
    goal = Fraction(int(target))
    if len(state) == 1:
        return state[0] == goal
    memo = {} if memo is None else memo
    for left, right in _splits(state, memo):
        for x in left:  # goal = x + y, x - y, y - x, x * y, x / y (y != 0) or y / x (x != 0)
            if goal - x in right or x - goal in right or goal + x in right:
                return True
            if not x and not goal:  # 0 * y
                return True
            if x and (goal / x in right or goal * x in right):
                return True
            if goal and x and x / goal in right:
                return True
    return False


@functools.lru_cache(maxsize=4096)
def _solvable(numbers: tuple[int, ...], target: int) -> tuple[Entrance, ...]:
    memo: dict = {}
    return tuple(e for e in entrances(numbers) if reachable(e.rest(numbers), target, memo))


def solvable_entrances(numbers: Sequence[int], target: int) -> list[Entrance]:
    """The entrances from which the target can still be reached (exact rationals, as the verifier grades)."""
    return list(_solvable(tuple(sorted(int(n) for n in numbers)), int(target)))


def parse_entrance(spec: Any, numbers: Sequence[int]) -> Entrance:
    """``"a op b"``, ``"a op b = c"``, an ``(a, op, b)`` triple or an ``Entrance``, checked against ``numbers``;
    ``+`` and ``*`` are returned larger operand first. Raises ``ValueError`` saying why and listing the valid ones."""
    numbers = [int(n) for n in numbers]

    def bad(why: str) -> ValueError:
        valid = [e.key for e in entrances(numbers)]
        shown = ", ".join(valid[:24]) + (f", ... ({len(valid)} in all)" if len(valid) > 24 else "")
        return ValueError(f"invalid entrance {spec!r} for numbers {numbers}: {why}; valid entrances: {shown}")

    claimed: int | None = None
    if isinstance(spec, Entrance):
        a, op, b, claimed = spec.a, spec.op, spec.b, spec.result
    elif isinstance(spec, str):
        m = _ENTRANCE.fullmatch(spec)
        if m is None:
            raise bad("expected 'a op b' or 'a op b = c' with op one of + - * / and non-negative integers")
        a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
        claimed = None if m.group(4) is None else int(m.group(4))
    elif isinstance(spec, (tuple, list)) and len(spec) == 3 and isinstance(spec[1], str):
        try:
            a, op, b = int(spec[0]), spec[1].strip(), int(spec[2])
        except (TypeError, ValueError):
            raise bad("expected integers around the operator") from None
    else:
        raise bad("expected a string 'a op b' or a triple (a, op, b)")
    if op not in ("+", "-", "*", "/"):
        raise bad(f"unknown operator {op!r}")
    available = Counter(numbers)
    if any(available[k] < v for k, v in Counter([a, b]).items()):
        raise bad("it uses a number that is not given (each given number can be used once)")
    if op in "+*" and a < b:
        a, b = b, a
    result = _apply_move(a, op, b)
    if result is None:
        raise bad(f"{a} - {b} is negative" if op == "-" else f"{a} / {b} is not an exact division by a number > 1")
    if claimed is not None and claimed != result:
        raise bad(f"{a} {op} {b} is {result}, not {claimed}")
    return Entrance(a, op, b, result)


def draw_entrance(numbers: Sequence[int], target: int, rng: np.random.Generator) -> Entrance:
    """One entrance uniformly among the solvable ones (among all valid ones if none is solvable).

    The first solvable entrance of a random permutation: uniform over the solvable ones, and it stops early, so a
    six-number task rarely needs the full (seconds-long) ``solvable_entrances``."""
    pool = entrances(numbers)
    if not pool:
        raise ValueError(f"numbers {list(numbers)} have no valid first operation")
    order = [int(i) for i in rng.permutation(len(pool))]
    memo: dict = {}
    found = next((pool[i] for i in order if reachable(pool[i].rest(numbers), target, memo)), None)
    return found if found is not None else pool[order[0]]


def _hint_mode(value: Any) -> str | None:
    if value is None or value is False:
        return None
    if value is True:
        return "sample"
    if value in HINT_MODES:
        return str(value)
    raise ValueError(f"entrance_hint must be False, True or one of {HINT_MODES}, got {value!r}")


class CountdownEnv(TextEnv):
    """``TextEnv`` plus the entrance option (module docstring). Without it, prompts and infos are ``TextEnv``'s."""

    def __init__(self, source: TaskSource, scorer: Any, *, entrance_hint: Any = False, entrance_seed: int = 0,
                 entrance_template: str = DEFAULT_ENTRANCE_TEMPLATE, entrance_as: str = "prompt",
                 entrances: Mapping[str, Any] | None = None, **kwargs: Any):
        self.entrance_hint = _hint_mode(entrance_hint)
        if entrance_as not in ENTRANCE_AS:
            raise ValueError(f"entrance_as must be one of {ENTRANCE_AS}, got {entrance_as!r}")
        if entrances is not None and not isinstance(entrances, Mapping):
            raise ValueError(f"entrances must map task ids to entrances ('a op b'), got {type(entrances).__name__}")
        self.entrance_as = entrance_as
        self.entrances = dict(entrances or {})
        if not isinstance(entrance_template, str) or "{entrance}" not in entrance_template:
            raise ValueError(f"entrance_template must be a string containing '{{entrance}}', got {entrance_template!r}")
        if isinstance(entrance_seed, bool) or not isinstance(entrance_seed, int) or entrance_seed < 0:
            raise ValueError(f"entrance_seed must be an int >= 0, got {entrance_seed!r}")
        self.entrance_seed = entrance_seed
        self.entrance_template = entrance_template
        self._entrance: Entrance | None = None
        super().__init__(source, scorer, **kwargs)

    @property
    def entrance(self) -> Entrance | None:
        """The current episode's entrance (None without the option)."""
        return self._entrance

    def messages_for(self, task: Task) -> list[dict[str, str]]:
        """``TextEnv``'s messages; for the current episode's task with an entrance (``entrance_as="prompt"``), the
        question carries the instruction (so every template containing ``{question}`` shows it)."""
        if self._entrance is not None and task is self._task and self.entrance_as == "prompt":
            hint = self.entrance_template.format(entrance=self._entrance.text)
            task = dataclasses.replace(task, question=f"{task.question} {hint}", messages=())
        return super().messages_for(task)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        options = dict(options or {})
        spec = options.pop("entrance", None)
        self._entrance = None
        obs, info = super().reset(seed=seed, options=options)
        task = self._task
        assert task is not None
        numbers, target = task.metadata["numbers"], int(task.answer)
        if spec is None:  # a per-task entrance from the env's table (e.g. one the policy did not select)
            spec = self.entrances.get(str(info["task_id"]))
        if spec is not None:  # an explicit entrance wins over entrance_hint
            self._entrance = parse_entrance(spec, numbers)
        elif self.entrance_hint == "sample":
            self._entrance = draw_entrance(numbers, target, self.np_random)
        elif self.entrance_hint == "task":
            rng = np.random.default_rng((self.entrance_seed, int(info["index"])))
            self._entrance = draw_entrance(numbers, target, rng)
        if self._entrance is None:
            return obs, info
        if self.entrance_as == "prefill":  # the response starts with the entrance as its first search line
            return obs, {**info, "entrance": self._entrance.text,
                         "response_prefix": self._entrance.trace_line(numbers, target) + "\n"}
        messages = self.messages_for(task)
        return render_messages(messages), {**info, "messages": messages, "entrance": self._entrance.text}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        entrance = self._entrance
        obs, reward, terminated, truncated, info = super().step(action)
        if entrance is not None:
            info["entrance"] = entrance.text
        return obs, reward, terminated, truncated, info


def make_env(*, split: str = "procedural", data_dir: str | None = None, min_numbers: int = 3, max_numbers: int = 4,
             min_number: int = 1, max_number: int = 100, min_target: int = 1, max_target: int = 100,
             seed_base: int = 0, size: int = DEFAULT_SIZE, prompt_template: str | None = DEFAULT_TEMPLATE,
             entrance_hint: bool | str = False, entrance_seed: int = 0,
             entrance_template: str = DEFAULT_ENTRANCE_TEMPLATE, entrance_as: str = "prompt",
             entrances: Mapping[str, Any] | None = None, **env_kwargs: Any) -> TextEnv:
    source: TaskSource
    if split == "procedural":
        source = CountdownSource(min_numbers=min_numbers, max_numbers=max_numbers, min_number=min_number,
                                 max_number=max_number, min_target=min_target, max_target=max_target,
                                 seed_base=seed_base, size=size)
    elif split == "cd3_test":
        source = _cd3_source(data_dir)
    else:
        raise ValueError(f"unknown countdown split {split!r}; choose one of {SPLITS}")
    return CountdownEnv(source, score, prompt_template=prompt_template, verifier_name="countdown (ast whitelist)",
                        gold_formatter=gold_response, entrance_hint=entrance_hint, entrance_seed=entrance_seed,
                        entrance_template=entrance_template, entrance_as=entrance_as, entrances=entrances,
                        **env_kwargs)
