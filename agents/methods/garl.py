"""GARL / PAFT (seed 004): the Tsallis q-log loss family J_Q. Stage: Loss (two components, ``garl`` and ``paft``).

With P = P_theta(correct | x) a prompt's success probability and ln_q the Tsallis q-logarithm,
``J_Q = E_x ln_q P = E_x (P^(1-q) - 1) / (1 - q)`` interpolates between RLVR (q = 0: J = P - 1) and the log marginal
likelihood of a correct answer (q = 1: J = log P). Every member has the same per-prompt gradient direction:

    grad J_Q = P^(-q) * grad P                              (prior form: amplified RL gradient)
             = P^(1-q) * E_{y ~ pi(y | x, correct)} grad log pi(y | x)     (posterior form: attenuated SFT)

since grad P = P * E_posterior grad log pi. The amplification P^(-q) is what escapes cold start (small p0). Both Monte
Carlo estimators take a group of M samples of one prompt with K correct, P_hat = K / M:

- ``garl`` (Gradient-Amplified RL, prior samples): the group's policy-gradient token losses times

      s_g = max(P_hat_g, p_min)^(-q),      p_min = 1/M_g by default (so s_g <= M^q: the floor bounds the
                                            amplification where P_hat is 0 or tiny; the estimator's bias is
                                            O(q / (M P^(q+1))) either way)

  on top of PPO-clip (``ppo_clip`` of agents/grpo/baselines.py, same clip, aggregation, row weights, KL and replay
  handling). Scaling the advantages of a group by s_g > 0 is exactly scaling its clipped token losses by s_g
  (max(-sA r, -sA clip r) = s max(-A r, -A clip r)), so the loss is PPO-clip on advantages A_i * s_g. At q = 0 every
  s_g = 1 and the loss is the PPO-clip loss it builds on, bit for bit.
- ``paft`` (Posterior-Attenuated Fine-Tuning, posterior samples): SFT on the group's correct samples only,

      loss = -(1/G) sum_g P_hat_g^(1-q) * (1/K_g) sum_{i in g, correct} w_i * mean_t log pi(y_it)

  over the G groups of the whole batch (w_i the row weights). Incorrect samples give no gradient; a group with no
  correct sample (K_g = 0) contributes 0. At q = 1 every prompt with a success weighs 1 (grad log P); at q = 0 the
  weight is K/M per group, 1/M per correct sample: rejection-sampling fine-tuning, the baseline-free grad P.

Both losses are normalized by the WHOLE batch (group statistics come from every row, not just the micro-batch's), so
the losses (and gradients) of a partition of the rows add up to the full-batch loss, as the trainer's micro-batching
requires.

Our reading (each a hyper-parameter):
- Which RL gradient GARL amplifies: whatever advantages the recipe's advantage stage wrote. ``agents/recipes/garl.toml``
  keeps GRPO's z-scored advantage and PPO-clip, so GARL differs from the GRPO baseline by the amplification alone and
  equals it at q = 0 (the comparison isolates the paper's mechanism). ``advantage = "dr_grpo"`` gives the textbook
  estimator, REINFORCE with the group-mean baseline, s_g * (1/M) sum_i (r_i - mean_g) grad log pi. Note that GRPO's
  std division already amplifies a binary-reward group by about P_hat^(-1/2) when P_hat is small, so with GRPO
  advantages the rare-success amplification is about P_hat^-(q + 1/2).
- Success = the env's verdict (``batch.correct``), not the (possibly shaped) reward; P_hat counts the group's rows in
  the batch (ragged groups: each its own M).
- ``p_min``: None = 1/M_g per group (the paper's max(P_hat, 1/M)); a number fixes the floor for every group.
- ``normalize`` (default True): divide every s_g by the mean s_g over the groups with signal (any non-zero advantage),
  so the mean amplification per step is 1. Under AdamW a global factor on the gradient is almost a no-op (Adam divides
  by the gradient's running RMS) but it does change how often ``max_grad_norm`` clips and how the steps of a run
  weigh against each other; normalizing keeps the gradient at GRPO's scale (the same lr and clip are comparable) and
  keeps what the paper says matters, the reweighting of prompts against each other ("reweights each instance
  independently of the learning rate"). Consequence: a step whose groups with signal all have the same P_hat is
  trained exactly like GRPO. ``normalize = false`` applies the raw P_hat^(-q).
- Groups with P_hat = 0 (and P_hat = 1) have no gradient under REINFORCE with a group baseline: r_i - mean_g = 0 for
  every row (GRPO's advantage too), whatever s_g is. The amplification acts only once a prompt has one success, which
  is where cold start stalls under GRPO: one success in M gets a small share of the update. PAFT is blind to all-wrong
  prompts the same way.
- PAFT's normalization: the paper "importance-resamples from the posterior and runs standard SFT". Resampling from the
  M prior samples with weights proportional to r_i picks each correct sample with probability 1/K; we take that
  expectation (every correct sample at 1/K, no resampling noise) times the prompt's weight P_hat^(1-q), then average
  over the prompts of the batch (``within_group = "mean"``). ``within_group = "sum"`` drops the 1/K (each correct
  sample weighs P_hat^(1-q): prompts with more successes weigh more, a different estimator, kept for comparison).
- PAFT's per-sample term is the mean token log-prob (``token_agg = "mean"``, the scale of GRPO's per-response token
  mean, independent of length); ``token_agg = "sum"`` is the exact sequence log-prob log pi(y | x). PAFT takes no
  importance ratio (plain SFT): replayed rows and PPO epochs are trained like fresh ones.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import torch

from agents.grpo.baselines import PPOClipLoss
from agents.grpo.batch import GroupBatch, group_sum
from agents.grpo.comparisons import FINITE_POOL, Comparison, declare
from agents.grpo.registry import Component, register

# An advantage smaller than this counts as none (a constant group's r - mean can be a rounding error, not signal).
_SIGNAL_TOL = 1e-8


def _check_q(q: float) -> float:
    q = float(q)
    if not math.isfinite(q) or not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be in [0, 1] (0: RLVR, 1: log marginal likelihood), got {q!r}")
    return q


def success_rates(batch: GroupBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(inverse, p_hat, size)``: each row's group, and per group the success rate K/M and the size M (float64)."""
    inverse, keys = batch.group_index()
    size = torch.bincount(inverse, minlength=len(keys)).double()
    k = group_sum(batch.correct.double(), inverse, len(keys))
    return inverse, k / size.clamp(min=1), size


