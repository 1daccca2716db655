"""Per-token log-probs and entropies of response tokens under a causal LM, without full-vocabulary fp32 logits.

Two parts:

- ``LinearTokenLogprob``: ``log_softmax((h @ W.T + b) / T)[t]`` (and the entropy, for logging) as one autograd Function that
  walks the rows in chunks. Its forward keeps ``softmax - onehot(t)`` (unless told not to), so its backward is two
  matmuls: no second lm_head matmul, no ``(B, T, V)`` fp32 logits, no full-vocabulary gather/scatter or zero-fill.
- ``response_logprobs``: the backbone runs over ``prompt + response`` in length buckets (rows sorted by length, each
  bucket padded only to its own longest row), only the hidden states that predict response tokens are kept, and the
  head runs once over all of them. Results go back to the caller's row order as ``(B, W)``.

Temperature: rollouts sampled at ``T`` come from ``softmax(logits / T)`` and engines report log-probs of that
distribution (agents.policy.engine), so training, old and reference log-probs take the same ``T``; otherwise the
importance ratio of an untouched policy would not be 1.

Why buckets and not one packed row: on CPU, SDPA with a block-diagonal mask over one long row does dense
``L_total ** 2`` attention work, while a bucket of similar-length rows wastes at most ``slack`` of its tokens on padding.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

PROB_STORE_BUDGET = 1 << 30  # bytes; above this the head recomputes logits in backward instead of storing Q
# Config fields of heads that scale or cap the logits after lm_head (Gemma2, Cohere, Granite): such models use the
# model's own forward (the fallback) so that the log-probs stay exact.
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


class LinearTokenLogprob(torch.autograd.Function):
    """``(token_lp, entropy)`` of rows ``h`` (N, H) under ``log_softmax((h @ weight.T + bias) / temperature)`` at
    ``targets`` (N,).

    The matmuls run in ``compute_dtype``; log-softmax and entropy in fp32 (fp64 when computing in fp64).
    Autocast is switched off inside (forward would otherwise run under the caller's autocast state and backward
    outside it), so the dtype is an explicit argument: ``linear_token_logprobs`` picks it. Gradients come back in the
    inputs' dtypes; ``entropy`` has no gradient.

    ``store_probs`` keeps ``Q = softmax - onehot(targets)`` (N, V) in ``compute_dtype``: ``d lp / d logits = -Q``,
    so backward is ``grad_h = -g * (Q @ W)``, ``grad_W = -Q.T @ (g * h)``, ``grad_b = -Q.T @ g`` -- two matmuls, no
    logits recompute and no pass over (N, V) (the row scale ``g`` goes on the small side). With a temperature, ``Q`` is
    of ``softmax(logits / T)`` and the chain rule adds ``1 / T`` to that row scale: ``g = grad_lp / T``.
    ``Q``'s target entries are
    ``expm1(lp)`` from fp32, so ``1 - p_t`` keeps its precision when ``p_t`` is close to 1 even with a bf16 ``Q``.
    Backward only reads ``Q``, so ``retain_graph`` works. Without ``store_probs`` backward recomputes each chunk's
    logits (one more lm_head matmul, ``chunk`` rows of memory).
    """

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor,
                chunk: int, store_probs: bool, compute_dtype: torch.dtype, temperature: float = 1.0
                ) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.autocast(hidden.device.type, enabled=False):
            h, w = hidden.to(compute_dtype), weight.to(compute_dtype)
            b = None if bias is None else bias.to(compute_dtype)
            resid = h.new_empty(h.shape[0], w.shape[0]) if store_probs else None
            token_lp, entropy = _chunked_stats(h, w, b, targets, chunk, resid, temperature)
        ctx.save_for_backward(h, w, b, targets, token_lp, resid)
        ctx.chunk, ctx.temperature = chunk, float(temperature)
        ctx.dtypes = (hidden.dtype, weight.dtype, None if bias is None else bias.dtype)
        ctx.mark_non_differentiable(entropy)
        return token_lp, entropy

    @staticmethod
    def backward(ctx, grad_lp: torch.Tensor, _grad_entropy: torch.Tensor) -> tuple:
        h, w, b, targets, token_lp, resid = ctx.saved_tensors
        need = ctx.needs_input_grad[:3]
        with torch.autocast(h.device.type, enabled=False):
            g = grad_lp.to(token_lp.dtype)
            if ctx.temperature != 1.0:  # d(logits / T) / d logits = 1 / T: folded into the (N,) row scale
                g = g / ctx.temperature
            if resid is not None:
                grads = _grad_from_resid(resid, g, h, w, *need)
            else:
                grads = _grad_by_recompute(h, w, b, targets, token_lp, g, ctx.chunk, *need, ctx.temperature)
        cast = [None if x is None else x.to(dt) for x, dt in zip(grads, ctx.dtypes)]
        return (*cast, None, None, None, None, None)


def _logits(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, stat: torch.dtype,
            temperature: float = 1.0) -> torch.Tensor:
    # .to(stat) is a no-op when the matmul already ran in stat; either way the result is a fresh tensor we own, so the
    # temperature divides in place, in stat precision, as the engines divide their fp32 logits (pick_tokens).
    logits = torch.nn.functional.linear(h, w, b).to(stat)
    return logits if temperature == 1.0 else logits.div_(temperature)


def _stat_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def _chunked_stats(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, targets: torch.Tensor, chunk: int,
                   resid: torch.Tensor | None, temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs and entropies chunk by chunk; fills ``resid`` (if given) with softmax - onehot(targets)."""
    stat = _stat_dtype(h.dtype)
    n = h.shape[0]
    token_lp, entropy = torch.empty(n, dtype=stat), torch.empty(n, dtype=stat)
    for s in range(0, n, chunk):
        e = min(n, s + chunk)
        # the fused log_softmax kernel: one pass fewer and no temporaries, unlike logsumexp + subtract
        logp = torch.log_softmax(_logits(h[s:e], w, b, stat, temperature), -1)
        token_lp[s:e] = logp.gather(1, targets[s:e, None]).squeeze(1)
        direct = resid is not None and resid.dtype == stat
        p = torch.exp(logp, out=resid[s:e]) if direct else logp.exp()
        entropy[s:e] = -logp.mul_(p).sum(-1)
        if resid is not None:
            if not direct:
                resid[s:e] = p
            resid[s:e].scatter_(1, targets[s:e, None], torch.expm1(token_lp[s:e, None]).to(resid.dtype))
    return token_lp, entropy


