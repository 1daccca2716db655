"""QLPO, Quadrant-weighted sampling for Length-aware Policy Optimization (seed 004). Stage: GroupTransform.

Over-generate M > G rollouts per prompt (the recipe's ``fixed`` allocator with n = M), then resample each group down to
G rows, keeping its correct/incorrect ratio and favouring short correct and long incorrect responses. The reward is
not changed: the kept group alone reshapes what GRPO trains on (its correct rows are shorter and its incorrect rows
longer than the group's average), which implicitly pushes the policy to shorter answers.

For a group of M rows with c correct:

    kept correct   k = floor(G * c / M + 1/2)                 (round half up)
                   k = min(max(k, 1), G - 1)                  if 0 < c < M and keep_mixed (the group keeps its signal)
    kept incorrect G - k
    within the correct rows:   P(row) ∝ exp(-beta * rank_short(L))   rank 0 = shortest
    within the incorrect rows: P(row) ∝ exp(-beta * rank_long(L))    rank 0 = longest

and k correct and G - k incorrect rows are drawn without replacement (successive draws, each ∝ these weights among the
rows not yet drawn). Groups with at most G rows pass through unchanged.

Our reading (the paper is known from its abstract only; all are hyper-parameters):
- "rank of length" is the 0-based rank within the subset, ties sharing their mean rank (equal lengths, equal odds);
  the rank is not normalized by the subset size, so beta is a per-rank log-odds.
- rounding half up; a mixed group never loses all its correct or all its incorrect rows (``keep_mixed``), which only
  binds when M > 2G.
- correctness is the env's flag (``batch.correct``), lengths are response tokens.
- kept rows stay in their input order, every per-row and per-token field with them (``GroupBatch.select``).
The draw uses this component's own seeded generator (``SeededComponent``), saved in its state: a resumed run keeps the
same rows as an uninterrupted one.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from agents.grpo.batch import GroupBatch
from agents.grpo.comparisons import Comparison, declare
from agents.grpo.registry import SeededComponent, register


def kept_correct(c: int, m: int, g: int, *, keep_mixed: bool = True) -> int:
    """How many of a group's ``c`` correct rows (of ``m``) survive when it is cut to ``g`` rows (``g < m``)."""
    k = math.floor(g * c / m + 0.5)
    if keep_mixed and 0 < c < m and g >= 2:
        k = min(max(k, 1), g - 1)
    return max(g - (m - c), min(k, c))  # never more rows of a kind than the group has


def mean_ranks(values: np.ndarray) -> np.ndarray:
    """0-based ranks of ``values`` (smallest first), ties sharing their mean rank."""
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values), dtype=np.float64)
    ranks[order] = np.arange(len(values), dtype=np.float64)
    for v in np.unique(values):
        tie = values == v
        ranks[tie] = ranks[tie].mean()
    return ranks


def length_logits(lengths: np.ndarray, beta: float, *, prefer: str) -> np.ndarray:
    """``-beta * rank``, rank 0 the shortest (``prefer="short"``) or the longest (``"long"``)."""
    return -beta * mean_ranks(np.asarray(lengths, dtype=np.float64) * (1.0 if prefer == "short" else -1.0))


def length_probs(lengths: np.ndarray, beta: float, *, prefer: str) -> np.ndarray:
    """First-draw sampling probabilities ∝ exp(-beta * rank)."""
    logits = length_logits(lengths, beta, prefer=prefer)
    w = np.exp(logits - logits.max())
    return w / w.sum()


@register("qlpo", stage="group_transform")
class QLPO(SeededComponent):
    def __init__(self, group_size: int = 8, beta: float = 0.5, keep_mixed: bool = True, seed: int = 0):
        if int(group_size) != group_size or group_size < 1:
            raise ValueError(f"qlpo: group_size must be an integer >= 1, got {group_size}")
        if not beta >= 0 or not math.isfinite(beta):
            raise ValueError(f"qlpo: beta must be finite and >= 0, got {beta}")
        super().__init__(seed)
        self.group_size, self.beta, self.keep_mixed = int(group_size), float(beta), bool(keep_mixed)
        self._reset_counts()

    def _reset_counts(self) -> None:
        self.counts = {"kept_rows": 0.0, "dropped_rows": 0.0, "resampled_groups": 0.0, "kept_len_sum": 0.0,
                       "dropped_len_sum": 0.0, "kept_correct": 0.0}

    def _draw(self, rows: list[int], lengths: np.ndarray, k: int, prefer: str) -> list[int]:
        if k <= 0:
            return []
        if k >= len(rows):
            return list(rows)
        # Gumbel top-k: the k largest of logit + Gumbel noise are k successive draws without replacement, each
        # proportional to exp(logit) among the rows left; unlike normalized probabilities it cannot underflow at
        # a large beta
        keys = length_logits(lengths[rows], self.beta, prefer=prefer) + self.rng.gumbel(size=len(rows))
        picked = np.argsort(-keys, kind="stable")[:k]
        return [rows[int(j)] for j in picked]

    def __call__(self, batch: GroupBatch) -> GroupBatch:
        g = self.group_size
        lengths = batch.response_lengths.numpy().astype(np.float64)
        correct = batch.correct.bool().tolist()
        keep: list[int] = []
        dropped: list[int] = []
        for rows in batch.groups().values():
            if len(rows) <= g:
                keep.extend(rows)
                continue
            good = [i for i in rows if correct[i]]
            bad = [i for i in rows if not correct[i]]
            k = kept_correct(len(good), len(rows), g, keep_mixed=self.keep_mixed)
            chosen = set(self._draw(good, lengths, k, "short")) | set(self._draw(bad, lengths, g - k, "long"))
            keep.extend(sorted(chosen))
            dropped.extend(i for i in rows if i not in chosen)
            self.counts["resampled_groups"] += 1
        self.counts["kept_rows"] += len(keep)
        self.counts["dropped_rows"] += len(dropped)
        self.counts["kept_len_sum"] += float(lengths[keep].sum()) if keep else 0.0
        self.counts["dropped_len_sum"] += float(lengths[dropped].sum()) if dropped else 0.0
        self.counts["kept_correct"] += sum(correct[i] for i in keep)
        if not dropped:
            return batch
        return batch.select(sorted(keep))

    def metrics(self) -> dict[str, float]:
        """This step's counts (refill rounds included): rows kept and dropped, their mean lengths; then reset."""
        c = self.counts
        out = {"kept_rows": c["kept_rows"], "dropped_rows": c["dropped_rows"],
               "resampled_groups": c["resampled_groups"],
               "kept_len_mean": c["kept_len_sum"] / c["kept_rows"] if c["kept_rows"] else 0.0,
               "dropped_len_mean": c["dropped_len_sum"] / c["dropped_rows"] if c["dropped_rows"] else 0.0,
               "kept_accuracy": c["kept_correct"] / c["kept_rows"] if c["kept_rows"] else 0.0}
        self._reset_counts()
        return out

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "counts": dict(self.counts)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if "counts" in state:
            self.counts = {k: float(v) for k, v in state["counts"].items()}


declare(Comparison(
    method="qlpo", baseline="grpo", metric="final_eval_tokens", direction="lower", accuracy_tolerance=0.05,
    claim="QLPO 'reduces response length by 30% to 70% while preserving reasoning performance' (paper, 1.5B-32B "
          "models). Budget here: both train on G = 8 rollouts per prompt; QLPO generates M = 16 and resamples 8 "
          "(its recipe's allocator n = 16, group_size = 8), GRPO generates 8 (so QLPO spends 2x the generation). "
          "Read: shorter final held-out answers than GRPO, mean final accuracy within 0.05"))
