"""Credit quality: how well a cheap per-token credit agrees with Monte-Carlo step values (seed 003, 2610.20497, our
reading: "compare RREDCoT and DASH against it on agreement"). Registers no component and imports no method file:
it reads per-token advantage tensors from any estimator and the MC reference's segments and values.

For a row i with MC bounds k_0 = 0 < k_1 < ... < k_{m+1} = L_i and values V_0..V_{m+1} (``mc_step``'s ``last_bounds``
and ``last_values``):

    reference credit   d_ij = V_{j+1} - V_j
    estimated credit   e_ij = mean_{t in [k_j, k_{j+1})} (A_it - A_i)      (A_it the estimator's token advantage,
                                                                            A_i the group advantage it builds on)
    spearman           rank correlation of (d, e) over every segment of every scored row (ties: average ranks)
    sign_agreement     share of segments with d != 0 where sign(e) = sign(d) (an e of 0 counts as a miss)

``dash_advantages`` is a simplified stand-alone DASH (drift-aware shaping; our reading of the spec): the response is
cut after each intermediate answer commitment, each commitment is checked against the gold answer, and the segment
that ends in a commitment gets +eta when it turns a wrong state right, -eta when it turns a right state wrong (the
state before the first commitment is wrong), 0 otherwise. Commitments: in a Countdown search trace, every leaf line
(``!`` right when the step is valid and reaches the target, ``x`` wrong) and the final ``<answer>`` (verified); in any
other text, every match of ``commit_pattern`` compared with ``info["answer"]``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from scipy.stats import spearmanr

from agents.grpo.segments import line_spans, token_ends, token_segments
from agents.policy.countdown_traces import check_trace
from rlvr_envs.verifiers.countdown import verify as countdown_verify


def reference_credit(values: Sequence[Sequence[float]]) -> list[float]:
    """MC step credits d_ij = V_{j+1} - V_j, flattened over rows (rows with no values add nothing)."""
    return [float(v[j + 1] - v[j]) for v in values for j in range(len(v) - 1)]


def segment_credit(advantages: torch.Tensor, base: torch.Tensor, bounds: Sequence[Sequence[int]]) -> list[float]:
    """Estimated credit of every segment ``[b_j, b_{j+1})`` of every row with bounds: the mean of ``A_it - A_i`` over
    its tokens (``advantages`` (B,) or (B, L), ``base`` (B,)); an empty segment gets 0."""
    adv = advantages.double()
    if adv.dim() == 1:
        adv = adv[:, None].expand(-1, max(1, max((b[-1] for b in bounds if b), default=1)))
    out = []
    for i, b in enumerate(bounds):
        for j in range(len(b) - 1):
            seg = adv[i, b[j]:b[j + 1]]
            out.append(float((seg - float(base[i])).mean()) if len(seg) else 0.0)
    return out


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation (average ranks for ties); nan with fewer than 2 points or a constant side."""
    if len(x) != len(y):
        raise ValueError(f"spearman: {len(x)} vs {len(y)} values")
    if len(x) < 2 or np.ptp(np.asarray(x, float)) == 0 or np.ptp(np.asarray(y, float)) == 0:
        return float("nan")
    return float(spearmanr(x, y).statistic)


def sign_agreement(reference: Sequence[float], estimate: Sequence[float], tol: float = 1e-9) -> tuple[float, int]:
    """(share of segments with |reference| > tol whose estimate has the same sign, how many such segments);
    nan when there are none. An estimate within tol of 0 has no sign and counts as a miss."""
    pairs = [(r, e) for r, e in zip(reference, estimate) if abs(r) > tol]
    if not pairs:
        return float("nan"), 0
    hits = sum(1 for r, e in pairs if abs(e) > tol and (r > 0) == (e > 0))
    return hits / len(pairs), len(pairs)


def agreement(reference: Sequence[float], estimate: Sequence[float], tol: float = 1e-9) -> dict[str, float]:
    """Spearman correlation and sign agreement of an estimate's segment credits with the reference's."""
    share, signed = sign_agreement(reference, estimate, tol)
    return {"spearman": spearman(reference, estimate), "sign_agreement": share, "segments": float(len(reference)),
            "signed_segments": float(signed)}


def compare(bounds: Sequence[Sequence[int]], values: Sequence[Sequence[float]], estimates: dict[str, torch.Tensor],
            base: torch.Tensor) -> dict[str, dict[str, float]]:
    """Agreement of each named estimator's advantages (over the same batch) with the MC reference."""
    ref = reference_credit(values)
    return {name: agreement(ref, segment_credit(adv, base, bounds)) for name, adv in estimates.items()}


# -- a stand-alone DASH ------------------------------------------------------------------------------------------------
def _normal(text: Any) -> str:
    return " ".join(str(text).split())


def commitments(text: str, info: dict[str, Any], commit_pattern: re.Pattern[str]) -> list[tuple[int, bool]]:
    """``(end character, right?)`` of every intermediate answer commitment of a response, in order."""
    meta = info.get("metadata") or {}
    meta = meta if isinstance(meta, dict) else {}
    out: list[tuple[int, bool]] = []
    try:
        numbers = [int(x) for x in meta["numbers"]]
        target = int(meta.get("target", info.get("answer")))
    except (KeyError, TypeError, ValueError):
        numbers = None
    if numbers is not None:  # a Countdown search trace: leaf lines, then the answer tag
        answer_at = text.find("<answer>")
        body_end = answer_at if answer_at >= 0 else len(text)
        seen = 0
        for _, end in line_spans(text[:body_end]):
            check = check_trace(numbers, target, text[:end])
            if len(check.steps) > seen:
                step = check.steps[-1]
                if step.mark in ("!", "x"):
                    out.append((end, step.valid and step.mark == "!" and step.result == target))
            seen = len(check.steps)
        if answer_at >= 0:
            close = text.find("</answer>", answer_at)
            end = close + len("</answer>") if close >= 0 else len(text)
            out.append((end, bool(countdown_verify(numbers, target, text[:end]).correct)))
        return out
    gold = info.get("answer")
    if gold is None:
        return out
    for m in commit_pattern.finditer(text):
        got = m.group(1) if commit_pattern.groups else m.group(0)
        out.append((m.end(), _normal(got) == _normal(gold)))
    return out


def dash_advantages(texts: Sequence[str], response_ids: Sequence[Sequence[int]], infos: Sequence[dict[str, Any]],
                    base: torch.Tensor, mask: torch.Tensor, tokenizer: Any, *, eta: float = 0.5,
                    commit_pattern: str = r"<answer>(.*?)</answer>") -> torch.Tensor:
    """Per-token DASH advantages ``A_i + credit`` (0 on padding); rows with no commitment keep ``A_i``."""
    if not math.isfinite(float(eta)):
        raise ValueError(f"eta must be finite, got {eta}")
    pattern = re.compile(commit_pattern, re.DOTALL)
    adv = base.double()[:, None].expand_as(mask).clone()
    for i, ids in enumerate(response_ids):
        if tokenizer is None or not ids:
            continue
        text = tokenizer.decode(list(ids), skip_special_tokens=True)
        found = commitments(text, infos[i] or {}, pattern)
        if not found:
            continue
        ends = token_ends(tokenizer, list(ids))
        segs = token_segments(ends, [c for c, _ in found])
        state = False
        for (a, b), (_, right) in zip(segs, found):
            if right != state:
                adv[i, a:b] += eta if right else -eta
            state = right
    return (adv * mask).float()