def _grad_from_resid(resid: torch.Tensor, g: torch.Tensor, h: torch.Tensor, w: torch.Tensor, need_h: bool,
                     need_w: bool, need_b: bool) -> tuple:
    grad_h = (resid @ w).to(g.dtype).mul_(-g[:, None]) if need_h else None
    grad_w = resid.T @ (h * -g[:, None]).to(resid.dtype) if need_w else None
    grad_b = (g.to(resid.dtype) @ resid).to(g.dtype).neg_() if need_b else None
    return grad_h, grad_w, grad_b


def _grad_by_recompute(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, targets: torch.Tensor,
                       token_lp: torch.Tensor, g: torch.Tensor, chunk: int, need_h: bool, need_w: bool,
                       need_b: bool, temperature: float = 1.0) -> tuple:
    stat = g.dtype
    grad_h = torch.empty(h.shape, dtype=stat) if need_h else None
    grad_w = torch.zeros(w.shape, dtype=stat) if need_w else None  # accumulated over chunks: keep it in fp32
    grad_b = torch.zeros(w.shape[0], dtype=stat) if need_b else None
    for s in range(0, h.shape[0], chunk):
        e = min(h.shape[0], s + chunk)
        resid = torch.softmax(_logits(h[s:e], w, b, stat, temperature), -1)
        resid.scatter_(1, targets[s:e, None], torch.expm1(token_lp[s:e, None]))
        if need_b:
            grad_b -= resid.T @ g[s:e]
        resid = resid.to(h.dtype)
        if need_h:
            grad_h[s:e] = (resid @ w).to(stat).mul_(-g[s:e, None])
        if need_w:
            grad_w -= resid.T @ (h[s:e] * g[s:e, None]).to(h.dtype)
    return grad_h, grad_w, grad_b


