"""``rlvr eval`` records do not depend on batching: with the default fp32 decoding, the same seeds give the same
responses for any ``--batch-size``, ``--decode-slots`` and torch thread count, whether the CPU is taken to have bf16 matmuls or not
(``RLVR_CPU_BF16=1`` / ``0``), and the results file records the precision. ``--precision auto`` on a bf16 CPU decodes in
bf16 (other responses): the flag is what makes the records portable."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("agents.policy")
torch = pytest.importorskip("torch")

from rlvr_envs.cli import main as rlvr_main  # noqa: E402

ARGS = ["eval", "--env", "rlvr/Arithmetic-v0", "--model", "tiny", "--samples", "2", "--limit", "6", "--seed", "5",
        "--temperature", "1.0", "--max-new-tokens", "12", "--no-progress"]


def responses(tmp_path, name: str, *extra: str) -> tuple[list[str], dict]:
    out = tmp_path / f"{name}.json"
    assert rlvr_main([*ARGS, *extra, "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    return [r["response"] for r in doc["records"]], doc["provenance"]["agent"]["engine"]


def test_fp32_records_are_the_same_for_any_batching_and_cpu(tmp_path, monkeypatch):
    threads = torch.get_num_threads()
    try:
        seen = {}
        for bf16 in ("1", "0"):
            monkeypatch.setenv("RLVR_CPU_BF16", bf16)
            for batch, slots in ((3, 64), (12, 64), (12, 2)):
                seen[(bf16, batch, slots)], engine = responses(tmp_path, f"{bf16}-{batch}-{slots}", "--batch-size",
                                                               str(batch), "--decode-slots", str(slots))
                assert engine["precision"] == "fp32"
        torch.set_num_threads(1 if threads > 1 else 2)  # another thread count splits the reductions differently
        seen["threads"], _ = responses(tmp_path, "threads", "--batch-size", "5")
        torch.set_num_threads(threads)
        first = next(iter(seen.values()))
        assert len(first) == 12 and len(set(first)) > 1  # sampled, varied responses
        assert all(r == first for r in seen.values())
        monkeypatch.setenv("RLVR_CPU_BF16", "1")
        auto, engine = responses(tmp_path, "auto", "--precision", "auto", "--batch-size", "12")
        assert engine["precision"] == "bf16" and auto != first  # what the default avoids
    finally:
        torch.set_num_threads(threads)
        from transformers.utils import logging as hf_logging

        hf_logging.enable_progress_bar()  # --no-progress turned transformers' bars off for the whole process
