"""Re-check a results file with an independent second verifier and list where the two verdicts differ.

``audit(results) -> AuditReport``: every record's first verdict (its ``status``, or what ``correct`` implies) is set
against a second verifier's, chosen by the env's verifier (``provenance.env.verifier``):

- ``math-verify`` (MATH, MATH-500, AIME, AMC, OlympiadBench, GSM8K) and ``exact integer`` (Arithmetic): the SymPy
  equivalence of ``rlvr_envs.verifiers.sympy_equiv`` (no Math-Verify, no latex2sympy) on the response's final answer
  (last ``\\boxed{}``, ``<answer>``, ``####`` or "the answer is", no answer-spam policy; else the record's
  ``parsed_answer``, e.g. Arithmetic's last-integer fallback), in the killable worker processes.
- ``countdown``: the ``<answer>`` (else last ``\\boxed{}``) expression read without ``ast``: a character whitelist,
  no unary signs, the number literals must be the task's numbers, and SymPy's exact value must equal the target.
- anything else (QA exact match / F1, BFCL call matching, the tool sandbox's final state, reasoning-gym's scorers):
  no second verifier; the report says so and lists nothing.

A response without any final answer is "wrong" for the second verifier too; an answer it cannot read is
"unverifiable". Disagreements are sorted so the rows that matter come first: first wrong but second correct
(candidate false negatives), then first correct but second wrong, then the rows where one side could not decide.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from rlvr_envs.core import CORRECT, UNVERIFIABLE, VERDICT_STATUSES, WRONG, Task, verdict_status
from rlvr_envs.extract import extract_answer, last_boxed
from rlvr_envs.harness.results import Results

MATH_VERIFIERS = ("math-verify", "exact integer")
NO_SECOND = {  # verifier name prefix -> why there is no second opinion
    "qa-": "QA exact match / token F1 is string normalization against the gold aliases; a second string match "
           "would repeat it, not check it",
    "BFCL": "BFCL grades function calls by AST matching against enumerated acceptable values; no independent check",
    "sandbox": "tool use is graded by the sandbox's final database state; replaying it is the same check",
    "reasoning-gym": "reasoning-gym's own score_answer is the reference for its generators",
}
_ORDER = {(WRONG, CORRECT): 0, (CORRECT, WRONG): 1, (UNVERIFIABLE, CORRECT): 2, (CORRECT, UNVERIFIABLE): 3,
          (UNVERIFIABLE, WRONG): 4, (WRONG, UNVERIFIABLE): 5}


@dataclass
class AuditRow:
    """One record's two verdicts. ``answer`` is what the second verifier read; ``reason`` why it decided so."""

    task_index: int
    sample_index: int
    task_id: str
    gold: str | None
    answer: str | None
    first: str
    second: str
    first_error: str | None = None
    reason: str | None = None

    @property
    def disagrees(self) -> bool:
        return self.first != self.second

    @property
    def decided_conflict(self) -> bool:
        """Both verifiers decided, and differently (correct vs wrong)."""
        return {self.first, self.second} == {CORRECT, WRONG}


@dataclass
class AuditReport:
    env_id: str
    second_verifier: str | None
    rows: list[AuditRow] = field(default_factory=list)
    note: str | None = None  # why there is no second verifier

    @property
    def pairs(self) -> Counter:
        """Counts by (first verdict, second verdict)."""
        return Counter((r.first, r.second) for r in self.rows)

    @property
    def disagreements(self) -> list[AuditRow]:
        rows = [r for r in self.rows if r.disagrees]
        return sorted(rows, key=lambda r: (_ORDER.get((r.first, r.second), 9), r.task_index, r.sample_index))

    def summary(self) -> str:
        if self.second_verifier is None:
            return f"audit {self.env_id}: no second verifier ({self.note}); {len(self.rows)} records not re-checked"
        n = len(self.rows)
        differ = self.disagreements
        decided = sum(r.decided_conflict for r in differ)
        pairs = ", ".join(f"{a}/{b}={c}" for (a, b), c in sorted(self.pairs.items(), key=lambda kv: -kv[1]))
        return (f"audit {self.env_id} ({self.second_verifier}): {n} records; disagreement rate "
                f"{_pct(len(differ), n)} ({len(differ)}/{n}): {decided} correct-vs-wrong, {len(differ) - decided} "
                f"with one side unverifiable; pairs first/second: {pairs}")

    def to_json(self) -> dict[str, Any]:
        return {"env_id": self.env_id, "second_verifier": self.second_verifier, "note": self.note,
                "records": len(self.rows), "disagreements": len(self.disagreements),
                "correct_vs_wrong": sum(r.decided_conflict for r in self.rows),
                "pairs": {f"{a}/{b}": c for (a, b), c in sorted(self.pairs.items())},
                "rows": [asdict(r) for r in self.disagreements]}


