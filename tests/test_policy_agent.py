"""PolicyAgent: chat-template prompts from infos, per-sample seeds, token counts, provenance; and a real env."""

from __future__ import annotations

import gymnasium as gym
import pytest

from agents.policy import PolicyAgent, SamplingParams, load_policy, make_engine


@pytest.fixture(scope="module")
def agent():
    p = load_policy("tiny")
    return PolicyAgent(p, make_engine(p), SamplingParams(max_new_tokens=8, seed=0))


def test_prompts_use_messages_then_observation(agent):
    msgs = [{"role": "user", "content": "What is 1+1?"}]
    out = agent.act(["ignored", "plain text"], [{"messages": msgs}, {}])
    assert len(out) == 2 and all(isinstance(t, str) for t in out)
    tok = agent.policy.tokenizer
    assert agent.last_rollouts[0].prompt_ids == tok(agent.policy.prompt_text(msgs), add_special_tokens=False).input_ids
    plain = agent.policy.prompt_text([{"role": "user", "content": "plain text"}])
    assert agent.last_rollouts[1].prompt_ids == tok(plain, add_special_tokens=False).input_ids
    assert agent.last_token_counts == [len(r.response_ids) for r in agent.last_rollouts]
    assert [r.text for r in agent.last_rollouts] == out


def test_per_sample_seeds_make_results_batch_independent(agent):
    infos = [{"seed": 10}, {"seed": 11}, {"seed": 12}]
    batch = agent.act(["a", "a", "b"], infos)
    assert batch[1] == agent.act(["a"], [{"seed": 11}])[0]
    assert batch[2] == agent.act(["b"], [{"seed": 12}])[0]
    with pytest.raises(ValueError, match="seed"):
        agent.act(["a", "b"], [{"seed": 1}, {}])
    with pytest.raises(ValueError):
        agent.act(["a", "b"], [{}])
    assert agent.act([], []) == []


def test_describe_is_provenance(agent):
    d = agent.describe()
    assert d["model"] == "tiny-seed0" and len(d["weights_hash"]) == 64
    assert d["sampling"]["max_new_tokens"] == 8 and d["engine"]["backend"] == "hf" and d["n_params"] > 0


def test_runs_against_a_real_env(agent):
    import rlvr_envs  # noqa: F401  (registers the IDs)

    env = gym.make("rlvr/Arithmetic-v0")
    obs, info = env.reset(seed=0)
    [response] = agent.act([obs], [info])
    _, reward, terminated, _, step_info = env.step(response)
    assert terminated and isinstance(step_info["correct"], bool) and isinstance(reward, float)
