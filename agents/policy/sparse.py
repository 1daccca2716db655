"""Sparse attention for decoding with the model's own weights: attention sinks + a recent window + the top-k keys by
score, per query head. The rest of the keys are masked and the softmax runs over the kept ones only.

The primitive behind S3R's drafts (``agents.policy.s3r``) and Sparrow's sparse rollouts. It plugs into any
transformers model that dispatches attention through ``AttentionInterface`` (Llama, Qwen, SmolLM2, ...):
``register()`` adds it under :data:`SPARSE_ATTENTION`, and ``with sparse_attention(model, pattern):`` switches the
model to it for the forwards inside the block and back to its own implementation afterwards. The KV cache is the
same object in both modes: sparse attention changes which cached keys a query reads, never what is stored.

Kept keys for a query (all counted among the keys it may see: causal, not padding, not a hole of a cache):

- the first ``sinks`` of them (attention sinks),
- the last ``window`` of them (for a decoding query, the newest token's own key is the last),
- the ``topk`` of the remaining keys with the highest score ``q·k / sqrt(d)`` for that query head.

With ``sinks + window + topk`` at least the number of visible keys every key is kept and the output is dense attention
(up to float rounding); ``tests/test_policy_sparse.py`` checks that against the model's own dense forward.

Grouped-query heads are scored as extra query rows of their key/value head, so the cache is read in place (no
repeated copy per query head); the kept set is still chosen per query head.

Our reading, and a cost note: exact top-k needs every score, so this reference implementation reads all keys (it is
an emulation of the access pattern, for exactness and acceptance measurements, and on CPU it is slower than the
dense kernel). What it saves in a fused kernel is the value reads and the ``p·V`` product for the dropped keys;
kernels that also skip key reads pick blocks from summaries (Quest-style page min/max) instead of exact scores.
:func:`attention_cost` accounts for both.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

SPARSE_ATTENTION = "rlvr_sparse_topk"


@dataclass(frozen=True)
class SparsePattern:
    """Which keys a query keeps: ``sinks`` first visible keys, ``window`` most recent ones, ``topk`` best-scoring
    others (per query head), and with a ``schedule`` (Sparrow's sparsity schedule over position) a further fraction
    of the middle keys that depends on how many keys the query sees.

    ``schedule`` is ``((from_keys, fraction), ...)`` with ``from_keys`` ascending: a query that sees at least
    ``from_keys`` keys (and fewer than the next entry's) also keeps the ``ceil(fraction * middle)`` best-scoring of its
    ``middle = visible - sinks - window`` keys, on top of ``topk``. Queries below the first entry add nothing."""

    sinks: int = 4
    window: int = 64
    topk: int = 64
    schedule: tuple[tuple[int, float], ...] = ()

    def __post_init__(self) -> None:
        for name in ("sinks", "window", "topk"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        edges = [e for e, _ in self.schedule]
        if any(not isinstance(e, int) or e < 0 for e in edges) or edges != sorted(set(edges)):
            raise ValueError(f"schedule positions must be distinct ints >= 0 in ascending order, got {edges!r}")
        if any(not 0.0 <= float(f) <= 1.0 for _, f in self.schedule):
            raise ValueError(f"schedule fractions must lie in [0, 1], got {[f for _, f in self.schedule]!r}")
        if self.sinks + self.window + self.topk == 0 and not any(f > 0 for _, f in self.schedule):
            raise ValueError("a sparse pattern must keep at least one key (sinks + window + topk >= 1)")

    @property
    def budget(self) -> int:
        """Keys kept per query head once the context is longer than the pattern (without the schedule's share)."""
        return self.sinks + self.window + self.topk

    def fraction(self, visible: int) -> float:
        """The schedule's fraction of middle keys for a query that sees ``visible`` keys."""
        share = 0.0
        for start, fraction in self.schedule:
            if visible >= start:
                share = float(fraction)
        return share

    def extra(self, visible: int) -> int:
        """Keys the schedule adds to ``topk`` for a query that sees ``visible`` keys."""
        middle = max(0, int(visible) - self.sinks - self.window)
        return math.ceil(self.fraction(visible) * middle - 1e-9) if self.schedule else 0

    def kept(self, visible: int) -> int:
        return min(int(visible), self.budget + self.extra(visible))


@dataclass
class SparseStats:
    """Counts over every (layer, query head, query) the sparse attention served while it was collecting: keys the
    query could see and keys it kept. ``kept / visible`` is the fraction of the KV the pattern reads."""

    visible: int = 0
    kept: int = 0
    calls: int = 0

    @property
    def kept_fraction(self) -> float:
        return self.kept / self.visible if self.visible else 1.0


# The pattern (and optional stats) of the innermost ``sparse_attention`` block. A context variable rather than a
# module attribute: the attention function is looked up by name, so it cannot be handed the pattern as an argument.
_ACTIVE: contextvars.ContextVar[tuple[SparsePattern, SparseStats | None] | None] = contextvars.ContextVar(
    "rlvr_sparse_pattern", default=None)


def visible_keys(attention_mask: torch.Tensor | None, q_len: int, kv_len: int, device: torch.device
                 ) -> torch.Tensor:
    """Boolean ``(B or 1, 1 or H, Q, L)``: which keys each query may attend to. ``None`` means plain causal attention
    with the queries at the end of the keys (what transformers passes when no mask is needed)."""
    if attention_mask is None:
        query_at = torch.arange(kv_len - q_len, kv_len, device=device)
        return (torch.arange(kv_len, device=device)[None, :] <= query_at[:, None])[None, None]
    mask = attention_mask[..., :kv_len]
    if mask.dtype == torch.bool:
        return mask
    return mask > torch.finfo(mask.dtype).min / 2  # additive float masks: 0 where allowed, the dtype's min elsewhere


def sparse_keep(scores: torch.Tensor, visible: torch.Tensor, pattern: SparsePattern) -> torch.Tensor:
    """Boolean mask, shape of ``scores`` ``(..., L)``: the keys each (query head, query) row keeps under ``pattern``;
    ``visible`` broadcasts to it."""
    visible = visible.expand_as(scores)
    rank = visible.cumsum(-1, dtype=torch.int32)  # 1-based rank among the visible keys, from the oldest
    total = rank[..., -1:]
    keep = visible & ((rank <= pattern.sinks) | (total - rank < pattern.window))
    if pattern.schedule:  # per query row: topk + the schedule's share of its middle keys (Sparrow)
        starts = torch.tensor([e for e, _ in pattern.schedule], device=scores.device, dtype=torch.int32)
        shares = torch.tensor([0.0] + [float(f) for _, f in pattern.schedule], device=scores.device)
        share = shares[torch.searchsorted(starts, total.contiguous(), right=True)]
        middle_count = (total - pattern.sinks - pattern.window).clamp(min=0)
        count = pattern.topk + torch.ceil(share * middle_count - 1e-9).to(torch.int64)
    else:
        count = None
    width = pattern.topk if count is None else int(count.max()) if count.numel() else 0
    if width:
        middle = visible & ~keep
        candidates = scores.masked_fill(~middle, float("-inf"))
        width = min(width, scores.shape[-1])
        best = candidates.topk(width, dim=-1).indices  # best first
        take = torch.ones_like(best, dtype=torch.bool) if count is None else (
            torch.arange(width, device=scores.device) < count)
        # fewer candidates than the count: the -inf picks are not middle keys and drop out here
        keep |= torch.zeros_like(keep).scatter_(-1, best, take) & middle
    return keep


def sparse_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                             **kwargs: Any) -> tuple[torch.Tensor, None]:
    """The ``AttentionInterface`` function: ``query`` (B, H, Q, D), ``key``/``value`` (B, H_kv, L, D) with the cache
    already appended; returns the attention output (B, Q, H, D) as transformers' own implementations do."""
    active = _ACTIVE.get()
    if active is None:
        raise RuntimeError(f"attention implementation {SPARSE_ATTENTION!r} used outside a sparse_attention() block")
    pattern, stats = active
    if kwargs.get("softcap") is not None or kwargs.get("s_aux") is not None or kwargs.get("sliding_window"):
        raise NotImplementedError("sparse attention supports plain full-attention layers (no softcap, learned sinks "
                                  "or sliding window)")
    b, heads, q_len, dim = query.shape
    kv_heads, kv_len = key.shape[1], key.shape[2]
    groups = heads // kv_heads
    # Grouped-query heads as extra query rows of their key/value head (query head h reads KV head h // groups), so
    # the cache is read in place: no repeated (B, H, L, D) copy of the keys and values per layer.
    grouped = query.reshape(b, kv_heads, groups * q_len, dim)
    scale = scaling if scaling is not None else dim ** -0.5
    # scores in the cache's dtype (as the dense kernels compute them), ranked and softmaxed in fp32
    scores = torch.matmul(grouped, key.transpose(-1, -2)).float() * scale
    visible = _grouped(visible_keys(attention_mask, q_len, kv_len, query.device), kv_heads, groups)
    if attention_mask is not None and attention_mask.dtype != torch.bool:
        scores = scores + _grouped(attention_mask[..., :kv_len].float(), kv_heads, groups)  # may carry a bias
    keep = sparse_keep(scores, visible, pattern)
    # all-masked rows: 0 (out of place: the softmax output is saved for backward when a sparse forward is trained)
    probs = torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=-1).nan_to_num(0.0)
    if dropout and module.training:
        probs = torch.nn.functional.dropout(probs, p=dropout)
    out = torch.matmul(probs.to(value.dtype), value).reshape(b, heads, q_len, value.shape[-1])
    if stats is not None:
        stats.visible += int(visible.expand_as(scores).sum())
        stats.kept += int(keep.sum())
        stats.calls += 1
    return out.transpose(1, 2).contiguous(), None


def _grouped(mask: torch.Tensor, kv_heads: int, groups: int) -> torch.Tensor:
    """A ``(B, 1 or H, Q, L)`` mask laid out as the grouped scores ``(B, 1 or H_kv, groups * Q, L)``."""
    b, h, q_len, length = mask.shape
    if h == 1:
        return mask[:, :, None].expand(b, 1, groups, q_len, length).reshape(b, 1, groups * q_len, length)
    return mask.reshape(b, kv_heads, groups * q_len, length)


def register() -> str:
    """Register the sparse attention (and, for the masks transformers builds from 2D padding masks, the ``sdpa``
    mask format, which the function reads) under :data:`SPARSE_ATTENTION`. Idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(SPARSE_ATTENTION, sparse_attention_forward)
    AttentionMaskInterface.register(SPARSE_ATTENTION, sdpa_mask)
    return SPARSE_ATTENTION


def set_attention(model: Any, name: str) -> None:
    """Switch the attention implementation every layer of ``model`` dispatches to (by its registered name)."""
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(name)
    else:  # an older transformers: the config attribute is what attention layers read
        model.config._attn_implementation = name


@contextlib.contextmanager
def sparse_attention(model: Any, pattern: SparsePattern, stats: SparseStats | None = None) -> Iterator[None]:
    """Forwards of ``model`` inside the block use sparse attention under ``pattern`` (counting into ``stats`` when
    given); the model's own attention implementation is restored on exit, also on an exception."""
    register()
    previous = model.config._attn_implementation
    token = _ACTIVE.set((pattern, stats))
    set_attention(model, SPARSE_ATTENTION)
    try:
        yield
    finally:
        set_attention(model, previous)
        _ACTIVE.reset(token)


def attention_cost(context: int, *, n_layers: int, n_heads: int, n_kv_heads: int, head_dim: int,
                   bytes_per_element: int, pattern: SparsePattern | None = None) -> dict[str, float]:
    """Per decoded token, all layers: KV bytes read and attention FLOPs (``q·K`` and ``p·V``, 2 FLOPs per
    multiply-add) at ``context`` cached positions, dense, and under ``pattern`` two ways:

    - ``exact_topk``: what this module computes: every key is read and scored, values only for kept keys;
    - ``block_select``: a kernel that selects without reading every key (page summaries): kept keys and values only,
      selection overhead not counted (a lower bound).
    """
    kv_row = n_kv_heads * head_dim * bytes_per_element * n_layers  # one position's keys (or values), all layers
    flops_row = 2 * n_heads * head_dim * n_layers  # one position's q·k (or p·v), all layers and query heads
    out = {"context": context, "dense_kv_bytes": 2 * context * kv_row, "dense_flops": 2 * context * flops_row}
    if pattern is not None:
        kept = pattern.kept(context)
        out.update({
            "kept_keys": kept,
            "exact_topk_kv_bytes": (context + kept) * kv_row, "exact_topk_flops": (context + kept) * flops_row,
            "block_select_kv_bytes": 2 * kept * kv_row, "block_select_flops": 2 * kept * flops_row,
        })
    return out
