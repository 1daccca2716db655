"""Policy loading: tiny from config (deterministic), local directories, errors. SmolLM2 (a GGUF conversion, about a
minute the first time) is checked in benchmarks/test_bench_engine.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from agents.policy import load_policy, weights_hash


def test_tiny_is_deterministic_and_leaves_global_rng_alone():
    torch.manual_seed(123)
    before = torch.rand(3)
    torch.manual_seed(123)
    a = load_policy("tiny", seed=0)
    after = torch.rand(3)
    assert torch.equal(before, after)
    b = load_policy("tiny", seed=0)
    c = load_policy("tiny", seed=1)
    assert a.weights_hash == b.weights_hash == weights_hash(b.model)
    assert a.weights_hash != c.weights_hash
    assert a.n_params < 200_000
    with torch.no_grad():
        a.model.model.embed_tokens.weight[0, 0] += 1.0
    assert weights_hash(a.model) != b.weights_hash


def test_tiny_tokenizer_round_trips_and_has_chat_template():
    p = load_policy("tiny")
    tok = p.tokenizer
    text = "What is 12 + 30?\n\tAnswer: {42}!"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text
    prompt = p.prompt_text([{"role": "user", "content": "hi"}])
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.eos_token_id in tok(prompt, add_special_tokens=False)["input_ids"]
    with pytest.raises(ValueError):
        p.prompt_text([{"content": "no role"}])
    tok.chat_template = None  # a base model without a template gets the plain turns (this policy is ours alone)
    assert p.prompt_text([{"role": "user", "content": "hi"}]) == "hi\n\n"


def test_local_directory_and_bf16(tmp_path):
    p = load_policy("tiny", seed=3)
    p.model.save_pretrained(tmp_path)
    p.tokenizer.save_pretrained(tmp_path)
    q = load_policy(str(tmp_path))
    assert q.weights_hash == p.weights_hash
    assert q.info["path"] == str(tmp_path.resolve())
    assert load_policy("tiny", dtype="bfloat16").model.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="dtype"):
        load_policy("tiny", dtype="int3")


def test_missing_model_gives_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="cannot load model"):
        load_policy(str(tmp_path / "no-such-model"))
    with pytest.raises(FileNotFoundError, match="cannot load model"):
        load_policy("no-such-org/no-such-model")


def test_cached_build_leaves_nothing_after_a_failed_build(tmp_path):
    from agents.policy.models import cached_build, tiny_model, tiny_tokenizer

    out = tmp_path / "models" / "thing-abc"
    calls = []

    class DiesWhileSaving:  # writes part of its weights, then the process "dies"
        def save_pretrained(self, path):
            (Path(path) / "model.safetensors").write_bytes(b"partial")
            raise RuntimeError("killed mid-save")

    def failing():
        calls.append("fail")
        return DiesWhileSaving(), tiny_tokenizer(), {"ok": 0}

    with pytest.raises(RuntimeError, match="killed mid-save"):
        cached_build(out, failing)
    # nothing half-written is left where the next load would look, nor a stray temporary folder
    assert not out.exists() and [p.name for p in out.parent.iterdir() if not p.name.endswith(".lock")] == []

    def build():
        calls.append("build")
        tok = tiny_tokenizer()
        return tiny_model(tok), tok, {"ok": 1}

    assert cached_build(out, build) == out and json.loads((out / "warmstart.json").read_text()) == {"ok": 1}
    assert cached_build(out, failing) == out  # a finished build is reused, never rebuilt
    assert calls == ["fail", "build"]