def _pct(k: int, n: int) -> str:
    return f"{100.0 * k / n:.1f}%" if n else "n/a"


# -- second verifiers ----------------------------------------------------------------------------------------------

Check = Callable[[Mapping[str, Any], Task | None], tuple[str, str | None, str | None, str | None]]
"""``check(record, task) -> (status, gold, answer read, reason)``."""


def final_answer(response: str, parsed_answer: str | None) -> str | None:
    """The second verifier's reading of the final answer (see the module docstring)."""
    answer, _ = extract_answer(response[-100_000:])
    return answer if answer is not None else parsed_answer


def math_check(timeout: float) -> Check:
    from rlvr_envs.verifiers.sympy_equiv import verify_answer

    def check(record: Mapping[str, Any], task: Task | None) -> tuple[str, str | None, str | None, str | None]:
        gold = record.get("answer") if record.get("answer") is not None else task.answer if task else None
        if gold is None:
            return UNVERIFIABLE, None, None, "no gold answer in the record or the task"
        answer = final_answer(record["response"], record.get("parsed_answer"))
        if answer is None:
            return WRONG, gold, None, "no final answer"
        verdict = verify_answer(str(gold), answer, timeout=timeout)
        return verdict.status, str(gold), answer, verdict.error

    return check


_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_COUNTDOWN_SAFE = re.compile(r"[0-9+\-*/() ]{1,300}")
_UNARY = re.compile(r"(?:^|[(+\-*/])\s*[+-]")
_COUNTDOWN_SYMBOLS = (("\\left(", "("), ("\\right)", ")"), ("\\times", "*"), ("\\cdot", "*"), ("\\div", "/"),
                      ("×", "*"), ("·", "*"), ("÷", "/"), ("−", "-"), ("\\,", " "))


def countdown_judge(numbers: list[int], target: int, response: str) -> tuple[str, str | None, str | None]:
    """``(status, expression read, reason)`` for a Countdown response, without ``ast`` (see the module docstring)."""
    import sympy
    from sympy.parsing.sympy_parser import auto_number, parse_expr

    tags = _ANSWER_TAG.findall(response[-100_000:])
    expr = tags[-1] if tags else last_boxed(response[-100_000:])
    if expr is None:
        return WRONG, None, "no <answer> expression"
    text = expr.strip().strip("$").strip().rstrip(".")
    for old, new in _COUNTDOWN_SYMBOLS:
        text = text.replace(old, new)
    sides = [s.strip() for s in text.split("=")]
    if len(sides) == 2:  # "EXPR = target" or "target = EXPR"
        if sides[1].isdigit() and int(sides[1]) == target:
            text = sides[0]
        elif sides[0].isdigit() and int(sides[0]) == target:
            text = sides[1]
    if not _COUNTDOWN_SAFE.fullmatch(text):
        return WRONG, expr[:200], "characters other than digits, + - * / and parentheses"
    if "**" in text or "//" in text or _UNARY.search(text):
        return WRONG, text, "an operator other than binary + - * /"
    literals = sorted(int(d) for d in re.findall(r"\d+", text))
    if literals != sorted(numbers):
        return WRONG, text, f"uses {literals}, not each of {sorted(numbers)} once"
    try:  # only digits and + - * / ( ) reach eval, with no names in scope
        value = parse_expr(text, local_dict={}, global_dict={"__builtins__": {}, "Integer": sympy.Integer},
                           transformations=(auto_number,))
    except Exception as exc:  # unbalanced parentheses, "2 3": the model's expression is malformed, so wrong
        return WRONG, text, f"not an expression ({type(exc).__name__})"
    if value.has(sympy.zoo, sympy.nan):
        return WRONG, text, "division by zero"
    return (CORRECT, text, None) if value == target else (WRONG, text, f"equals {value}, not {target}")