def linear_token_logprobs(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                          targets: torch.Tensor, *, chunk: int = 1024, store_probs: bool | None = None,
                          temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(token_lp, entropy)`` (N,) each, fp32 (fp64 for fp64 inputs), of ``softmax(logits / temperature)``;
    gradients flow into ``token_lp``.

    The matmul dtype is the autocast dtype of ``hidden``'s device when autocast is on there (as ``F.linear`` would
    use), else the promoted dtype of ``hidden`` and ``weight``. ``store_probs=None`` stores ``Q`` (see
    ``LinearTokenLogprob``) when it fits ``PROB_STORE_BUDGET``.
    """
    temperature = check_temperature(temperature)
    device = hidden.device.type
    if torch.is_autocast_enabled(device):
        dtype = torch.get_autocast_dtype(device)
    else:
        dtype = torch.promote_types(hidden.dtype, weight.dtype)
    needs_grad = torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in (hidden, weight, bias))
    if not needs_grad:  # inference: no autograd node, nothing kept
        with torch.no_grad(), torch.autocast(device, enabled=False):
            b = None if bias is None else bias.to(dtype)
            return _chunked_stats(hidden.to(dtype), weight.to(dtype), b, targets, max(1, chunk), None, temperature)
    if store_probs is None:
        store_probs = hidden.shape[0] * weight.shape[0] * dtype.itemsize <= PROB_STORE_BUDGET
    return LinearTokenLogprob.apply(hidden, weight, bias, targets, max(1, chunk), store_probs, dtype, temperature)


def check_temperature(temperature: float) -> float:
    """``temperature`` as a float; a clear error unless it is finite and > 0 (greedy rollouts are scored at T = 1)."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not (
            math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be a finite number > 0 (use 1 for greedy rollouts), got {temperature!r}")
    return float(temperature)


def length_buckets(lengths: Sequence[int], slack: float | None) -> list[list[int]]:
    """Row indices grouped for separate backbone calls. Rows are sorted longest first (ties by index); a bucket takes
    the following rows while each is at least ``(1 - slack)`` times the bucket's first (longest) row, so padding is
    at most ``slack`` of every row's padded length. ``slack=None`` turns bucketing off: one bucket, original order."""
    if slack is None:
        return [list(range(len(lengths)))] if len(lengths) else []
    if not 0.0 <= slack < 1.0:
        raise ValueError(f"bucket_slack must be in [0, 1) or None, got {slack}")
    buckets: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda k: (-lengths[k], k)):
        if buckets and lengths[i] >= (1.0 - slack) * lengths[buckets[-1][0]]:
            buckets[-1].append(i)
        else:
            buckets.append([i])
    return buckets


def _check_prompts(prompt_ids: Sequence[Sequence[int]]) -> None:
    if any(len(p) == 0 for p in prompt_ids):
        raise ValueError("every sequence needs at least one prompt token (the first response token is predicted "
                         "from the last prompt position)")


