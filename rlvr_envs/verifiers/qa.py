"""Short-answer QA scoring: exact match and token F1 with SQuAD normalization.

The gold answer(s) and the model's final answer are the only inputs: nothing from the prompt (example answers in a
template, retrieved passages) can leak into the reward. ``verify`` reads the answer from the *last* ``<answer>...</answer>``
of the text it is given; multi-turn envs pass only the model's final turn.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence

from rlvr_envs.core import Verdict
from rlvr_envs.extract import answer_tag

METRICS = ("em", "f1")
MAX_ANSWER_CHARS = 2000  # a gold answer is a few words; longer "answers" are spam and get no credit beyond this

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD v1.1 normalization: lower case, drop punctuation and the articles a/an/the, collapse whitespace."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1_score(prediction: str, gold: str) -> float:
    """SQuAD token F1. Two answers that normalize to nothing match (1.0); one empty side scores 0."""
    pred = normalize_answer(prediction).split()
    ref = normalize_answer(gold).split()
    if not pred or not ref:
        return float(pred == ref)
    common = Counter(pred) & Counter(ref)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(ref)
    return 2 * precision * recall / (precision + recall)


def best_score(prediction: str, golds: str | Sequence[str], metric: str = "em") -> float:
    """The best score of ``prediction`` over the gold aliases."""
    if metric not in METRICS:
        raise ValueError(f"unknown QA metric {metric!r}; known: {METRICS}")
    if isinstance(golds, str):
        golds = [golds]
    if not golds:
        raise ValueError("no gold answer to score against")
    fn = exact_match if metric == "em" else f1_score
    return max(fn(prediction, g) for g in golds)


def verify(gold: str | Sequence[str], response: str, *, metric: str = "em") -> Verdict:
    """Score the last ``<answer>`` of ``response``. ``correct`` means exact match, whatever the reward metric.

    Unverifiable (reward 0) when no gold alias is usable: none given, or every one normalizes to nothing (a gold of
    only articles and punctuation would be matched by an empty answer alone)."""
    if metric not in METRICS:
        raise ValueError(f"unknown QA metric {metric!r}; known: {METRICS}")
    parsed = answer_tag(response)
    if parsed is None:
        return Verdict.failed("no <answer>...</answer> in the response")
    parsed = parsed[:MAX_ANSWER_CHARS]
    golds = [gold] if isinstance(gold, str) else list(gold)
    if not any(isinstance(g, str) and normalize_answer(g) for g in golds):
        return Verdict.could_not_verify(f"no usable gold answer to score against ({golds[:3]!r})", parsed=parsed,
                                        format_ok=True)
    reward = best_score(parsed, gold, metric)
    correct = best_score(parsed, gold, "em") == 1.0
    return Verdict(correct=correct, reward=reward, parsed=parsed, format_ok=True)