def countdown_check(record: Mapping[str, Any], task: Task | None) -> tuple[str, str | None, str | None, str | None]:
    if task is None or "numbers" not in task.metadata:
        return UNVERIFIABLE, None, None, "the task's numbers are unknown"
    target = int(task.metadata.get("target", task.answer))
    status, expr, reason = countdown_judge([int(n) for n in task.metadata["numbers"]], target, record["response"])
    return status, str(target), expr, reason


def second_verifier(verifier_name: str, *, timeout: float = 10.0) -> tuple[str | None, Check | None, str | None]:
    """``(name, check, note)`` for a first verifier's name; ``check`` is None (with ``note`` saying why) when there
    is no second verifier for it."""
    if verifier_name in MATH_VERIFIERS:
        return "sympy-equivalence", math_check(timeout), None
    if verifier_name.startswith("countdown"):
        return "countdown-sympy", countdown_check, None
    for prefix, why in NO_SECOND.items():
        if verifier_name.startswith(prefix):
            return None, None, why
    return None, None, f"no second verifier for {verifier_name or 'an unnamed verifier'!r}"


# -- the audit -----------------------------------------------------------------------------------------------------


class _Tasks:
    """The run's tasks, from an env built like the run's (only when a check needs one)."""

    def __init__(self, env_id: str, env_kwargs: Mapping[str, Any]):
        self.env_id, self.env_kwargs = env_id, dict(env_kwargs)
        self._source: Any = None
        self.error: str | None = None

    def task(self, record: Mapping[str, Any]) -> Task | None:
        if self._source is None:
            import gymnasium as gym

            import rlvr_envs  # noqa: F401  (registers the IDs)

            try:
                env = gym.make(self.env_id, **self.env_kwargs)
            except Exception as exc:  # missing data or extra: checks that need the task say it is unknown
                self.error = f"could not build {self.env_id}: {type(exc).__name__}: {exc}"
                self._source = False
                return None
            self._source = env.unwrapped.source
            env.close()
        if self._source is False:
            return None
        try:
            return self._source.task(self._source.index_of(record["task_id"]))
        except (KeyError, IndexError):
            return None


def audit(results: Results, *, timeout: float = 10.0, workers: int | None = None,
          verifier_name: str | None = None) -> AuditReport:
    """Every record re-checked by the second verifier for the run's env (``verifier_name`` overrides the one the
    results file names)."""
    cfg = results.config
    name = verifier_name or results.provenance.get("env", {}).get("verifier") or ""
    label, check, note = second_verifier(name, timeout=timeout)
    report = AuditReport(cfg["env_id"], label, note=note)
    first = [verdict_status(r["correct"], r.get("status")) for r in results.records]
    if check is None:
        report.rows = [AuditRow(r["task_index"], r["sample_index"], r["task_id"], _text(r.get("answer")),
                                r.get("parsed_answer"), f, f, r.get("error")) for r, f in zip(results.records, first)]
        return report
    tasks = _Tasks(cfg["env_id"], cfg.get("env_kwargs") or {})
    needs_task = label != "sympy-equivalence" or any(r.get("answer") is None for r in results.records)
    task_of = [tasks.task(r) if needs_task else None for r in results.records]

    def one(i: int) -> AuditRow:
        record = results.records[i]
        status, gold, answer, reason = check(record, task_of[i])
        assert status in VERDICT_STATUSES
        return AuditRow(record["task_index"], record["sample_index"], record["task_id"], gold, answer, first[i],
                        status, record.get("error"), reason)

    if label == "sympy-equivalence":  # checks wait on worker processes: keep every worker busy
        from rlvr_envs.verifiers.math import pool

        with ThreadPoolExecutor(max_workers=workers or pool().size) as ex:
            report.rows = list(ex.map(one, range(len(results.records))))
    else:
        report.rows = [one(i) for i in range(len(results.records))]
    return report


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def format_rows(rows: list[AuditRow], width: int = 32) -> list[tuple[str, ...]]:
    """Table rows (one line each, long cells cut to ``width``)."""

    def cell(value: Any) -> str:
        text = "-" if value is None else " ".join(str(value).split())
        return text if len(text) <= width else text[: width - 1] + "…"

    return [(cell(r.task_id), str(r.sample_index), cell(r.gold), cell(r.answer), r.first, r.second,
             cell(r.first_error), cell(r.reason)) for r in rows]


TABLE_HEADER = ("task", "sample", "gold", "answer (2nd)", "first", "second", "first error", "second reason")
