"""RREDCoT, reward redistribution for chains of thought (seed 004). Stage: AdvantageEstimator.

The terminal reward of a chain of thought is redistributed over its segments with the model itself as the value
function, without generating anything: the value of a prefix is how likely the model finds a correct answer after it.
For a response y of row i, split into reasoning segments s_1..s_J with token bounds b_0 = 0 < b_1 < ... < b_J:

    V(b)    = log sum_{a in A*} pi(a | x, y_<b)   (teacher-forced, no gradient; A* the answers the verifier accepts)
    dV_j    = V(b_j) - V(b_{j-1})           (segment j's redistributed reward: how much it moved the model to A*)
    c_j     = norm(dV)_j, then tied to the outcome: max(c_j, 0) for a correct row, min(c_j, 0) for a wrong one
    A_it    = A_i + beta * c_j              for the tokens t of segment j
    A_it    = A_i                           for the answer tokens after the reasoning, and for rows without a gold answer
    A_it    = 0                             on padding

A_i is the group advantage (GRPO's z-score by default). The dV of one row telescope to V(end of reasoning) - V(start):
a row's segments share the change in the model's belief in a correct answer that its reasoning brought.

Two readings fixed after the micro-lane collapse (issue 45's review), both ours:
- *A correct answer, not the gold one.* Countdown has many valid expressions; scoring only the task's gold expression
  made a trace that found another solution lose value at its last line (the model then expects its own expression,
  not the gold one), so correct search was paid as if it led away from the answer. A* is now the gold continuation
  plus the group's own final expressions that the env's Countdown verifier (``rlvr_envs.verifiers.countdown``)
  accepts, most written first, at most ``max_answers`` (1: the gold answer alone, the earlier reading); the value
  is the model's probability of writing any of them (``logsumexp`` over A*). Tasks without a ``{solution}`` slot in
  the template (a single numeric answer) keep the gold continuation alone.
- *Credit tied to the outcome* (``outcome_gate``, default on). Centred z-scoring over an all-wrong group gives about
  half its segments positive credit: the policy was paid for reasoning that ended wrong (on SmolLM2 for an empty
  answer box, which raises the model's likelihood of the gold line). The value now decides *which* segments of a
  row carry its outcome, not its sign: a wrong row's segments get no positive credit, a correct row's no negative;
  an all-wrong group (A_i = 0) is pushed only away from its lowest-dV segments. ``outcome_gate = false`` gives the
  earlier, ungated credit.

Our reading (the abstract names the idea, not these details; each is a hyper-parameter):
- ``split``: segments are the response's lines (``"lines"``, one search step of a micro-lane Countdown trace),
  ``"tokens=K"`` chunks of K tokens, or ``"regex=PATTERN"`` cuts after every match. At most ``max_segments`` reasoning
  segments per row: beyond that, adjacent segments merge at evenly spaced cuts (the scoring pass costs
  (J + 1) x |A*| sequences per row).
- ``answer_marker``: the reasoning ends where the response's answer begins (``"<answer>"``, the micro lane's format);
  the answer tokens keep the plain group advantage (their credit is the outcome itself). ``""``: the whole response is
  reasoning. A response that opens with the answer has no reasoning segments: group advantage.
- ``template``: the gold continuation a*, formatted with ``info["answer"]`` and the task's metadata keys. ``"auto"``:
  ``"<answer>{solution}</answer>"`` for Countdown tasks (metadata numbers and solution: what a trace ends with,
  written right after a line break), else ``"\\nThe answer is {answer}"``; a row whose template cannot be filled (no
  gold answer) gets the group advantage. a* is tokenized on its own and scored after the prefix's own token ids.
- ``value``: ``"logprob"`` (sum over a*'s tokens, the default; over A*: log of the summed probabilities),
  ``"mean_logprob"`` (per token; over A*: the best answer's), ``"prob"`` (exp of the sum; over A*: the sum, at most 1).
  Scored at temperature 1 (the model's own distribution), with the current weights, through the trainer's log-prob
  service (one batched no-grad pass, counted in the run's FLOPs).
- ``normalize``: ``"group"`` z-scores dV over every segment of the group's rows (so beta is in units of the
  group's spread; a group whose segments all have one dV gets 0); ``"group_scale"`` divides by that std without
  centering (keeps dV's sign); ``"batch"`` z-scores over the whole batch; ``"none"`` uses dV as is.
- ``base``: ``"grpo"`` (z-score) or ``"dr_grpo"`` (mean-centred) group advantage.
"""

