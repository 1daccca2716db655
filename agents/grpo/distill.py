"""The student's own samples scored under a second context: token log-probs and per-token divergences between the
policy reading the plain prompt (the student) and the same weights reading a privileged one (the teacher: the prompt
with a verified solution, a hint, feedback), for the self-distillation losses (agents/methods/opsd.py, distil.py).

``context_stats`` runs the backbone over ``student prompt + response`` (with gradients) and over ``teacher prompt +
response`` (without), both in the length-bucketed path of ``agents.grpo.logprobs``, keeps only the hidden states that
predict response tokens, and walks them through the head ``chunk`` rows at a time. Per chunk it forms both rows'
logits, the student's token log-probs and entropies, the teacher's token log-probs and the chosen divergence between
the two next-token distributions. The teacher is either the policy itself (a live teacher) or a frozen copy of it
(``teacher_model``: OPSD's specification and public code use the initial policy). The chunk function runs under activation checkpointing, so no ``(N, V)`` tensor
outlives its chunk: backward recomputes one chunk's logits at a time (one extra lm_head matmul per chunk, the price
of the memory). The teacher side is computed under ``no_grad`` and never receives gradients (a stop-gradient teacher).

Divergences, per response token t, with S = softmax(z_student / T), Q = softmax(z_teacher / T) over the vocabulary
(``divergence``'s name -> formula; our reading of each paper's "generalized JSD" / "forward cross-entropy" is in the
method files):

- ``"jsd"`` (generalized Jensen-Shannon, ``beta`` in [0, 1], as GKD and OPSD's public code define it):
  M = beta Q + (1 - beta) S,  D = beta KL(Q || M) + (1 - beta) KL(S || M); the ends are the two KLs themselves
  (beta = 0: KL(Q || S), forward; beta = 1: KL(S || Q), reverse), since the mixture form vanishes there.
- ``"forward_ce"``: H(Q, S) = -sum_v Q_v log S_v (the same gradient as KL(Q || S); DistIL's loss).
- ``"none"``: only token log-probs (RLCSD reads the teacher's token log-probs and nothing else).

Temperature ``T`` divides both rows' logits, as the rollouts were sampled (see agents/grpo/logprobs.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

from agents.grpo.logprobs import _separable_head, check_temperature, response_features

DIVERGENCES = ("jsd", "forward_ce", "none")


@dataclass
class ContextStats:
    """Per response token, ``(B, W)`` each, zero past a row's end."""

    logprobs: torch.Tensor  # student log pi(y_t | x, y_<t), with gradients
    entropies: torch.Tensor  # student entropy (detached)
    teacher_logprobs: torch.Tensor  # log pi(y_t | x', y_<t) under the teacher context (no gradients)
    divergence: torch.Tensor | None  # D_t(student, teacher), gradients into the student (None for "none")


def check_divergence(divergence: str, beta: float) -> None:
    if divergence not in DIVERGENCES:
        raise ValueError(f"divergence must be one of {DIVERGENCES}, got {divergence!r}")
    if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must be a number in [0, 1], got {beta!r}")


def token_divergence(student_logits: torch.Tensor, teacher_logits: torch.Tensor, divergence: str = "jsd",
                     beta: float = 0.5) -> torch.Tensor:
    """``D`` per row of ``(N, V)`` logits (already divided by the temperature); see the module docstring."""
    check_divergence(divergence, beta)
    log_s = torch.log_softmax(student_logits.float(), -1)
    log_q = torch.log_softmax(teacher_logits.float(), -1)
    if divergence == "forward_ce":
        return -(log_q.exp() * log_s).sum(-1)
    if divergence == "none":
        return torch.zeros(log_s.shape[0], dtype=log_s.dtype)
    if beta == 0.0:
        return (log_q.exp() * (log_q - log_s)).sum(-1)
    if beta == 1.0:
        return (log_s.exp() * (log_s - log_q)).sum(-1)
    log_m = torch.logsumexp(torch.stack([log_q + math.log(beta), log_s + math.log1p(-beta)]), 0)
    kl_q = (log_q.exp() * (log_q - log_m)).sum(-1)
    kl_s = (log_s.exp() * (log_s - log_m)).sum(-1)
    return beta * kl_q + (1.0 - beta) * kl_s


