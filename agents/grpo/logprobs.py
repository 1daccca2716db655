"""Per-token log-probs and entropies of response tokens under a causal LM, without full-vocabulary fp32 logits.

The backbone runs once over ``prompt + response`` (right-padded); only the hidden states that predict response tokens
are kept, and the LM head + log-softmax run over them in chunks of ``chunk`` positions. Under autograd each chunk is
checkpointed, so the backward pass recomputes one chunk's logits at a time instead of keeping ``(B, T, V)`` fp32
activations alive.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.utils.checkpoint import checkpoint


def _head_logprobs(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    logits = torch.nn.functional.linear(hidden, weight, bias).float()
    logz = torch.logsumexp(logits, dim=-1)
    token_lp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - logz
    with torch.no_grad():
        probs = torch.softmax(logits, dim=-1)
        entropy = logz - (probs * logits).sum(-1)
    return token_lp, entropy


def pack(prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]], pad_id: int = 0
         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ``input_ids``, ``attention_mask``, the positions whose hidden state predicts each response token
    ``(B, W)`` and the response token ids ``(B, W)`` (W = longest response)."""
    lengths = [len(p) + len(r) for p, r in zip(prompt_ids, response_ids)]
    total, width = max(lengths), max(1, max(len(r) for r in response_ids))
    n = len(prompt_ids)
    input_ids = torch.full((n, total), pad_id, dtype=torch.long)
    attention = torch.zeros(n, total, dtype=torch.long)
    positions = torch.zeros(n, width, dtype=torch.long)
    targets = torch.zeros(n, width, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompt_ids, response_ids)):
        if not p:
            raise ValueError("every sequence needs at least one prompt token (the first response token is predicted "
                             "from the last prompt position)")
        seq = list(p) + list(r)
        input_ids[i, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        attention[i, : len(seq)] = 1
        k = len(r)
        positions[i, :k] = torch.arange(len(p) - 1, len(p) - 1 + k)
        targets[i, :k] = torch.tensor(list(r), dtype=torch.long)
    return input_ids, attention, positions, targets


def response_logprobs(model: torch.nn.Module, prompt_ids: Sequence[Sequence[int]],
                      response_ids: Sequence[Sequence[int]], *, chunk: int = 64, pad_id: int = 0,
                      autocast_bf16: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logprobs, entropies)``, each ``(B, W)``, zero past each response's end. Gradients flow into ``logprobs``
    when grad is enabled; entropies are detached (for logging)."""
    input_ids, attention, positions, targets = pack(prompt_ids, response_ids, pad_id)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast_bf16):
        token_lp, ent = _forward(model, input_ids, attention, positions, targets, chunk)
    mask = torch.zeros_like(token_lp, dtype=torch.bool)
    for i, r in enumerate(response_ids):
        mask[i, : len(r)] = True
    return token_lp * mask, ent.detach() * mask


def _forward(model: torch.nn.Module, input_ids: torch.Tensor, attention: torch.Tensor, positions: torch.Tensor,
             targets: torch.Tensor, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    backbone = getattr(model, "base_model", None)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if backbone is None or backbone is model or head is None:  # no separable head: full logits
        logits = model(input_ids=input_ids, attention_mask=attention).logits
        picked = logits.gather(1, positions.unsqueeze(-1).expand(-1, -1, logits.shape[-1])).float()
        lp = torch.log_softmax(picked, -1)
        return lp.gather(-1, targets.unsqueeze(-1)).squeeze(-1), -(lp.exp() * lp).sum(-1).detach()
    hidden = backbone(input_ids=input_ids, attention_mask=attention).last_hidden_state
    picked = hidden.gather(1, positions.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))  # (B, W, H)
    weight, bias = head.weight, head.bias
    lps, ents = [], []
    for start in range(0, picked.shape[1], chunk):
        h, t = picked[:, start:start + chunk], targets[:, start:start + chunk]
        if torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad):
            lp, ent = checkpoint(_head_logprobs, h, weight, bias, t, use_reentrant=False)
        else:
            lp, ent = _head_logprobs(h, weight, bias, t)
        lps.append(lp)
        ents.append(ent)
    return torch.cat(lps, 1), torch.cat(ents, 1)
