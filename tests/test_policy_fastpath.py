"""The CPU fast path: precision detection, MKL-packed linears in the hf engine, bf16 decoding copies."""

from __future__ import annotations

import pytest
import torch

from agents.grpo.config import from_dict
from agents.policy import SamplingParams, load_policy, make_engine
from agents.policy.fastpath import PackedLinearCache, mkl_packing_available, resolve_precision

needs_mkl = pytest.mark.skipif(not mkl_packing_available(), reason="this torch build has no MKL")


@pytest.fixture()
def tiny():
    return load_policy("tiny", seed=0)


def _prompts(policy) -> list[str]:
    return [policy.prompt_text([{"role": "user", "content": q}]) for q in ("1+1?", "what is 12*7?", "hi")]


def _teacher_forced(model, rollout, temperature: float) -> torch.Tensor:
    ids = torch.tensor([rollout.prompt_ids + rollout.response_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(rollout.prompt_ids) - 1:-1].float()
    lp = torch.log_softmax(logits / temperature, -1)
    return lp.gather(-1, torch.tensor(rollout.response_ids).unsqueeze(-1)).squeeze(-1)


def test_precision_resolution(monkeypatch):
    assert resolve_precision("fp32") == "fp32" and resolve_precision("bf16") == "bf16"
    monkeypatch.setenv("RLVR_CPU_BF16", "1")
    assert resolve_precision("auto", "cpu") == "bf16"
    monkeypatch.setenv("RLVR_CPU_BF16", "0")
    assert resolve_precision("auto", "cpu") == "fp32"
    with pytest.raises(ValueError, match="precision must be one of"):
        resolve_precision("fp8")


def test_recipe_precision_key_is_checked():
    assert from_dict({"precision": "fp32"}).precision == "fp32"
    with pytest.raises(ValueError, match="precision must be one of"):
        from_dict({"precision": "half"})
    with pytest.raises(ValueError, match="replaced by precision"):
        from_dict({"bf16": True})


@needs_mkl
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_packed_decoding_matches_plain_decoding(tiny, temperature):
    sampling = SamplingParams(temperature=temperature, max_new_tokens=16, seed=5)
    packed = make_engine(tiny, "hf", precision="fp32").generate(_prompts(tiny), 3, sampling)
    plain = make_engine(tiny, "hf", precision="fp32", pack_weights=False).generate(_prompts(tiny), 3, sampling)
    for a, b in zip(packed, plain):
        assert a.response_ids == b.response_ids and a.text == b.text
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=0)
    for ro in packed:  # and both equal a teacher-forced forward pass of the unpatched model
        expected = _teacher_forced(tiny.model, ro, temperature or 1.0)
        torch.testing.assert_close(torch.tensor(ro.logprobs), expected, atol=1e-4, rtol=0)


@needs_mkl
def test_packed_weights_follow_weight_updates(tiny):
    engine = make_engine(tiny, "hf", precision="fp32")
    sampling = SamplingParams(temperature=0.0, max_new_tokens=8)
    engine.generate(_prompts(tiny), 1, sampling)
    first = engine.packs.repacks
    engine.generate(_prompts(tiny), 1, sampling)
    assert engine.packs.repacks == first  # unchanged weights: the packed copies are reused
    with torch.no_grad():
        for p in tiny.model.parameters():
            p.add_(0.05 * torch.randn_like(p))  # what an optimizer step does: in place
    after = engine.generate(_prompts(tiny), 1, sampling)
    assert engine.packs.repacks == 2 * first
    plain = make_engine(tiny, "hf", precision="fp32", pack_weights=False).generate(_prompts(tiny), 1, sampling)
    assert [r.response_ids for r in after] == [r.response_ids for r in plain]


@needs_mkl
def test_packed_forward_is_removed_after_the_block_even_on_error(tiny):
    cache = PackedLinearCache()
    linears = [m for m in tiny.model.modules() if isinstance(m, torch.nn.Linear)]
    with pytest.raises(RuntimeError, match="boom"):
        with torch.inference_mode(), cache.applied(tiny.model) as swapped:
            assert swapped == len(linears)
            tiny.model(input_ids=torch.tensor([[1, 2, 3]]))
            raise RuntimeError("boom")
    assert all("forward" not in m.__dict__ for m in linears)
    # with grad enabled the original forward runs, so training through the block still gets gradients
    with cache.applied(tiny.model):
        tiny.model(input_ids=torch.tensor([[1, 2, 3]])).logits.sum().backward()
    assert tiny.model.lm_head.weight.grad is not None


def test_bf16_decoding_copy_is_exact_for_itself_and_refreshed_after_updates(tiny):
    engine = make_engine(tiny, "hf", precision="bf16")
    sampling = SamplingParams(temperature=1.0, max_new_tokens=12, seed=2)
    rollouts = engine.generate(_prompts(tiny), 2, sampling)
    copy = engine.decode_model()
    assert next(copy.parameters()).dtype == torch.bfloat16
    assert next(tiny.model.parameters()).dtype == torch.float32  # the policy's master weights stay fp32
    for ro in rollouts:
        assert len(ro.response_ids) == len(ro.logprobs) and all(lp <= 0 for lp in ro.logprobs)
        torch.testing.assert_close(torch.tensor(ro.logprobs), _teacher_forced(copy, ro, 1.0), atol=2e-2, rtol=0)
        # and, to bf16 accuracy, the fp32 policy's own log-probs
        torch.testing.assert_close(torch.tensor(ro.logprobs), _teacher_forced(tiny.model, ro, 1.0), atol=0.1, rtol=0)
    with torch.no_grad():
        tiny.model.lm_head.weight.mul_(0.5)
    assert engine.decode_model() is copy
    torch.testing.assert_close(copy.lm_head.weight.float(), tiny.model.lm_head.weight, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_decoding_follows_a_fused_optimizer_step_after_sync(tiny, precision):
    # Fused AdamW updates weights in place without moving their version counters: the engine's derived copies
    # (packed linears, the bf16 copy) would keep decoding the old weights. The trainer calls sync_weights.
    if precision == "fp32" and not mkl_packing_available():
        pytest.skip("MKL weight packing is not available in this torch build")
    engine = make_engine(tiny, "hf", precision=precision)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=12, seed=3)
    engine.generate(_prompts(tiny), 2, sampling)  # builds the derived copies
    params = [p for p in tiny.model.parameters()]
    opt = torch.optim.AdamW(params, lr=0.05, fused=True)
    for p in params:
        p.grad = torch.randn_like(p)
    versions = [p._version for p in params]
    opt.step()
    assert [p._version for p in params] == versions  # the trap: nothing shows the weights changed
    engine.sync_weights(tiny.model)
    after = engine.generate(_prompts(tiny), 2, sampling)
    fresh = make_engine(tiny, "hf", precision=precision).generate(_prompts(tiny), 2, sampling)
    assert [r.response_ids for r in after] == [r.response_ids for r in fresh]
    torch.testing.assert_close(torch.tensor([lp for r in after for lp in r.logprobs]),
                               torch.tensor([lp for r in fresh for lp in r.logprobs]), atol=1e-5, rtol=0)
