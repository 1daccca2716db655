"""verl's multi-turn path: ``RlvrEnvAgentLoop`` (a ``verl.experimental.agent_loop`` agent loop) plays rlvr/ToolUse-v0
through ``rlvr serve`` with verl's own Continuous Token builder (SmolLM2's chat template). The LLM server is a
scripted one that answers with the env's gold turns (or a wrong final turn): the env, the server, the session and
verl's token merging are real."""

from __future__ import annotations

import asyncio
import json

import gymnasium as gym
import pytest

pytest.importorskip("verl", reason="runs in .venv-verl (Makefile): verl's omegaconf needs the ANTLR 4.9 runtime")
pytest.importorskip("openenv")

from omegaconf import OmegaConf  # noqa: E402
from verl.experimental.agent_loop.agent_loop import DictConfigWrap  # noqa: E402
from verl.utils.dataset.rl_dataset import RLHFDataset  # noqa: E402
from verl.workers.rollout.replica import TokenOutput  # noqa: E402

import rlvr_envs  # noqa: E402,F401
from rlvr_envs.integrations.verl_agent_loop import RlvrEnvAgentLoop  # noqa: E402
from rlvr_envs.serve import create_app, running_server  # noqa: E402

ENV = "rlvr/ToolUse-v0"


@pytest.fixture(scope="module")
def served():
    with running_server(create_app([ENV], max_sessions=8)) as url:
        yield url


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from agents.policy.models import smollm2_dir

    return AutoTokenizer.from_pretrained(smollm2_dir())


class ScriptedLLM:
    """verl's ``server_manager.generate`` answering each call with the next scripted turn (and its end-of-turn token)."""

    def __init__(self, tokenizer, turns: list[str]):
        self.tokenizer, self.turns, self.calls = tokenizer, list(turns), []

    async def generate(self, request_id, prompt_ids, sampling_params, **kwargs) -> TokenOutput:
        self.calls.append(list(prompt_ids))
        ids = self.tokenizer.encode(self.turns.pop(0), add_special_tokens=False) + [self.tokenizer.eos_token_id]
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids), stop_reason="completed")


def play(tokenizer, llm, extra_info, response_length=2048):
    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"response_length": response_length,
                                                                 "prompt_length": 4096, "multi_turn": {}}}})

    async def main():
        loop = RlvrEnvAgentLoop(trainer_config=DictConfigWrap(config), server_manager=llm, tokenizer=tokenizer,
                                processor=None, dataset_cls=RLHFDataset, data_config=DictConfigWrap(OmegaConf.create({})),
                                hf_model_type="llama")
        return await loop.run({"temperature": 1.0}, extra_info=extra_info, raw_prompt=[])

    return asyncio.run(main())


def gold_turns(index: int) -> list[str]:
    env = gym.make(ENV).unwrapped
    env.reset(options={"index": index})
    return list(env.gold_turns(env.task))


@pytest.mark.parametrize("index", [1, 4])
def test_gold_turns_earn_1_and_env_tokens_are_masked(served, tokenizer, index):
    turns = gold_turns(index)
    llm = ScriptedLLM(tokenizer, turns)
    out = play(tokenizer, llm, {"env_id": ENV, "index": index, "env_kwargs": "{}", "env_url": served})
    assert out.reward_score == 1.0 and out.extra_fields["rlvr_episode_ended"]
    assert out.extra_fields["rlvr_assistant_turns"] == len(turns) == len(llm.calls)
    assert len(out.response_ids) == len(out.response_mask) == len(out.response_logprobs)
    model_tokens = [t for t, m in zip(out.response_ids, out.response_mask) if m == 1]
    env_tokens = [t for t, m in zip(out.response_ids, out.response_mask) if m == 0]
    assert env_tokens, "the env's tool results are in the response, masked out"
    model_text = tokenizer.decode(model_tokens)
    assert all(t.strip() in model_text for t in turns)  # every assistant turn is trained on ...
    assert "<tool_response>" not in model_text and "customer_id" in tokenizer.decode(env_tokens)  # ... env text not
    # each generate call saw the whole episode so far: prompt + every earlier turn and tool result
    assert llm.calls[-1] == out.prompt_ids + out.response_ids[:len(llm.calls[-1]) - len(out.prompt_ids)]


def test_an_episode_that_skips_the_needed_action_earns_0_and_a_bad_row_is_refused(served, tokenizer):
    turns = gold_turns(1)[:1] + ["Done."]  # looks the customer up, never cancels the order
    out = play(tokenizer, ScriptedLLM(tokenizer, turns), {"env_id": ENV, "index": 1, "env_url": served})
    assert out.reward_score == 0.0
    with pytest.raises(ValueError, match="needs extra_info env_id and index"):
        play(tokenizer, ScriptedLLM(tokenizer, []), {"index": 1, "env_url": served})


def test_a_response_budget_cut_ends_the_episode_unrewarded(served, tokenizer):
    out = play(tokenizer, ScriptedLLM(tokenizer, gold_turns(1)), {"env_id": ENV, "index": 1, "env_url": served,
                                                                   "env_kwargs": json.dumps({})}, response_length=40)
    assert out.reward_score == 0.0 and not out.extra_fields["rlvr_episode_ended"]
    assert len(out.response_ids) <= 40


def test_exported_rows_drive_the_loop(served, tokenizer, tmp_path):
    import pyarrow.parquet as pq

    from rlvr_envs.cli import main

    out = tmp_path / "tool.parquet"
    assert main(["export", "--format", "verl", "--env", ENV, "--n", "2", "--start", "4", "--out", str(out),
                 "--env-url", served]) == 0
    rows = pq.read_table(out).to_pylist()
    assert [r["agent_name"] for r in rows] == ["rlvr_env", "rlvr_env"]
    assert [r["extra_info"]["index"] for r in rows] == [4, 5] and rows[0]["extra_info"]["env_url"] == served
    result = play(tokenizer, ScriptedLLM(tokenizer, gold_turns(4)), rows[0]["extra_info"])
    assert result.reward_score == 1.0