def response_logprobs(model: torch.nn.Module, prompt_ids: Sequence[Sequence[int]],
                      response_ids: Sequence[Sequence[int]], *, chunk: int = 64, pad_id: int = 0,
                      autocast_bf16: bool = False, bucket_slack: float | None = 0.25,
                      store_probs: bool | None = None, temperature: float = 1.0, share_prompts: bool = True,
                      frozen_prefix: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logprobs, entropies)``, each ``(B, W)`` fp32 (W = longest response), zero past each response's end, of the
    sampling distribution ``softmax(logits / temperature)``. Gradients flow into ``logprobs`` when grad is enabled;
    entropies are detached (for logging and reward shaping).

    ``chunk``: the head handles ``chunk * B`` response tokens at a time (the memory of ``chunk`` positions of every
    row). ``bucket_slack``: see ``length_buckets`` (None: one batch padded to the longest row). ``store_probs``: see
    ``linear_token_logprobs``. ``share_prompts``, ``frozen_prefix``: see ``response_features``."""
    temperature = check_temperature(temperature)
    n_rows, width = len(prompt_ids), max(1, max((len(r) for r in response_ids), default=1))
    head = _separable_head(model)
    device = next(model.parameters()).device.type
    with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast_bf16):
        hidden, rows, cols, target = response_features(model, prompt_ids, response_ids, pad_id=pad_id,
                                                       bucket_slack=bucket_slack, head=head,
                                                       share_prompts=share_prompts, frozen_prefix=frozen_prefix)
        if head is not None:
            lp, ent = linear_token_logprobs(hidden, head.weight, head.bias, target, chunk=chunk * n_rows,
                                            store_probs=store_probs, temperature=temperature)
        else:  # the model's own (possibly soft-capped or scaled) logits; the temperature applies after them, as in vLLM
            logp = torch.log_softmax(hidden.float() / temperature, -1)
            lp, ent = logp.gather(1, target[:, None]).squeeze(1), -(logp.exp() * logp).sum(-1)
    index = (rows, cols)
    out_lp = torch.zeros(n_rows, width, dtype=lp.dtype).index_put(index, lp)
    out_ent = torch.zeros(n_rows, width, dtype=ent.dtype).index_put(index, ent.detach())
    return out_lp, out_ent


def response_features(model: torch.nn.Module, prompt_ids: Sequence[Sequence[int]],
                      response_ids: Sequence[Sequence[int]], *, pad_id: int = 0, bucket_slack: float | None = 0.25,
                      head: torch.nn.Linear | None | str = "auto", share_prompts: bool = True,
                      frozen_prefix: Any = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(features, rows, cols, targets)``: for every response token, flattened, the backbone's hidden state that
    predicts it (the model's logits when ``head`` is None: no separable lm_head), its ``(row, column)`` in a
    ``(B, W)`` output and its id. The backbone runs in length buckets (``length_buckets``); the caller's autocast
    state applies. ``head="auto"``: ``_separable_head(model)``.

    ``share_prompts``: rows with the same prompt (a GRPO group) run that prompt through the backbone once; its KV
    cache (with its autograd graph) is expanded to the rows, which then run only their responses. Same values and
    gradients as running every row whole (up to fp32 rounding; the gradients of the shared prompt positions sum
    over the rows through the expand), for a fraction of the tokens: a group of ``n`` with prompt length ``p``
    runs ``p + sum(len(r))`` positions instead of ``n * p + sum(len(r))``.

    ``frozen_prefix``: an ``agents.policy.frozen_prefix.FrozenPrefixCache`` of ``model``. A row whose tokens it holds
    (the engine decoded exactly them) runs only the layers from the first trained one, on the kept states; other
    rows run as above. Needs a separable head (else ignored)."""
    if len(prompt_ids) != len(response_ids) or not prompt_ids:
        raise ValueError(f"need as many prompts as responses (>= 1), got {len(prompt_ids)} and {len(response_ids)}")
    _check_prompts(prompt_ids)
    if isinstance(head, str):
        head = _separable_head(model)
    lengths = [len(p) + len(r) for p, r in zip(prompt_ids, response_ids)]
    # rows without response tokens need no forward, unless every row is empty (then one keeps the graph connected)
    live = [i for i, r in enumerate(response_ids) if len(r)] or [0]
    feats, rows, cols, targets = [], [], [], []
    if frozen_prefix is not None and head is not None and frozen_prefix.model is model:
        kept = {}
        for i in live:
            if len(response_ids[i]):
                states = frozen_prefix.get(list(prompt_ids[i]) + list(response_ids[i][:-1]))
                if states is not None:
                    kept[i] = states
        if kept:
            for acc, x in zip((feats, rows, cols, targets), _frozen_tail_features(
                    model, frozen_prefix.layer, prompt_ids, response_ids, kept, bucket_slack)):
                acc.append(x)
            live = [i for i in live if i not in kept]
    if share_prompts:
        groups: dict[tuple[int, ...], list[int]] = {}
        for i in live:
            groups.setdefault(tuple(prompt_ids[i]), []).append(i)
        alone = []
        for prompt, group in groups.items():
            part = _shared_prompt_features(model, head is not None, prompt, response_ids, group, pad_id,
                                           bucket_slack) if len(group) > 1 else None
            if part is None:  # one row, or a cache that cannot be expanded: the row runs whole
                alone += group
                continue
            for acc, x in zip((feats, rows, cols, targets), part):
                acc.append(x)
        live = sorted(alone)
    buckets = [[live[j] for j in b] for b in length_buckets([lengths[i] for i in live], bucket_slack)]
    for bucket in buckets:
        for acc, x in zip((feats, rows, cols, targets),
                          _bucket_features(model, head is not None, prompt_ids, response_ids, bucket, pad_id)):
            acc.append(x)
    return torch.cat(feats), torch.cat(rows), torch.cat(cols), torch.cat(targets)