def _row_signal(batch: GroupBatch) -> torch.Tensor:
    """(B,) bool: the row has a non-zero advantage (on one of its response tokens, for per-token advantages)."""
    adv = batch.advantages
    if adv is None:
        return torch.zeros(len(batch), dtype=torch.bool)
    if adv.dim() == 1:
        return adv.abs() > _SIGNAL_TOL
    width = min(adv.shape[1], batch.response_mask.shape[1])
    return ((adv[:, :width].abs() > _SIGNAL_TOL) & batch.response_mask[:, :width]).any(dim=1)


def garl_scales(batch: GroupBatch, q: float, p_min: float | None = None, normalize: bool = True
                ) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-row amplification s_g = max(P_hat_g, p_min)^(-q) (p_min None: 1/M_g), divided by the mean s_g over groups
    with signal when ``normalize``; and the step's statistics. Depends on the whole batch only."""
    inverse, p_hat, size = success_rates(batch)
    floor = 1.0 / size.clamp(min=1) if p_min is None else torch.full_like(p_hat, float(p_min))
    raw = torch.maximum(p_hat, floor) ** (-q)
    signal = group_sum(_row_signal(batch).double(), inverse, len(p_hat)) > 0  # a group with any signal
    mean_signal = float(raw[signal].mean()) if bool(signal.any()) else 1.0
    scale = raw / mean_signal if normalize else raw
    stats = {"p_hat_mean": float(p_hat.mean()), "signal_groups": float(signal.sum()),
             "raw_scale_mean": mean_signal,  # mean raw amplification over groups with signal (the normalizer)
             "scale_max": float(scale[signal].max()) if bool(signal.any()) else 0.0}
    return scale[inverse], stats


