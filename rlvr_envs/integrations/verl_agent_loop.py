"""verl's multi-turn path for tool-use and search envs: an agent loop (``verl.experimental.agent_loop``) that plays
an rlvr env served by ``rlvr serve``, one WebSocket session per trajectory.

The loop resets the session on the row's task, then alternates: verl's LLM server generates the assistant turn
(``server_manager.generate`` on the running token ids), the env answers it over the session (a tool result, a search
result, or the end of the episode), and the env's new messages are appended with verl's own Continuous Token builder
(``ct_merge_context_msg``), masked out of the loss (``response_mask`` 0). The episode's reward is the env's final
reward, returned as ``reward_score``, so verl uses it instead of calling a reward function.

Rows (``rlvr export --format verl --env rlvr/ToolUse-v0 --env-url http://host:8000``) name the loop and the task::

    {"agent_name": "rlvr_env", "prompt": [...], "extra_info": {"env_id": ..., "index": 3, "env_kwargs": "{}",
                                                              "env_url": "http://host:8000"}}

and verl finds the loop through ``actor_rollout_ref.rollout.agent.agent_loop_config_path`` pointing at a YAML file::

    - name: rlvr_env
      _target_: rlvr_envs.integrations.verl_agent_loop.RlvrEnvAgentLoop

``RLVR_ENV_URL`` is used when a row has no ``env_url``.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, register

from rlvr_envs.remote import RemoteEnv

AGENT_NAME = "rlvr_env"


@register(AGENT_NAME)
class RlvrEnvAgentLoop(AgentLoopBase):
    """Plays one rlvr env episode per call of ``run`` through ``rlvr serve``."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.response_length = int(self.rollout_config.response_length)
        multi_turn = self.rollout_config.get("multi_turn", {}) or {}
        self.max_assistant_turns = multi_turn.get("max_assistant_turns") or None

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        extra = dict(kwargs.get("extra_info") or {})
        url = extra.get("env_url") or os.environ.get("RLVR_ENV_URL")
        if not url or "env_id" not in extra or "index" not in extra:
            raise ValueError(f"{AGENT_NAME}: a row needs extra_info env_id and index, and env_url (or RLVR_ENV_URL); "
                             f"got {sorted(extra)} (write rows with `rlvr export --format verl --env-url URL`)")
        env_kwargs = extra.get("env_kwargs") or {}
        if isinstance(env_kwargs, str):
            env_kwargs = json.loads(env_kwargs)
        env = await asyncio.to_thread(RemoteEnv, url, str(extra["env_id"]), env_kwargs=env_kwargs)
        try:
            return await self._play(env, int(extra["index"]), sampling_params)
        finally:
            await asyncio.to_thread(env.close)

    async def _play(self, env: RemoteEnv, index: int, sampling_params: dict[str, Any]) -> AgentLoopOutput:
        _, info = await asyncio.to_thread(env.reset, options={"index": index})
        messages = list(info["messages"])
        prompt_ids = await self.ct_build_initial_tokens(messages)
        running = list(prompt_ids)
        response_mask: list[int] = []
        logprobs: list[float] = []  # stays empty when the server reports none
        reward, turns, ended, metrics = 0.0, 0, False, {}
        request_id = uuid4().hex
        while True:
            output = await self.server_manager.generate(request_id=request_id, prompt_ids=running,
                                                        sampling_params=sampling_params)
            merged, response_mask, merged_logprobs = await self.ct_merge_assistant_token(
                running, output.token_ids, response_mask, logprobs if (logprobs or output.log_probs) else None,
                assistant_logprobs=output.log_probs or None)
            running = merged.token_ids
            logprobs = merged_logprobs or []
            turns += 1
            text = self.tokenizer.decode(output.token_ids, skip_special_tokens=True)
            _, step_reward, terminated, truncated, info = await asyncio.to_thread(env.step, text)
            if terminated or truncated:
                reward, ended = float(step_reward), True
                break
            if len(response_mask) >= self.response_length or (self.max_assistant_turns
                                                               and turns >= self.max_assistant_turns):
                break  # cut off mid-episode: the episode earns nothing, as an unfinished one does in rlvr eval
            updated = list(info["messages"])
            previous = updated[:len(messages) + 1]  # the chat so far and the assistant turn the env recorded
            merged, response_mask, merged_logprobs = await self.ct_merge_context_msg(
                previous, updated, running, response_mask, logprobs or None)
            running = merged.token_ids
            logprobs = merged_logprobs or []
            messages = updated
            if len(response_mask) >= self.response_length:
                break
        n_prompt = len(running) - len(response_mask)
        return AgentLoopOutput(
            prompt_ids=running[:n_prompt], response_ids=running[n_prompt:][: self.response_length],
            response_mask=response_mask[: self.response_length],
            response_logprobs=logprobs[: self.response_length] if logprobs else None,
            reward_score=reward, num_turns=2 * turns, metrics=metrics,
            extra_fields={"rlvr_episode_ended": ended, "rlvr_assistant_turns": turns})
