"""Competition math: MATH, MATH-500, AIME 2024/2025, AMC 2023, OlympiadBench; graded by ``rlvr_envs.verifiers.math``.

``make_env(dataset=..., split=..., subject=..., level=...)``:

- ``math``: Hendrycks MATH, ``split="test"`` (5000, default) or ``"train"`` (7500 rows; the 2 whose solution boxes
  nothing are dropped: 7498). ``subject=`` (``"Number Theory"``, ``"number_theory"``, or a list) and ``level=``
  (1-5 or a list) filter it, and MATH-500 too. Two train rows have level ``"Level ?"``: kept, level ``None``.
- ``math500``: the 500-problem PRM800K test subset; ids are its ``unique_id`` (``test/algebra/1547.json``).
- ``aime24``/``aime25`` (30 each; leading zeros of AIME answers such as ``025`` are dropped: the answer is the
  integer), ``amc23`` (40; answers stored as floats like ``27.0`` are written as integers).
- ``olympiadbench``: the English, text-only, open-ended math competition set (``OE_TO_maths_en_COMP``, 675 rows), cut
  to single-answer problems: ``is_multiple_answer`` false (drops 94), one final answer that is one ``$...$`` formula
  (drops the one ``$f(n)=n$, $g(n)=1$`` pair), and no numeric tolerance (the verifier grades exact equivalence; drops
  the one row with ``error="1e-1"``). **579 of 675 remain.** Units (7 rows, e.g. ``km/h``) stay in metadata only.

Data come from ``data_dir`` / ``RLVR_DATA_DIR`` (files named in ``FILES``) or else the Hugging Face hub.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from rlvr_envs.core import ListSource, Task, TextEnv, Verdict
from rlvr_envs.data import HFSource, data_root, load_rows
from rlvr_envs.extract import last_boxed
from rlvr_envs.verifiers.math import same_answer, verify

DEFAULT_TEMPLATE = "{question}\n\nPlease reason step by step, and put your final answer within \\boxed{{}}."

FILES: dict[tuple[str, str], str] = {
    ("math", "test"): "math/test.jsonl",
    ("math", "train"): "math/train.jsonl",
    ("math500", "test"): "math/math500.jsonl",
    ("aime24", "test"): "competition/aime24.jsonl",
    ("aime25", "test"): "competition/aime25.jsonl",
    ("amc23", "test"): "competition/amc23.jsonl",
    ("olympiadbench", "test"): "competition/olympiadbench.jsonl",
}
HUB: dict[tuple[str, str], HFSource] = {
    ("math", "test"): HFSource("DigitalLearningGmbH/MATH-lighteval", "test"),
    ("math", "train"): HFSource("DigitalLearningGmbH/MATH-lighteval", "train"),
    ("math500", "test"): HFSource("HuggingFaceH4/MATH-500", "test"),
    ("aime24", "test"): HFSource("HuggingFaceH4/aime_2024", "train"),
    ("aime25", "test"): HFSource("math-ai/aime25", "test"),
    ("amc23", "test"): HFSource("math-ai/amc23", "test"),
    ("olympiadbench", "test"): HFSource("Hothan/OlympiadBench", "train", name="OE_TO_maths_en_COMP"),
}
DATASETS = tuple(dict.fromkeys(d for d, _ in FILES))
SUBJECTS = ("algebra", "counting_and_probability", "geometry", "intermediate_algebra", "number_theory", "prealgebra",
            "precalculus")


def subject_key(subject: str) -> str:
    """``"Counting & Probability"`` / ``"counting_and_probability"`` -> ``"counting_and_probability"``."""
    return re.sub(r"[^a-z]+", "_", subject.lower().replace("&", "and")).strip("_")


def _level(value: Any) -> int | None:
    m = re.search(r"\d+", str(value))
    return int(m.group(0)) if m else None


def _first(row: Mapping[str, Any], *keys: str) -> Any:
    for k in keys:
        if row.get(k) not in (None, ""):
            return row[k]
    return None


def integer_text(value: Any) -> str:
    """``"025"`` -> ``"25"``, ``27.0`` -> ``"27"``; other values as their text."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    text = str(value).strip()
    if re.fullmatch(r"[+-]?\d+", text):
        return str(int(text))
    if re.fullmatch(r"[+-]?\d+\.0*", text):
        return str(int(float(text)))
    return text


# -- row -> Task, one per dataset (each reads the local file's schema and the hub's) --------------------------------


def _math_row(row: Mapping[str, Any], pos: int, dataset: str, split: str) -> Task | None:
    question = _first(row, "problem", "question")
    solution = row.get("solution") or ""
    answer = _first(row, "answer") or last_boxed(solution)
    if not question or not answer:
        return None
    subject = _first(row, "subject", "type") or ""
    if dataset == "math500":
        task_id = str(_first(row, "unique_id") or f"math500-{pos}")
    else:
        task_id = f"math-{split}-{row.get('idx', pos)}"
    return Task(id=task_id, question=question, answer=str(answer),
                metadata={"subject": subject, "subject_key": subject_key(subject), "level": _level(row.get("level")),
                          "solution": solution})


