"""S3R self-speculative decoding vs dense decoding on long contexts, and an honest CPU account of sparse attention.

Part 1 (``engines``): for each model, one long prompt, ``--rows`` samples of ``--new-tokens`` tokens (EOS ignored, so
both engines emit the same number of tokens): the plain ``hf`` engine vs the same engine with
``speculative=S3RConfig(...)`` for each draft pattern. Reported: tokens/s (wall, prefill included, and the prefill's
own seconds), S3R's acceptance rate, tokens per row and round, draft / verify seconds, and the fraction of the
visible KV the drafts kept.

Part 2 (``account``): where sparse attention can pay on this CPU. For each context length (256, 1k, 4k) and batch
size, one decode step over a KV cache of that length (random keys and values: the step's cost does not depend on
them), timed three ways: dense (the model's own SDPA), with attention replaced by a no-op (the rest of the step:
projections, MLP, norms, logits), and with the sparse attention emulation. Attention's share of the step is
``1 - no_attention / dense``: the most any sparse pattern could save. Also timed: S3R's dense verify forward over
``k + 1`` tokens. Beside the seconds, the KV bytes read and the attention FLOPs per step, dense and under the pattern
(``agents.policy.sparse.attention_cost``).

Part 3 (``projection``, a cost model, not a measurement): S3R's speed-up at each (batch, context) from part 1's
tokens per round and part 2's step times, for a dense draft, this module's emulated sparse draft, and an ideal
kernel that reads only the kept keys.

    python benchmarks/s3r_decoding.py [--models tiny,smollm2] [--out benchmarks/results/s3r_decoding.json]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
NO_ATTENTION = "rlvr_no_attention"


def _interleaved_medians(model: Any, step: Any, verify: Any, pattern: Any, reps: int, min_s: float = 1.0
                         ) -> dict[str, float]:
    """Median seconds of a decode ``step`` with dense, no-op and sparse attention, and of a dense ``verify`` forward
    over a block of tokens, measured in turn within every repetition (so drifting load on a shared machine hits all
    alike); at least ``reps`` repetitions and ``min_s`` seconds, at most 200 repetitions."""
    from agents.policy.sparse import SPARSE_ATTENTION, sparse_attention

    dense = model.config._attn_implementation
    modes = {"dense_s": (dense, step), "no_attention_s": (NO_ATTENTION, step),
             "sparse_emulated_s": (SPARSE_ATTENTION, step), "verify_block_s": (dense, verify)}
    times: dict[str, list[float]] = {key: [] for key in modes}
    with sparse_attention(model, pattern):  # makes the sparse pattern current; each mode is switched to below
        try:
            started = time.perf_counter()
            for rep in range(200):
                for key, (name, fn) in modes.items():
                    model.set_attn_implementation(name)
                    t0 = time.perf_counter()
                    fn()
                    if rep:  # the first repetition warms up
                        times[key].append(time.perf_counter() - t0)
                if rep >= reps and time.perf_counter() - started >= min_s:
                    break
        finally:
            model.set_attn_implementation(dense)
    return {key: statistics.median(values) for key, values in times.items()}


def _decode_step(model: Any, cache_kw: str, cache: Any, tokens: Any, positions: Any, mask: Any = None) -> None:
    """One forward of ``tokens`` (B, n) over ``cache``, then the cache is cropped back to its length."""
    model(input_ids=tokens, position_ids=positions, attention_mask=mask, use_cache=True, **{cache_kw: cache})
    cache.crop(-tokens.shape[1])


def _no_attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, **kwargs: Any) -> tuple:
    """Attention replaced by zeros of its output's shape: times everything else in a decode step."""
    return query.new_zeros(query.shape[0], query.shape[2], query.shape[1], value.shape[-1]), None


def long_prompt(policy: Any, tokens: int) -> list[int]:
    """About ``tokens`` tokens of real text (this repository's docs) in the policy's chat template."""
    text = ""
    for path in sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]:
        text += path.read_text(errors="replace") + "\n"
    ids = policy.tokenizer(text, add_special_tokens=False)["input_ids"][:tokens]
    body = policy.tokenizer.decode(ids)
    prompt = policy.prompt_text([{"role": "user", "content": "Summarize the following notes.\n\n" + body}])
    return policy.tokenizer(prompt, add_special_tokens=False)["input_ids"]


