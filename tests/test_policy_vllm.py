"""The vllm backend without a GPU: sampling-parameter mapping, output conversion, and the engine itself over a fake
``vllm`` module that mimics the real API (``LLM(...)``, ``SamplingParams(n=, seed=)``, parallel-sampling seeds)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from grpo_toys import make_policy
from packaging.version import Version
from safetensors.torch import load_file

from agents.policy import SamplingParams, make_engine, vllm_engine
from agents.policy.vllm_engine import VLLMEngine, rollouts_from_outputs, sampling_kwargs


class FakeVLLMSamplingParams:
    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)


class FakeLLM:
    """``vllm.LLM``: records its constructor arguments; ``generate`` follows vLLM's parallel sampling, where child ``j``
    of a request with ``SamplingParams(n=n, seed=s)`` samples with seed ``s + j``, and each child's one token is a
    function of the seed it used."""

    built: list[FakeLLM] = []

    def __init__(self, **kwargs):
        self.kwargs = kwargs
        FakeLLM.built.append(self)

    @staticmethod
    def token_for(seed):
        return 3 if seed is None else 3 + seed % 13

    def generate(self, prompts, params, use_tqdm=True):
        outputs = []
        for prompt, sp in zip(prompts, params):
            children = []
            for j in range(sp.n):
                tok = self.token_for(None if sp.seed is None else sp.seed + j)
                children.append(SimpleNamespace(index=j, token_ids=[tok], text=str(tok), logprobs=[{tok: -0.5}],
                                                finish_reason="length", stop_reason=None))
            outputs.append(SimpleNamespace(prompt_token_ids=prompt["prompt_token_ids"], outputs=children[::-1]))
        return outputs


@pytest.fixture
def fake_vllm(monkeypatch):
    """Installs the fake module; returns a setter for the installed vLLM version."""
    FakeLLM.built = []
    monkeypatch.setattr(vllm_engine, "_import_vllm",
                        lambda: SimpleNamespace(LLM=FakeLLM, SamplingParams=FakeVLLMSamplingParams))
    version = {"v": "0.11.0"}
    monkeypatch.setattr(vllm_engine, "installed_vllm_version", lambda: Version(version["v"]))
    return lambda v: version.update(v=v)


def test_recorded_seeds_are_the_ones_vllm_samples_with(fake_vllm):
    engine = VLLMEngine(make_policy())
    rollouts = engine.generate(["p0", "p1 p2"], 3, SamplingParams(temperature=1.0, max_new_tokens=4, seed=7))
    for k, r in enumerate(rollouts):
        assert r.response_ids == [FakeLLM.token_for(r.seed)], k  # the sample is the one its recorded seed draws
    for i in range(2):  # one request per prompt: consecutive child seeds from the request's seed
        seeds = [r.seed for r in rollouts[3 * i: 3 * i + 3]]
        assert seeds == [seeds[0], seeds[0] + 1, seeds[0] + 2]
    assert rollouts[0].seed != rollouts[3].seed
    again = engine.generate(["p3", "p1 p2"], 3, SamplingParams(temperature=1.0, max_new_tokens=4), seeds=[1, 2])
    same = engine.generate(["p1 p2"], 3, SamplingParams(temperature=1.0, max_new_tokens=4), seeds=[2])
    assert [r.seed for r in again[3:]] == [r.seed for r in same]  # a rollout depends only on (seeds[i], j)
    greedy = engine.generate(["p0"], 2, SamplingParams(temperature=0.0, max_new_tokens=4, seed=7))
    assert [r.seed for r in greedy] == [None, None]  # greedy requests carry no seed


@pytest.mark.parametrize(("version", "mode"), [("0.10.1", "raw_logprobs"), ("0.10.2", "processed_logprobs"),
                                               ("0.10.2rc1", "processed_logprobs"), ("0.11.0", "processed_logprobs")])
def test_logprobs_mode_follows_the_installed_version(fake_vllm, version, mode):
    fake_vllm(version)
    engine = VLLMEngine(make_policy())
    kwargs = FakeLLM.built[-1].kwargs
    assert kwargs.get("logprobs_mode") == (mode if mode == "processed_logprobs" else None)
    assert engine.describe()["logprobs"] == mode and engine.describe()["vllm_version"] == version


def test_sync_weights_rebuilds_from_the_current_weights(fake_vllm):
    policy = make_policy()
    engine = VLLMEngine(policy)
    with torch.no_grad():
        policy.model.lm_head.weight.add_(1.0)  # an optimizer step
    engine.sync_weights(policy.model)
    assert len(FakeLLM.built) == 2 and engine.llm is FakeLLM.built[-1]
    saved = load_file(Path(FakeLLM.built[-1].kwargs["model"]) / "model.safetensors")
    torch.testing.assert_close(saved["lm_head.weight"], policy.model.lm_head.weight, atol=0, rtol=0)
    with pytest.raises(ValueError, match="policy"):
        engine.sync_weights(make_policy(seed=1).model)


def test_sampling_kwargs_mirror_ours():
    sp = SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=32, seed=1, stop=("\n\n", "</answer>"))
    kw = sampling_kwargs(sp, 4, 12345)
    assert kw == dict(n=4, temperature=0.7, top_p=0.9, max_tokens=32, seed=12345, stop=["\n\n", "</answer>"],
                      logprobs=0, skip_special_tokens=True, include_stop_str_in_output=False)
    assert sampling_kwargs(SamplingParams(temperature=0.0), 1, None)["seed"] is None


def test_outputs_become_prompt_major_rollouts():
    lp = lambda v: SimpleNamespace(logprob=v, rank=1, decoded_token="x")  # noqa: E731
    req = lambda prompt, outs: SimpleNamespace(prompt_token_ids=prompt, outputs=outs)  # noqa: E731
    comp = lambda i, ids, text, lps, reason, stop=None: SimpleNamespace(  # noqa: E731
        index=i, token_ids=ids, text=text, logprobs=[{t: lp(v), 99: lp(-9.0)} for t, v in zip(ids, lps)],
        finish_reason=reason, stop_reason=stop)
    outputs = [
        req([1, 2], [comp(1, [7], "b", [-0.5], "length"), comp(0, [5, 2], "a", [-0.1, -0.2], "stop")]),
        req([3], [comp(0, [8, 9], "c", [-1.0, -2.0], "stop", "</x>"), comp(1, [4], "d", [-3.0], "abort")]),
    ]
    rs = rollouts_from_outputs(outputs, 2, [[10, 11], [12, 13]])
    assert [r.response_ids for r in rs] == [[5, 2], [7], [8, 9], [4]]
    assert [r.prompt_ids for r in rs] == [[1, 2], [1, 2], [3], [3]]
    assert [r.logprobs for r in rs] == [[-0.1, -0.2], [-0.5], [-1.0, -2.0], [-3.0]]
    assert [r.finish_reason for r in rs] == ["stop", "length", "stop", "length"]
    assert [r.seed for r in rs] == [10, 11, 12, 13] and rs[2].meta == {"stop_reason": "</x>"}
    assert all(r.entropies is None for r in rs)
    with pytest.raises(RuntimeError):
        rollouts_from_outputs(outputs, 3, [[0, 0, 0], [0, 0, 0]])


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed here")
def test_missing_vllm_gives_clear_error():
    from agents.policy import load_policy

    with pytest.raises(ImportError, match="pip install vllm"):
        make_engine(load_policy("tiny"), backend="vllm")
