"""``GroupBatch``: one training step's rollouts as ragged groups.

A group is every rollout of one prompt; groups are keyed by a group id and may have any size (VIGOR gives some prompts
more rollouts than others). Per-token fields are right-padded to the longest response and masked by
``response_mask`` (False on padding, and on the env's tokens inside a multi-turn episode). Group statistics use
``group_index`` (an inverse index into the groups) and scatter ops, so no stage reshapes the batch to
``(n_groups, G)`` - that shape cannot express ragged groups.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch

_TOKEN_FIELDS = ("behaviour_logprobs", "old_logprobs", "ref_logprobs", "entropies", "response_mask", "policy_logprobs")
_ROW_FIELDS = ("rewards", "base_rewards", "correct")
# Optional per-row fields and the value a row without one has.
_OPTIONAL_ROW_FIELDS = {"weights": 1.0, "off_policy": False}
_LIST_FIELDS = ("group_ids", "prompt_ids", "response_ids", "texts", "prompts", "infos", "finish_reasons")


@dataclass
class Sample:
    """One scored rollout, as the rollout stage produces it."""

    group_id: str
    prompt: str
    prompt_ids: list[int]
    response_ids: list[int]
    text: str
    reward: float
    correct: bool = False
    logprobs: Sequence[float] | None = None
    entropies: Sequence[float] | None = None
    finish_reason: str = "stop"
    info: dict[str, Any] = field(default_factory=dict)
    # per response token, True where the model sampled it; None = every token (a single-turn response). A multi-turn
    # episode's env tokens are False: they stay out of the loss (response_mask) and their log-probs are 0.
    token_mask: Sequence[bool] | None = None


@dataclass
class GroupBatch:
    group_ids: list[str]
    prompts: list[str]
    prompt_ids: list[list[int]]
    response_ids: list[list[int]]
    texts: list[str]
    infos: list[dict[str, Any]]
    finish_reasons: list[str]
    rewards: torch.Tensor  # (B,) the reward the optimizer sees, after shaping
    base_rewards: torch.Tensor  # (B,) the env's reward, never shaped (what eval and metrics report)
    correct: torch.Tensor  # (B,) bool
    response_mask: torch.Tensor  # (B, L) bool
    behaviour_logprobs: torch.Tensor  # (B, L) log-probs of the sampled tokens under the sampler (0 where unknown)
    entropies: torch.Tensor  # (B, L) sampler's token entropies (0 where unknown)
    old_logprobs: torch.Tensor | None = None  # (B, L) policy before this update (PPO ratio denominator)
    ref_logprobs: torch.Tensor | None = None  # (B, L) frozen reference policy (KL)
    # (B, L) the training forward's log-probs of the sampled tokens before the update (its first epoch, detached),
    # filled by the trainer: what components read after the update to compare the sampler with the trained policy
    # (Sparrow's sparse-to-dense alignment) without a forward of their own.
    policy_logprobs: torch.Tensor | None = None
    advantages: torch.Tensor | None = None  # (B,) or (B, L)
    # (B,) per-row loss weights (data policies, DUET's reweighting of aborted rollouts); None = every row weight 1.
    # Every loss multiplies a row's token losses by its weight before aggregating.
    weights: torch.Tensor | None = None
    # (B,) bool: rows sampled by an older policy (replay). The loss takes their ratio against the stored behaviour
    # log-probs (a clipped importance ratio) instead of against the current policy's.
    off_policy: torch.Tensor | None = None
    step: int = 0
    temperature: float = 1.0  # the rollouts' sampling temperature (1 for greedy): every log-prob is of softmax(logits / T)
    tokenizer: Any = None  # lets shapers map text positions to tokens; never serialized

    # -- construction ----------------------------------------------------------------------------------------------
    @classmethod
    def from_samples(cls, samples: Sequence[Sample], *, step: int = 0, tokenizer: Any = None,
                     temperature: float = 1.0) -> GroupBatch:
        if not samples:
            raise ValueError("GroupBatch needs at least one sample")
        width = max(1, max(len(s.response_ids) for s in samples))
        n = len(samples)
        mask = torch.zeros(n, width, dtype=torch.bool)
        lp = torch.zeros(n, width)
        ent = torch.zeros(n, width)
        for i, s in enumerate(samples):
            k = len(s.response_ids)
            if s.token_mask is None:
                mask[i, :k] = True
            elif len(s.token_mask) != k:
                raise ValueError(f"sample {i} (group {s.group_id}): {len(s.token_mask)} mask entries for {k} tokens")
            else:
                mask[i, :k] = torch.as_tensor([bool(m) for m in s.token_mask], dtype=torch.bool)
            for name, values, out in (("logprobs", s.logprobs, lp), ("entropies", s.entropies, ent)):
                if values is None or len(values) == 0:  # unknown (an engine that cannot report them): 0
                    continue
                if len(values) != k:  # padding or cutting would misalign every later token with its value
                    raise ValueError(f"sample {i} (group {s.group_id}): {len(values)} {name} for {k} response tokens")
                out[i, :k] = torch.as_tensor(list(values), dtype=torch.float32)
        rewards = torch.tensor([float(s.reward) for s in samples])
        return cls(
            group_ids=[s.group_id for s in samples], prompts=[s.prompt for s in samples],
            prompt_ids=[list(s.prompt_ids) for s in samples], response_ids=[list(s.response_ids) for s in samples],
            texts=[s.text for s in samples], infos=[dict(s.info) for s in samples],
            finish_reasons=[s.finish_reason for s in samples], rewards=rewards, base_rewards=rewards.clone(),
            correct=torch.tensor([bool(s.correct) for s in samples]), response_mask=mask,
            behaviour_logprobs=lp, entropies=ent, step=step, temperature=float(temperature), tokenizer=tokenizer)

    # -- shape and groups ------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.group_ids)

    @property
    def response_lengths(self) -> torch.Tensor:
        return self.response_mask.sum(dim=1)

    def group_index(self) -> tuple[torch.Tensor, list[str]]:
        """``(inverse, keys)``: ``keys`` in order of first appearance, ``inverse[i]`` the group of row ``i``."""
        keys: dict[str, int] = {}
        inverse = [keys.setdefault(g, len(keys)) for g in self.group_ids]
        return torch.tensor(inverse, dtype=torch.long), list(keys)

    def groups(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for i, g in enumerate(self.group_ids):
            out.setdefault(g, []).append(i)
        return out

    @property
    def num_groups(self) -> int:
        return len(set(self.group_ids))

    # -- slicing ---------------------------------------------------------------------------------------------------
    def select(self, rows: Sequence[int] | torch.Tensor) -> GroupBatch:
        idx = torch.as_tensor(list(rows) if not isinstance(rows, torch.Tensor) else rows, dtype=torch.long)
        picked = idx.tolist()
        changes: dict[str, Any] = {}
        for f in _LIST_FIELDS:
            values = getattr(self, f)
            changes[f] = [values[i] for i in picked]
        for f in (*_ROW_FIELDS, *_TOKEN_FIELDS, *_OPTIONAL_ROW_FIELDS, "advantages"):
            value = getattr(self, f)
            changes[f] = None if value is None else value[idx]
        return replace(self, **changes)

    @staticmethod
    def concat(batches: Sequence[GroupBatch]) -> GroupBatch:
        batches = [b for b in batches if b is not None and len(b)]
        if not batches:
            raise ValueError("nothing to concatenate")
        if len(batches) == 1:
            return batches[0]
        temperatures = sorted({b.temperature for b in batches})
        if len(temperatures) > 1:  # one batch's log-probs are all taken at one temperature
            raise ValueError(f"cannot concatenate batches sampled at different temperatures {temperatures}")
        width = max(b.response_mask.shape[1] for b in batches)
        changes: dict[str, Any] = {}
        for f in _LIST_FIELDS:
            changes[f] = [x for b in batches for x in getattr(b, f)]
        for f in _ROW_FIELDS:
            changes[f] = torch.cat([getattr(b, f) for b in batches])
        for f, fill in _OPTIONAL_ROW_FIELDS.items():  # absent in some parts: their default (weight 1, on-policy)
            values = [getattr(b, f) for b in batches]
            changes[f] = None if all(v is None for v in values) else torch.cat(
                [v if v is not None else torch.full((len(b),), fill, dtype=_dtype(values)) for v, b in zip(values, batches)])
        for f in (*_TOKEN_FIELDS, "advantages"):
            values = [getattr(b, f) for b in batches]
            if any(v is None for v in values):
                changes[f] = None
                continue
            changes[f] = torch.cat([_pad(v, width) if v.dim() == 2 else v for v in values])
        return replace(batches[0], **changes)

    def to_record(self) -> dict[str, Any]:
        """Plain-data copy (for replay buffers and checkpoints): every field but the tokenizer."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "tokenizer"}


