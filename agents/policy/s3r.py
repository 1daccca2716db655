"""S3R self-speculative decoding (seed 003): draft with sparse attention, verify with one dense forward, same weights.

Enabled with ``HFEngine(policy, speculative=S3RConfig(k=4, sinks=4, window=64, topk=64))`` (or
``make_engine(policy, "hf", speculative=...)``, or the ``s3r`` GenerationController in ``agents/methods/s3r.py``).
The samples are draws from the dense policy under the sampling parameters, exactly: a draft only decides how many
tokens one dense forward settles.

One round for every live row, which holds a *pending* token (sampled, not yet forwarded):

1. Draft: ``k`` single-token forwards under :func:`agents.policy.sparse.sparse_attention` (sinks + recent window +
   top-k keys) feed the pending token and the drafts so far; each samples draft ``d_j ~ q_j``, the draft's
   distribution after the same temperature / top-p processing as the target's.
2. Roll back: the drafts' KV entries are dropped (``cache.crop``). They cannot be kept: past the first layer a
   token's keys and values are computed from hidden states the sparse attention changed, so they are not the dense
   ones. The draft reads the dense cache of everything before the round (self-speculative: one KV cache).
3. Verify: one dense forward over ``[pending, d_1 .. d_k]`` writes their dense KV and gives the target
   distributions ``p_1 .. p_{k+1}``.
4. Accept ``d_j`` with probability ``min(1, p_j(d_j) / q_j(d_j))`` while they are accepted; at the first rejection
   sample from ``normalize(max(0, p_j - q_j))``; when all ``k`` are accepted, a bonus token from ``p_{k+1}``. This is
   the standard speculative-sampling rule (Leviathan et al., Chen et al.): the emitted tokens are distributed as
   dense sampling. Greedy decoding is the same rule with one-hot distributions: accept while the dense argmax
   agrees, then emit the dense argmax, so the output equals dense greedy token for token.
5. Rejected drafts' KV positions stay in the cache as *holes*, masked out of every later attention (rows of a batch
   accept different numbers of drafts, so their caches cannot all be cropped to one length). When holes exceed
   ``compact_fraction`` of the cache, :func:`compact_cache` gathers each row's valid positions together again.

Log-probs and entropies of the emitted tokens come from the verify forward's dense logits,
``log_softmax(logits / T)`` as the plain engine reports them, so the trainer's importance ratios start at 1.

Batching: rows decode together (per-row positions, a per-row validity mask over cache positions); each round drafts
``k`` tokens for every row (a row counts fewer near the end of its budget). Randomness: per round a row draws
``2k + 1`` uniforms from its own generator, so a row's samples do not depend on its batch-mates; they differ from
the plain engine's samples for the same seed (the same distribution, other draws).

KV-aware scheduler: a row reserves ``prompt + max_new_tokens + k + 1`` KV positions; rows are admitted from the
queue (each with its own prefill, merged into the running batch) while the live rows' reservations fit in
``kv_budget_tokens`` and a decode slot (``max_batch_size``) is free, so drafting never over-commits the cache
(the paper's "limits cache thrashing"). At least one row always runs. The reservation does not count holes, which
compaction keeps under ``compact_fraction`` of the cache.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from agents.policy.engine import SamplingParams, merge_caches, pick_tokens, set_layer_states
from agents.policy.sparse import SparsePattern, SparseStats, sparse_attention


@dataclass(frozen=True)
class S3RConfig:
    """``k`` drafted tokens per round; the draft's sparse pattern (``sinks``, ``window``, ``topk``); the KV budget
    (positions reserved over all concurrent rows, ``None``: slots only); ``compact_fraction`` of cache positions
    that may be holes before the cache is compacted."""

    k: int = 4
    sinks: int = 4
    window: int = 64
    topk: int = 64
    kv_budget_tokens: int | None = None
    compact_fraction: float = 0.25

    def __post_init__(self) -> None:
        if not isinstance(self.k, int) or self.k < 1:
            raise ValueError(f"k must be an int >= 1, got {self.k!r}")
        if self.kv_budget_tokens is not None and (not isinstance(self.kv_budget_tokens, int)
                                                  or self.kv_budget_tokens < 1):
            raise ValueError(f"kv_budget_tokens must be an int >= 1 or None, got {self.kv_budget_tokens!r}")
        if not 0.0 < self.compact_fraction <= 1.0:
            raise ValueError(f"compact_fraction must be in (0, 1], got {self.compact_fraction!r}")
        SparsePattern(sinks=self.sinks, window=self.window, topk=self.topk)  # validates the sparse pattern

    @property
    def pattern(self) -> SparsePattern:
        return SparsePattern(sinks=self.sinks, window=self.window, topk=self.topk)


@dataclass
class S3RStats:
    """Cumulative counters of the S3R decode loop (``HFEngine.speculative_stats``)."""

    rounds: int = 0
    row_rounds: int = 0  # rounds summed over the rows they served (one verify position block each)
    drafted: int = 0  # draft tokens proposed, over rows still running
    accepted: int = 0  # of them, accepted by the dense verification
    emitted: int = 0  # tokens emitted (accepted drafts, resampled / bonus tokens, first tokens after prefill)
    draft_forwards: int = 0
    verify_forwards: int = 0
    prefills: int = 0
    compactions: int = 0
    peak_rows: int = 0
    draft_s: float = 0.0
    verify_s: float = 0.0
    sparse_visible_keys: int = 0
    sparse_kept_keys: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    def to_dict(self) -> dict[str, float]:
        return {**asdict(self), "acceptance_rate": self.acceptance_rate,
                # tokens one row gets per round (accepted drafts + the resampled / bonus token), before stops
                "tokens_per_row_round": (self.accepted + self.row_rounds) / self.row_rounds if self.row_rounds else 0.0,
                "sparse_kept_fraction": (self.sparse_kept_keys / self.sparse_visible_keys
                                         if self.sparse_visible_keys else 1.0)}


def sampling_probs(logits: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """The distribution ``pick_tokens`` samples from, as float64 probabilities over the last axis: softmax of
    ``logits / T`` cut to the top-p nucleus (the top token always stays) and renormalized; one-hot on the argmax
    when greedy."""
    logits = logits.double()
    if sampling.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).double()
    probs = torch.softmax(logits / sampling.temperature, dim=-1)
    if sampling.top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        before = sorted_p.cumsum(-1) - sorted_p
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p * (before < sampling.top_p))
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample_from(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw, one per row of ``probs`` ``(..., V)`` (need not be normalized), with ``uniforms`` ``(...)``."""
    cdf = probs.cumsum(-1)
    target = (uniforms.double() * cdf[..., -1]).unsqueeze(-1)
    return torch.searchsorted(cdf, target, right=True).clamp_(max=probs.shape[-1] - 1).squeeze(-1)


