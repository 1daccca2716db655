"""Metrics over per-sample records: pass@k (unbiased), mean@k, maj@k, grouped accuracy, lengths, token and FLOP counts.

maj@k votes on verified-equivalent answers (``1/2``, ``0.5`` and ``\\frac{1}{2}`` are one answer on a math env): the
env's ``same_answer`` groups parsed answers into classes. Everything here is a pure function of the records (and that
rule), so a leaderboard can recompute a submission's metrics from its re-verified records and compare them with the
claimed ones. Timing is measurement, not a metric: it lives elsewhere.

Countdown records (``rlvr_envs.harness.coverage.is_countdown``) also get solution coverage and entrance statistics
(``coverage@n``, ``entrances@n``, ``entrance_entropy@n``, ``entrance_entropy_all@n``, ``entrance_sources``; see
``rlvr_envs.harness.coverage``). Results files written before those keys existed lack them; ``metrics_match`` accepts
that (a key the claim leaves out is not a false claim), but a claimed value must match.

``unverifiable_rate`` is the share of samples whose verdict the verifier could not decide (a record's ``status``,
see ``rlvr_envs.core.Verdict``); they count as not correct in every accuracy above, and this rate says how much of
the shortfall is the verifier's rather than the model's. Records from before statuses existed have none: their
status follows ``correct`` (``record_status``), and a claim without the key is accepted like a coverage key.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from rlvr_envs.core import UNVERIFIABLE, verdict_status
from rlvr_envs.harness.coverage import coverage_metrics, is_countdown, is_coverage_key

# Whether two parsed answers are one answer (the env's verifier decides; see answer_classes).
AnswerEquivalence = Callable[[str, str], bool]
# Task metadata keys that get an accuracy breakdown when tasks carry them.
GROUP_KEYS = ("subject", "level", "difficulty", "category")
# Metrics added after results files were first published: a claim may lack them (it predates them), never misstate them.
LATER_KEYS = frozenset({"unverifiable_rate"})


def record_status(record: Mapping[str, Any]) -> str:
    """A record's verdict status: its ``status`` field, or (files from before statuses) derived from ``correct``."""
    return verdict_status(bool(record["correct"]), record.get("status"))


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples with ``c`` correct (Chen et al. 2021): ``1 - C(n-c, k) / C(n, k)``.

    Computed as ``1 - prod_{i=n-c+1}^{n} (1 - k/i)``, which never forms the huge binomials.
    """
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def default_ks(n: int) -> list[int]:
    """Powers of two up to ``n``, plus ``n`` itself."""
    ks, k = [], 1
    while k <= n:
        ks.append(k)
        k *= 2
    if ks[-1] != n:
        ks.append(n)
    return ks


def answer_classes(parsed: Sequence[str | None], same_answer: AnswerEquivalence | None = None) -> list[int | None]:
    """The answer class of each sample (None: nothing parsed), classes numbered in the order first seen.

    Answers equal once whitespace is stripped are one class without asking ``same_answer``; any other answer joins
    the first earlier class whose first-seen answer ``same_answer(that, answer)`` accepts, else opens a new class.
    Without ``same_answer`` only equal strings share a class. Deterministic for a deterministic ``same_answer``;
    it is called once per (class, new distinct answer) pair, so rarely more than a few times per task."""
    keys = [p.strip() if isinstance(p, str) and p.strip() else None for p in parsed]
    representatives: list[str] = []
    class_of: dict[str, int] = {}
    classes: list[int | None] = []
    for key in keys:
        if key is not None and key not in class_of:
            found = None
            if same_answer is not None:
                found = next((c for c, rep in enumerate(representatives) if same_answer(rep, key)), None)
            if found is None:
                found = len(representatives)
                representatives.append(key)
            class_of[key] = found
        classes.append(None if key is None else class_of[key])
    return classes


def majority_answer(parsed: Sequence[str | None], same_answer: AnswerEquivalence | None = None) -> int | None:
    """Index of the first sample of the most common answer class (see ``answer_classes``; ties: the class seen first);
    None if no sample parsed an answer."""
    classes = answer_classes(parsed, same_answer)
    counts = Counter(c for c in classes if c is not None)
    if not counts:
        return None
    best = max(counts.values())
    for i, c in enumerate(classes):
        if c is not None and counts[c] == best:
            return i
    return None  # unreachable


def answer_equivalence(env: Any) -> AnswerEquivalence | None:
    """The env's rule for "same answer" (``env.unwrapped.same_answer``), or None (votes then compare strings)."""
    rule = getattr(getattr(env, "unwrapped", env), "same_answer", None)
    return rule if callable(rule) else None