from __future__ import annotations

import math
import string
from typing import Any

import torch

from agents.grpo.baselines import DrGRPOAdvantage, GRPOAdvantage
from agents.grpo.batch import GroupBatch, Sample
from agents.grpo.comparisons import Comparison, declare
from agents.grpo.registry import Component, register
from agents.grpo.segments import evenly, line_spans, parse_split, token_ends, token_segments
from rlvr_envs.extract import answer_tag
from rlvr_envs.verifiers.countdown import verify as countdown_verify

COUNTDOWN_TEMPLATE = "<answer>{solution}</answer>"
GENERIC_TEMPLATE = "\nThe answer is {answer}"
VALUES = ("logprob", "mean_logprob", "prob")
NORMALIZE = ("group", "group_scale", "batch", "none")


def reasoning_bounds(text: str, ends: list[int], split: tuple[str, Any], marker: str,
                     max_segments: int) -> list[int]:
    """Token bounds ``[0, b_1, ..., b_J]`` of the reasoning segments of a response (``ends`` = its ``token_ends``);
    ``[0]`` or ``[]`` when it has no reasoning. The reasoning stops at ``marker`` (if given and present)."""
    n = len(ends)
    stop = text.find(marker) if marker else -1
    limit = stop if stop >= 0 else len(text)
    if limit <= 0 or n == 0:
        return []
    kind, arg = split
    last = token_segments(ends, [limit])[0][1] if stop >= 0 else n  # the token the marker's cut closes
    if last == 0:
        return []
    if kind == "tokens":
        inner = list(range(arg, last, arg))
    else:
        if kind == "lines":
            cuts = [b for _, b in line_spans(text[:limit])]
        else:
            cuts = [m.end() for m in arg.finditer(text[:limit])]
        cuts = [c for c in cuts if 0 < c < limit]
        inner = [a for a, _ in token_segments(ends, cuts)[1:]]
    inner = sorted({b for b in inner if 0 < b < last})
    return [0, *evenly(inner, max_segments - 1), last]


def _template(info: dict[str, Any], template: str) -> str:
    meta = info.get("metadata") if isinstance(info.get("metadata"), dict) else {}
    if template != "auto":
        return template
    countdown = meta.get("numbers") is not None and meta.get("solution") not in (None, "")
    return COUNTDOWN_TEMPLATE if countdown else GENERIC_TEMPLATE


def gold_continuation(info: dict[str, Any], template: str, solution: str | None = None) -> str | None:
    """The gold-answer text a* for a row (with ``solution`` in place of the task's own, if given), or None when the
    task has none (or the template names a missing field)."""
    meta = info.get("metadata") or {}
    if not isinstance(meta, dict):
        meta = {}
    template = _template(info, template)
    fields = {**meta, "answer": info.get("answer"), **({"solution": solution} if solution else {})}
    try:
        names = [name for _, name, _, _ in string.Formatter().parse(template) if name]
    except ValueError:
        return None
    if any(fields.get(name.split(".")[0].split("[")[0]) in (None, "") for name in names):
        return None
    try:
        return template.format_map(fields)
    except (KeyError, IndexError, AttributeError, ValueError):
        return None


def verified_solutions(infos: list[dict[str, Any]], texts: list[str]) -> list[str]:
    """The distinct final ``<answer>`` expressions of a group's responses that the env's Countdown verifier accepts
    for the task, most written first (ties: first written). Empty for a task without numbers and target."""
    info = infos[0] if infos else {}
    meta = info.get("metadata") if isinstance(info.get("metadata"), dict) else {}
    try:
        numbers = [int(x) for x in meta["numbers"]]
        target = int(meta.get("target", info.get("answer")))
    except (KeyError, TypeError, ValueError):
        return []
    counts: dict[str, int] = {}
    for text in texts:
        expr = answer_tag(text or "")
        # graded on its own, as the continuation the value will score: the expression, not the text around it
        if expr and countdown_verify(numbers, target, f"<answer>{expr}</answer>").correct:
            counts[expr] = counts.get(expr, 0) + 1
    return sorted(counts, key=lambda e: -counts[e])  # stable: ties keep the order written


