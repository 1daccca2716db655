"""verifiers (>= 0.4) as a client: ``load_environment(env_id)`` goes through verifiers' own loader (the taskset
resolved from its id), and verifiers' own ``Task.score`` runs our reward on traces built with its types."""

from __future__ import annotations

import asyncio

import pytest

vf = pytest.importorskip("verifiers.v1", reason="verifiers >= 0.4 is not installed (pip install 'rlvr-envs[adapters]')")

from verifiers.v1.graph import MessageNode  # noqa: E402
from verifiers.v1.types import AssistantMessage, UserMessage  # noqa: E402

from rlvr_envs.integrations.verifiers_env import (  # noqa: E402
    TASKSET_ID,
    RlvrTask,
    RlvrTaskset,
    load_environment,
)

ENV = "rlvr/Countdown-v0"


def _trace(task: RlvrTask, reply: str) -> vf.Trace:
    prompt = task.data.prompt if isinstance(task.data.prompt, str) else task.data.prompt_text
    trace = vf.Trace(task=vf.TraceTask(type=type(task).__name__, data=task.data, key=task.key),
                     agent=vf.AgentInfo(config=vf.AgentConfig()))
    trace.nodes.append(MessageNode(message=UserMessage(content=prompt)))
    trace.nodes.append(MessageNode(parent=0, message=AssistantMessage(content=reply), sampled=True))
    return trace


def test_verifiers_loader_resolves_the_taskset_id():
    from verifiers.v1.utils.loaders import environment_class, taskset_class

    assert taskset_class(TASKSET_ID) is RlvrTaskset
    assert environment_class(TASKSET_ID) is vf.SingleAgentEnv  # a plain taskset: verifiers' single-agent env
    env = load_environment(ENV, env_kwargs={"max_numbers": 3}, start=5, num_tasks=4)
    assert isinstance(env, vf.SingleAgentEnv) and isinstance(env.taskset, RlvrTaskset)
    assert env.config.agent.harness.id == "null" and env.config.agent.runtime.type == "subprocess"
    tasks = list(env.taskset)
    import gymnasium as gym

    ours = gym.make(ENV, max_numbers=3)
    assert [t.data.idx for t in tasks] == [0, 1, 2, 3]
    for i, task in enumerate(tasks):
        _, info = ours.reset(options={"index": 5 + i})
        assert task.data.task_id == info["task_id"] and task.key == f"{ENV}:{info['task_id']}"
        assert task.data.prompt == info["messages"][-1]["content"]
        assert task.data.answer == ours.unwrapped.task.answer
    assert [t.data.task_id for t in env.taskset.take(2)] == [t.data.task_id for t in tasks[:2]]  # verifiers' views


def test_verifiers_scoring_runs_our_verifier():
    env = load_environment(ENV, num_tasks=3)
    import gymnasium as gym

    ours = gym.make(ENV).unwrapped
    for task in env.taskset:
        gold = ours.gold_response(ours.source.task(ours.source.index_of(task.data.task_id)))
        for reply, expected in ((gold, 1.0), ("<answer>1 + 1</answer>", 0.0), ("no answer", 0.0)):
            trace = _trace(task, reply)
            asyncio.run(task.score(trace))  # verifiers' scoring: @vf.metric and @vf.reward hooks, weights
            assert trace.rewards["rlvr_reward"].value == expected
            assert trace.reward == expected and trace.metrics["correct"] == expected
            assert trace.info["rlvr"]["verdict"] == ("correct" if expected else "wrong")


def test_a_multi_turn_env_is_refused():
    env = load_environment("rlvr/ToolUse-v0", num_tasks=1)
    with pytest.raises(NotImplementedError, match="multi-turn"):
        list(env.taskset)
