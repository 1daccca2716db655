"""verifiers (>= 0.4, ``verifiers.v1``) as a client: our single-turn envs as a verifiers taskset whose reward is the
env's own verifier.

verifiers 0.4 finds a taskset by its id: ``--env.taskset.id`` names a top-level importable module that exports one
``Taskset`` subclass in ``__all__`` (``verifiers.v1.utils.loaders``; there is no entry-point group), so installing
rlvr-envs installs it: ``TASKSET_ID = "rlvr-envs-verifiers"`` is the ``rlvr_envs_verifiers`` package, which
re-exports ``RlvrTaskset`` from here::

    vf-eval rlvr-envs-verifiers --env.taskset.env-id rlvr/Countdown-v0 --env.taskset.num-tasks 64 ...

    from rlvr_envs.integrations.verifiers_env import load_environment
    env = load_environment("rlvr/Countdown-v0", num_tasks=64)        # a verifiers.v1 Env (SingleAgentEnv)

Each task carries the env id, env kwargs and task id; its ``@vf.reward`` ``rlvr_reward`` scores the trace's final
reply with the env (the verdict's ``correct`` is the ``@vf.metric`` ``correct``). Single-turn envs only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import verifiers.v1 as vf
from pydantic import Field

from rlvr_envs.integrations._scoring import env_kwargs_text, make_env, score_response, task_indices

TASKSET_ID = "rlvr-envs-verifiers"  # the rlvr_envs_verifiers package
DEFAULT_HARNESS = "null"  # verifiers' tool-less chat loop: one prompt, one reply
DEFAULT_RUNTIME = "subprocess"  # the chat loop needs no sandbox (verifiers' default runtime is a remote one)


class RlvrData(vf.TaskData):
    """One task of an rlvr env: enough to rebuild it (env id, kwargs, task id) plus the gold answer."""

    env_id: str
    env_kwargs: str = "{}"
    task_id: str
    answer: str


class RlvrTasksetConfig(vf.TasksetConfig):
    env_id: str = "rlvr/Arithmetic-v0"
    """The rlvr env ID (single-turn)."""
    env_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments for ``gymnasium.make``."""
    start: int = 0
    """First task index."""
    num_tasks: int = 100
    """Number of tasks (fewer where the env has fewer)."""


class RlvrTask(vf.Task[RlvrData]):
    """Scored by the env's verifier on the trace's final reply (the rubric the env was made with included)."""

    @property
    def key(self) -> str:
        return f"{self.data.env_id}:{self.data.task_id}"

    async def _score(self, trace: vf.Trace) -> dict[str, Any]:
        cached = trace.info.get("rlvr")
        if cached is None:
            d = self.data
            cached = await asyncio.to_thread(score_response, d.env_id, d.env_kwargs, d.task_id, trace.last_reply,
                                             d.answer, who="the verifiers taskset")
            trace.info["rlvr"] = cached
        return cached

    @vf.reward
    async def rlvr_reward(self, trace: vf.Trace) -> float:
        return float((await self._score(trace))["reward"])

    @vf.metric
    async def correct(self, trace: vf.Trace) -> float:
        return float((await self._score(trace))["correct"])


class RlvrTaskset(vf.Taskset[RlvrTask, RlvrTasksetConfig]):
    """Tasks ``start .. start+num_tasks-1`` of ``env_id``: the prompt (and system prompt) the env shows."""

    def load(self) -> Iterator[RlvrTask]:
        cfg = self.config
        kwargs_text = env_kwargs_text(cfg.env_kwargs)
        env = make_env(cfg.env_id, kwargs_text, "the verifiers taskset")
        try:
            for i in task_indices(env, cfg.start, cfg.num_tasks, "num_tasks"):
                _, info = env.reset(options={"index": i})
                messages = info["messages"]
                system = "\n\n".join(m["content"] for m in messages if m["role"] == "system") or None
                chat = [m for m in messages if m["role"] != "system"]
                prompt: Any = chat[0]["content"] if len(chat) == 1 and chat[0]["role"] == "user" else chat
                yield RlvrTask(RlvrData(id=info["task_id"], name=f"{cfg.env_id}#{info['task_id']}", prompt=prompt,
                                        system_prompt=system, env_id=cfg.env_id, env_kwargs=kwargs_text,
                                        task_id=info["task_id"], answer=str(env.unwrapped.task.answer)),
                               cfg.task)
        finally:
            env.close()


__all__ = ["RlvrTaskset"]  # verifiers' loader wants exactly one Taskset subclass here (and no Env or Harness)


def environment_config(env_id: str, *, env_kwargs: dict[str, Any] | None = None, start: int = 0,
                       num_tasks: int = 100, harness: str = DEFAULT_HARNESS,
                       runtime: str = DEFAULT_RUNTIME) -> vf.SingleAgentEnvConfig:
    """The verifiers env config for ``env_id``: this taskset, one agent seat on ``harness`` in ``runtime``."""
    return vf.SingleAgentEnvConfig(
        taskset={"id": TASKSET_ID, "env_id": env_id, "env_kwargs": dict(env_kwargs or {}), "start": start,
                 "num_tasks": num_tasks},
        agent={"harness": {"id": harness}, "runtime": {"type": runtime}})


def load_environment(env_id: str, *, env_kwargs: dict[str, Any] | None = None, start: int = 0, num_tasks: int = 100,
                     harness: str = DEFAULT_HARNESS, runtime: str = DEFAULT_RUNTIME) -> vf.Env:
    """A ``verifiers.v1`` environment over ``env_id``'s tasks, built by verifiers' own loader (the taskset resolved
    from its id, as ``vf-eval`` does)."""
    from verifiers.v1.utils.loaders import load_environment as vf_load_environment

    return vf_load_environment(environment_config(env_id, env_kwargs=env_kwargs, start=start, num_tasks=num_tasks,
                                                  harness=harness, runtime=runtime))
