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


# -- verifiers' own evaluation path: vf-eval against a policy served by `rlvr serve --policy` -------------------------
def _vf_eval(url: str, out, model: str) -> list[dict]:
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    vf_eval = Path(sys.executable).with_name("vf-eval")
    cmd = [str(vf_eval), TASKSET_ID, "--env.taskset.env-id", ENV, "--env.taskset.num-tasks", "3",
           "--env.agent.harness.id", "null", "--env.agent.runtime.type", "subprocess",
           "--client.base-url", url + "/v1", "--client.api-key-var", "RLVR_TEST_KEY", "-m", model, "-r", "2",
           "--sampling.max-tokens", "24", "--no-push", "--no-rich", "-o", str(out)]
    done = subprocess.run(cmd, env={**os.environ, "RLVR_TEST_KEY": "unused"}, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (traces,) = list(Path(out).glob("*/traces.jsonl"))
    return [t for line in traces.read_text().splitlines() for t in json.loads(line)["traces"]]


class GoldEngine:
    """An engine that answers each Countdown prompt with its gold response (what a perfect policy writes)."""

    def __init__(self, n_tasks: int):
        import gymnasium as gym

        from agents.policy.engine import Rollout

        self.Rollout = Rollout
        env = gym.make(ENV)
        self.gold = {}
        for i in range(n_tasks):
            _, info = env.reset(options={"index": i})
            self.gold[info["messages"][-1]["content"]] = env.unwrapped.gold_response(env.unwrapped.task)

    def generate(self, prompts, n, sampling, *, seeds=None):
        return [self.Rollout([1], [2, 3], self.gold[p], [0.0, 0.0], None, "stop") for p in prompts for _ in range(n)]


def test_vf_eval_scores_a_served_policy_with_our_verifier(tmp_path):
    """verifiers' CLI evaluation (its null chat harness, its interception proxy, its scoring) against the OpenAI
    endpoint of `rlvr serve --policy`: the tiny model's replies are scored (0: it cannot solve Countdown), and a
    policy that writes the gold responses scores 1 on every rollout."""
    from types import SimpleNamespace

    pytest.importorskip("agents.policy")
    from agents.policy.engine import make_engine
    from agents.policy.models import load_policy
    from rlvr_envs.serve import running_server
    from rlvr_envs.serve.policy import create_policy_app

    tiny = load_policy("tiny")
    app = create_policy_app(tiny, make_engine(tiny, precision="fp32"), model_name="tiny")
    with running_server(app) as url:
        traces = _vf_eval(url, tmp_path / "tiny", "tiny")
    assert len(traces) == 6 and app.state.requests["requests"] == 6  # every rollout's reply came from our server
    assert all(t["ok"] and t["rewards"]["rlvr_reward"]["score"] == 0.0 and t["metrics"]["correct"] == 0.0
               for t in traces)

    gold_policy = SimpleNamespace(name="gold", prompt_text=lambda messages: messages[-1]["content"])
    gold_app = create_policy_app(gold_policy, GoldEngine(3), model_name="gold")
    with running_server(gold_app) as url:
        traces = _vf_eval(url, tmp_path / "gold", "gold")
    assert len(traces) == 6
    assert all(t["rewards"]["rlvr_reward"]["score"] == 1.0 and t["metrics"]["correct"] == 1.0 for t in traces)
