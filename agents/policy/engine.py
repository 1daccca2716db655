"""Rollout engines behind one interface, and the ``hf`` backend (our own KV-cached decode loop over a transformers model).

``generate(prompts, n, sampling, *, seeds=None) -> list[Rollout]`` returns ``n`` rollouts per prompt in prompt-major
order. Conventions shared by every backend:

- ``logprobs[k]`` is the log-probability of ``response_ids[k]`` under the policy's distribution *with temperature
  applied* (``log_softmax(logits / T)``), without top-p truncation: that is what a trainer recomputes from the same
  weights, so on-policy importance ratios start at exactly 1. Greedy decoding (``temperature == 0``) reports ``T = 1``.
  ``entropies[k]`` is the entropy of that same distribution.
- ``response_ids`` include the EOS token when the model stopped by itself (its logprob matters for learning to stop);
  ``text`` never contains special tokens. On a stop string, ``response_ids`` end with the token that completed it and
  ``text`` is cut before it (vLLM's convention). ``finish_reason`` is ``"stop"`` (EOS or stop string) or ``"length"``
  (``"abort"`` when ``generate_with_abort`` stopped it).
- Randomness: each rollout has its own generator seeded from ``seeds[i]`` (or ``sampling.seed`` and the prompt index)
  and its sample index, so a rollout does not depend on which other rollouts share its batch.
"""

from __future__ import annotations

import abc
import contextlib
import copy
import functools
import inspect
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
import torch

from agents.policy.fastpath import PackedLinearCache, resolve_precision
from agents.policy.kv_compression import (
    KVCompression,
    KVCompressionStats,
    compress_prompt_cache,
    kv_cache_bytes,
    observe_queries,
)