def engines(policy: Any, prompt_tokens: int, rows: int, new_tokens: int, configs: list[Any], temperature: float
            ) -> dict[str, Any]:
    from agents.policy.engine import HFEngine, SamplingParams

    prompt = long_prompt(policy, prompt_tokens)
    sp = SamplingParams(temperature=temperature, max_new_tokens=new_tokens, seed=0)
    warm = SamplingParams(temperature=temperature, max_new_tokens=2, seed=0)
    dense = HFEngine(policy, ignore_eos=True)
    dense.generate([prompt[:64]], 1, warm)  # packs the weights / makes the bf16 copy once
    t0 = time.perf_counter()
    dense.generate([prompt], rows, SamplingParams(temperature=temperature, max_new_tokens=1, seed=0))
    prefill_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    out = dense.generate([prompt], rows, sp)
    dense_s = time.perf_counter() - t0
    tokens = sum(r.n_tokens for r in out)
    result: dict[str, Any] = {
        "prompt_tokens": len(prompt), "rows": rows, "new_tokens": new_tokens, "temperature": temperature,
        "precision": dense.precision, "prefill_s": prefill_s,
        "dense": {"wall_s": dense_s, "tokens": tokens, "tokens_per_s": tokens / dense_s,
                  "decode_tokens_per_s": tokens / max(dense_s - prefill_s, 1e-9)},
        "s3r": []}
    for cfg in configs:
        engine = HFEngine(policy, ignore_eos=True, speculative=cfg)
        engine.packs, engine._bf16_copy = dense.packs, dense._bf16_copy  # the same derived weights, already built
        t0 = time.perf_counter()
        spec = engine.generate([prompt], rows, sp)
        wall = time.perf_counter() - t0
        n = sum(r.n_tokens for r in spec)
        stats = engine.speculative_stats.to_dict()
        result["s3r"].append({
            "config": {"k": cfg.k, "sinks": cfg.sinks, "window": cfg.window, "topk": cfg.topk},
            "wall_s": wall, "tokens": n, "tokens_per_s": n / wall,
            "decode_tokens_per_s": n / max(wall - prefill_s, 1e-9), "speedup_vs_dense": (n / wall) / (tokens / dense_s),
            "acceptance_rate": stats["acceptance_rate"], "tokens_per_row_round": stats["tokens_per_row_round"],
            "draft_s": stats["draft_s"], "verify_s": stats["verify_s"], "draft_forwards": stats["draft_forwards"],
            "verify_forwards": stats["verify_forwards"], "sparse_kept_fraction": stats["sparse_kept_fraction"]})
        print(f"  s3r {result['s3r'][-1]['config']}: {n / wall:.1f} tok/s vs dense {tokens / dense_s:.1f}, "
              f"acceptance {stats['acceptance_rate']:.3f}", flush=True)
    return result


