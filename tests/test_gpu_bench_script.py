"""The GPU engine-comparison script's CPU path (``--engines hf`` on the tiny model): the JSON it writes, a missing
vLLM reported as a skipped section, and a failing section recorded without losing the others."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "compare_engines.py"
SMALL = ["--model", "tiny", "--device", "cpu", "--hf-precision", "fp32", "--n-prompts", "3", "--samples", "2",
         "--new-tokens", "6", "--repeats", "2", "--logprob-prompts", "2", "--greedy-prompts", "3"]


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("compare_engines", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(script, tmp_path: Path, *extra: str) -> dict:
    out = tmp_path / "result.json"
    assert script.main([*SMALL, *extra, "--out", str(out)]) == 0
    return json.loads(out.read_text())


def test_hf_only_cpu_run_writes_every_section(script, tmp_path):
    result = run(script, tmp_path, "--engines", "hf")
    sections = result["sections"]
    assert list(sections) == ["setup", "load", "engine:hf", "throughput", "logprobs", "greedy"]
    assert all(s["status"] == "ok" for s in sections.values()), sections
    assert sections["load"]["model"] == "tiny-seed0" and sections["load"]["prompts"] == 3
    throughput = sections["throughput"]["hf"]
    assert len(throughput["runs"]) == 2 and all(r["tokens"] > 0 for r in throughput["runs"])
    rates = sorted(r["tokens_per_s"] for r in throughput["runs"])
    assert throughput["tokens_per_s_median"] == pytest.approx(sum(rates) / 2)
    assert "vllm" not in sections["throughput"] and "vllm_over_hf" not in sections["throughput"]
    # fp32 hf decoding: its log-probs and greedy tokens are the teacher-forced fp32 forward's
    logprobs = sections["logprobs"]["hf"]
    assert logprobs["tokens"] > 0 and logprobs["max_abs_diff"] < 1e-4 and logprobs["fraction_within_tol"] == 1.0
    greedy = sections["greedy"]["per_engine"]["hf"]
    assert greedy["reference_argmax_agreement"] == 1.0
    assert greedy["first_disagreement_with_reference"] == [None, None, None]


def test_missing_vllm_is_a_skipped_section(script, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError, installed or not
    result = run(script, tmp_path, "--engines", "vllm,hf")
    sections = result["sections"]
    assert sections["setup"]["vllm"] is None
    assert sections["engine:vllm"]["status"] == "skipped"
    assert "vllm is not importable" in sections["engine:vllm"]["reason"]
    assert sections["throughput"]["status"] == "ok" and set(sections["throughput"]) >= {"hf"}
    assert "vllm" not in sections["throughput"]
    assert sections["greedy"]["vllm_vs_hf"]["status"] == "skipped"


def test_a_failing_section_is_recorded_and_the_rest_still_run(script, tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("reference forward exploded")

    monkeypatch.setattr(script, "logprob_agreement", broken)
    result = run(script, tmp_path, "--engines", "hf")
    sections = result["sections"]
    assert sections["logprobs"]["status"] == "error"
    assert "reference forward exploded" in sections["logprobs"]["error"]
    assert sections["greedy"]["status"] == "ok" and sections["throughput"]["status"] == "ok"


def test_time_budget_skips_late_sections(script, tmp_path):
    result = run(script, tmp_path, "--engines", "hf", "--budget-s", "0")
    sections = result["sections"]
    assert sections["load"]["status"] == "ok"  # setup and load always run
    for name in ("engine:hf", "throughput", "logprobs", "greedy"):
        assert sections[name]["status"] == "skipped" and "time budget" in sections[name]["reason"]
