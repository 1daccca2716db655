"""Sparrow's cost model (seed 000; our reading): the fastest sparsity schedule whose alignment tail stays at the
threshold, chosen from a calibration sweep instead of the online feedback rule of ``agents/methods/sparrow.py``.

The abstract: "we use a cost model to find the sparsity schedule for maximum speedup under this mismatch threshold".
Our reading, with its assumptions stated:

- **Cost of a decoded token** (:class:`DecodeCost`): ``fixed + per_key * kept_keys``, where ``kept_keys`` is what
  the pattern keeps at the token's visible keys (``SparsePattern.kept``). This is an ideal kernel that reads only the
  kept keys and values (``attention_cost``'s ``block_select`` account); the emulation in ``agents/policy/sparse.py``
  reads every key, so on CPU this is a projection, not a measured time. Two ways to set the constants: the model's
  arithmetic (:meth:`DecodeCost.flops`, exact and machine-independent, blind to memory traffic) or a fit to timed
  dense decode steps at several contexts (:meth:`DecodeCost.fit`, the machine's own balance, noisy under load).
- **Cost of a schedule**: the sum over the decoded tokens of a workload (the visible-key counts its rollouts went
  through, :func:`visible_histogram`) of the per-token cost under the schedule.
- **Feasibility**: a calibration sweep decodes the workload at each candidate share ``f`` (one share for every
  position) and measures each position bucket's tail (the 5th percentile of ``a_t``). A share is feasible for a bucket
  when that tail is at or above the threshold.
- **Choice** (:func:`choose_schedule`): per bucket, the smallest feasible share (a bucket where none is feasible
  decodes densely, share 1). Under the additive cost model this is the cheapest feasible schedule, on the assumption
  that a bucket's tail depends on its own share only (earlier buckets' sparsity also shifts the context a later token
  sees; the benchmark decodes the chosen schedule again and reports the tails it actually gets).

result: benchmarks/results/sparrow_vs_sparrow_fixed.json (the schedule is the sparrow recipe's; its cost model: sparrow_schedule.json)
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from agents.policy.sparse import SparsePattern


@dataclasses.dataclass(frozen=True)
class DecodeCost:
    """Cost of decoding one token that reads ``kept`` keys: ``fixed + per_key * kept``, in ``unit`` (``"s"`` for a
    fit to timed steps, ``"flop"`` for the model's arithmetic)."""

    fixed: float
    per_key: float
    unit: str = "s"

    def __post_init__(self) -> None:
        if not (self.fixed >= 0 and self.per_key >= 0):
            raise ValueError(f"costs must be >= 0, got fixed={self.fixed!r}, per_key={self.per_key!r}")

    def step(self, kept: float) -> float:
        return self.fixed + self.per_key * kept

    @classmethod
    def fit(cls, contexts: Sequence[int], seconds: Sequence[float]) -> DecodeCost:
        """Least squares of dense step ``seconds`` on ``contexts`` (keys read = context); a negative slope (timing
        noise) clips to 0."""
        if len(contexts) != len(seconds) or len(contexts) < 2 or len(set(contexts)) < 2:
            raise ValueError("fit needs at least two distinct contexts, one time each")
        n = len(contexts)
        mx, my = sum(contexts) / n, sum(seconds) / n
        sxx = sum((x - mx) ** 2 for x in contexts)
        slope = sum((x - mx) * (y - my) for x, y in zip(contexts, seconds)) / sxx
        slope = max(0.0, slope)
        return cls(fixed=max(0.0, my - slope * mx), per_key=slope, unit="s")

    @classmethod
    def flops(cls, config: Any) -> DecodeCost:
        """FLOPs per decoded token of a Llama-style ``config`` (2 per multiply-add): the projections, MLP and logits
        (``fixed``) and, per key read, ``q.k`` and ``p.v`` over every layer and query head (``per_key``). Norms,
        rotary and softmax are left out. The attention term matches ``agents.policy.sparse.attention_cost``."""
        hidden, layers = int(config.hidden_size), int(config.num_hidden_layers)
        heads = int(config.num_attention_heads)
        kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(config, "head_dim", None) or hidden // heads)
        inter, vocab = int(config.intermediate_size), int(config.vocab_size)
        attn_proj = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2  # q, o and k, v
        mlp = 3 * hidden * inter  # gate, up, down
        fixed = 2 * (layers * (attn_proj + mlp) + hidden * vocab)
        return cls(fixed=float(fixed), per_key=float(2 * 2 * heads * head_dim * layers), unit="flop")


def visible_histogram(prompt_lengths: Iterable[int], response_lengths: Iterable[int]) -> Counter[int]:
    """How many decoded tokens saw each number of keys: a response of ``t`` tokens after a ``p``-token prompt decodes
    tokens 1..t-1 at ``p + 1 .. p + t - 1`` visible keys (token 0 comes from the prefill and is not counted)."""
    out: Counter[int] = Counter()
    for p, t in zip(prompt_lengths, response_lengths):
        for visible in range(p + 1, p + t):
            out[visible] += 1
    return out


def pattern_for(base: SparsePattern, positions: Sequence[int], shares: Sequence[float]) -> SparsePattern:
    """``base``'s sinks / window / topk with the schedule ``zip(positions, shares)``."""
    if len(positions) != len(shares):
        raise ValueError(f"{len(shares)} shares for {len(positions)} position buckets")
    return dataclasses.replace(base, schedule=tuple((int(p), float(f)) for p, f in zip(positions, shares)))


def schedule_cost(pattern: SparsePattern | None, histogram: Mapping[int, int], cost: DecodeCost) -> float:
    """What the workload's decode steps cost under ``pattern`` (``None``: dense, every visible key read)."""
    return sum(count * cost.step(visible if pattern is None else pattern.kept(visible))
               for visible, count in histogram.items())


def choose_schedule(tails: Mapping[float, Sequence[float]], threshold: float) -> list[float]:
    """Per bucket, the smallest share whose measured tail is at or above ``threshold`` (1.0 where none is).

    ``tails[share][b]`` is bucket ``b``'s tail when every position decodes at ``share``; NaN (a bucket no token
    reached) counts as feasible, since that bucket costs nothing in the workload either."""
    if not tails:
        raise ValueError("no calibration shares")
    sizes = {len(v) for v in tails.values()}
    if len(sizes) != 1:
        raise ValueError(f"every share needs one tail per bucket, got bucket counts {sorted(sizes)}")
    chosen = []
    for b in range(sizes.pop()):
        feasible = [s for s, v in tails.items() if math.isnan(v[b]) or v[b] >= threshold]
        chosen.append(min(feasible) if feasible else 1.0)
    return chosen


def projection(base: SparsePattern, positions: Sequence[int], shares: Sequence[float],
               histogram: Mapping[int, int], cost: DecodeCost) -> dict[str, Any]:
    """Cost of the schedule against dense decoding of the same workload, and the kept fraction of visible keys."""
    pattern = pattern_for(base, positions, shares)
    dense = schedule_cost(None, histogram, cost)
    sparse = schedule_cost(pattern, histogram, cost)
    visible = sum(v * c for v, c in histogram.items())
    kept = sum(pattern.kept(v) * c for v, c in histogram.items())
    return {"shares": list(shares), "unit": cost.unit, "dense_cost": dense, "sparse_cost": sparse,
            "speedup": dense / sparse if sparse else math.inf, "kept_fraction": kept / visible if visible else 1.0}
