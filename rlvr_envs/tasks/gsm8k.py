"""``rlvr/GSM8K-v0``: grade-school word problems (``split="test"``: 1319, default; ``"train"``: 7473).

The gold answer is the number after the solution's final ``####`` with thousands separators removed (``1,600`` ->
``1600``); the worked solution (with its ``<<a*b=c>>`` calculator notes) stays in ``metadata["solution"]``.
Responses are graded by the math verifier, which reads the last ``\\boxed{}`` (the prompt asks for it) or else
``#### N`` / "The answer is N".
"""

from __future__ import annotations

import functools
import re
from typing import Any

from rlvr_envs.core import ListSource, Task, TextEnv
from rlvr_envs.data import HFSource, data_root, load_rows
from rlvr_envs.tasks.math import DEFAULT_TEMPLATE, make_scorer
from rlvr_envs.verifiers.math import same_answer

SPLITS = ("test", "train")


def gold_answer(solution: str) -> str:
    """The number after the last ``####``, commas stripped (ValueError if there is none)."""
    head, sep, tail = solution.rpartition("####")
    if not sep:
        raise ValueError(f"no '####' in GSM8K solution {solution[-80:]!r}")
    answer = tail.strip().replace(",", "").rstrip(".")
    if not re.fullmatch(r"[+-]?\d+(?:\.\d+)?", answer):
        raise ValueError(f"GSM8K answer after '####' is not a number: {tail.strip()[:80]!r}")
    return answer


@functools.lru_cache(maxsize=8)
def _load(split: str, root: str | None) -> tuple[Task, ...]:
    rows, _, origin = load_rows(f"gsm8k/{split}.jsonl", data_dir=root, hf=HFSource("openai/gsm8k", split, name="main"))
    tasks = []
    for i, row in enumerate(rows):
        try:
            tasks.append(Task(id=f"gsm8k-{split}-{i}", question=row["question"], answer=gold_answer(row["answer"]),
                              metadata={"solution": row["answer"]}))
        except (KeyError, ValueError) as exc:
            raise ValueError(f"{origin}: row {i}: {exc}") from None
    return tuple(tasks)


def load_tasks(split: str = "test", *, data_dir: str | None = None) -> list[Task]:
    if split not in SPLITS:
        raise ValueError(f"unknown GSM8K split {split!r}; choose one of {SPLITS}")
    root = data_root(data_dir)
    return list(_load(split, str(root) if root is not None else None))


def gold_response(task: Task) -> str:
    """The reference solution without its calculator notes, ending in the boxed answer."""
    steps = re.sub(r"<<[^>]*>>", "", task.metadata.get("solution", "")).rpartition("####")[0].strip()
    return f"{steps}\nThe answer is \\boxed{{{task.answer}}}.".lstrip()


def make_env(*, split: str = "test", data_dir: str | None = None, verify_timeout: float = 5.0,
             prompt_template: str | None = DEFAULT_TEMPLATE, **env_kwargs: Any) -> TextEnv:
    name = "gsm8k" if split == "test" else f"gsm8k/{split}"
    return TextEnv(ListSource(load_tasks(split, data_dir=data_dir), name=name), make_scorer(verify_timeout),
                   prompt_template=prompt_template, verifier_name="math-verify", gold_formatter=gold_response,
                   answer_equivalence=functools.partial(same_answer, timeout=verify_timeout), **env_kwargs)