def correct_continuations(info: dict[str, Any], template: str, solutions: list[str], max_answers: int) -> list[str]:
    """A* for a row: the gold continuation first, then (for a template with a ``{solution}`` slot) the same template
    around each verified solution of the group, distinct, at most ``max_answers``."""
    gold = gold_continuation(info, template)
    if gold is None:
        return []
    out = [gold]
    if "{solution}" in _template(info, template):
        for expr in solutions:
            text = gold_continuation(info, template, solution=expr)
            if text is not None and text not in out:
                out.append(text)
    return out[:max_answers]


def _aggregate(values: list[float], how: str) -> float:
    """The value of "some answer in A*" from the per-answer values: probabilities add (``logprob``: logsumexp)."""
    if how == "prob":
        return min(1.0, sum(values))
    if how == "mean_logprob":
        return max(values)
    top = max(values)
    if not math.isfinite(top):
        return top
    return top + math.log(sum(math.exp(v - top) for v in values))


@register("rredcot", stage="advantage")
class RREDCoTAdvantage(Component):
    def __init__(self, beta: float = 0.5, split: str = "lines", max_segments: int = 32, answer_marker: str = "<answer>",
                 template: str = "auto", value: str = "logprob", normalize: str = "group", base: str = "grpo",
                 eps: float = 1e-6, unbiased: bool = True, max_answers: int = 4, outcome_gate: bool = True):
        if not math.isfinite(float(beta)):
            raise ValueError(f"beta must be finite, got {beta}")
        if int(max_segments) < 1:
            raise ValueError(f"max_segments must be >= 1, got {max_segments}")
        if value not in VALUES:
            raise ValueError(f"value must be one of {VALUES}, got {value!r}")
        if normalize not in NORMALIZE:
            raise ValueError(f"normalize must be one of {NORMALIZE}, got {normalize!r}")
        if base not in ("grpo", "dr_grpo"):
            raise ValueError(f"base must be 'grpo' or 'dr_grpo', got {base!r}")
        if not isinstance(template, str) or not template:
            raise ValueError(f"template must be 'auto' or a format string, got {template!r}")
        if float(eps) <= 0:
            raise ValueError(f"eps must be > 0, got {eps}")
        if int(max_answers) < 1:
            raise ValueError(f"max_answers must be >= 1, got {max_answers}")
        self.max_answers, self.outcome_gate = int(max_answers), bool(outcome_gate)
        self.beta, self.max_segments, self.answer_marker = float(beta), int(max_segments), str(answer_marker or "")
        self.split, self._split = split, parse_split(split)
        self.template, self.value, self.normalize, self.eps = template, value, normalize, float(eps)
        self.base = GRPOAdvantage(eps=eps, unbiased=unbiased) if base == "grpo" else DrGRPOAdvantage()
        self.services: Any = None
        self._metrics: dict[str, float] = {}
        # what the last call computed, per row: token bounds and raw dV (credit-quality analysis reads it)
        self.last_bounds: list[list[int]] = []
        self.last_delta: list[list[float]] = []

    def bind(self, services: Any) -> None:
        self.services = services

    # -- values ----------------------------------------------------------------------------------------------------
    def _tokenizer(self, batch: GroupBatch) -> Any:
        return batch.tokenizer if batch.tokenizer is not None else getattr(self.services, "tokenizer", None)

    def plan(self, batch: GroupBatch) -> tuple[list[list[int]], list[list[list[int]] | None]]:
        """Per row: the reasoning token bounds (``[]`` = no segments) and the token ids of each answer in A*."""
        tok = self._tokenizer(batch)
        bounds: list[list[int]] = []
        answers: list[list[list[int]] | None] = []
        solutions = {g: verified_solutions([batch.infos[i] or {} for i in rows], [batch.texts[i] for i in rows])
                     for g, rows in batch.groups().items()}
        for i in range(len(batch)):
            ids = batch.response_ids[i]
            conts = correct_continuations(batch.infos[i] or {}, self.template, solutions[batch.group_ids[i]],
                                          self.max_answers)
            if tok is None or not conts or not ids:
                bounds.append([])
                answers.append(None)
                continue
            answer_ids = [a for a in (list(tok(c, add_special_tokens=False)["input_ids"]) for c in conts) if a]
            ends = token_ends(tok, ids)
            text = tok.decode(ids, skip_special_tokens=True)  # the text the ends index (engines' text may differ)
            b = reasoning_bounds(text, ends, self._split, self.answer_marker, self.max_segments) if answer_ids else []
            bounds.append(b if len(b) >= 2 else [])
            answers.append(answer_ids if len(b) >= 2 else None)
        return bounds, answers

    def values(self, batch: GroupBatch, bounds: list[list[int]], answers: list[list[list[int]] | None]
               ) -> list[list[float]]:
        """V at every bound of every row (over the row's A*), from one batched call of the log-prob service."""
        samples, where = [], []
        for i, (b, conts) in enumerate(zip(bounds, answers)):
            for j, k in enumerate(b):
                for a, ans in enumerate(conts or []):
                    samples.append(Sample(group_id=f"rredcot:{i}:{k}:{a}", prompt="",
                                          prompt_ids=list(batch.prompt_ids[i]) + list(batch.response_ids[i][:k]),
                                          response_ids=list(ans), text="", reward=0.0))
                    where.append((i, j))
        out: list[list[float]] = [[] for _ in bounds]
        if not samples:
            return out
        scoring = GroupBatch.from_samples(samples, step=batch.step, tokenizer=batch.tokenizer, temperature=1.0)
        lp = self.services.logprobs(scoring, list(range(len(scoring))))
        lp = (lp.double() * scoring.response_mask[:, : lp.shape[1]]).sum(1)
        lengths = scoring.response_lengths.double()
        per: dict[tuple[int, int], list[float]] = {}
        for key, total, n in zip(where, lp.tolist(), lengths.tolist()):
            if self.value == "mean_logprob":
                total /= max(1.0, n)
            elif self.value == "prob":
                total = math.exp(min(total, 0.0))  # a log-prob is never above 0; guard a service that says otherwise
            per.setdefault(key, []).append(float(total))
        for i, b in enumerate(bounds):
            out[i] = [_aggregate(per[(i, j)], self.value) for j in range(len(b))] if b else []
        self._metrics["scoring_sequences"] = float(len(samples))
        self._metrics["answers_mean"] = float(sum(len(a) for a in answers if a) / max(1, sum(1 for a in answers if a)))
        return out

    # -- advantages ------------------------------------------------------------------------------------------------
    def _normalized(self, batch: GroupBatch, deltas: list[list[float]]) -> list[list[float]]:
        if self.normalize == "none":
            return deltas
        pools: dict[str, list[float]] = {}
        for i, d in enumerate(deltas):
            key = "" if self.normalize == "batch" else batch.group_ids[i]
            pools.setdefault(key, []).extend(d)
        stats = {}
        for key, vals in pools.items():
            t = torch.tensor(vals, dtype=torch.float64)
            mean = float(t.mean()) if len(vals) else 0.0
            std = float(t.std(unbiased=False)) if len(vals) > 1 else 0.0
            stats[key] = (mean, std)
        out = []
        for i, d in enumerate(deltas):
            mean, std = stats["" if self.normalize == "batch" else batch.group_ids[i]]
            if std <= 1e-12:  # one segment, or all equal: nothing to tell the segments apart
                out.append([0.0] * len(d))
            elif self.normalize == "group_scale":
                out.append([x / (std + self.eps) for x in d])
            else:
                out.append([(x - mean) / (std + self.eps) for x in d])
        return out

    def __call__(self, batch: GroupBatch) -> torch.Tensor:
        self._metrics = {"scoring_sequences": 0.0, "answers_mean": 0.0}
        base = self.base(batch).double()
        mask = batch.response_mask
        adv = base[:, None].expand_as(mask).clone()
        bounds: list[list[int]] = [[] for _ in range(len(batch))]
        answers: list[list[int] | None] = [None] * len(batch)
        if self.services is not None and getattr(self.services, "logprobs", None) is not None:
            bounds, answers = self.plan(batch)
        deltas: list[list[float]] = [[] for _ in bounds]
        if any(bounds):
            vals = self.values(batch, bounds, answers)
            deltas = [[v[j + 1] - v[j] for j in range(len(v) - 1)] for v in vals]
            deltas = [d if all(math.isfinite(x) for x in d) else [] for d in deltas]  # -inf log-probs: no credit
            bounds = [b if d else [] for b, d in zip(bounds, deltas)]
        credits = self._normalized(batch, deltas)
        gated = 0
        if self.outcome_gate:  # the value places the row's outcome on its segments; it never flips its sign
            correct = batch.correct.tolist()
            tied = [[max(x, 0.0) if ok else min(x, 0.0) for x in c] for c, ok in zip(credits, correct)]
            gated = sum(1 for c, t in zip(credits, tied) for x, y in zip(c, t) if x != y)
            credits = tied
        for i, (b, c) in enumerate(zip(bounds, credits)):
            for j, x in enumerate(c):
                adv[i, b[j]:b[j + 1]] += self.beta * x
        self.last_bounds, self.last_delta = bounds, deltas
        flat = [x for d in deltas for x in d]
        scored = sum(1 for b in bounds if b)
        self._metrics.update(scored_rows=float(scored), fallback_rows=float(len(batch) - scored),
                             segments=float(len(flat)), gated_segments=float(gated),
                             dv_mean=float(sum(flat) / len(flat)) if flat else 0.0,
                             dv_abs_mean=float(sum(abs(x) for x in flat) / len(flat)) if flat else 0.0)
        return (adv * mask).float()

    def metrics(self) -> dict[str, float]:
        return dict(self._metrics)


