"""FLOPs of a training run, counted from the token counts the trainer actually processed (attention included).

Per token, a decoder's matmuls cost 2 FLOPs per weight of every linear layer (multiply + add), and causal attention at
context length ``c`` costs ``4 * c * d_attn`` per layer (``QK^T`` and ``AV``, ``d_attn`` = query heads x head dim);
norms, activations and softmax are left out (a few percent at these sizes). Counts:

- **generation**: a prefill of each distinct prompt per generation call (logits at its last position only), then one
  forward per response token at its context length: ``2 * N * r + 4 * L * d_attn * (P * r + r (r + 1) / 2)``.
- **training forward** over prompt + response (``T = P + r`` positions), the LM head only at the ``r`` response
  positions (the trainer never materializes prompt logits).
- **training backward**: gradients with respect to activations (2 FLOPs per weight per token) flow through every
  layer from the lowest trainable one up, the LM head included; gradients with respect to weights (2 more) only for
  trainable linears; attention backward is twice its forward in those layers. With every weight trainable a training
  token costs ``6 * N`` plus attention, the usual ``6 * N * tokens``.
- **no-grad passes** (old-policy or reference log-probs, entropy recomputation, a component's drift check) cost a
  training forward each.

Held-out evaluation is measurement, not training, and is not counted.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class FlopModel:
    n_linear: int  # weights of every linear layer, LM head included
    n_head: int  # LM head weights (its matmul runs only where logits are needed)
    n_layers: int
    d_attn: int  # query heads x head dim
    n_span: int  # linear weights (head excluded) from the lowest trainable layer up: what backward passes through
    span_layers: int  # decoder layers backward passes through
    n_trainable: int  # trainable linear weights (weight gradients)

    @classmethod
    def of(cls, model: torch.nn.Module, layers: Sequence[torch.nn.Module] | None = None) -> FlopModel:
        """Read a model's shape; ``layers`` are its decoder layers (trainable parameters must already be marked)."""
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
        n_linear = sum(m.weight.numel() for m in linears)
        n_head = head.weight.numel() if isinstance(head, torch.nn.Linear) else 0
        if isinstance(head, torch.nn.Linear) and head not in linears:
            n_linear += n_head
        cfg = getattr(model, "config", None)
        layers = list(layers or [])
        n_layers = len(layers) or int(getattr(cfg, "num_hidden_layers", 0) or 0)
        heads = int(getattr(cfg, "num_attention_heads", 0) or 0)
        head_dim = getattr(cfg, "head_dim", None) or (int(getattr(cfg, "hidden_size", 0) or 0) // max(1, heads))
        d_attn = heads * int(head_dim)
        # the lowest layer holding a trainable weight; a trainable embedding means every layer
        lowest = n_layers
        for k, layer in enumerate(layers):
            if any(p.requires_grad for p in layer.parameters()):
                lowest = k
                break
        embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
        if embed is not None and embed.weight.requires_grad and embed.weight is not getattr(head, "weight", None):
            lowest = 0
        span = layers[lowest:]
        n_span = sum(m.weight.numel() for layer in span for m in layer.modules() if isinstance(m, torch.nn.Linear))
        n_trainable = sum(m.weight.numel() for m in linears if m.weight.requires_grad)
        return cls(n_linear=n_linear, n_head=n_head, n_layers=n_layers, d_attn=d_attn, n_span=n_span,
                   span_layers=len(span), n_trainable=n_trainable)

    # -- one sequence ----------------------------------------------------------------------------------------------
    def _attention(self, layers: int, positions: int) -> float:
        """Causal attention over ``positions`` tokens (token k attends to k positions) in ``layers`` layers."""
        return 4.0 * layers * self.d_attn * positions * (positions + 1) / 2

    def prefill(self, prompt_len: int) -> float:
        return 2.0 * (self.n_linear - self.n_head) * prompt_len + 2.0 * self.n_head + self._attention(
            self.n_layers, prompt_len)

    def decode(self, prompt_len: int, response_len: int) -> float:
        r = response_len
        return 2.0 * self.n_linear * r + 4.0 * self.n_layers * self.d_attn * (prompt_len * r + r * (r + 1) / 2)

    def forward(self, prompt_len: int, response_len: int) -> float:
        """A training (or no-grad log-prob) forward over prompt + response, logits at response positions only."""
        t = prompt_len + response_len
        return (2.0 * (self.n_linear - self.n_head) * t + 2.0 * self.n_head * response_len
                + self._attention(self.n_layers, t))

    def backward(self, prompt_len: int, response_len: int) -> float:
        t = prompt_len + response_len
        activation = 2.0 * self.n_span * t + 2.0 * self.n_head * response_len
        weight = 2.0 * (self.n_trainable - (self.n_head if self._head_trainable else 0)) * t
        weight += 2.0 * self.n_head * response_len if self._head_trainable else 0.0
        return activation + weight + 2.0 * self._attention(self.span_layers, t)

    @property
    def _head_trainable(self) -> bool:
        # every linear trainable (full fine-tuning) is the only case where the head is: the trainer never trains a
        # head alone
        return self.n_trainable == self.n_linear

    # -- a batch ---------------------------------------------------------------------------------------------------
    def generation(self, prompt_lens: Iterable[int], response_lens: Iterable[int], distinct_prompt_lens: Iterable[int]
                   ) -> float:
        """A generation call: one prefill per distinct prompt, then every rollout's decode."""
        return (sum(self.prefill(p) for p in distinct_prompt_lens)
                + sum(self.decode(p, r) for p, r in zip(prompt_lens, response_lens)))

    def training(self, prompt_lens: Iterable[int], response_lens: Iterable[int], *, passes: int = 1,
                 no_grad_passes: int = 0) -> float:
        """``passes`` forward + backward passes and ``no_grad_passes`` forwards over every row."""
        total = 0.0
        for p, r in zip(prompt_lens, response_lens):
            fwd = self.forward(p, r)
            total += passes * (fwd + self.backward(p, r)) + no_grad_passes * fwd
        return total