def whitespace_length(text: str) -> int:
    return len(text.split())


def _group_by_task(records: Iterable[Mapping[str, Any]]) -> dict[int, list[Mapping[str, Any]]]:
    groups: dict[int, list[Mapping[str, Any]]] = defaultdict(list)
    for r in records:
        groups[int(r["task_index"])].append(r)
    for g in groups.values():
        g.sort(key=lambda r: int(r["sample_index"]))
    return dict(sorted(groups.items()))


def compute_metrics(records: Sequence[Mapping[str, Any]], n_samples: int, *, n_params: Any = None,
                    same_answer: AnswerEquivalence | None = None) -> dict[str, Any]:
    """Every metric of a finished run. ``records`` must hold ``n_samples`` samples of each task.

    maj@n votes over answer classes (``answer_classes`` with ``same_answer``, the env's rule from
    ``answer_equivalence``), and is correct when the first sample of the winning class is."""
    if not records:
        raise ValueError("no records to compute metrics from")
    by_task = _group_by_task(records)
    for ti, group in by_task.items():
        if len(group) != n_samples:
            raise ValueError(f"task index {ti} has {len(group)} samples, expected {n_samples}")
    n = n_samples
    correct = [[bool(r["correct"]) for r in g] for g in by_task.values()]
    metrics: dict[str, Any] = {"n_tasks": len(by_task), "n_samples": n, "n_records": len(records)}
    counts = [sum(c) for c in correct]
    for k in default_ks(n):
        metrics[f"pass@{k}"] = float(np.mean([pass_at_k(n, c, k) for c in counts]))
    metrics[f"mean@{n}"] = float(np.mean([c / n for c in counts]))
    maj = []
    for g in by_task.values():
        i = majority_answer([r.get("parsed_answer") for r in g], same_answer)
        maj.append(False if i is None else bool(g[i]["correct"]))
    metrics[f"maj@{n}"] = float(np.mean(maj))
    metrics["accuracy"] = metrics[f"mean@{n}"]

    for key in GROUP_KEYS:
        groups: dict[str, list[bool]] = defaultdict(list)
        for r in records:
            value = (r.get("metadata") or {}).get(key)
            if value is not None:
                groups[str(value)].append(bool(r["correct"]))
        if groups:
            metrics[f"accuracy_by_{key}"] = {
                v: {"accuracy": float(np.mean(cs)), "n": len(cs)} for v, cs in sorted(groups.items())
            }

    # Lengths: the agent's token counts when every record has one; otherwise whitespace words, labeled as such.
    tokens = [r.get("tokens") for r in records]
    have_tokens = all(isinstance(t, int) for t in tokens)
    lengths = tokens if have_tokens else [whitespace_length(str(r["response"])) for r in records]
    metrics["length_unit"] = "tokens" if have_tokens else "whitespace_words"
    metrics["length_mean"] = float(np.mean(lengths))
    metrics["length_median"] = float(statistics.median(lengths))
    metrics["format_error_rate"] = float(np.mean([not r.get("format_ok", False) for r in records]))
    metrics["unverifiable_rate"] = float(np.mean([record_status(r) == UNVERIFIABLE for r in records]))
    metrics["tokens_generated"] = int(sum(tokens)) if have_tokens else None
    # Forward-pass FLOPs of the generated tokens only (2 * params per token; prompt processing excluded).
    params_ok = isinstance(n_params, (int, float)) and not isinstance(n_params, bool) and n_params > 0
    metrics["flops_estimate"] = float(2 * n_params * metrics["tokens_generated"]) if params_ok and have_tokens else None
    if is_countdown(records):
        metrics.update(coverage_metrics(list(by_task.values()), n))
    return metrics


def metrics_match(claimed: Mapping[str, Any], recomputed: Mapping[str, Any], *, rel_tol: float = 1e-9) -> list[str]:
    """Human-readable differences between two metric dicts (empty when they agree). A coverage key (``coverage.
    is_coverage_key``) or a ``LATER_KEYS`` key that the claim lacks is not a difference: files from before those
    metrics do not have them."""
    diffs = []
    for key in sorted(set(claimed) | set(recomputed)):
        if key not in claimed and (is_coverage_key(key) or key in LATER_KEYS):
            continue
        a, b = claimed.get(key), recomputed.get(key)
        if not _close(a, b, rel_tol):
            diffs.append(f"{key}: claimed {a!r}, re-verified {b!r}")
    return diffs


def _close(a: Any, b: Any, rel_tol: float) -> bool:
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return set(a) == set(b) and all(_close(a[k], b[k], rel_tol) for k in a)
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return abs(a - b) <= rel_tol * max(1.0, abs(a), abs(b))
    return a == b
