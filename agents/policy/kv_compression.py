"""KV-cache compression for long prompts in the ``hf`` engine (seed 003, 2608.08878; abstract truncated, our reading).

The paper's abstract stops after the problem statement (the KV cache grows linearly with the sequence and bounds
long-context inference); what follows is our reading: *SnapKV-style prompt KV selection*. After a prompt's prefill,
each layer and KV head keeps ``budget`` of the prompt's cached positions and evicts the rest for the whole decode:

- the first ``sinks`` positions (attention sinks, as StreamingLLM keeps them),
- the last ``window`` positions (a recent window; it contains the observation window),
- the ``budget - sinks - window`` other positions that the *observation window* attends to most: the softmax
  attention of each of the last ``observe`` prompt queries over the prompt keys, summed over those queries and over
  the query heads that share the KV head (grouped-query attention), optionally smoothed along the sequence with a
  1-D average pool of width ``pool`` (SnapKV's clustering: neighbours of a heavy hitter carry its context).

SnapKV keeps only the observation window as its recent part (``window == observe``, ``pool`` 5-7). On SmolLM2-135M
with GSM8K few-shot prompts that kept the logits furthest from dense of the three shapes we measured
(``benchmarks/kv_compression.py``, part ``policies``: KL(dense || compressed) on the dense continuation): a recent
window alone (StreamingLLM, ``window = budget - sinks``) did better, and half the budget recent plus unpooled votes
matched it at 1k-token prompts and beat both at 2k (budget 512: KL 0.12 vs 0.23 recent-only vs 0.41 SnapKV). So
``window`` is its own knob; the defaults keep half the budget recent (512 / 256), no pooling;
``window=observe, pool=5`` is SnapKV's shape.

Why this policy in this engine: it runs once per distinct prompt, before the prompt's cache is copied to its ``n``
rollouts, so a GRPO group of ``n`` shares one selection and every row decodes with the smaller cache; the decode
loop itself is untouched (the kept keys already carry their rotary positions, new tokens keep their true positions).
Decode-time eviction (H2O's accumulated attention) would need attention weights on every step, which the fused
SDPA kernel does not return.

The observation queries are captured during the ordinary prefill by an ``AttentionInterface`` wrapper that records
``query[..., -observe:, :]`` per layer and calls the model's own attention implementation unchanged, so the prefill's
logits are bit-identical to the dense ones. Scores are then computed from those queries and the cached keys.

Memory: a prompt of ``L`` positions keeps ``min(L, budget)`` per layer and KV head; the saving is the evicted
positions times :func:`kv_bytes_per_position`. The prefill itself still holds the full prompt's KV for a moment
(a chunked prefill would lower that peak); the saving holds for the decode, where ``n`` rows x the cache live
together. Prompts no longer than ``budget`` are not touched: the engine then decodes exactly as without compression.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch

from agents.policy.sparse import set_attention

CAPTURE_ATTENTION_PREFIX = "rlvr_kv_observe"


@dataclass(frozen=True)
class KVCompression:
    """Keep ``budget`` prompt KV positions per layer and KV head: ``sinks`` first, ``window`` last, the rest by the
    pooled attention of the last ``observe`` prompt queries (``pool``: odd width of the average pool, 1 = none)."""

    budget: int = 512
    sinks: int = 4
    window: int = 256
    observe: int = 32
    pool: int = 1

    def __post_init__(self) -> None:
        for name in ("budget", "sinks", "window", "observe", "pool"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        if not 1 <= self.observe <= self.window:
            raise ValueError(f"observe must be in [1, window]: the voting queries are kept, got {self.observe}")
        if self.sinks + self.window > self.budget:
            raise ValueError(f"budget ({self.budget}) must hold sinks + window ({self.sinks} + {self.window})")
        if self.pool < 1 or self.pool % 2 == 0:
            raise ValueError(f"pool must be an odd int >= 1, got {self.pool}")


@dataclass
class KVCompressionStats:
    """Cumulative over ``generate`` calls (``HFEngine.kv_compression_stats``). Positions and bytes are per decoded
    row (a prompt's cache copied to ``n`` rows counts ``n`` times), prompt part of the cache only."""

    prefills: int = 0  # prefills that compressed (prompt longer than the budget)
    rows: int = 0
    prompt_positions: int = 0  # cached prompt positions a dense decode would hold (padding included)
    kept_positions: int = 0
    dense_kv_bytes: int = 0
    kept_kv_bytes: int = 0

    @property
    def saved_kv_bytes(self) -> int:
        return self.dense_kv_bytes - self.kept_kv_bytes

    def to_dict(self) -> dict[str, int]:
        return {**asdict(self), "saved_kv_bytes": self.saved_kv_bytes}


def kv_bytes_per_position(cache: Any) -> int:
    """Bytes one cached position takes over all layers (keys and values of every KV head)."""
    total = 0
    for layer in cache.layers:
        keys, values = layer.keys, layer.values
        total += keys.shape[1] * keys.shape[3] * keys.element_size() + values.shape[1] * values.shape[3] * (
            values.element_size())
    return total


def kv_cache_bytes(cache: Any) -> int:
    """Bytes of the cache's live positions, all rows and layers (not counting preallocated free positions)."""
    return sum(layer.keys.numel() * layer.keys.element_size() + layer.values.numel() * layer.values.element_size()
               for layer in cache.layers)


# The observation window's query states, per layer, while a capture is active (the attention function is looked up by
# name, so the capture cannot be handed to it as an argument).
_CAPTURE: contextvars.ContextVar[dict[int, tuple[torch.Tensor, float]] | None] = contextvars.ContextVar(
    "rlvr_kv_observe", default=None)
_OBSERVE: contextvars.ContextVar[int] = contextvars.ContextVar("rlvr_kv_observe_count", default=0)


def _inner_attention(module: torch.nn.Module, name: str) -> Any:
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if name in ALL_ATTENTION_FUNCTIONS:
        return ALL_ATTENTION_FUNCTIONS[name]
    if name == "eager":  # eager attention is each model's own function, in its modeling module
        eager = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
        if eager is not None:
            return eager
    raise NotImplementedError(f"KV compression cannot wrap attention implementation {name!r}")


def _observing(inner_name: str) -> Any:
    def forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: torch.Tensor | None, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, Any]:
        captured = _CAPTURE.get()
        if captured is not None:
            layer = getattr(module, "layer_idx", len(captured))
            scaling = kwargs.get("scaling")
            scale = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
            captured[layer] = (query[:, :, -_OBSERVE.get():, :].detach().clone(), scale)
        return _inner_attention(module, inner_name)(module, query, key, value, attention_mask, *args, **kwargs)

    return forward


