"""DASH, drift-aware advantage shaping (seed 004). Stage: AdvantageEstimator (per-token advantages ``(B, L)``).

A response is cut at its intermediate answer commitments c_1 < ... < c_K (character offsets where a candidate answer
ends); segment k is the text from c_{k-1} (the start for k = 1) to c_k, and s_k in {right, wrong} is commitment k
checked against the gold. The segment's credit is the drift it caused:

    d_k = +eta   if s_{k-1} = wrong and s_k = right      (productive reflection)
    d_k = -eta   if s_{k-1} = right and s_k = wrong      (talking itself out of a right answer)
    d_k = 0      otherwise
    A_t = A_i^GRPO + d_k   for every token t of segment k;   A_t = A_i^GRPO on tokens after the last commitment

with A_i^GRPO the group z-score advantage of ``grpo`` (same ``eps`` / ``unbiased``). Rows without commitments, and
every row when eta = 0, get the plain group advantage on every token; padding gets 0.

Our reading (each a hyper-parameter):
- ``initial``: the state before the first commitment. ``"none"`` (default): the first segment carries no drift credit
  (DASH credits reflection, i.e. what follows a first answer); ``"wrong"``: no answer counts as a wrong one, so a first
  segment that commits to a right answer earns +eta.
- Countdown rows (``infos[i]["metadata"]`` has ``numbers`` and ``target``; the micro lane's search traces, parsed by
  ``agents.policy.countdown_traces.check_trace``): a commitment is a leaf line (``!`` or ``x``), ending at its line end;
  it is right when the line claims the target (``!``), its result is the target and ``check_trace`` finds it valid
  (valid arithmetic on the numbers of a valid branch, every number used). The final ``<answer>..</answer>`` is the last
  commitment (ending at ``</answer>``, or at the end of the text when unclosed), judged by the row's ``correct`` flag.
  ``countdown=False`` sends these rows down the generic path.
- Other rows (the generic path): commitments are the matches of ``patterns`` -- ``"boxed"`` (``\\boxed{..}``, braces
  balanced), ``"answer_tag"`` (``<answer>..</answer>``), ``"answer_is"`` (``answer is X`` up to the end of the
  sentence) -- nested matches count once (the outer one). Each is compared with ``info["answer"]`` after light
  normalization (spaces, ``$``, a trailing period and case dropped; equal numbers compare equal, ``1,000`` = ``1000``);
  with ``final_by_correct`` (default) the last one is judged by the row's ``correct`` flag instead (the env's verifier is
  the authority on the answer it read). A row without a gold answer gets no credit (no drift can be measured).
- The credit is added in advantage units, whatever the sign of the row's group advantage (the spec's "group advantage
  + segment credit"); right->right and wrong->wrong segments get 0.
- Token positions come from decoding growing prefixes of the response (``agents.grpo.segments``); the text parsed is
  the decoded response, so character offsets and tokens always agree. A batch without a tokenizer gets no credit.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

import torch

from agents.grpo.baselines import GRPOAdvantage
from agents.grpo.batch import GroupBatch
from agents.grpo.comparisons import Comparison, declare
from agents.grpo.registry import Component, register
from agents.grpo.rows import countdown_task
from agents.grpo.segments import line_spans, token_ends, token_segments
from agents.policy.countdown_traces import check_trace

PATTERNS = ("boxed", "answer_tag", "answer_is")
INITIAL = ("none", "wrong")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.S)
_ANSWER_IS = re.compile(r"answer is\s*:?\s*(.+?)(?=\.\s|\.$|\n|$)", re.I)


def is_step_line(line: str) -> bool:
    """Whether ``line`` parses as one search-trace operation (the check that ``check_trace`` applies to a line)."""
    return len(check_trace((), 0, line).steps) == 1


def countdown_commitments(numbers: Sequence[int], target: int, text: str, correct: bool) -> list[tuple[int, bool]]:
    """``(end offset, right)`` of every leaf line of a search trace, then of the final ``<answer>``; see the module."""
    body = text.split("<answer>", 1)[0]
    spans = [(a, b) for a, b in line_spans(body) if is_step_line(body[a:b])]
    check = check_trace(numbers, target, text, max_lines=len(body.splitlines()) + 1)
    out: list[tuple[int, bool]] = []
    if len(spans) == len(check.steps):  # always, unless the two parsers disagree: then no leaf is trusted
        for (_, end), step in zip(spans, check.steps):
            if step.mark:
                out.append((end, bool(step.valid and step.mark == "!" and step.result == target)))
    start = text.find("<answer>")
    if start >= 0:
        close = text.find("</answer>", start)
        out.append((close + len("</answer>") if close >= 0 else len(text), bool(correct)))
    return out


def _boxed(text: str) -> list[tuple[int, int, str]]:
    out = []
    for m in re.finditer(r"\\boxed\s*\{", text):
        depth, k = 1, m.end()
        while k < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[k], 0)
            k += 1
        if depth == 0:  # an unclosed box commits to nothing
            out.append((m.start(), k, text[m.end(): k - 1]))
    return out


def answer_matches(text: str, patterns: Sequence[str]) -> list[tuple[int, str]]:
    """``(end offset, content)`` of each answer commitment in ``text``, in order; nested matches count once."""
    found: list[tuple[int, int, str]] = []
    if "boxed" in patterns:
        found += _boxed(text)
    if "answer_tag" in patterns:
        found += [(m.start(), m.end(), m.group(1)) for m in _ANSWER_TAG.finditer(text)]
    if "answer_is" in patterns:
        found += [(m.start(), m.end(), m.group(1)) for m in _ANSWER_IS.finditer(text)]
    out: list[tuple[int, str]] = []
    last_end = -1
    for start, end, content in sorted(found, key=lambda f: (f[0], -f[1])):
        if end <= last_end:  # inside the previous match (<answer>\boxed{5}</answer>)
            continue
        if start < last_end:  # overlapping but not nested: keep the earlier one only
            continue
        out.append((end, content))
        last_end = end
    return out


def normalize_answer(s: str) -> str:
    s = str(s).strip().strip("$").replace("\\!", "").replace(" ", "").lower()
    return s[:-1] if s.endswith(".") else s


def same_answer(candidate: str, gold: Any) -> bool:
    """Light equivalence: normalized strings, or equal numbers (``1,000`` = ``1000.0``)."""
    a, b = normalize_answer(candidate), normalize_answer(str(gold))
    if a == b:
        return True
    try:
        x, y = float(a.replace(",", "")), float(b.replace(",", ""))
    except (ValueError, OverflowError):
        return False
    return math.isfinite(x) and math.isfinite(y) and math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-9)


def generic_commitments(text: str, gold: Any, correct: bool, patterns: Sequence[str],
                        final_by_correct: bool = True) -> list[tuple[int, bool]]:
    if gold is None or str(gold).strip() == "":
        return []
    found = answer_matches(text, patterns)
    out = [(end, same_answer(content, gold)) for end, content in found]
    if out and final_by_correct:
        out[-1] = (out[-1][0], bool(correct))
    return out


def drift_credits(states: Sequence[bool], eta: float, initial: str = "none") -> list[float]:
    """The credit d_k of each segment k (ending at commitment k) from the commitments' right/wrong states."""
    prev: bool | None = None if initial == "none" else False
    out = []
    for s in states:
        out.append(0.0 if prev is None or prev == s else (eta if s else -eta))
        prev = s
    return out