FINISH_REASONS = ("stop", "length", "abort")  # abort: stopped by a generation controller (generate_with_abort)


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    seed: int | None = None
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        object.__setattr__(self, "stop", stop)
        if not (isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not (isinstance(self.max_new_tokens, int) and self.max_new_tokens >= 1):
            raise ValueError(f"max_new_tokens must be an int >= 1, got {self.max_new_tokens!r}")
        if self.seed is not None and not isinstance(self.seed, (int, np.integer)):
            raise ValueError(f"seed must be an int or None, got {self.seed!r}")
        if any(not isinstance(s, str) or not s for s in stop):
            raise ValueError(f"stop must be non-empty strings, got {self.stop!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["stop"] = list(self.stop)
        return d


@dataclass
class Rollout:
    prompt_ids: list[int]
    response_ids: list[int]
    text: str
    logprobs: list[float]
    entropies: list[float] | None  # None where a backend cannot provide them (vLLM)
    finish_reason: str
    seed: int | None = None  # the rollout's own sampling seed
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def n_tokens(self) -> int:
        return len(self.response_ids)


class RolloutEngine(abc.ABC):
    """``generate`` returns ``n`` rollouts per prompt, prompt-major. ``seeds`` (one per prompt) overrides
    ``sampling.seed``: rollout ``j`` of prompt ``i`` then depends only on ``(seeds[i], j)``. ``sync_weights(model)``
    makes later rollouts come from ``model``'s current weights (a trainer calls it after every update)."""

    backend: str = "?"

    @abc.abstractmethod
    def generate(
        self, prompts: Sequence[str] | Sequence[Sequence[int]], n: int, sampling: SamplingParams,
        *, seeds: Sequence[int] | None = None,
    ) -> list[Rollout]: ...

    @abc.abstractmethod
    def sync_weights(self, model: Any) -> None: ...

    def describe(self) -> dict[str, Any]:
        return {"backend": self.backend}


def cache_kwarg(model: Any) -> str:
    """The forward's KV-cache argument: transformers 5.x renamed ``past_key_values`` to ``cache`` (the cache object
    is updated in place either way). A peft wrapper's forward takes ``**kwargs``, so its base model is asked."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def rollout_seeds(n_prompts: int, n: int, sampling: SamplingParams, seeds: Sequence[int] | None) -> list[list[int]]:
    """Per-rollout seeds ``[prompt][sample]``: from ``seeds[i]`` and ``j``, else from ``sampling.seed``, ``i`` and ``j``;
    with neither, from torch's global RNG (so ``torch.manual_seed`` still makes a run repeatable)."""
    if seeds is not None:
        if len(seeds) != n_prompts:
            raise ValueError(f"seeds has {len(seeds)} entries for {n_prompts} prompts")
        keys = [(int(s), ()) for s in seeds]
    else:
        base = sampling.seed if sampling.seed is not None else int(torch.randint(0, 2**62, ()).item())
        keys = [(int(base), (i,)) for i in range(n_prompts)]
    out = []
    for entropy, spawn in keys:
        out.append([int(np.random.SeedSequence(entropy, spawn_key=(*spawn, j)).generate_state(1, np.uint64)[0] >> 1)
                    for j in range(n)])
    return out


def encode_prompts(tokenizer: Any, prompts: Sequence[str] | Sequence[Sequence[int]], *,
                   add_special_tokens: bool = False) -> list[list[int]]:
    """Token ids for each prompt. Strings are encoded without extra special tokens by default: chat-templated text
    already carries them."""
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence) or len(prompts) == 0:
        raise ValueError("prompts must be a non-empty list of strings or of token-id lists")
    out = []
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            ids = tokenizer(p, add_special_tokens=add_special_tokens)["input_ids"]
        elif isinstance(p, Sequence) and all(isinstance(t, (int, np.integer)) for t in p):
            ids = [int(t) for t in p]
        else:
            raise ValueError(f"prompt {i} is neither a string nor a list of token ids: {type(p).__name__}")
        if not ids:
            raise ValueError(f"prompt {i} is empty")
        out.append(list(ids))
    return out


def eos_ids(model: Any, tokenizer: Any) -> set[int]:
    ids: set[int] = set()
    gen = getattr(model, "generation_config", None)
    for src in (getattr(gen, "eos_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if isinstance(src, int):
            ids.add(src)
        elif isinstance(src, (list, tuple)):
            ids.update(int(t) for t in src)
    return ids


def cut_at_stop(tokenizer: Any, response_ids: list[int], stop: Sequence[str]) -> tuple[int, str] | None:
    """If the decoded response contains a stop string: (number of tokens up to and including the one that completes
    the earliest stop string, text before it). ``None`` when no stop string occurs."""
    text = tokenizer.decode(response_ids, skip_special_tokens=True)
    hits = [(text.find(s), s) for s in stop if s in text]
    if not hits:
        return None
    at, s = min(hits)
    need = at + len(s)
    lo, hi = 1, len(response_ids)  # smallest k whose decoded prefix reaches past the stop string
    while lo < hi:
        mid = (lo + hi) // 2
        if len(tokenizer.decode(response_ids[:mid], skip_special_tokens=True)) >= need:
            hi = mid
        else:
            lo = mid + 1
    return lo, text[:at]


def pick_tokens(logits: torch.Tensor, sampling: SamplingParams, uniforms: torch.Tensor | None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Choose one token per row. Returns (tokens, logprobs of them, entropies) under ``softmax(logits / T)``
    (``T = 1`` when greedy). Sampling is inverse-CDF with one uniform per row (top-p: over the sorted nucleus)."""
    logits = logits.float()
    scaled = logits if sampling.greedy else logits / sampling.temperature
    logp = torch.log_softmax(scaled, dim=-1)
    probs = logp.exp()
    entropy = -(probs * logp).nan_to_num().sum(-1)  # 0 * -inf = nan for masked tokens
    if sampling.greedy:
        tokens = logits.argmax(-1)
    else:
        assert uniforms is not None
        if sampling.top_p < 1.0:
            sorted_p, order = probs.sort(dim=-1, descending=True)
            before = sorted_p.cumsum(-1) - sorted_p
            sorted_p = sorted_p * (before < sampling.top_p)  # the top token always stays (before == 0)
            cdf = sorted_p.double().cumsum(-1)
        else:
            order, cdf = None, probs.double().cumsum(-1)
        target = (uniforms.double() * cdf[:, -1]).unsqueeze(-1)
        idx = torch.searchsorted(cdf, target, right=True).clamp_(max=cdf.shape[-1] - 1)
        tokens = (order.gather(-1, idx) if order is not None else idx).squeeze(-1)
    return tokens, logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1), entropy


@functools.cache
def _prealloc_layer_class() -> type:
    from transformers.cache_utils import DynamicLayer

    class PreallocLayer(DynamicLayer):
        """Writes into preallocated buffers instead of ``torch.cat``-ing the whole cache every step (a full copy per
        layer per token). ``capacity`` (the initial size) is set by the engine; buffers double when full."""

        capacity = 0

        def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
            b, h, _, d = key_states.shape
            self.device = key_states.device
            self._k = key_states.new_empty((b, h, self.capacity, d))
            self._v = value_states.new_empty((b, h, self.capacity, value_states.shape[-1]))
            self._len = 0
            self.keys, self.values = self._k[:, :, :0], self._v[:, :, :0]
            self.is_initialized = True

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
                   ) -> tuple[torch.Tensor, torch.Tensor]:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            end = self._len + key_states.shape[-2]
            if end > self._k.shape[2]:  # grow geometrically: amortized O(1) copies per token
                grow = max(end, 2 * self._k.shape[2]) - self._k.shape[2]
                self._k = torch.cat([self._k, self._k.new_empty((*self._k.shape[:2], grow, self._k.shape[3]))], 2)
                self._v = torch.cat([self._v, self._v.new_empty((*self._v.shape[:2], grow, self._v.shape[3]))], 2)
            self._k[:, :, self._len:end] = key_states
            self._v[:, :, self._len:end] = value_states
            self._len = end
            self.keys, self.values = self._k[:, :, :end], self._v[:, :, :end]
            return self.keys, self.values

        def get_seq_length(self) -> int:
            return self._len if self.is_initialized else 0

        def crop(self, tokens_to_remove: int) -> None:
            # DynamicLayer.crop would slice ``keys`` only; the write position ``_len`` must move back with it, so the
            # next update overwrites the cropped positions (speculative decoding rolls drafts back this way).
            if tokens_to_remove > 0:
                raise ValueError(f"crop takes a negative number of positions to remove, got {tokens_to_remove}")
            if self.is_initialized and tokens_to_remove:
                self._len = max(0, self._len + tokens_to_remove)
                self.keys, self.values = self._k[:, :, :self._len], self._v[:, :, :self._len]

        def batch_select_indices(self, indices: torch.Tensor) -> None:
            if self.is_initialized:
                self._k, self._v = self._k[indices], self._v[indices]
                self.keys, self.values = self._k[:, :, :self._len], self._v[:, :, :self._len]

    return PreallocLayer


def new_cache(capacity: int | None) -> Any:
    """A transformers ``DynamicCache``; with ``capacity``, its layers preallocate that many positions (and grow)."""
    from transformers import DynamicCache

    cache = DynamicCache()
    if capacity:
        base = _prealloc_layer_class()
        cache.layer_class_to_replicate = type("PreallocLayer", (base,), {"capacity": int(capacity)})
    return cache


def merge_caches(cache: Any, mask: torch.Tensor, other: Any, other_mask: torch.Tensor, *, extra: int = 0
                 ) -> torch.Tensor:
    """Append ``other``'s rows to ``cache`` in place (continuous batching): both are left-padded to the longer of
    the two lengths, the padding masked. Returns the merged ``(B1 + B2, L)`` padding mask. ``extra``: free positions
    kept after the merge in preallocated layers."""
    length = max(mask.shape[1], other_mask.shape[1])

    def pad(t: torch.Tensor, width: int, dim: int) -> torch.Tensor:
        if width == 0:
            return t
        shape = list(t.shape)
        shape[dim] = width
        return torch.cat([t.new_zeros(shape), t], dim=dim)

    for layer, new in zip(cache.layers, other.layers):
        keys = torch.cat([pad(layer.keys, length - layer.keys.shape[2], 2), pad(new.keys, length - new.keys.shape[2], 2)])
        values = torch.cat([pad(layer.values, length - layer.values.shape[2], 2),
                            pad(new.values, length - new.values.shape[2], 2)])
        set_layer_states(layer, keys, values, extra=extra)
    return torch.cat([pad(mask, length - mask.shape[1], 1), pad(other_mask, length - other_mask.shape[1], 1)])


def set_layer_states(layer: Any, keys: torch.Tensor, values: torch.Tensor, *, extra: int = 0) -> None:
    """Replace a cache layer's keys and values (a merge, a compaction); a preallocated layer gets new buffers with
    ``extra`` free positions after them."""
    length = keys.shape[2]
    if hasattr(layer, "_k"):
        layer._k = torch.cat([keys, keys.new_empty((*keys.shape[:2], extra, keys.shape[3]))], 2)
        layer._v = torch.cat([values, values.new_empty((*values.shape[:2], extra, values.shape[3]))], 2)
        layer._len = length
        layer.keys, layer.values = layer._k[:, :, :length], layer._v[:, :, :length]
    else:
        layer.keys, layer.values = keys, values


@dataclass
class _Row:
    prompt: int
    seed: int
    gen: torch.Generator | None
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)
    finish: str | None = None
    hidden: list[torch.Tensor] = field(default_factory=list)  # frozen-prefix states, when the engine captures them


class HFEngine(RolloutEngine):
    """Batched generation with our own decode loop over ``model(..., past_key_values=DynamicCache)``.

    Each distinct prompt of a batch is prefilled once (left-padded, only the last position's logits computed) and
    its KV cache is copied to its rows, so a GRPO group of n shares one prefill. Rows that finish are dropped from
    the batch (cache rows included) once ``prune_fraction`` of the live batch has finished, so long-tail rollouts
    don't drag finished ones along. ``max_batch_size`` bounds the rows decoded together.
    """

    backend = "hf"

    def __init__(self, policy: Any, *, max_batch_size: int = 64, prune_fraction: float = 0.25,
                 add_special_tokens: bool = False, preallocate: bool = True, cache_block: int = 256,
                 ignore_eos: bool = False, precision: str = "auto", pack_weights: bool = True,
                 continuous: bool = True, refill_fraction: float = 0.25, speculative: Any = None,
                 kv_compression: KVCompression | None = None, sparse_decode: Any = None) -> None:
        if max_batch_size < 1:
            raise ValueError("max_batch_size must be >= 1")
        if kv_compression is not None and speculative is not None:
            # S3R's exactness is relative to dense attention over the full cache; the two are not combined
            raise ValueError("kv_compression and speculative decoding cannot be combined")
        if sparse_decode is not None and speculative is not None:
            raise ValueError("sparse_decode and speculative decoding cannot be combined (S3R drafts sparsely itself)")
        if not 0.0 < refill_fraction <= 1.0:
            raise ValueError(f"refill_fraction must be in (0, 1], got {refill_fraction!r}")
        # Continuous batching: with more rows than max_batch_size (decode slots), a queued row takes a slot as soon as
        # refill_fraction of the slots are free (its own prefill, merged into the running batch), instead of every
        # chunk of max_batch_size rows waiting for its longest row. Off: static chunks.
        self.continuous, self.refill_fraction = bool(continuous), float(refill_fraction)
        # speculative: an agents.policy.s3r.S3RConfig decodes with S3R self-speculative drafts (sparse attention,
        # same weights) verified by dense forwards; the samples keep the dense distribution (opt-in).
        self.speculative = speculative
        self.speculative_stats: Any = None  # agents.policy.s3r.S3RStats, cumulative over calls
        # kv_compression: evict long prompts' KV positions after their prefill (sinks + recent window + positions the
        # last prompt queries attend to, SnapKV-style; opt-in); prompts within its budget decode exactly as without.
        self.kv_compression = kv_compression
        self.kv_compression_stats: KVCompressionStats | None = None  # cumulative over calls
        # sparse_decode: an agents.policy.sparse.SparsePattern every decode forward attends under (Sparrow's sparse
        # rollouts: prefill dense, each new token reads sinks + window + top-k keys); the samples then come from the
        # sparse policy, and their log-probs are the sparse ones (opt-in).
        self.sparse_decode = sparse_decode
        self.sparse_decode_stats: Any = None  # agents.policy.sparse.SparseStats, cumulative over calls
        # frozen_prefix: an agents.policy.frozen_prefix.FrozenPrefixCache the trainer sets; while it is capturing,
        # each rollout's hidden states entering its first trained layer are kept for the loss forward.
        self.frozen_prefix: Any = None
        self._captured: list[torch.Tensor] | None = None  # the capture hook's output during one generate call
        self.policy = policy
        self.model = policy.model
        # Decoding precision: bf16 weights only where the hardware multiplies bf16 (fastpath.resolve_precision);
        # in fp32 on CPU, linear layers run against MKL-packed weights (2-3x faster for a few rows per token).
        device = getattr(self.model, "device", torch.device("cpu"))
        self.precision = resolve_precision(precision, device)
        self.packs = PackedLinearCache() if pack_weights and torch.device(device).type == "cpu" else None
        self._bf16_copy: tuple[Any, tuple[int, ...]] | None = None
        self.tokenizer = policy.tokenizer
        self.max_batch_size = max_batch_size
        self.prune_fraction = prune_fraction
        self.add_special_tokens = add_special_tokens
        self.preallocate = preallocate
        self.cache_block = cache_block  # KV positions preallocated beyond the prompt (buffers double when full)
        self.eos = set() if ignore_eos else eos_ids(self.model, self.tokenizer)  # ignore_eos: fixed-length benchmarks
        pad = getattr(self.tokenizer, "pad_token_id", None)
        eos = eos_ids(self.model, self.tokenizer)
        self.pad_id = int(pad) if pad is not None else (min(eos) if eos else 0)
        self.max_positions = getattr(self.model.config, "max_position_embeddings", None)
        self.cache_kw = cache_kwarg(self.model)

    def sync_weights(self, model: Any) -> None:
        """Drop the derived copies (MKL-packed linears, the bf16 decoding copy) so the next ``generate`` rebuilds them
        from the policy's current tensors. Call it after every optimizer step (the trainer does): derived copies also
        refresh when a weight's version counter moves, but fused optimizers (``AdamW(fused=True)``) update weights in
        place without moving it, so that check alone decodes with stale weights."""
        if model is not self.model:
            raise ValueError("HFEngine decodes its policy's model; sync_weights got a different model")
        if self.packs is not None:
            self.packs.clear()
        if self._bf16_copy is not None:
            self._bf16_copy = (self._bf16_copy[0], ())  # no version tuple matches (): the next decode copies

    def describe(self) -> dict[str, Any]:
        return {"backend": self.backend, "max_batch_size": self.max_batch_size, "logprobs": "log_softmax(logits/T)",
                "precision": self.precision, "packed_weights": self.packs is not None, "continuous": self.continuous,
                **({"speculative": asdict(self.speculative)} if self.speculative is not None else {}),
                **({"kv_compression": asdict(self.kv_compression)} if self.kv_compression is not None else {}),
                **({"sparse_decode": asdict(self.sparse_decode)} if self.sparse_decode is not None else {})}

    def decode_model(self) -> Any:
        """The model decoding runs: the policy's own, or (precision bf16, fp32 policy) a bf16 copy refreshed whenever
        a policy weight has changed since the copy was made."""
        params = list(self.model.parameters())
        if self.precision != "bf16" or not params or params[0].dtype == torch.bfloat16:
            return self.model
        versions = tuple(p._version for p in params)
        if self._bf16_copy is None:
            copy_ = copy.deepcopy(self.model).to(torch.bfloat16)
            for p in copy_.parameters():
                p.requires_grad_(False)
                p.grad = None
            self._bf16_copy = (copy_, versions)
        elif self._bf16_copy[1] != versions:
            with torch.no_grad():
                for dst, src in zip(self._bf16_copy[0].parameters(), params):
                    dst.copy_(src)
            self._bf16_copy = (self._bf16_copy[0], versions)
        return self._bf16_copy[0]

    def generate(
        self, prompts: Sequence[str] | Sequence[Sequence[int]], n: int, sampling: SamplingParams,
        *, seeds: Sequence[int] | None = None,
    ) -> list[Rollout]:
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be an int >= 1, got {n!r}")
        prompt_ids = encode_prompts(self.tokenizer, prompts, add_special_tokens=self.add_special_tokens)
        longest = max(len(p) for p in prompt_ids)
        lookahead = self.speculative.k if self.speculative is not None else 0  # drafts may run past a row's budget
        if self.max_positions and longest + sampling.max_new_tokens + lookahead > self.max_positions:
            raise ValueError(f"prompt ({longest} tokens) + max_new_tokens ({sampling.max_new_tokens})"
                             f"{f' + {lookahead} drafts' if lookahead else ''} exceeds the model's "
                             f"{self.max_positions} positions")
        row_seeds = rollout_seeds(len(prompt_ids), n, sampling, seeds)
        rows = []
        for i in range(len(prompt_ids)):
            for j in range(n):
                gen = None
                if not sampling.greedy:
                    gen = torch.Generator().manual_seed(row_seeds[i][j])
                rows.append(_Row(prompt=i, seed=row_seeds[i][j], gen=gen))
        model = self.decode_model()
        was_training = model.training
        model.eval()
        packed = self.packs.applied(model) if self.packs is not None else contextlib.nullcontext()
        capture = self._capture_for(model)
        hook = capture.hook(model) if capture is not None else contextlib.nullcontext()
        try:
            with torch.inference_mode(), packed, hook as seen:
                self._captured = seen
                if self.continuous:
                    self._decode(model, prompt_ids, rows, sampling)
                else:
                    for start in range(0, len(rows), self.max_batch_size):
                        self._decode(model, prompt_ids, rows[start:start + self.max_batch_size], sampling)
        finally:
            self._captured = None
            model.train(was_training)
        return [self._finish(prompt_ids[r.prompt], r, sampling, capture) for r in rows]

    def _capture_for(self, model: Any) -> Any:
        """The frozen-prefix cache to fill in this call, or None: only while it is capturing, and only when decoding
        computes the states a training forward would (the policy's own weights, dense attention over the full KV)."""
        cache = self.frozen_prefix
        if cache is None or not cache.active or cache.full or cache.model is not self.model or model is not self.model:
            return None
        if self.speculative is not None or self.sparse_decode is not None or self.kv_compression is not None:
            return None
        return cache

    def _take_captured(self) -> torch.Tensor | None:
        """The states the capture hook saw in the forward that just ran (None when not capturing)."""
        if self._captured is None:
            return None
        states = self._captured[-1]
        self._captured.clear()
        return states

    def _prefill(self, model: Any, prompt_ids: list[list[int]], rows: list[_Row], max_new_tokens: int
                 ) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
        units = sorted({r.prompt for r in rows})
        unit_of = {p: k for k, p in enumerate(units)}
        width = max(len(prompt_ids[p]) for p in units)
        ids = torch.full((len(units), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(units), width), dtype=torch.long)
        for k, p in enumerate(units):
            seq = prompt_ids[p]
            ids[k, width - len(seq):] = torch.tensor(seq)
            mask[k, width - len(seq):] = 1
        device = model.device
        ids, mask = ids.to(device), mask.to(device)
        positions = (mask.cumsum(-1) - 1).clamp_(min=0)
        extra = min(max_new_tokens, self.cache_block)
        cache = new_cache(width + extra if self.preallocate else None)
        compress = self.kv_compression is not None and width > self.kv_compression.budget
        observe = observe_queries(model, self.kv_compression.observe) if compress else contextlib.nullcontext({})
        with observe as observed:
            # Without padding, no mask: SDPA then runs causal / grouped-query attention without materializing one.
            out = model(input_ids=ids, attention_mask=None if bool(mask.all()) else mask, position_ids=positions,
                        use_cache=True, logits_to_keep=1, **{self.cache_kw: cache})
        if compress:  # before the copy to the rows: a group of n shares one selection, each row the smaller cache
            dense_bytes = kv_cache_bytes(cache)
            mask = compress_prompt_cache(cache, observed, mask, self.kv_compression,
                                         extra=extra if self.preallocate else 0)
            stats = self.kv_compression_stats = self.kv_compression_stats or KVCompressionStats()
            stats.prefills += 1
            stats.rows += len(rows)
            stats.prompt_positions += width * len(rows)
            stats.kept_positions += mask.shape[1] * len(rows)
            stats.dense_kv_bytes += dense_bytes // len(units) * len(rows)
            stats.kept_kv_bytes += kv_cache_bytes(cache) // len(units) * len(rows)
        states = self._take_captured()
        if states is not None:  # each row starts from its prompt's states (padding cut; a view, shared by a group)
            for r in rows:
                r.hidden = [states[unit_of[r.prompt], width - len(prompt_ids[r.prompt]):]]
        expand = torch.tensor([unit_of[r.prompt] for r in rows], device=device)
        if len(units) != len(rows) or not torch.equal(expand.cpu(), torch.arange(len(rows))):
            cache.batch_select_indices(expand)  # one prefill per distinct prompt, copied to its rows
        return cache, out.logits[:, -1, :][expand], mask[expand], positions[expand, -1]

    def _decode(self, model: Any, prompt_ids: list[list[int]], rows: list[_Row], sampling: SamplingParams) -> None:
        """Decode every row of ``rows`` in at most ``max_batch_size`` slots. A row's tokens depend only on its own
        prompt and generator (padding is masked, positions are per row), so how rows share slots never changes them."""
        if self.speculative is not None:
            from agents.policy.s3r import s3r_decode

            s3r_decode(self, model, prompt_ids, rows, sampling)
            return
        slots = self.max_batch_size
        queue = list(range(len(rows)))
        live, queue = queue[:slots], queue[slots:]
        cache, logits, mask, last_pos = self._prefill(model, prompt_ids, [rows[i] for i in live],
                                                      sampling.max_new_tokens)
        unpadded = bool(mask.all())  # a prune keeps it so; a refill recomputes it
        stop_window = max((len(s) for s in sampling.stop), default=0) + 8
        refill_at = max(1, int(self.refill_fraction * slots))
        while live:
            uniforms = None
            if not sampling.greedy:
                uniforms = torch.cat([torch.rand(1, generator=rows[i].gen) for i in live]).to(logits.device)
            tokens, logps, ents = pick_tokens(logits, sampling, uniforms)
            tok_list, lp_list, ent_list = tokens.tolist(), logps.tolist(), ents.tolist()
            for b, i in enumerate(live):
                row = rows[i]
                if row.finish is not None:
                    continue
                row.ids.append(tok_list[b])
                row.logprobs.append(lp_list[b])
                row.entropies.append(ent_list[b])
                if tok_list[b] in self.eos:
                    row.finish = "stop"
                elif sampling.stop and any(
                        s in self.tokenizer.decode(row.ids[-stop_window:], skip_special_tokens=True)
                        for s in sampling.stop):
                    row.finish = "stop"
                elif len(row.ids) >= sampling.max_new_tokens:
                    row.finish = "length"
            alive = [b for b, i in enumerate(live) if rows[i].finish is None]
            free = slots - len(alive)
            refill = bool(queue) and free >= min(refill_at, len(queue))
            if not alive and not refill:
                break
            if refill or len(live) - len(alive) >= max(1, self.prune_fraction * len(live)):
                if len(alive) < len(live):
                    keep = torch.tensor(alive, device=mask.device, dtype=torch.long)
                    if alive:
                        cache.batch_select_indices(keep)
                    mask, last_pos, tokens = mask[keep], last_pos[keep], tokens[keep]
                    live = [live[b] for b in alive]
            if live:
                last_pos = last_pos + 1
                mask = torch.cat([mask, mask.new_ones((len(live), 1))], dim=-1)
                # One new token per row attends to every real cached position: the (B, 1, 1, L) boolean mask is the
                # padding mask itself, so we hand it over ready-made rather than have transformers rebuild a 4D mask.
                with self._decode_attention(model):
                    out = model(input_ids=tokens.unsqueeze(-1),
                                attention_mask=None if unpadded else mask[:, None, None, :].bool(),
                                position_ids=last_pos.unsqueeze(-1), use_cache=True, **{self.cache_kw: cache})
                logits = out.logits[:, -1, :]
                states = self._take_captured()
                if states is not None:  # rows that finished but still ride along get extra states; _finish cuts them
                    for b, i in enumerate(live):
                        rows[i].hidden.append(states[b])
            if refill:
                new, queue = queue[:free], queue[free:]
                c2, l2, m2, p2 = self._prefill(model, prompt_ids, [rows[i] for i in new], sampling.max_new_tokens)
                if live:
                    mask = merge_caches(cache, mask, c2, m2, extra=min(sampling.max_new_tokens, self.cache_block))
                    logits, last_pos = torch.cat([logits, l2]), torch.cat([last_pos, p2])
                else:
                    cache, logits, mask, last_pos = c2, l2, m2, p2
                live = live + new
                unpadded = bool(mask.all())

    def _decode_attention(self, model: Any) -> Any:
        """The attention one decode forward runs: the model's own, or ``sparse_decode``'s pattern (counted)."""
        if self.sparse_decode is None:
            return contextlib.nullcontext()
        from agents.policy.sparse import SparseStats, sparse_attention

        self.sparse_decode_stats = self.sparse_decode_stats or SparseStats()
        return sparse_attention(model, self.sparse_decode, self.sparse_decode_stats)

    def _finish(self, prompt: list[int], row: _Row, sampling: SamplingParams, capture: Any = None) -> Rollout:
        ids, lps, ents, reason = row.ids, row.logprobs, row.entropies, row.finish or "length"
        cut = cut_at_stop(self.tokenizer, ids, sampling.stop) if sampling.stop else None
        if cut is not None:
            k, text = cut
            ids, lps, ents, reason = ids[:k], lps[:k], ents[:k], "stop"
        else:
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
        if capture is not None and row.hidden:
            # the sequence the training forward feeds: the prompt and every response token but the last
            fed = len(prompt) + len(ids) - 1
            states = torch.cat(row.hidden)[:fed]  # outside inference mode: a tensor autograd may use
            if states.shape[0] == fed:
                capture.put(list(prompt) + list(ids[:-1]), states)
        row.hidden = []
        return Rollout(list(prompt), list(ids), text, list(lps), list(ents), reason, seed=row.seed)


def generate_with_abort(engine: RolloutEngine, prompts: Sequence[str] | Sequence[Sequence[int]], n: int,
                        sampling: SamplingParams, *, abort_after: int, markers: Sequence[str]) -> list[Rollout]:
    """Generate with a marker-gated abort, on any engine: every rollout first decodes up to ``abort_after`` tokens;
    one still running then is stopped (``finish_reason="abort"``) unless its text already contains one of
    ``markers`` (it has committed to an answer), in which case it continues to ``sampling.max_new_tokens``.

    The continuation is a second ``generate`` call on the rollout's own token ids (prompt + response so far), never
    on re-tokenized text, with its own seed derived from the rollout's: the joined rollout is a sample of the same
    policy, and its log-probs and entropies are those of the tokens as sampled.
    """
    if not isinstance(abort_after, int) or abort_after < 1:
        raise ValueError(f"abort_after must be an int >= 1, got {abort_after!r}")
    markers = tuple(markers)
    if not markers or any(not isinstance(m, str) or not m for m in markers):
        raise ValueError(f"markers must be non-empty strings, got {markers!r}")
    if abort_after >= sampling.max_new_tokens:
        return engine.generate(prompts, n, sampling)
    first = engine.generate(prompts, n, replace(sampling, max_new_tokens=abort_after))
    keep = [k for k, ro in enumerate(first) if ro.finish_reason == "length" and any(m in ro.text for m in markers)]
    for k, ro in enumerate(first):
        if ro.finish_reason == "length" and k not in keep:
            ro.finish_reason = "abort"
    if keep:
        rest = replace(sampling, max_new_tokens=sampling.max_new_tokens - abort_after)
        # the rollout's own seed, else (engines that do not report one) the call's seed and the rollout's index
        roots = [(getattr(first[k], "seed", None), k) for k in keep]
        seeds = [int(np.random.SeedSequence(int(s) if s is not None else int(sampling.seed or 0),
                                            spawn_key=(1,) if s is not None else (1, k)).generate_state(1, np.uint64)[0]
                     >> 1) for s, k in roots]
        tails = engine.generate([first[k].prompt_ids + first[k].response_ids for k in keep], 1, rest, seeds=seeds)
        tokenizer = getattr(engine, "tokenizer", None)
        for k, tail in zip(keep, tails):
            ro = first[k]
            ids = ro.response_ids + tail.response_ids
            text = tokenizer.decode(ids, skip_special_tokens=True) if tokenizer is not None else ro.text + tail.text
            ents = None if ro.entropies is None or tail.entropies is None else list(ro.entropies) + list(tail.entropies)
            first[k] = Rollout(list(ro.prompt_ids), ids, text, list(ro.logprobs) + list(tail.logprobs), ents,
                               tail.finish_reason, seed=getattr(ro, "seed", None),
                               meta={**getattr(ro, "meta", {}), "continued_at": abort_after})
    return first


@contextlib.contextmanager
def engine_options(engine: Any, **options: Any) -> Any:
    """Set attributes of ``engine`` (``sparse_decode=...``, ``speculative=...``, their stats) for the block and put
    the previous values back on exit, also on an exception. A GenerationController switches the trainer's own
    engine this way for one call, so the engine keeps its derived weights and the trainer's ``sync_weights``."""
    unknown = [name for name in options if not hasattr(engine, name)]
    if unknown:
        raise AttributeError(f"{type(engine).__name__} has no option(s) {unknown}")
    previous = {name: getattr(engine, name) for name in options}
    for name, value in options.items():
        setattr(engine, name, value)
    try:
        yield engine
    finally:
        for name, value in previous.items():
            setattr(engine, name, value)


def make_engine(policy: Any, backend: str = "hf", **kwargs: Any) -> RolloutEngine:
    """``hf`` (any CPU/GPU transformers model) or ``vllm`` (needs the ``vllm`` package and a GPU)."""
    if backend == "hf":
        return HFEngine(policy, **kwargs)
    if backend == "vllm":
        from agents.policy.vllm_engine import VLLMEngine

        return VLLMEngine(policy, **kwargs)
    raise ValueError(f"unknown backend {backend!r}; use 'hf' or 'vllm'")