@register("garl", stage="loss")
class GARLLoss(PPOClipLoss):
    """Gradient-Amplified RL: PPO-clip with each group's advantages times max(P_hat, 1/M)^(-q) (module docstring)."""

    def __init__(self, q: float = 0.75, p_min: float | None = None, normalize: bool = True, clip_low: float = 0.2,
                 clip_high: float = 0.2, aggregation: str = "seq-mean-token-mean", kl_coef: float = 0.0,
                 norm_len: int | None = None):
        self.q = _check_q(q)
        if p_min is not None and not (math.isfinite(float(p_min)) and 0.0 < float(p_min) <= 1.0):
            raise ValueError(f"p_min must be in (0, 1] or None (1/M per group), got {p_min!r}")
        if not isinstance(normalize, bool):
            raise ValueError(f"normalize must be true or false, got {normalize!r}")
        super().__init__(clip_low, clip_high, aggregation, kl_coef, norm_len)
        self.p_min = None if p_min is None else float(p_min)
        self.normalize = normalize
        self._stats: dict[str, float] = {}

    def scales(self, batch: GroupBatch) -> torch.Tensor:
        """(B,) the amplification of each row's policy-gradient token losses."""
        return garl_scales(batch, self.q, self.p_min, self.normalize)[0]

    def __call__(self, batch: GroupBatch, logprobs: torch.Tensor, rows: Sequence[int] | torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, dict[str, float]]:
        if batch.advantages is None:
            raise ValueError("loss/garl: the batch has no advantages (the advantage stage runs before the loss)")
        scale = self.scales(batch).to(batch.advantages.dtype)
        adv = batch.advantages * (scale if batch.advantages.dim() == 1 else scale[:, None])
        # s > 0 commutes with PPO-clip's max: scaling the advantages scales the clipped token losses, not the KL term
        return super().__call__(dataclasses.replace(batch, advantages=adv), logprobs, rows)

    def observe(self, batch: GroupBatch) -> None:
        self._stats = garl_scales(batch, self.q, self.p_min, self.normalize)[1] if batch.advantages is not None else {}

    def metrics(self) -> dict[str, float]:
        return dict(self._stats)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "q": self.q, "p_min": self.p_min, "normalize": self.normalize}


def paft_weights(batch: GroupBatch, q: float, within_group: str = "mean") -> torch.Tensor:
    """(B,) float64: each row's SFT weight before the 1/G batch mean: P_hat^(1-q) / K for a correct row
    (``within_group="sum"``: P_hat^(1-q)), 0 for an incorrect row. Row weights (``batch.weights``) are not included."""
    inverse, p_hat, size = success_rates(batch)
    k = p_hat * size
    per_group = p_hat ** (1.0 - q)  # 0^(1-q) = 0 for q < 1; at q = 1 an all-wrong group still has no correct row
    if within_group == "mean":
        per_group = per_group / k.clamp(min=1)
    return torch.where(batch.correct, per_group[inverse], torch.zeros_like(per_group[inverse]))