@register("dash", stage="advantage")
class DASHAdvantage(Component):
    def __init__(self, eta: float = 0.3, initial: str = "none", patterns: Sequence[str] = ("boxed", "answer_tag"),
                 final_by_correct: bool = True, countdown: bool = True, eps: float = 1e-6, unbiased: bool = True):
        if not (isinstance(eta, (int, float)) and math.isfinite(eta) and eta >= 0):
            raise ValueError(f"eta must be a finite number >= 0, got {eta!r}")
        if initial not in INITIAL:
            raise ValueError(f"initial must be one of {INITIAL}, got {initial!r}")
        if not isinstance(patterns, (list, tuple)) or not all(p in PATTERNS for p in patterns):
            raise ValueError(f"patterns must be a list drawn from {PATTERNS}, got {patterns!r}")
        self.eta, self.initial, self.patterns = float(eta), initial, tuple(patterns)
        self.final_by_correct, self.countdown = bool(final_by_correct), bool(countdown)
        self.group = GRPOAdvantage(eps=eps, unbiased=unbiased)
        self._metrics: dict[str, float] = {}

    def commitments(self, text: str, info: Any, correct: bool) -> list[tuple[int, bool]]:
        task = countdown_task(info) if self.countdown else None
        if task is not None:
            return countdown_commitments(task[0], task[1], text, correct)
        gold = info.get("answer") if isinstance(info, dict) else None
        return generic_commitments(text, gold, correct, self.patterns, self.final_by_correct)

    def __call__(self, batch: GroupBatch) -> torch.Tensor:
        mask = batch.response_mask
        base = self.group(batch).double()
        credit = torch.zeros(mask.shape, dtype=torch.float64)
        rows_with = up = down = 0
        tok = batch.tokenizer
        for i, ids in enumerate(batch.response_ids):
            if tok is None or not ids:
                continue
            text = tok.decode(list(ids), skip_special_tokens=True)
            found = self.commitments(text, batch.infos[i], bool(batch.correct[i]))
            if not found:
                continue
            ends = token_ends(tok, ids)  # O(L^2) decoding: only for rows that get credit
            rows_with += 1
            states = [right for _, right in found]
            credits = drift_credits(states, self.eta, self.initial)
            up += sum(c > 0 for c in credits)
            down += sum(c < 0 for c in credits)
            segments = token_segments(ends, [end for end, _ in found])
            for (a, b), c in zip(segments, credits):  # the last segment (after the last commitment) gets none
                if c:
                    credit[i, a:b] = c
        self._metrics = {"commit_rows": rows_with / max(1, len(batch)), "up_segments": float(up),
                         "down_segments": float(down)}
        return ((base[:, None] + credit) * mask).float()

    def metrics(self) -> dict[str, float]:
        # read once per logged step: a step whose groups were all dropped reports nothing, resumed or not
        out, self._metrics = self._metrics, {}
        return out


declare(Comparison(
    method="dash", baseline="grpo", metric="final_accuracy", direction="higher",
    known_result=(
        "micro lane, seeds 0-2 (commit ce3043a runs): final mean@4 0.520 vs GRPO 0.510, diff +0.009 [95% paired "
        "bootstrap -0.029, +0.058]: inconclusive (per seed -0.009, +0.061, -0.025). Nearly every rollout has a "
        "commitment; about 36 wrong->right and 17 right->wrong segments a step of 256 rollouts got +-eta. Eval length "
        "28.3 vs 28.1 tokens, coverage 0.78 vs 0.77 solutions per task"),
    claim="DASH's drift-aware segment credit beats GRPO where overthinking is prevalent (AIME25 50.8% vs 45.4% GRPO); "
          "on the micro lane a commitment is a search leaf (! / x) or the final <answer>"))