def _competition_row(row: Mapping[str, Any], pos: int, dataset: str, split: str) -> Task | None:
    question = _first(row, "problem", "question", "Problem")
    answer = _first(row, "answer", "Answer")
    if not question or answer is None:
        return None
    rid = _first(row, "id", "ID")
    return Task(id=f"{dataset}-{rid if rid is not None else pos}", question=question, answer=integer_text(answer),
                metadata={"original_answer": str(answer), "url": row.get("url")})


def olympiad_answer(row: Mapping[str, Any]) -> str | None:
    """The one final answer without its ``$...$``, or None if the row is not a single exact answer."""
    finals = row.get("final_answer") or []
    if row.get("is_multiple_answer") or len(finals) != 1 or row.get("error"):
        return None
    text = str(finals[0]).strip().rstrip(".").strip()
    if text.startswith("$") and text.endswith("$") and len(text) >= 2:
        text = text[1:-1].strip()
    return text if text and "$" not in text else None


def _olympiad_row(row: Mapping[str, Any], pos: int, dataset: str, split: str) -> Task | None:
    answer = olympiad_answer(row)
    if answer is None or any(k.startswith("image_") and row[k] for k in row):  # the hub copy carries image columns
        return None
    question = row["question"] if not row.get("context") else f"{row['context']}\n\n{row['question']}"
    return Task(id=f"olympiadbench-{row.get('id', pos)}", question=question, answer=answer,
                metadata={"subfield": row.get("subfield"), "answer_type": row.get("answer_type"),
                          "unit": row.get("unit"), "solution": (row.get("solution") or [""])[0]})


_ROW: dict[str, Callable[[Mapping[str, Any], int, str, str], Task | None]] = {
    "math": _math_row, "math500": _math_row, "aime24": _competition_row, "aime25": _competition_row,
    "amc23": _competition_row, "olympiadbench": _olympiad_row,
}


@functools.lru_cache(maxsize=32)
def _load(dataset: str, split: str, root: str | None) -> tuple[tuple[Task, ...], str, int]:
    """``(tasks, content hash, rows dropped)``; cached per data directory so vector envs parse each file once."""
    rows, digest, origin = load_rows(FILES[dataset, split], data_dir=root, hf=HUB.get((dataset, split)))
    convert = _ROW[dataset]
    tasks = [t for pos, row in enumerate(rows) if (t := convert(row, pos, dataset, split)) is not None]
    return tuple(tasks), digest, len(rows) - len(tasks)


def _as_set(values: Any, convert: Callable[[Any], Any]) -> set | None:
    if values is None:
        return None
    items = [values] if isinstance(values, (str, int)) else list(values)
    return {convert(v) for v in items}


def load_tasks(dataset: str = "math", split: str = "test", *, subject: str | Iterable[str] | None = None,
               level: int | Iterable[int] | None = None, data_dir: str | None = None) -> list[Task]:
    """The tasks of one dataset/split after the subject/level filters (ValueError for unknown names)."""
    if dataset not in DATASETS:
        raise ValueError(f"unknown math dataset {dataset!r}; choose one of {DATASETS}")
    splits = [s for d, s in FILES if d == dataset]
    if split not in splits:
        raise ValueError(f"dataset {dataset!r} has splits {splits}, not {split!r}")
    subjects = _as_set(subject, lambda s: subject_key(str(s)))
    levels = _as_set(level, _level)
    if (subjects or levels) and dataset not in ("math", "math500"):
        raise ValueError("subject=/level= filters apply to dataset='math' and 'math500' only")
    if subjects and not subjects <= set(SUBJECTS):
        raise ValueError(f"unknown subject(s) {sorted(subjects - set(SUBJECTS))}; known: {SUBJECTS}")
    if levels and not levels <= {1, 2, 3, 4, 5}:
        raise ValueError(f"level must be 1..5 (or a list of them), got {level!r}")
    root = data_root(data_dir)
    tasks, _, _ = _load(dataset, split, str(root) if root is not None else None)
    return [t for t in tasks if (subjects is None or t.metadata["subject_key"] in subjects)
            and (levels is None or t.metadata["level"] in levels)]


def make_env(*, dataset: str = "math", split: str = "test", subject: str | Iterable[str] | None = None,
             level: int | Iterable[int] | None = None, data_dir: str | None = None, verify_timeout: float = 5.0,
             prompt_template: str | None = DEFAULT_TEMPLATE, **env_kwargs: Any) -> TextEnv:
    tasks = load_tasks(dataset, split, subject=subject, level=level, data_dir=data_dir)
    name = dataset if split == "test" else f"{dataset}/{split}"
    if subject is not None or level is not None:
        name += f"[subject={subject!r},level={level!r}]"
    return TextEnv(ListSource(tasks, name=name), make_scorer(verify_timeout), prompt_template=prompt_template,
                   verifier_name="math-verify", answer_equivalence=functools.partial(same_answer, timeout=verify_timeout),
                   **env_kwargs)


def make_scorer(timeout: float = 5.0) -> Callable[[Task, str], Verdict]:
    """A scorer grading responses against ``task.answer`` with the math verifier (hard ``timeout`` seconds)."""

    def score(task: Task, response: str) -> Verdict:
        return verify(task.answer, response, timeout=timeout)

    return score