@contextlib.contextmanager
def observe_queries(model: Any, observe: int) -> Iterator[dict[int, tuple[torch.Tensor, float]]]:
    """Inside the block, every attention call of ``model`` records its last ``observe`` query states (and its softmax
    scale) under its layer index in the yielded dict, then runs the model's own attention implementation: outputs
    are unchanged. The model's implementation is restored on exit, also on an exception."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    previous = model.config._attn_implementation
    name = f"{CAPTURE_ATTENTION_PREFIX}_{previous}"  # one name per wrapped implementation: its mask format too
    AttentionInterface.register(name, _observing(previous))
    AttentionMaskInterface.register(name, AttentionMaskInterface._global_mapping[previous])
    captured: dict[int, tuple[torch.Tensor, float]] = {}
    token, observe_token = _CAPTURE.set(captured), _OBSERVE.set(int(observe))
    set_attention(model, name)
    try:
        yield captured
    finally:
        set_attention(model, previous)
        _CAPTURE.reset(token)
        _OBSERVE.reset(observe_token)


def observation_scores(queries: torch.Tensor, keys: torch.Tensor, valid: torch.Tensor, scale: float, pool: int
                       ) -> torch.Tensor:
    """SnapKV's vote: ``(B, H_kv, L)`` attention mass each prompt key gets from the observation window.

    ``queries`` ``(B, H, w, D)`` are the last ``w`` prompt positions' queries, ``keys`` ``(B, H_kv, L, D)`` the
    prompt's cached keys, ``valid`` ``(B, L)`` the padding mask (left padding). A query sees the valid keys at or
    before its own position; queries on padding vote nothing. Softmax per (query head, query), summed over the
    window's queries and the query heads of each KV head, then average-pooled along ``L`` with width ``pool``."""
    b, heads, w, dim = queries.shape
    kv_heads, length = keys.shape[1], keys.shape[2]
    groups = heads // kv_heads
    # query head h reads KV head h // groups: group them as extra query rows of their KV head (no repeated keys)
    grouped = queries.reshape(b, kv_heads, groups * w, dim).float()
    scores = torch.matmul(grouped, keys.float().transpose(-1, -2)) * scale  # (B, H_kv, groups * w, L)
    query_at = torch.arange(length - w, length, device=keys.device)
    causal = torch.arange(length, device=keys.device)[None, :] <= query_at[:, None]  # (w, L)
    # a query on left padding sees no valid key at or before it: its softmax row is all -inf, zeroed below
    visible = causal[None] & valid[:, None, :].bool()  # (B, w, L)
    visible = visible[:, None, None].expand(b, 1, groups, w, length).reshape(b, 1, groups * w, length)
    probs = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1).nan_to_num_(0.0)
    votes = probs.sum(-2)  # (B, H_kv, L)
    if pool > 1:
        votes = torch.nn.functional.avg_pool1d(votes, kernel_size=pool, stride=1, padding=pool // 2,
                                               count_include_pad=False)
    return votes