def _frozen_tail_features(model: torch.nn.Module, layer: int, prompt_ids: Sequence[Sequence[int]],
                          response_ids: Sequence[Sequence[int]], kept: dict[int, torch.Tensor],
                          bucket_slack: float | None
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``_bucket_features``' outputs for the rows in ``kept`` (row -> the states entering ``layer`` at every fed
    position): only ``layers[layer:]`` run, in length buckets, right-padded."""
    from agents.policy.frozen_prefix import tail_forward

    order = list(kept)
    feats, rows, cols, targets = [], [], [], []
    for bucket in length_buckets([kept[i].shape[0] for i in order], bucket_slack):
        members = [order[j] for j in bucket]
        width = max(kept[i].shape[0] for i in members)
        first = kept[members[0]]
        states = first.new_zeros(len(members), width, first.shape[1])
        for j, i in enumerate(members):
            states[j, : kept[i].shape[0]] = kept[i]
        local, pos, r, c, t = _token_places([len(prompt_ids[i]) - 1 for i in members], response_ids, members)
        feats.append(tail_forward(model, layer, states)[local, pos])
        rows.append(r)
        cols.append(c)
        targets.append(t)
    return torch.cat(feats), torch.cat(rows), torch.cat(cols), torch.cat(targets)


def _token_places(first_pos: Sequence[int], response_ids: Sequence[Sequence[int]], bucket: list[int],
                  skip: int = 0) -> list[torch.Tensor]:
    """For every response token of ``bucket``'s rows from column ``skip`` on: ``(local, pos, rows, cols, targets)``:
    its row in the bucket, the position of the forward that predicts it (``first_pos[j]`` for row ``j``'s column
    ``skip``), its ``(row, column)`` in a ``(B, W)`` output and its id. Whole rows: ``first_pos`` is each prompt's
    length - 1 and ``skip`` 0."""
    local, pos, rows, cols, targets = [], [], [], [], []
    for j, i in enumerate(bucket):
        k = len(response_ids[i]) - skip
        local += [j] * k
        pos += range(first_pos[j], first_pos[j] + k)
        rows += [i] * k
        cols += range(skip, skip + k)
        targets += response_ids[i][skip:]
    return [torch.tensor(x, dtype=torch.long) for x in (local, pos, rows, cols, targets)]


def _shared_prompt_features(model: torch.nn.Module, separable: bool, prompt: Sequence[int],
                            response_ids: Sequence[Sequence[int]], group: list[int], pad_id: int,
                            bucket_slack: float | None
                            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """``_bucket_features``' outputs for the rows ``group`` that share ``prompt``: the prompt runs once, then each
    length bucket of their responses runs on a copy of its KV cache. None, before any forward, when the model's
    cache would have layers other than plain full-attention ones (a sliding window would have to be cut per row) or
    the model has no config to tell; the caller then runs the rows whole."""
    from transformers.cache_utils import DynamicCache, DynamicLayer

    from agents.policy.engine import cache_kwarg

    run = model.base_model if separable else model
    config = getattr(run, "config", None)
    if config is None:
        return None
    cache = DynamicCache(config=config)  # the layer kinds the model's own forward would make
    if not cache.layers or any(type(layer) is not DynamicLayer for layer in cache.layers):
        return None
    cache_kw = cache_kwarg(run)
    out = run(input_ids=torch.tensor([list(prompt)], dtype=torch.long), use_cache=True, **{cache_kw: cache})
    states = out.last_hidden_state if separable else out.logits
    kv = [(layer.keys, layer.values) for layer in cache.layers]
    # Response token 0 is predicted by the prompt's last position; token k >= 1 by response position k - 1, so each
    # row feeds its response less its last token. Right padding comes after every real position: the causal mask
    # keeps it out of them, so no padding mask is needed.
    feats = [states[0, -1:].expand(len(group), -1)]
    rows = [torch.tensor(group, dtype=torch.long)]
    cols = [torch.zeros(len(group), dtype=torch.long)]
    targets = [torch.tensor([response_ids[i][0] for i in group], dtype=torch.long)]
    more = [i for i in group if len(response_ids[i]) > 1]
    for bucket in length_buckets([len(response_ids[i]) - 1 for i in more], bucket_slack):
        members = [more[j] for j in bucket]
        width = max(len(response_ids[i]) - 1 for i in members)
        ids = torch.tensor([list(response_ids[i][:-1]) + [pad_id] * (width - len(response_ids[i]) + 1)
                            for i in members], dtype=torch.long)
        # expand() is a view: the cache's first update concatenates it into its own rows; gradients of the shared
        # prompt positions sum over the rows on the way back
        copy = DynamicCache([(k.expand(len(members), -1, -1, -1), v.expand(len(members), -1, -1, -1)) for k, v in kv])
        positions = torch.arange(len(prompt), len(prompt) + width).expand(len(members), -1)
        o = run(input_ids=ids, position_ids=positions, use_cache=True, **{cache_kw: copy})
        hidden = o.last_hidden_state if separable else o.logits
        local, pos, r, c, t = _token_places([0] * len(members), response_ids, members, skip=1)
        feats.append(hidden[local, pos])
        rows.append(r)
        cols.append(c)
        targets.append(t)
    return torch.cat(feats), torch.cat(rows), torch.cat(cols), torch.cat(targets)


def _separable_head(model: torch.nn.Module) -> torch.nn.Linear | None:
    """The lm_head when the model is ``base_model`` + a plain Linear head; None means: use the model's own forward."""
    backbone = getattr(model, "base_model", None)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if backbone is None or backbone is model or not isinstance(head, torch.nn.Linear):
        return None
    config = getattr(model, "config", None)
    if any(getattr(config, name, None) not in (None, 1, 1.0) for name in _LOGIT_TRANSFORMS):
        return None
    return head


