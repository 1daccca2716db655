"""The harness with a real (tiny, from-config) policy: `rlvr eval --model tiny` wiring, token counts, provenance,
and interrupt + resume giving exactly the records of an uninterrupted run."""

import pytest

from rlvr_envs.harness import Results, evaluate

policy_mod = pytest.importorskip("agents.policy", reason="agents.policy is not available")

ARITH = "rlvr/Arithmetic-v0"


@pytest.fixture(scope="module")
def tiny_agent():
    policy = policy_mod.load_policy("tiny", seed=0)
    sampling = policy_mod.SamplingParams(temperature=1.0, max_new_tokens=12)
    return policy_mod.PolicyAgent(policy, policy_mod.make_engine(policy), sampling)


class InterruptAfter:
    def __init__(self, agent, calls):
        self.agent, self.calls = agent, calls

    def act(self, observations, infos):
        if self.calls == 0:
            raise KeyboardInterrupt
        self.calls -= 1
        return self.agent.act(observations, infos)

    @property
    def last_token_counts(self):
        return self.agent.last_token_counts

    def describe(self):  # the same run as the wrapped agent's (resume compares agent provenance)
        cls = type(self.agent)
        return {**self.agent.describe(), "class": f"{cls.__module__}.{cls.__qualname__}"}


def test_tiny_policy_interrupt_and_resume_equals_one_run(tiny_agent, tmp_path):
    kw = dict(n_samples=2, seed=1, limit=5, batch_size=3, progress=False)
    full = evaluate(tiny_agent, ARITH, **kw)
    assert full.metrics["length_unit"] == "tokens"
    assert full.metrics["tokens_generated"] == sum(r["tokens"] for r in full.records) > 0
    agent_prov = full.provenance["agent"]
    assert agent_prov["model"].startswith("tiny") and len(agent_prov["weights_hash"]) >= 16
    assert full.metrics["flops_estimate"] == 2 * agent_prov["n_params"] * full.metrics["tokens_generated"]
    assert agent_prov["sampling"]["temperature"] == 1.0
    # Sampling really depends on the per-sample seed: not every pair of samples of a task is identical.
    assert any(a["response"] != b["response"] for a, b in zip(full.records[::2], full.records[1::2]))
    out = tmp_path / "tiny.json"
    with pytest.raises(KeyboardInterrupt):
        evaluate(InterruptAfter(tiny_agent, 2), ARITH, out=out, **kw)
    assert len(Results.load(out).records) == 6
    resumed = evaluate(tiny_agent, ARITH, out=out, resume=True, **kw)
    assert resumed.records == full.records and resumed.metrics == full.metrics
