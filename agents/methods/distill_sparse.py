"""DistillSparse (seed 000, Sparrow's last section; our reading): a LoRA adapter on the rollout actor, distilled on the
actor's own sparse rollouts toward the dense policy, so that a more aggressive sparsity keeps the same sparse-to-dense
alignment tail.

The abstract says only "lightweight LoRA-based distillation on sparse rollout lets more aggressive sparsity reach the
same sparse-to-dense mismatch threshold". Our reading, every choice a parameter of :class:`DistillSparseConfig`:

- The teacher is the dense policy (the weights being trained, adapter off, no gradient). The student is the same
  weights plus a LoRA adapter (``peft``), run the way the rollout engine runs it: dense prefill of the prompt, then
  sparse attention under ``pattern`` for every response token (:func:`sparse_logprobs`, which reproduces the engine's
  sparse decode log-probs token for token; a test checks it).
- Data: the student's own sparse rollouts (``HFEngine(sparse_decode=pattern)`` on the adapter-merged actor), fresh
  every ``resample_every`` updates, so distillation happens on the states a sparse rollout visits.
- Loss per response token: the full-vocabulary KL between teacher and student next-token distributions,
  ``forward`` = KL(dense || sparse) (default, as in standard distillation) or ``reverse`` = KL(sparse || dense) (it
  penalizes most the tokens the sparse actor over-samples, i.e. the low tail of ``a_t``).
- In RL the dense weights change every step; the adapter would be re-distilled as they drift. Here it is distilled
  once for fixed dense weights, which is the question the abstract's claim asks: at a given sparsity, does the tail
  statistic rise? (``benchmarks/sparrow_schedule.py`` measures it on the micro lane.)

The actor after distillation is ``merged_actor(...)``: a plain model (adapter merged) the ``hf`` engine decodes
sparsely; the dense policy is left untouched.

result: benchmarks/results/sparrow_distill_vs_sparrow.json (its comparison is declared in sparrow.py)
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import time
from collections.abc import Sequence
from typing import Any

import torch

from agents.grpo.distill import token_divergence
from agents.methods.sparrow import bucket_of, token_alignment
from agents.policy.engine import HFEngine, Rollout, SamplingParams, cache_kwarg
from agents.policy.sparse import SparsePattern, sparse_attention

DIVERGENCES = ("forward", "reverse")


@dataclasses.dataclass
class DistillSparseConfig:
    rank: int = 8
    alpha: float = 16.0
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    lr: float = 1e-3
    steps: int = 60
    prompts_per_step: int = 8
    n: int = 4  # sparse rollouts per prompt
    resample_every: int = 1  # updates per batch of rollouts
    divergence: str = "forward"
    max_grad_norm: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.divergence not in DIVERGENCES:
            raise ValueError(f"divergence must be one of {DIVERGENCES}, got {self.divergence!r}")
        for name in ("rank", "steps", "prompts_per_step", "n", "resample_every"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if self.lr <= 0 or self.alpha <= 0:
            raise ValueError("lr and alpha must be > 0")


def _response_logits(model: Any, prompt_ids: Sequence[int], responses: Sequence[Sequence[int]],
                     pattern: SparsePattern | None, pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Logits ``(R, T, V)`` predicting each response token of rollouts that share one prompt, as the engine computes
    them: the prompt's prefill dense (its last position predicts token 0), then every response position under
    ``pattern`` (dense when ``None``). Also the padded response ids and their mask."""
    from transformers import DynamicCache

    rows, width = len(responses), max(len(r) for r in responses)
    ids = torch.full((rows, width), pad_id, dtype=torch.long)
    mask = torch.zeros(rows, width, dtype=torch.bool)
    for i, r in enumerate(responses):
        ids[i, :len(r)] = torch.tensor(list(r), dtype=torch.long)
        mask[i, :len(r)] = True
    prompt = torch.tensor([list(prompt_ids)] * rows, dtype=torch.long)
    cache = DynamicCache()
    kw = cache_kwarg(model)
    first = model(input_ids=prompt, use_cache=True, **{kw: cache}).logits[:, -1:]
    if width == 1:
        return first.float(), ids, mask
    # Right padding only: a padded key comes after every real one, so causal attention never shows it to a real query.
    positions = torch.arange(len(prompt_ids), len(prompt_ids) + width - 1)[None].expand(rows, -1)
    with sparse_attention(model, pattern) if pattern is not None else contextlib.nullcontext():
        rest = model(input_ids=ids[:, :-1], position_ids=positions, use_cache=True, **{kw: cache}).logits
    return torch.cat([first, rest], dim=1).float(), ids, mask