def account(policy: Any, contexts: list[int], batches: list[int], pattern: Any, reps: int, precision: str,
            k: int) -> list[dict[str, Any]]:
    import torch
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    from agents.policy.engine import HFEngine, new_cache
    from agents.policy.sparse import attention_cost

    AttentionInterface.register(NO_ATTENTION, _no_attention)
    AttentionMaskInterface.register(NO_ATTENTION, sdpa_mask)
    engine = HFEngine(policy, precision=precision)
    model = engine.decode_model().eval()
    cfg = model.config
    dtype = next(model.parameters()).dtype
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    rows = []
    gen = torch.Generator().manual_seed(0)
    for batch in batches:
        for context in contexts:
            cache = new_cache(context + k + 2)
            for layer in range(cfg.num_hidden_layers):
                shape = (batch, cfg.num_key_value_heads, context, head_dim)
                cache.update(torch.randn(shape, generator=gen).to(dtype), torch.randn(shape, generator=gen).to(dtype),
                             layer)
            token = torch.randint(0, cfg.vocab_size, (batch, 1), generator=gen)
            position = torch.full((batch, 1), context)

            step = functools.partial(_decode_step, model, engine.cache_kw, cache, token, position)
            # S3R's verify forward: k + 1 tokens with the explicit (B, 1, k+1, L+k+1) boolean mask it passes
            block = torch.randint(0, cfg.vocab_size, (batch, k + 1), generator=gen)
            causal = torch.ones((k + 1, k + 1), dtype=torch.bool).tril()
            mask = torch.cat([torch.ones((batch, 1, k + 1, context), dtype=torch.bool),
                              causal[None, None].expand(batch, 1, k + 1, k + 1)], dim=-1)
            verify = functools.partial(_decode_step, model, engine.cache_kw, cache, block,
                                       context + torch.arange(k + 1).expand(batch, k + 1), mask)
            packed = engine.packs.applied(model) if engine.packs is not None else contextlib.nullcontext()
            with torch.inference_mode(), packed:
                timed = _interleaved_medians(model, step, verify, pattern, reps)
            cost = attention_cost(context, n_layers=cfg.num_hidden_layers, n_heads=cfg.num_attention_heads,
                                  n_kv_heads=cfg.num_key_value_heads, head_dim=head_dim,
                                  bytes_per_element=torch.finfo(dtype).bits // 8, pattern=pattern)
            row = {"batch": batch, "context": context, "dtype": str(dtype).removeprefix("torch."), **timed,
                   "attention_s": timed["dense_s"] - timed["no_attention_s"],
                   "attention_share": 1 - timed["no_attention_s"] / timed["dense_s"],
                   # per step (all rows): what a kernel that skips dropped keys could save, at best
                   **{key: value * batch if key.endswith(("bytes", "flops")) else value for key, value in cost.items()}}
            rows.append(row)
            print(f"  batch {batch} context {context}: step {timed['dense_s'] * 1e3:.1f} ms, attention "
                  f"{row['attention_share']:.1%}, sparse emulation {timed['sparse_emulated_s'] * 1e3:.1f} ms, "
                  f"verify of {k + 1} {timed['verify_block_s'] * 1e3:.1f} ms", flush=True)
    return rows


def projection(steps: list[dict[str, Any]], measured: dict[str, Any], k: int) -> dict[str, Any]:
    """A cost model, not a measurement: S3R's decode speed-up over dense at each (batch, context) of the account, from
    the tokens a row gets per round as measured by the engine run (``measured``, at its prompt length) and the step
    times measured above: ``tokens_per_round * dense_s / (k * draft_s + verify_block_s)``, with ``draft_s`` for
    three drafts: a dense step (no sparsity at all), this module's emulation, and an ideal kernel that reads only
    the kept keys (``no_attention_s + attention_s * kept / context``; selection overhead not counted)."""
    per_round = measured["tokens_per_row_round"]
    rows = []
    for step in steps:
        ideal = step["no_attention_s"] + step["attention_s"] * step["kept_keys"] / step["context"]
        rows.append({"batch": step["batch"], "context": step["context"], **{
            f"speedup_{name}": per_round * step["dense_s"] / (k * draft + step["verify_block_s"])
            for name, draft in (("dense_draft", step["dense_s"]), ("emulated_sparse_draft", step["sparse_emulated_s"]),
                                ("ideal_sparse_draft", ideal))}})
    return {"k": k, "tokens_per_row_round": per_round, "acceptance_rate": measured["acceptance_rate"], "rows": rows}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="tiny,smollm2")
    p.add_argument("--prompt-tokens", type=int, default=1024)
    p.add_argument("--rows", type=int, default=4)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--contexts", default="256,1024,4096")
    p.add_argument("--batches", default="1,8")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "s3r_decoding.json"))
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    import torch

    from agents.policy import load_policy
    from agents.policy.s3r import S3RConfig
    from agents.policy.sparse import SparsePattern

    configs = [S3RConfig(k=4, sinks=4, window=64, topk=64), S3RConfig(k=4, sinks=4, window=128, topk=128),
               S3RConfig(k=2, sinks=4, window=64, topk=64)]
    pattern = SparsePattern(sinks=4, window=64, topk=64)
    assert configs[0].pattern == pattern  # the projection combines that config's acceptance with the pattern's cost
    started = time.perf_counter()
    out: dict[str, Any] = {
        "benchmark": "s3r_decoding",
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count(),
                    "torch_threads": torch.get_num_threads(), "load_average_at_start": os.getloadavg(),
                    "note": "shared 2-core CPU machine; other jobs (training runs) were running during the measurement, "
                            "so absolute seconds are noisy; ratios measured back to back are the figures to read"},
        "models": {}}
    for name in args.models.split(","):
        print(f"{name}:", flush=True)
        policy = load_policy(name, seed=0)
        if name == "tiny":  # the tiny model's 2,048 positions would not hold the 4k account
            policy.model.config.max_position_embeddings = 8192
        entry: dict[str, Any] = {"engines": engines(policy, args.prompt_tokens, args.rows, args.new_tokens, configs,
                                                    args.temperature)}
        entry["account"] = {"pattern": {"sinks": pattern.sinks, "window": pattern.window, "topk": pattern.topk},
                            "precision": entry["engines"]["precision"],
                            "steps": account(policy, [int(c) for c in args.contexts.split(",")],
                                             [int(b) for b in args.batches.split(",")], pattern, args.reps,
                                             entry["engines"]["precision"], configs[0].k)}
        entry["projection"] = projection(entry["account"]["steps"], entry["engines"]["s3r"][0], configs[0].k)
        out["models"][name] = entry
    out["machine"]["load_average_at_end"] = os.getloadavg()
    out["wall_s"] = time.perf_counter() - started
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out} ({out['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