def _dtype(values: Sequence[torch.Tensor | None]) -> torch.dtype:
    return next(v.dtype for v in values if v is not None)


def task_of(group_id: str) -> str:
    """The task id inside a trainer group id (``step:round:index:task_id``; task ids may contain colons)."""
    parts = group_id.split(":", 3)
    return parts[3] if len(parts) == 4 else group_id


def _pad(t: torch.Tensor, width: int) -> torch.Tensor:
    if t.shape[1] == width:
        return t
    pad = torch.zeros(t.shape[0], width - t.shape[1], dtype=t.dtype)
    return torch.cat([t, pad], dim=1)


# -- ragged group statistics --------------------------------------------------------------------------------------
def group_sum(values: torch.Tensor, inverse: torch.Tensor, n_groups: int) -> torch.Tensor:
    return torch.zeros(n_groups, dtype=values.dtype).index_add_(0, inverse, values)


def group_mean(values: torch.Tensor, inverse: torch.Tensor, n_groups: int) -> torch.Tensor:
    counts = torch.bincount(inverse, minlength=n_groups).to(values.dtype)
    return group_sum(values, inverse, n_groups) / counts.clamp(min=1)


def group_std(values: torch.Tensor, inverse: torch.Tensor, n_groups: int, *, unbiased: bool = True) -> torch.Tensor:
    """Per-group standard deviation; a group too small for the estimator (one sample, unbiased) gets 0."""
    counts = torch.bincount(inverse, minlength=n_groups).to(values.dtype)
    mean = group_mean(values, inverse, n_groups)
    sq = group_sum((values - mean[inverse]) ** 2, inverse, n_groups)
    dof = counts - 1 if unbiased else counts
    var = torch.where(dof > 0, sq / dof.clamp(min=1), torch.zeros_like(sq))
    return var.sqrt()
