"""Issue 8: the fast CPU path vs the plain fp32 path, side by side in one run.

1. ``test_training_step``: the reference step (``fastpath_step.py``: SmolLM2-135M, all parameters, 8 x (64 + 192)
   tokens, PPO-clip, AdamW). One process alternates naive and fast steps (median wall and CPU time of ``STEPS``
   each); naive and fast then run alone, one process each, for their peak RSS. A last process checks the fast loss
   and gradient in fp32 against the naive fp32 ones on the same weights (``FP32_TOL``: only summation order differs;
   measured loss rel diff 0, gradient rel err ~1e-6). Where the fast path runs in bf16, one more process checks the
   bf16 fast step (``BF16_TOL``): against the naive fp32 step with bf16-sized tolerances (bf16 autocast alone moves
   this gradient by ~25%, cosine ~0.975, measured on an AVX512-BF16 CPU), and against the naive step under the same
   autocast with tight ones (measured loss rel diff 0, gradient rel err 6e-3), so the fast path adds little of its own.
   Speed target: >= 2.5x where the CPU multiplies bf16 in hardware (``resolve_precision("auto") == "bf16"``); on a
   CPU without it the fast path stays fp32 and the target is no slowdown (>= 1.0x), as the issue says.
2. ``test_grpo_run``: a short GRPO run on rlvr/Arithmetic-v0 (same recipe, same seeds) in the plain fp32 path
   (engine without the fast path, full-logits log-probs, foreach AdamW) and in the default fast path, the two runs
   stepping in turn. Same held-out greedy accuracy within ``ACC_TOLERANCE`` at the last step, in less wall time. The
   runs are not bit-identical (packed matmuls round differently at ~1e-6, which can flip a sampled token), so "same"
   is within sampling noise.

Decoding throughput is ``test_bench_engine.py``. Run: ``pytest -q -s benchmarks/test_bench_fastpath.py``. Knobs:
RLVR_BENCH_STEPS (4 timed steps per path), RLVR_BENCH_GRPO_STEPS (6).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from agents.policy.fastpath import resolve_precision
from agents.policy.models import smollm2_gguf_path

STEPS = int(os.environ.get("RLVR_BENCH_STEPS", "4"))
GRPO_STEPS = int(os.environ.get("RLVR_BENCH_GRPO_STEPS", "6"))
ACC_TOLERANCE = 0.1  # held-out accuracy difference allowed between the two runs (about 5 of 48 tasks)
# Fast vs naive step on the same weights and batch. fp32: the same arithmetic in another order (chunked head, length
# buckets, fused kernels). Bounds are ~100x what was measured (loss 0, gradient rel err 9e-7, cosine 1 - 5e-13).
FP32_TOL = {"loss_rel_diff": 1e-5, "grad_cosine": 0.99999, "grad_rel_err": 1e-4}
# bf16 autocast: vs the fp32 step (measured 7e-4, 0.974, 0.25: plain autocast alone gives the same) and vs the naive
# step under the same autocast (measured 0, 0.99998, 6e-3).
BF16_TOL = {"loss_rel_diff": 5e-3, "grad_cosine": 0.95, "grad_rel_err": 0.35,
            "autocast_loss_rel_diff": 1e-3, "autocast_grad_cosine": 0.9995, "autocast_grad_rel_err": 0.03}
STEP_SCRIPT = Path(__file__).with_name("fastpath_step.py")
ROOT = STEP_SCRIPT.parent.parent


@pytest.fixture(scope="module", autouse=True)
def _needs_smollm2():
    try:
        smollm2_gguf_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))


def _step_process(mode: str, steps: int, precision: str = "auto") -> dict:
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, str(STEP_SCRIPT), mode, "--steps", str(steps), "--precision", precision],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=3600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads([line for line in out.stdout.splitlines() if line.startswith("{")][-1])


def _outside(check: dict, tol: dict) -> list[str]:
    """The figures of a ``compare`` run that miss their bound (cosines are lower bounds, the rest upper bounds)."""
    return [f"{k} {check[k]:.3g} (bound {b})" for k, b in tol.items()
            if (check[k] < b if k.endswith("cosine") else check[k] > b)]


def _print_check(label: str, check: dict, prefix: str = "") -> None:
    print(f"{label}: loss rel diff {check[prefix + 'loss_rel_diff']:.2e}, gradient cosine "
          f"{check[prefix + 'grad_cosine']:.6f}, gradient rel err {check[prefix + 'grad_rel_err']:.2e}")


@pytest.mark.timeout(7200)
def test_training_step():
    bf16 = resolve_precision("auto", "cpu") == "bf16"
    timing = _step_process("interleaved", STEPS)
    peak = {m: _step_process(m, 1)["peak_rss_mb"] for m in ("naive", "fast")}
    check = _step_process("compare", 0, "fp32")
    check_bf16 = _step_process("compare", 0, "bf16") if bf16 else None
    median = {m: statistics.median(ts) for m, ts in timing["step_s"].items()}
    cpu = {m: statistics.median(ts) for m, ts in timing["cpu_s"].items()}
    speedup, cpu_speedup = median["naive"] / median["fast"], cpu["naive"] / cpu["fast"]
    target = 2.5 if bf16 else 1.0
    print(f"\nreference step (8 x 256 tokens, full fine-tune), fast path precision {'bf16' if bf16 else 'fp32'}, "
          f"{STEPS} interleaved steps each after a warm-up (load average at end {os.getloadavg()[0]:.1f})")
    print("| path | step s (median) | all steps | CPU s (median) | peak RSS MB (own process) |")
    print("|---|---|---|---|---|")
    for m in ("naive", "fast"):
        steps = ", ".join(f"{t:.1f}" for t in timing["step_s"][m])
        print(f"| {m} | {median[m]:.2f} | {steps} | {cpu[m]:.1f} | {peak[m]:.0f} |")
    print(f"speed-up {speedup:.2f}x wall, {cpu_speedup:.2f}x CPU time (target >= {target}x)")
    _print_check("fp32 fast step vs fp32 naive step", check)
    if check_bf16:
        _print_check("bf16 fast step vs fp32 naive step", check_bf16)
        _print_check("bf16 fast step vs naive step under bf16 autocast", check_bf16, "autocast_")
    assert not check["bf16"] and not _outside(check, FP32_TOL), _outside(check, FP32_TOL)
    if check_bf16:
        assert check_bf16["bf16"] and not _outside(check_bf16, BF16_TOL), _outside(check_bf16, BF16_TOL)
    assert peak["fast"] <= peak["naive"], peak
    assert speedup >= target, f"fast step {speedup:.2f}x the naive one, target {target}x"


def _grpo_trainer(out_dir: Path, fast: bool):
    from agents.grpo.config import load_recipe
    from agents.grpo.trainer import Trainer
    from agents.policy import load_policy
    from agents.policy.engine import HFEngine

    cfg = load_recipe("grpo", [f"steps={GRPO_STEPS}", "prompts_per_step=4", "max_new_tokens=64", "temperature=1.0",
                               "lr=5e-5", "eval_every=0", "eval_size=48", "checkpoint_every=0", "progress=false",
                               "plot=false", f"out_dir=\"{out_dir}\"", f"precision=\"{'auto' if fast else 'fp32'}\""])
    policy = load_policy(cfg.model, seed=cfg.seed)
    if fast:
        return Trainer(cfg, policy=policy)
    trainer = _plain_trainer_class()(cfg, policy=policy, engine=HFEngine(policy, precision="fp32", pack_weights=False))
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    trainer.optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=tuple(cfg.betas))
    return trainer


class _PlainLogprobs:
    """The plain fp32 path's log-probs: full logits from the model's own forward, fp32 log-softmax, gather."""

    def _logprobs(self, model, batch, rows):
        prompts = [batch.prompt_ids[i] for i in rows]
        responses = [batch.response_ids[i] for i in rows]
        seqs = [list(p) + list(r) for p, r in zip(prompts, responses)]
        longest, width = max(map(len, seqs)), max(1, max(map(len, responses)))
        ids = torch.tensor([s + [self.pad_id] * (longest - len(s)) for s in seqs])
        mask = torch.tensor([[1] * len(s) + [0] * (longest - len(s)) for s in seqs])
        logp = torch.log_softmax(model(input_ids=ids, attention_mask=mask).logits.float(), -1)
        lp, ent = torch.zeros(len(rows), width), torch.zeros(len(rows), width)
        for j, (p, r) in enumerate(zip(prompts, responses)):
            rowlp = logp[j, len(p) - 1:len(p) - 1 + len(r)]
            lp[j, : len(r)] = rowlp.gather(-1, torch.tensor(r)[:, None]).squeeze(-1)
            ent[j, : len(r)] = -(rowlp.exp() * rowlp).sum(-1).detach()
        return lp, ent


def _plain_trainer_class() -> type:
    from agents.grpo.trainer import Trainer

    return type("PlainTrainer", (_PlainLogprobs, Trainer), {})


@pytest.mark.timeout(7200)
def test_grpo_run(tmp_path):
    # The two runs advance in lockstep (one step of each in turn), so a slow phase of the shared machine costs both:
    # back-to-back runs of a few minutes each differed by more than the fast path saves.
    trainers = {"fp32 path": _grpo_trainer(tmp_path / "fp32", fast=False),
                "fast path": _grpo_trainer(tmp_path / "fast", fast=True)}
    results = {name: {"acc": [], "wall": 0.0, "gen_s": 0.0, "train_s": 0.0, "reward": [], "tokens": 0}
               for name in trainers}

    def timed(name, fn):
        t0 = time.perf_counter()
        out = fn()
        results[name]["wall"] += time.perf_counter() - t0
        return out

    for name, t in trainers.items():
        results[name]["acc"].append(timed(name, t.evaluate)["eval_accuracy"])
    for _ in range(GRPO_STEPS):
        for name, t in trainers.items():
            t.step += 1
            record = timed(name, t.train_step)
            r = results[name]
            r["gen_s"] += record["gen_s"]
            r["train_s"] += record["train_s"]
            r["tokens"] += round(record["response_len_mean"] * record["samples"])
            r["reward"].append(round(record["reward_mean"], 3))
    for name, t in trainers.items():
        results[name]["acc"].append(timed(name, t.evaluate)["eval_accuracy"])
    print(f"\nGRPO on rlvr/Arithmetic-v0, {GRPO_STEPS} steps x 4 prompts x 8 rollouts, 64 new tokens, held-out greedy "
          f"accuracy on 48 tasks (seed_base=1); the two runs interleaved step by step")
    print("| path | held-out acc (step 0 -> last) | wall s (steps + evals) | generation s | training s | "
          "response tokens trained | train reward per step |")
    print("|---|---|---|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['acc'][0]:.3f} -> {r['acc'][-1]:.3f} | {r['wall']:.0f} | {r['gen_s']:.0f} | "
              f"{r['train_s']:.0f} | {r['tokens']} | {r['reward']} |")
    plain, fast = results["fp32 path"], results["fast path"]
    assert abs(fast["acc"][-1] - plain["acc"][-1]) <= ACC_TOLERANCE, results
    assert fast["wall"] < plain["wall"], results