@register("paft", stage="loss")
class PAFTLoss(Component):
    """Posterior-Attenuated Fine-Tuning: SFT on each group's correct samples, weighted P_hat^(1-q) (module docstring)."""

    def __init__(self, q: float = 0.75, within_group: str = "mean", token_agg: str = "mean"):
        self.q = _check_q(q)
        if within_group not in ("mean", "sum"):
            raise ValueError(f"within_group must be 'mean' or 'sum', got {within_group!r}")
        if token_agg not in ("mean", "sum"):
            raise ValueError(f"token_agg must be 'mean' or 'sum', got {token_agg!r}")
        self.within_group, self.token_agg = within_group, token_agg
        self._stats: dict[str, float] = {}

    def weights(self, batch: GroupBatch) -> torch.Tensor:
        """(B,) each row's coefficient in the loss: P_hat^(1-q) / K (or without / K), times its row weight, over G."""
        w = paft_weights(batch, self.q, self.within_group)
        if batch.weights is not None:
            w = w * batch.weights.double()
        return w / max(1, batch.num_groups)

    def __call__(self, batch: GroupBatch, logprobs: torch.Tensor, rows: Sequence[int] | torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, dict[str, float]]:
        """Loss of ``rows`` given their current log-probs ``(len(rows), W)``; normalized by the whole batch's groups,
        so the losses of a partition of the rows add up to the full-batch loss."""
        rows = torch.arange(len(batch)) if rows is None else torch.as_tensor(rows, dtype=torch.long)
        width = logprobs.shape[1]
        mask = batch.response_mask[rows, :width].to(logprobs.dtype)
        per_seq = (logprobs * mask).sum(dim=1)
        if self.token_agg == "mean":
            per_seq = per_seq / mask.sum(dim=1).clamp(min=1)  # an empty response: 0, never a division by 0
        coef = self.weights(batch)[rows].to(logprobs.dtype)
        loss = -(coef * per_seq).sum()
        with torch.no_grad():
            metrics = {"tokens": float(mask.sum()), "sft_rows": float((coef > 0).sum()),
                       "sft_tokens": float((mask * (coef > 0).to(mask.dtype)[:, None]).sum())}
        return loss, metrics

    def observe(self, batch: GroupBatch) -> None:
        _, p_hat, _ = success_rates(batch)
        w = paft_weights(batch, self.q, self.within_group)
        self._stats = {"p_hat_mean": float(p_hat.mean()), "sft_rows": float((w > 0).sum()),
                       "groups_with_success": float((p_hat > 0).sum()),
                       # the mean prompt weight P_hat^(1-q) over the batch (what 1/G times the SFT sum carries)
                       "prompt_weight_mean": float((p_hat ** (1.0 - self.q) * (p_hat > 0)).mean())}

    def metrics(self) -> dict[str, float]:
        return dict(self._stats)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "q": self.q, "within_group": self.within_group, "token_agg": self.token_agg}


# The hard Countdown variant of agents/methods/hint.py (same overrides and tag, so the GRPO baseline runs are shared):
# targets 60-120, beyond the warm start's 2-40, where the untrained policy solves 0.9% of samples - the cold start.
_HARD = (*FINITE_POOL, "env_kwargs.min_target=60", "env_kwargs.max_target=120")
declare(Comparison(
    method="garl", baseline="grpo", metric="final_accuracy", direction="higher", tag="hard", overrides=_HARD,
    claim="GARL (q = 0.75) escapes cold start where GRPO stalls: amplifying each prompt's RL gradient by "
          "max(P_hat, 1/M)^(-q) 'substantially mitigates cold-start stalling, escaping cold start where GRPO fails "
          "entirely' (FinQA, HotPotQA, MuSiQue; here: Countdown-3 with targets 60-120, beyond the warm start's 2-40)",
    known_result=(
        "micro lane, seeds 0-2 at 60211bd: final mean@4 0.335 vs GRPO 0.337, diff -0.002 [-0.046, +0.054]: not "
        "reproduced. GRPO does not stall on this setting (step-0 0.015-0.024 -> 0.295 / 0.347 / 0.370), so the "
        "premise is not met; GARL finished ahead on seed 0 (0.345) and behind on seeds 1-2 (0.326, 0.335)")))
declare(Comparison(
    method="paft", baseline="grpo", metric="final_accuracy", direction="higher", tag="hard", overrides=_HARD,
    claim="PAFT (q = 0.75: SFT on correct samples weighted P_hat^(1-q)) learns from a small success probability p0 "
          "where GRPO stalls (the paper: both estimators address cold start; PAFT at q = 0.75 best on HotPotQA, 47.9 "
          "maj@16, +14.4 over GRPO; here: Countdown-3 with targets 60-120, beyond the warm start's 2-40)",
    known_result=(
        "micro lane, seeds 0-2 at 60211bd: final mean@4 0.374 vs GRPO 0.337, diff +0.036 [-0.001, +0.074]: "
        "inconclusive. Ahead on seeds 0-1 (0.361, 0.391 vs 0.295, 0.347), even on seed 2 (0.369 vs 0.370); GRPO "
        "does not stall on this setting, so the premise is not met")))