def sparse_logprobs(model: Any, prompt_ids: Sequence[int], responses: Sequence[Sequence[int]],
                    pattern: SparsePattern | None, *, pad_id: int = 0, temperature: float = 1.0) -> torch.Tensor:
    """Teacher-forced log-probs ``(R, T)`` of each response's own tokens under the engine's sparse decoding (dense
    prefill, ``pattern`` on response positions; dense everywhere when ``pattern`` is ``None``), 0 on padding. Keeps
    the graph when called with gradients on."""
    logits, ids, mask = _response_logits(model, prompt_ids, responses, pattern, pad_id)
    logp = torch.log_softmax(logits / temperature, dim=-1).gather(-1, ids[..., None])[..., 0]
    return logp * mask


def divergence(teacher_logits: torch.Tensor, student_logits: torch.Tensor, kind: str) -> torch.Tensor:
    """Per position: ``forward`` = KL(teacher || student), ``reverse`` = KL(student || teacher) (the distillation
    losses' generalized JSD at beta 0 and 1)."""
    return token_divergence(student_logits, teacher_logits, "jsd", beta=0.0 if kind == "forward" else 1.0)


def add_adapter(model: Any, cfg: DistillSparseConfig) -> Any:
    """Wrap ``model`` (in place) with a fresh LoRA adapter (``peft``); only the adapter trains. The base weights are
    the dense policy: ``with peft_model.disable_adapter():`` runs them unchanged."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(cfg.seed)  # LoRA's A init; B starts at 0, so the adapter starts as the identity
    lora = LoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, target_modules=list(cfg.target_modules), lora_dropout=0.0,
                      bias="none")
    return get_peft_model(model, lora)


def merged_actor(peft_model: Any) -> Any:
    """A plain copy of base + adapter (the rollout actor), leaving ``peft_model`` as it is."""
    return copy.deepcopy(peft_model).merge_and_unload()


def adapter_state(peft_model: Any) -> dict[str, torch.Tensor]:
    """The adapter's own tensors (LoRA A and B), detached CPU copies: what a checkpoint keeps."""
    from peft import get_peft_model_state_dict

    return {k: v.detach().cpu().clone() for k, v in get_peft_model_state_dict(peft_model).items()}


def load_adapter(peft_model: Any, state: dict[str, torch.Tensor]) -> None:
    """Put ``state`` (from :func:`adapter_state`) into ``peft_model``'s adapter; any missing or extra tensor (another
    rank or other target modules) is an error, not a silent partial load."""
    from peft import get_peft_model_state_dict, set_peft_model_state_dict

    result = set_peft_model_state_dict(peft_model, state)
    unexpected = list(getattr(result, "unexpected_keys", []) or [])
    wanted = set(get_peft_model_state_dict(peft_model))  # the names only: no copy of the tensors
    if unexpected or set(state) != wanted:
        raise ValueError(f"distill_sparse: adapter state does not fit this adapter (unexpected {unexpected[:3]}, "
                         f"missing {sorted(wanted - set(state))[:3]})")


def actor_with_adapter(dense_model: Any, state: dict[str, torch.Tensor], cfg: DistillSparseConfig) -> Any:
    """The rollout actor for the current dense weights: a copy of ``dense_model`` with the adapter ``state`` merged
    in (``dense_model`` is left untouched). In RL the dense weights move every step while the adapter is re-distilled
    only now and then, so the actor is rebuilt from the current weights each time."""
    model = add_adapter(copy.deepcopy(dense_model), cfg)
    load_adapter(model, state)
    return model.merge_and_unload()


def sample_sparse(policy: Any, actor: Any, prompts: Sequence[str], n: int, sampling: SamplingParams,
                  pattern: SparsePattern) -> list[Rollout]:
    """``n`` rollouts per prompt decoded by ``actor`` (the policy's own model when no adapter) under ``pattern``."""
    return HFEngine(with_model(policy, actor), precision="fp32", sparse_decode=pattern).generate(prompts, n, sampling)


def with_model(policy: Any, model: Any) -> Any:
    """A shallow copy of ``policy`` (a dataclass or any object with a ``model`` attribute) holding ``model``."""
    if dataclasses.is_dataclass(policy):
        return dataclasses.replace(policy, model=model)
    out = copy.copy(policy)
    out.model = model
    return out