def select_positions(votes: torch.Tensor, valid: torch.Tensor, config: KVCompression) -> torch.Tensor:
    """Indices ``(B, H_kv, C)`` of the prompt positions kept per row and KV head, ascending, ``C = min(budget, L)``.

    Among a row's valid positions: the first ``sinks`` and the last ``window`` always, then the highest ``votes``
    (ties: the lower position). A row with fewer valid positions than ``C`` keeps all of them and fills up with its
    padding positions; since padding is on the left and the indices are sorted, every head and layer of the row then
    starts with the same number of padding positions, so one ``(B, C)`` padding mask serves all of them."""
    b, kv_heads, length = votes.shape
    keep = min(config.budget, length)
    valid = valid.bool()
    rank = valid.cumsum(-1)  # 1-based rank among the row's valid positions, from the oldest
    total = rank[:, -1:]
    forced = valid & ((rank <= config.sinks) | (total - rank < config.window))
    priority = votes.float().clone()
    priority = priority.masked_fill(forced[:, None, :], float("inf")).masked_fill(~valid[:, None, :], float("-inf"))
    # a stable descending sort breaks ties towards the lower position (topk's tie order is unspecified)
    order = torch.sort(priority, dim=-1, descending=True, stable=True).indices[..., :keep]
    return order.sort(dim=-1).values


def compress_prompt_cache(cache: Any, observed: dict[int, tuple[torch.Tensor, float]], mask: torch.Tensor,
                          config: KVCompression, *, extra: int = 0) -> torch.Tensor:
    """Evict prompt positions of every layer of ``cache`` in place (each layer and KV head by its own votes); returns
    the new ``(B, C)`` padding mask. ``observed``: :func:`observe_queries`' capture from the prefill that filled
    ``cache``; ``mask`` ``(B, L)`` its padding mask; ``extra``: free positions kept after a preallocated layer."""
    from agents.policy.engine import set_layer_states

    if mask.shape[1] <= config.budget:
        return mask
    if len(observed) != len(cache.layers):
        raise RuntimeError(f"observed {len(observed)} attention layers for a cache of {len(cache.layers)}")
    new_mask = None
    for index, layer in enumerate(cache.layers):
        queries, scale = observed[index]
        keys, values = layer.keys, layer.values
        votes = observation_scores(queries, keys, mask, scale, config.pool)
        kept = select_positions(votes, mask, config)
        gather_k = kept[..., None].expand(*kept.shape, keys.shape[-1])
        gather_v = kept[..., None].expand(*kept.shape, values.shape[-1])
        set_layer_states(layer, keys.gather(2, gather_k), values.gather(2, gather_v), extra=extra)
        if new_mask is None:  # the same for every head and layer (see select_positions)
            new_mask = mask.gather(1, kept[:, 0])
    assert new_mask is not None
    return new_mask