def _logits(x: torch.Tensor, head: torch.nn.Linear | None, temperature: float) -> torch.Tensor:
    z = x if head is None else torch.nn.functional.linear(x, head.weight, head.bias)
    return z.float() / temperature


def _chunk(h_student: torch.Tensor, h_teacher: torch.Tensor, targets: torch.Tensor, head: torch.nn.Linear | None,
           teacher_head: torch.nn.Linear | None, temperature: float, divergence: str, beta: float
           ) -> tuple[torch.Tensor, ...]:
    z_s = _logits(h_student, head, temperature)
    with torch.no_grad():
        z_t = _logits(h_teacher, teacher_head, temperature)
        log_q = torch.log_softmax(z_t, -1)
        teacher_lp = log_q.gather(1, targets[:, None]).squeeze(1)
    log_s = torch.log_softmax(z_s, -1)
    lp = log_s.gather(1, targets[:, None]).squeeze(1)
    with torch.no_grad():
        ent = -(log_s.exp() * log_s).sum(-1)
    div = token_divergence(z_s, z_t, divergence, beta) if divergence != "none" else torch.zeros_like(lp)
    return lp, ent, teacher_lp, div


def context_stats(model: torch.nn.Module, student_prompt_ids: Sequence[Sequence[int]],
                  teacher_prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]], *,
                  divergence: str = "jsd", beta: float = 0.5, temperature: float = 1.0, chunk: int = 64,
                  pad_id: int = 0, autocast_bf16: bool = False, bucket_slack: float | None = 0.25,
                  teacher_model: torch.nn.Module | None = None) -> ContextStats:
    """Student and teacher statistics of ``response_ids`` (see ``ContextStats``). ``chunk``: head rows per step
    times the number of rows (as ``response_logprobs``'s ``chunk``). ``teacher_model``: the weights that read the
    teacher prompts (a frozen copy of the start policy); None: ``model`` itself (a live teacher)."""
    if not (len(student_prompt_ids) == len(teacher_prompt_ids) == len(response_ids)):
        raise ValueError(f"need one student prompt, one teacher prompt and one response per row, got "
                         f"{len(student_prompt_ids)}, {len(teacher_prompt_ids)} and {len(response_ids)}")
    check_divergence(divergence, beta)
    temperature = check_temperature(temperature)
    n_rows, width = len(response_ids), max(1, max((len(r) for r in response_ids), default=1))
    head = _separable_head(model)
    teacher = model if teacher_model is None else teacher_model
    teacher_head = head if teacher_model is None else _separable_head(teacher_model)
    if (head is None) != (teacher_head is None):
        raise ValueError("student and teacher models must have the same head layout")
    device = next(model.parameters()).device.type
    with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast_bf16):
        h_s, rows, cols, targets = response_features(model, student_prompt_ids, response_ids, pad_id=pad_id,
                                                     bucket_slack=bucket_slack, head=head)
        with torch.no_grad():
            h_t, t_rows, t_cols, _ = response_features(teacher, teacher_prompt_ids, response_ids, pad_id=pad_id,
                                                       bucket_slack=bucket_slack, head=head)
        # the two passes bucket rows by their own lengths: put the teacher's features in the student's token order
        order = torch.empty(n_rows * width, dtype=torch.long)
        order[t_rows * width + t_cols] = torch.arange(len(t_rows))
        h_t = h_t[order[rows * width + cols]].detach()
        step = max(1, chunk * n_rows)
        parts = []
        for s in range(0, h_s.shape[0], step):
            args = (h_s[s:s + step], h_t[s:s + step], targets[s:s + step], head, teacher_head, temperature,
                    divergence, beta)
            parts.append(checkpoint(_chunk, *args, use_reentrant=False) if torch.is_grad_enabled()
                         else _chunk(*args))
    lp, ent, teacher_lp, div = (torch.cat(x) for x in zip(*parts))
    index = (rows, cols)

    def place(values: torch.Tensor) -> torch.Tensor:
        return torch.zeros(n_rows, width, dtype=values.dtype).index_put(index, values)

    return ContextStats(logprobs=place(lp), entropies=place(ent.detach()), teacher_logprobs=place(teacher_lp),
                        divergence=None if divergence == "none" else place(div))
