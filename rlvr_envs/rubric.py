"""Rubrics: a reward made of named, weighted terms, each term's value reported in ``info["rubric"]``.

``reward = sum(weight * value)`` over the terms, in the order given. Every env takes one: ``gym.make(id,
rubric={"correctness": 1.0, "format": 0.1})``; a term's value is a weight alone or a mapping with ``weight`` and the
term's parameters (``{"length": {"weight": 0.2, "budget": 1500}}``). ``Rubric([Term(name, fn, weight), ...])`` takes
custom terms; ``register_term(name, factory)`` adds a named one.

Built-in terms (``TERMS``), each a function of the episode's ``Verdict``, the model's text and the step's ``info``:

- ``correctness``: the verifier's reward (1/0 for exact-match verifiers, token F1 for ``reward="f1"``, the
  precision-scaled reward of ``rlvr/ToolUse-v0``); always 0 for an unverifiable verdict.
- ``format``: 1 when the answer came in the requested format (``verdict.format_ok``), else 0.
- ``length``: ``-min(1, max(0, chars - budget) / budget)``, a penalty for model text beyond ``budget`` characters
  (default 2048; all of the model's turns in a multi-turn episode). Characters, since envs have no tokenizer.
- ``tool_precision``: ``min(1, plan_length / calls_made)`` of a *correct* episode, else 0 (ungated, an episode
  that makes no call at all would score 1); read from ``info["precision"]`` or ``info``'s call counts, 0 where the
  env reports neither.
- ``tool_recall``: ``min(1, plan_calls_hit / plan_length)``, the share of the gold plan's calls the episode made
  successfully, ungated by correctness and with extra calls free: a recall-style reward that pays for any correct
  call (the baseline the tool-orchestration paper's precision reward is set against); 0 where the env reports no hits.

Without ``rubric=``, an env's rubric is ``{"correctness": 1.0}`` plus ``{"format": format_reward}`` when the
``format_reward`` shortcut is non-zero, which gives exactly the rewards envs gave before rubrics existed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # core imports this module; the Verdict type is only needed for annotations
    from rlvr_envs.core import Verdict


@dataclass(frozen=True)
class RubricInput:
    """What a term sees: the episode's verdict, the model's text, and the info the env reports (without the rubric)."""

    verdict: Verdict
    response: str
    info: Mapping[str, Any]


TermFn = Callable[[RubricInput], float]


@dataclass(frozen=True)
class Term:
    name: str
    fn: TermFn
    weight: float = 1.0


class Rubric:
    """Named, weighted terms; ``score`` gives ``(reward, {name: value})``."""

    def __init__(self, terms: Sequence[Term]):
        names = [t.name for t in terms]
        if len(set(names)) != len(names):
            raise ValueError(f"rubric term names must be unique, got {names}")
        self.terms = tuple(Term(t.name, t.fn, float(t.weight)) for t in terms)

    @property
    def weights(self) -> dict[str, float]:
        return {t.name: t.weight for t in self.terms}

    def score(self, verdict: Verdict, response: str, info: Mapping[str, Any]) -> tuple[float, dict[str, float]]:
        """The reward and each term's (unweighted) value."""
        given = RubricInput(verdict, response, info)
        values = {t.name: float(t.fn(given)) for t in self.terms}
        reward = 0.0
        for t in self.terms:  # summed in order: the default rubric reproduces verdict.reward + format_reward exactly
            reward += t.weight * values[t.name]
        return reward, values

    def __repr__(self) -> str:
        return f"Rubric({self.weights})"


# -- built-in terms -----------------------------------------------------------------------------------------------


def correctness() -> TermFn:
    return lambda x: 0.0 if x.verdict.unverifiable else float(x.verdict.reward)


def format_term() -> TermFn:
    return lambda x: 1.0 if x.verdict.format_ok else 0.0


def length(budget: int = 2048) -> TermFn:
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise ValueError(f"length budget must be a positive number of characters, got {budget!r}")
    return lambda x: 0.0 - min(1.0, max(0, len(x.response) - budget) / budget)  # 0.0, not -0.0, within budget


def plan_precision(info: Mapping[str, Any]) -> float:
    """``min(1, plan_length / calls_made)`` from an episode's info (``info["precision"]`` when the env reports it)."""
    if info.get("precision") is not None:
        return float(info["precision"])
    calls, plan = info.get("calls_made"), info.get("plan_length")
    if not calls or plan is None:
        return 0.0
    return min(1.0, float(plan) / float(calls))


def tool_precision() -> TermFn:
    return lambda x: plan_precision(x.info) if x.verdict.correct else 0.0


def plan_recall(info: Mapping[str, Any]) -> float:
    """``min(1, plan_calls_hit / plan_length)`` from an episode's info, 0 where it reports no hits."""
    hits, plan = info.get("plan_calls_hit"), info.get("plan_length")
    if not hits or not plan:
        return 0.0
    return min(1.0, float(hits) / float(plan))


def tool_recall() -> TermFn:
    return lambda x: plan_recall(x.info)


TERMS: dict[str, Callable[..., TermFn]] = {
    "correctness": correctness,
    "format": format_term,
    "length": length,
    "tool_precision": tool_precision,
    "tool_recall": tool_recall,
}


def register_term(name: str, factory: Callable[..., TermFn]) -> None:
    """Make ``name`` usable in rubric mappings; ``factory(**params)`` returns the term function."""
    if name in TERMS:
        raise ValueError(f"rubric term {name!r} is already registered")
    TERMS[name] = factory


def build_rubric(spec: Rubric | Mapping[str, Any] | None = None, *, format_reward: float = 0.0) -> Rubric:
    """A ``Rubric`` from a rubric, a ``{name: weight | {"weight": w, **params}}`` mapping, or None (the default
    rubric, with ``format_reward`` as the format term's weight). ``format_reward`` is a shortcut for the default
    rubric only: giving it with a rubric is an error, so no setting is silently ignored."""
    if spec is not None and float(format_reward) != 0.0:
        raise ValueError("pass format_reward or rubric=, not both (add a 'format' term to the rubric instead)")
    if spec is None:
        terms = [Term("correctness", correctness(), 1.0)]
        if float(format_reward) != 0.0:
            terms.append(Term("format", format_term(), float(format_reward)))
        return Rubric(terms)
    if isinstance(spec, Rubric):
        return spec
    if not isinstance(spec, Mapping) or not spec:
        raise ValueError(f"rubric must be a non-empty mapping of term names to weights, got {spec!r}")
    terms = []
    for name, value in spec.items():
        if name not in TERMS:
            raise ValueError(f"unknown rubric term {name!r}; known: {sorted(TERMS)}")
        params = dict(value) if isinstance(value, Mapping) else {"weight": value}
        weight = params.pop("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)):
            raise ValueError(f"rubric term {name!r}: weight must be a number, got {weight!r}")
        terms.append(Term(name, TERMS[name](**params), float(weight)))
    return Rubric(terms)
