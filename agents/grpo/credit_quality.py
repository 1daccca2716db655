"""Credit quality: how well a cheap per-token credit agrees with Monte-Carlo step values (seed 003, 2610.20497, our
reading: "compare RREDCoT and DASH against it on agreement"). Registers no component and knows no method: it reads
per-token advantage tensors from any estimator (the registered ``rredcot``, ``dash``, ...) and the MC reference's
segments and values.

For a row i with MC bounds k_0 = 0 < k_1 < ... < k_{m+1} = L_i and values V_0..V_{m+1} (``mc_step``'s ``last_bounds``
and ``last_values``):

    reference credit   d_ij = V_{j+1} - V_j
    estimated credit   e_ij = mean_{t in [k_j, k_{j+1})} (A_it - A_i)      (A_it the estimator's token advantage,
                                                                            A_i the group advantage it builds on)
    spearman           rank correlation of (d, e) over every segment of every scored row (ties: average ranks)
    sign_agreement     share of segments with d != 0 where sign(e) = sign(d) (an e of 0 counts as a miss)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from scipy.stats import spearmanr


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
