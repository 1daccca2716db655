"""The vllm backend's pure parts (no GPU here): sampling-parameter mapping and output conversion."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest

from agents.policy import SamplingParams, make_engine
from agents.policy.vllm_engine import rollouts_from_outputs, sampling_kwargs


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