def _bucket_features(model: torch.nn.Module, separable: bool, prompt_ids: Sequence[Sequence[int]],
                     response_ids: Sequence[Sequence[int]], bucket: list[int], pad_id: int
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One backbone call on ``bucket``'s rows padded to their longest: the hidden states (or, without a separable
    head, the logits) that predict each response token, flattened, with their ``(row, column)`` in the output and
    the target ids."""
    seqs = [list(prompt_ids[i]) + list(response_ids[i]) for i in bucket]
    longest = max(len(s) for s in seqs)
    input_ids = torch.tensor([s + [pad_id] * (longest - len(s)) for s in seqs], dtype=torch.long)
    # Right padding never reaches a real position through a causal mask; pass a mask only when there is padding, so
    # an unpadded bucket takes the plain causal attention path.
    padded = any(len(s) < longest for s in seqs)
    mask = torch.tensor([[1] * len(s) + [0] * (longest - len(s)) for s in seqs]) if padded else None
    if separable:
        out = model.base_model(input_ids=input_ids, attention_mask=mask).last_hidden_state
    else:
        out = model(input_ids=input_ids, attention_mask=mask).logits
    local, pos, rows, cols, targets = _token_places([len(prompt_ids[i]) - 1 for i in bucket], response_ids, bucket)
    return out[local, pos], rows, cols, targets