def alignment(dense_model: Any, rollouts: Sequence[Rollout], positions: Sequence[int], *, quantile: float = 0.05,
              pad_id: int = 0, temperature: float = 1.0) -> dict[str, Any]:
    """Per-token ``a_t = min(1, pi_dense / pi_sparse)`` of sparse rollouts (their sampled log-probs against the dense
    model's teacher-forced ones), token 0 (dense prefill) left out: the ``quantile`` tail overall and per position
    bucket (visible keys), the mean, and the token count per bucket."""
    groups: dict[tuple[int, ...], list[Rollout]] = {}
    for r in rollouts:
        if r.n_tokens:
            groups.setdefault(tuple(r.prompt_ids), []).append(r)
    aligns, buckets = [], []
    with torch.no_grad():
        for prompt, rows in groups.items():
            dense = sparse_logprobs(dense_model, prompt, [r.response_ids for r in rows], None, pad_id=pad_id,
                                    temperature=temperature)
            for i, r in enumerate(rows):
                t = r.n_tokens
                a = token_alignment(dense[i, :t], torch.tensor(r.logprobs[:t]))[1:]
                aligns.append(a)
                buckets.append(bucket_of(len(prompt) + torch.arange(1, t), positions))
    values = torch.cat(aligns) if aligns else torch.zeros(0)
    where = torch.cat(buckets) if buckets else torch.zeros(0, dtype=torch.long)
    out: dict[str, Any] = {"tokens": int(values.numel()), "tail": _quantile(values, quantile),
                           "mean": float(values.mean()) if values.numel() else math.nan, "buckets": []}
    for b in range(len(positions)):
        chosen = values[where == b]
        out["buckets"].append({"from_keys": int(positions[b]), "tokens": int(chosen.numel()),
                               "tail": _quantile(chosen, quantile)})
    return out


def _quantile(values: torch.Tensor, q: float) -> float:
    return float(torch.quantile(values, q)) if values.numel() else math.nan


def distill_sparse(policy: Any, pattern: SparsePattern, prompts: Sequence[str], sampling: SamplingParams,
                   cfg: DistillSparseConfig | None = None, *, log: Any = None,
                   init_adapter: dict[str, torch.Tensor] | None = None) -> tuple[Any, list[dict[str, float]]]:
    """Distill a LoRA adapter on ``policy.model`` (wrapped in place; see :func:`add_adapter`) so its sparse decoding
    under ``pattern`` matches the dense model. Prompts are drawn in order, cycling. ``init_adapter`` (an
    :func:`adapter_state`) continues an earlier adapter instead of starting from the identity; the optimizer starts
    fresh either way. Returns the peft model and one record per update (loss, tokens, seconds)."""
    cfg = cfg or DistillSparseConfig()
    model = add_adapter(policy.model, cfg)
    if init_adapter is not None:
        load_adapter(model, init_adapter)
    pad_id = getattr(policy.tokenizer, "pad_token_id", None) or 0
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    history: list[dict[str, float]] = []
    rollouts: list[Rollout] = []
    cursor = 0
    for step in range(cfg.steps):
        t0 = time.perf_counter()
        if step % cfg.resample_every == 0:
            chosen = [prompts[(cursor + i) % len(prompts)] for i in range(cfg.prompts_per_step)]
            cursor += cfg.prompts_per_step
            step_sampling = dataclasses.replace(sampling, seed=cfg.seed * 1_000_003 + step)
            model.eval()
            rollouts = sample_sparse(policy, merged_actor(model), chosen, cfg.n, step_sampling, pattern)
        groups: dict[tuple[int, ...], list[list[int]]] = {}
        for r in rollouts:
            if r.n_tokens:
                groups.setdefault(tuple(r.prompt_ids), []).append(r.response_ids)
        model.train()
        opt.zero_grad(set_to_none=True)
        total_tokens = sum(len(x) for rows in groups.values() for x in rows)
        loss_sum = 0.0
        for prompt, rows in groups.items():
            with torch.no_grad(), model.disable_adapter():
                teacher, _, mask = _response_logits(model, prompt, rows, None, pad_id)
            student, _, _ = _response_logits(model, prompt, rows, pattern, pad_id)
            div = divergence(teacher / sampling.temperature, student / sampling.temperature, cfg.divergence)
            loss = (div * mask).sum() / max(1, total_tokens)
            loss.backward()
            loss_sum += float(loss.detach())
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm))
        opt.step()
        record = {"step": step + 1, "loss": loss_sum, "tokens": total_tokens, "grad_norm": grad_norm,
                  "seconds": time.perf_counter() - t0}
        history.append(record)
        if log:
            log(record)
    model.eval()
    return model, history