declare(Comparison(
    method="rredcot", baseline="grpo", metric="final_accuracy", direction="higher",
    known_result=(
        "micro lane at HEAD keys, seeds 0-4 (2026-12-07, after the verifier-scored value and the outcome gate): "
        "final mean@4 on 1,000 held-out tasks 0.450 vs GRPO 0.434, diff +0.016 [95% t -0.012, +0.043], MDE 0.037 "
        "(sd between seeds 0.021, eval 0.007): inconclusive, no collapse (per seed +0.020, +0.029, +0.035, -0.022, "
        "+0.017; 26.2 vs 28.5 eval tokens). Before the fix (19d3900 runs, seeds 0-2) it ended 0.368 vs 0.510 and "
        "seed 1 collapsed after step 40 (0.466 -> 0.142): the value scored one gold expression and centred z-scores "
        "paid half the segments of all-wrong groups"),
    claim=("RREDCoT redistributes the terminal reward over CoT segments with the model's own teacher-forced "
           "likelihood of the gold answer, 'without additional generation', as an alternative to Monte-Carlo "
           "credit; the abstract gives no figure (read: higher final accuracy than GRPO's sequence-level credit)")))
declare(Comparison(
    method="rredcot", baseline="grpo", metric="final_accuracy", direction="higher", lane="smollm2",  # 5 paired seeds (the default): an accuracy claim at 2 seeds has an MDE of ~0.15
    known_result=(
        "smollm2 lane, seeds 0-1 (2026-12-06, ab301f3 runs): final greedy held-out accuracy 0.173 vs GRPO 0.370, "
        "diff -0.198 [95% paired bootstrap -0.380, -0.020]: not reproduced (worse). Seed 0 0.345 vs 0.390 "
        "(length 10.6 vs 10.9 tokens); seed 1 collapsed to an empty '\\boxed{}' (0.170 -> 0.140 -> 0.000, 5.0 "
        "tokens). Why: under the base model an empty box raises log p('The answer is N') by +6.8 nats, a wrong "
        "number by +4.0 (a right one +12.4; 40 tasks, benchmarks/rredcot_probe.py), so in groups with no correct "
        "answer the z-scored segment credit pays not committing. 1.36x GRPO's wall time (1,002-1,048 s vs "
        "738-765 s). The earlier seed-0 run (4e509c5) gave 0.425 vs 0.415"),
    claim="RREDCoT's likelihood-based segment credit beats GRPO's sequence-level credit (as rredcot_vs_grpo), on the "
          "real-model lane: SmolLM2-135M on arithmetic, greedy held-out accuracy; segments are the response's lines, "
          "a* = 'The answer is N' after the prefix, the recipe's settings unchanged"))