def speculative_accept(target: torch.Tensor, draft: torch.Tensor, drafted: torch.Tensor,
                       accept_uniforms: torch.Tensor, resample_uniforms: torch.Tensor,
                       limit: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The speculative-sampling rule, batched. ``target`` ``(B, k+1, V)`` dense distributions, ``draft`` ``(B, k, V)``
    the drafts' distributions, ``drafted`` ``(B, k)`` the drafted tokens, uniforms ``(B, k)`` and ``(B,)``; ``limit``
    ``(B,)``: how many of the drafts count for each row (default all ``k``).
    Returns (accepted drafts per row ``m``, the token emitted after them): ``d_j`` is accepted when
    ``u_j · q_j(d_j) < p_j(d_j)`` (probability ``min(1, p/q)``), the first rejection draws from
    ``normalize(max(0, p_m − q_m))``, all ``limit`` accepted draws a bonus from ``p_{limit+1}``."""
    k = drafted.shape[1]
    rows = torch.arange(target.shape[0], device=target.device)
    if k == 0:
        return torch.zeros_like(rows), sample_from(target[:, 0], resample_uniforms)
    limit = torch.full_like(rows, k) if limit is None else limit
    p_drafted = target[:, :k].gather(-1, drafted.unsqueeze(-1)).squeeze(-1)
    q_drafted = draft.gather(-1, drafted.unsqueeze(-1)).squeeze(-1)
    accepted = accept_uniforms.double() * q_drafted < p_drafted
    accepted &= torch.arange(k, device=target.device)[None, :] < limit[:, None]
    m = accepted.long().cumprod(-1).sum(-1)  # leading accepts
    p_next = target[rows, m]
    q_next = torch.where((m < limit).unsqueeze(-1), draft[rows, m.clamp(max=k - 1)], torch.zeros_like(p_next))
    residual = (p_next - q_next).clamp_(min=0.0)
    # p == q up to rounding leaves no residual mass; a rejection then has probability ~0, and p is the right law
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_next)
    return m, sample_from(residual, resample_uniforms)


def crop_cache(cache: Any, positions: int) -> None:
    """Drop the last ``positions`` cache positions of every layer (the draft's KV entries)."""
    if positions:
        cache.crop(-positions)


def compact_cache(cache: Any, valid: torch.Tensor, *, extra: int) -> torch.Tensor:
    """Gather each row's valid cache positions (in order) to the right end of a cache as wide as the row with the most
    of them; the rest is left padding. Returns the new ``(B, W)`` validity mask."""
    width = int(valid.sum(1).max())
    # a stable sort of 0/1 puts a row's holes and padding first and its valid positions after, in their order
    order = torch.sort(valid.to(torch.uint8), dim=1, stable=True).indices[:, valid.shape[1] - width:]
    for layer in cache.layers:
        keys, values = layer.keys, layer.values
        index_k = order[:, None, :, None].expand(keys.shape[0], keys.shape[1], width, keys.shape[3])
        index_v = order[:, None, :, None].expand(values.shape[0], values.shape[1], width, values.shape[3])
        set_layer_states(layer, keys.gather(2, index_k), values.gather(2, index_v), extra=extra)
    return valid.gather(1, order)


class _Batch:
    """The running rows: row indices, the shared cache, which cache positions each row may attend to, each row's
    pending token and its position."""

    def __init__(self, live: list[int], cache: Any, valid: torch.Tensor, pending: torch.Tensor,
                 next_pos: torch.Tensor) -> None:
        self.live, self.cache, self.valid, self.pending, self.next_pos = live, cache, valid, pending, next_pos

    def select(self, keep: list[int]) -> None:
        index = torch.tensor(keep, dtype=torch.long, device=self.valid.device)
        self.cache.batch_select_indices(index)
        self.live = [self.live[b] for b in keep]
        self.valid, self.pending, self.next_pos = self.valid[index], self.pending[index], self.next_pos[index]

    def merge(self, other: _Batch, extra: int) -> None:
        self.valid = merge_caches(self.cache, self.valid, other.cache, other.valid, extra=extra)
        self.live = self.live + other.live
        self.pending = torch.cat([self.pending, other.pending])
        self.next_pos = torch.cat([self.next_pos, other.next_pos])


def _uniforms(rows: Sequence[Any], count: int, device: torch.device) -> torch.Tensor:
    """``(B, count)`` uniforms, each row's from its own generator (zeros when greedy: no generator, none needed)."""
    if not count:
        return torch.zeros((len(rows), 0), dtype=torch.float64, device=device)
    return torch.stack([torch.rand(count, generator=r.gen, dtype=torch.float64) if r.gen is not None
                        else torch.zeros(count, dtype=torch.float64) for r in rows]).to(device)


def s3r_decode(engine: Any, model: Any, prompt_ids: list[list[int]], rows: list[Any], sampling: SamplingParams
               ) -> None:
    """Decode every row of ``rows`` (``engine``'s ``_Row`` records, filled in place) with S3R under
    ``engine.speculative``; see the module docstring."""
    cfg: S3RConfig = engine.speculative
    if engine.speculative_stats is None:
        engine.speculative_stats = S3RStats()
    stats: S3RStats = engine.speculative_stats
    pattern = cfg.pattern
    device = model.device
    temperature = sampling.temperature or 1.0
    stop_window = max((len(s) for s in sampling.stop), default=0) + 8
    extra = min(sampling.max_new_tokens, engine.cache_block)
    kw = engine.cache_kw

    def reserve(i: int) -> int:
        return len(prompt_ids[rows[i].prompt]) + sampling.max_new_tokens + cfg.k + 1

    def emit(i: int, token: int, logprob: float, entropy: float) -> None:
        row = rows[i]
        row.ids.append(token)
        row.logprobs.append(logprob)
        row.entropies.append(entropy)
        stats.emitted += 1
        if token in engine.eos:
            row.finish = "stop"
        elif sampling.stop and any(s in engine.tokenizer.decode(row.ids[-stop_window:], skip_special_tokens=True)
                                   for s in sampling.stop):
            row.finish = "stop"
        elif len(row.ids) >= sampling.max_new_tokens:
            row.finish = "length"

    def admit(new: list[int]) -> _Batch:
        """Prefill ``new`` rows and emit their first token from the prefill's dense logits."""
        cache, logits, mask, last_pos = engine._prefill(model, prompt_ids, [rows[i] for i in new],
                                                        sampling.max_new_tokens)
        stats.prefills += 1
        uniforms = None if sampling.greedy else _uniforms([rows[i] for i in new], 1, logits.device)[:, 0]
        tokens, logps, ents = pick_tokens(logits, sampling, uniforms)
        for b, i in enumerate(new):
            emit(i, int(tokens[b]), float(logps[b]), float(ents[b]))
        return _Batch(list(new), cache, mask.bool(), tokens, last_pos + 1)

    queue = list(range(len(rows)))
    batch: _Batch | None = None
    while True:
        # -- schedule: drop finished rows when enough have finished or a queued row could take their place ----------
        running = [] if batch is None else [b for b, i in enumerate(batch.live) if rows[i].finish is None]
        reserved = sum(reserve(batch.live[b]) for b in running) if batch is not None else 0
        admissible = bool(queue) and len(running) < engine.max_batch_size and (
            not running or cfg.kv_budget_tokens is None or reserved + reserve(queue[0]) <= cfg.kv_budget_tokens)
        if batch is not None and len(running) < len(batch.live) and (
                admissible or not running or len(batch.live) - len(running) >= max(1, engine.prune_fraction
                                                                                   * len(batch.live))):
            if running:
                batch.select(running)
            else:
                batch = None
        if admissible:
            new: list[int] = []
            while queue and len(running) + len(new) < engine.max_batch_size and (
                    not (running or new) or cfg.kv_budget_tokens is None
                    or reserved + reserve(queue[0]) <= cfg.kv_budget_tokens):
                reserved += reserve(queue[0])
                new.append(queue.pop(0))
            arrived = admit(new)
            if batch is None:
                batch = arrived
            else:
                batch.merge(arrived, extra)
            continue  # rows finished at their first token are dropped by the next pass
        if batch is None:
            break
        stats.peak_rows = max(stats.peak_rows, len(batch.live))
        _round(engine, model, batch, rows, sampling, cfg, pattern, stats, emit, temperature, extra, kw, device)


def _round(engine: Any, model: Any, batch: _Batch, rows: list[Any], sampling: SamplingParams, cfg: S3RConfig,
           pattern: SparsePattern, stats: S3RStats, emit: Any, temperature: float, extra: int, kw: str,
           device: torch.device) -> None:
    """One draft + verify round over every row of ``batch`` (finished rows ride along without emitting)."""
    n_rows = len(batch.live)
    running = [rows[i].finish is None for i in batch.live]
    # a round emits up to k + 1 tokens: a row near the end of its budget counts fewer drafts (its own k, so its
    # samples do not depend on its batch-mates; the batch drafts the most any row counts)
    row_k = [max(0, min(cfg.k, sampling.max_new_tokens - len(rows[i].ids) - 1)) if r else 0
             for i, r in zip(batch.live, running)]
    k = max(row_k)
    # a fixed 2 * cfg.k + 1 uniforms per row and round: drafts, acceptance tests, the resample / bonus token
    uniforms = _uniforms([rows[i] for i in batch.live], 2 * cfg.k + 1, device)
    start = batch.valid.shape[1]

    # draft: k sparse single-token forwards over the shared cache, then roll their KV back
    t0 = time.perf_counter()
    drafted: list[torch.Tensor] = []
    draft_probs: list[torch.Tensor] = []
    if k:
        sparse_stats = SparseStats()
        token, valid = batch.pending, batch.valid
        with sparse_attention(model, pattern, sparse_stats):
            for j in range(k):
                valid = torch.cat([valid, valid.new_ones((n_rows, 1))], dim=1)
                out = model(input_ids=token.unsqueeze(-1), attention_mask=valid[:, None, None, :],
                            position_ids=(batch.next_pos + j).unsqueeze(-1), use_cache=True, **{kw: batch.cache})
                q = sampling_probs(out.logits[:, -1], sampling)
                token = sample_from(q, uniforms[:, j]) if not sampling.greedy else q.argmax(-1)
                drafted.append(token)
                draft_probs.append(q)
        crop_cache(batch.cache, k)
        stats.draft_forwards += k
        stats.sparse_visible_keys += sparse_stats.visible
        stats.sparse_kept_keys += sparse_stats.kept
    stats.draft_s += time.perf_counter() - t0

    # verify: one dense forward over [pending, d_1 .. d_k]; a query sees the old valid positions and the block causally
    t0 = time.perf_counter()
    n = k + 1
    block = torch.stack([batch.pending, *drafted], dim=1)
    causal = torch.ones((n, n), dtype=torch.bool, device=device).tril()
    mask = torch.cat([batch.valid[:, None, None, :].expand(n_rows, 1, n, start),
                      causal[None, None].expand(n_rows, 1, n, n)], dim=-1)
    positions = batch.next_pos.unsqueeze(-1) + torch.arange(n, device=device)
    out = model(input_ids=block, attention_mask=mask, position_ids=positions, use_cache=True, **{kw: batch.cache})
    logits = out.logits.float()
    stats.verify_forwards += 1
    target = sampling_probs(logits, sampling)
    drafted_t = block[:, 1:]
    draft_t = torch.stack(draft_probs, dim=1) if k else target.new_zeros((n_rows, 0, target.shape[-1]))
    accepted, following = speculative_accept(target, draft_t, drafted_t, uniforms[:, cfg.k:cfg.k + k],
                                             uniforms[:, 2 * cfg.k], torch.tensor(row_k, device=device))
    stats.verify_s += time.perf_counter() - t0

    # the dense log-probs / entropies of what is emitted: log_softmax(logits / T), as pick_tokens reports them
    logp = torch.log_softmax(logits / temperature, dim=-1)
    entropy = -(logp.exp() * logp).nan_to_num().sum(-1)
    emitted = torch.cat([drafted_t, following.unsqueeze(-1)], dim=1)
    emitted = emitted.scatter(1, accepted.unsqueeze(-1), following.unsqueeze(-1))  # token m is the resample/bonus
    emitted_logp = logp.gather(-1, emitted.unsqueeze(-1)).squeeze(-1)
    tokens_l, logp_l, ent_l, acc_l = emitted.tolist(), emitted_logp.tolist(), entropy.tolist(), accepted.tolist()
    stats.rounds += 1
    for b, i in enumerate(batch.live):
        if not running[b]:
            continue
        stats.drafted += row_k[b]
        stats.accepted += acc_l[b]
        stats.row_rounds += 1
        for t in range(acc_l[b] + 1):
            emit(i, tokens_l[b][t], logp_l[b][t], ent_l[b][t])
            if rows[i].finish is not None:
                break

    # the block's positions up to the last accepted draft are valid; rejected drafts' positions become holes
    batch.valid = torch.cat([batch.valid, torch.arange(n, device=device)[None, :] <= accepted[:, None]], dim=1)
    batch.pending = following
    batch.next_pos = batch.next_pos + 1 + accepted
    width = batch.valid.shape[1]
    if width - int(batch.valid.sum(1).max()) > cfg.compact_fraction * width:
        batch.valid = compact_cache(batch.cache, batch.valid, extra=extra)
        stats.compactions += 1
