"""Frozen-prefix reuse: the hidden states that enter the first trained decoder layer, kept from decoding.

A trainer that trains only the last ``k`` decoder layers (``train_layers=k``) never changes the embeddings or the
layers before them. The hidden state entering layer ``L = n_layers - k`` at a position depends only on the tokens up
to it and those frozen weights, so the one the engine computed while decoding a rollout is the one the training
forward would compute again (up to fp32 rounding of other batch shapes). ``FrozenPrefixCache`` keeps them, keyed by
the exact token sequence fed to the model (``prompt + response[:-1]``); the loss forward then runs only layers
``L..`` on them (``agents.grpo.logprobs.response_features``), which on SmolLM2 with two trained layers skips 28 of
its 30 layers.

Safe by construction rather than by convention:

- a lookup is by the row's exact tokens, so a row a component edited, a replayed row or a row from another model
  misses and runs whole;
- every frozen parameter's version counter is recorded at capture; if any moved since (someone wrote to a frozen
  weight), every lookup misses;
- the engine captures only when it decodes with the policy's own fp32 weights and dense attention over a full KV
  cache (no bf16 copy, sparse decoding, KV compression or speculative drafts, each of which changes those states);
- only model types whose forward passes ``inputs_embeds`` straight to the first layer (:data:`MODEL_TYPES`) qualify.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch

# Decoder-only model types whose base model feeds ``inputs_embeds`` to the first layer unchanged (no embedding scale,
# as Gemma has): running ``layers[L:]`` on captured states through the model's own forward is then exact.
MODEL_TYPES = frozenset({"llama", "qwen2", "qwen3"})


def decoder_layer_list(model: torch.nn.Module) -> torch.nn.ModuleList | None:
    layers = getattr(getattr(model, "base_model", None), "layers", None)
    return layers if isinstance(layers, torch.nn.ModuleList) else None


def frozen_layer_count(model: torch.nn.Module) -> int:
    """How many leading decoder layers (with the embeddings) have no trainable parameter: 0 when the embeddings
    train, or the model does not qualify (:data:`MODEL_TYPES`)."""
    layers = decoder_layer_list(model)
    config = getattr(model, "config", None)
    if layers is None or getattr(config, "model_type", None) not in MODEL_TYPES:
        return 0
    if any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or ()):
        return 0  # the tail forward indexes layer types by position: only uniform full attention is split
    embed = model.get_input_embeddings()
    if any(p.requires_grad for p in embed.parameters()):
        return 0
    count = 0
    for layer in layers:
        if any(p.requires_grad for p in layer.parameters()):
            break
        count += 1
    return count


class FrozenPrefixCache:
    """Hidden states entering decoder layer ``layer`` of ``model``, by token sequence.

    ``capturing`` (a context manager the trainer wraps its rollout collection in) makes the engine record them;
    ``get(tokens)`` returns the ``(len(tokens), H)`` states or None. ``clear()`` forgets everything (the trainer
    calls it before each collection: only the newest rollouts are looked up). ``max_bytes`` bounds what is kept:
    past it, ``put`` keeps nothing more (those rows run whole; ``dropped`` counts them) and the engine stops
    capturing for the rest of the collection."""

    def __init__(self, model: torch.nn.Module, layer: int, *, max_bytes: int = 2 << 30) -> None:
        layers = decoder_layer_list(model)
        if layers is None:
            raise ValueError(f"{type(model).__name__} has no base_model.layers to split")
        if not 0 < layer < len(layers):
            raise ValueError(f"layer must be in [1, {len(layers) - 1}], got {layer}")
        if frozen_layer_count(model) < layer:
            raise ValueError(f"layers before {layer} (and the embeddings) must be frozen, and the model type one of "
                             f"{sorted(MODEL_TYPES)}; {frozen_layer_count(model)} leading layers are frozen")
        self.model, self.layer = model, layer
        self._frozen = [*model.get_input_embeddings().parameters(),
                        *(p for block in list(layers)[:layer] for p in block.parameters())]
        self._versions = self._snapshot()
        self._store: dict[tuple[int, ...], torch.Tensor] = {}
        self.active = False  # set by ``capturing``: engines record only then
        self.max_bytes = int(max_bytes)
        self.clear()

    def _snapshot(self) -> tuple[int, ...]:
        return tuple(p._version for p in self._frozen)

    def valid(self) -> bool:
        """False once any frozen parameter was written to after this cache was made (then nothing is served)."""
        return self._snapshot() == self._versions

    @contextlib.contextmanager
    def capturing(self) -> Iterator[FrozenPrefixCache]:
        self.active = True
        try:
            yield self
        finally:
            self.active = False

    def clear(self) -> None:
        """Forget every kept state and reset the counters."""
        self._store.clear()
        self.nbytes = 0
        self.hits = self.misses = self.dropped = 0

    @property
    def full(self) -> bool:
        """True once a state was kept out for the budget (the engine then stops capturing until ``clear``)."""
        return self.dropped > 0 or self.nbytes >= self.max_bytes

    def __len__(self) -> int:
        return len(self._store)

    def put(self, tokens: Sequence[int], hidden: torch.Tensor) -> None:
        if hidden.dim() != 2 or hidden.shape[0] != len(tokens):
            raise ValueError(f"need ({len(tokens)}, H) states for {len(tokens)} tokens, got {tuple(hidden.shape)}")
        size = hidden.numel() * hidden.element_size()
        if self.nbytes + size > self.max_bytes:
            self.dropped += 1
            return
        key = tuple(tokens)
        old = self._store.get(key)
        if old is not None:
            self.nbytes -= old.numel() * old.element_size()
        self._store[key] = hidden
        self.nbytes += size

    def get(self, tokens: Sequence[int]) -> torch.Tensor | None:
        hit = self._store.get(tuple(tokens)) if self.valid() else None
        if hit is None:
            self.misses += 1
        else:
            self.hits += 1
        return hit

    @contextlib.contextmanager
    def hook(self, model: torch.nn.Module) -> Iterator[list[torch.Tensor]]:
        """While open, each forward of ``model`` appends the hidden states entering layer ``layer`` to the yielded
        list (what the engine reads after each prefill or decode forward)."""
        seen: list[torch.Tensor] = []

        def grab(_module: Any, args: tuple, kwargs: dict) -> None:
            seen.append(args[0] if args else kwargs["hidden_states"])

        handle = decoder_layer_list(model)[self.layer].register_forward_pre_hook(grab, with_kwargs=True)
        try:
            yield seen
        finally:
            handle.remove()


def tail_forward(model: torch.nn.Module, layer: int, hidden: torch.Tensor) -> torch.Tensor:
    """The base model's last hidden states (after its final norm) for right-padded input states ``hidden``
    ``(B, T, H)`` entering decoder layer ``layer``: the model's own forward with ``inputs_embeds`` and only
    ``layers[layer:]`` in place (positions ``0..T-1``; right padding never reaches a real position through the causal
    mask). Autograd flows into the trained layers as in a whole forward."""
    base = model.base_model
    layers = base.layers
    base.layers = torch.nn.ModuleList(list(layers)[layer:])
    try:
        return base(inputs_embeds=hidden, use_cache=False).last_hidden_state
    finally:
        base.layers = layers
