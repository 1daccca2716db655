"""rlvr/ToolUse-v0: the env contract, the oracle plan scores 1, redundancy lowers the reward, wrong outcomes score 0."""

import json

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import rlvr_envs  # noqa: F401
from rlvr_envs.tools.env import OracleAgent, ToolUseEnv, plan_calls
from rlvr_envs.tools.services import TOOLS

N_EPISODES = 120  # the 1,000-episode sweep lives in benchmarks/test_bench_tooluse.py

# A read-only call per service (redundant for every template) and a state change per service (wrong for every template).
READ = {"shop": ("find_customers", {"name": "a"}), "calendar": ("list_events", {"date": "2025-03-05"}),
        "files": ("list_files", {"folder": "/docs"})}
WRITE = {"shop": ("restock_product", {"product_id": 501, "quantity": 1}),
         "calendar": ("create_event", {"title": "x", "date": "2025-03-05", "start_time": "10:00", "duration_minutes": 30}),
         "files": ("write_file", {"path": "/tmp/x.txt", "content": "x"})}


def call_text(name, arguments):
    return f'<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'


def run(env, turns, **reset):
    """Play scripted turns; returns (total reward, last info, rewards per step)."""
    obs, info = env.reset(**reset)
    rewards = []
    for turn in turns:
        obs, reward, terminated, truncated, info = env.step(turn)
        rewards.append(reward)
        if terminated or truncated:
            break
    return sum(rewards), info, rewards


@pytest.fixture(scope="module")
def env():
    e = gym.make("rlvr/ToolUse-v0").unwrapped
    yield e
    e.close()


def test_check_env_and_registration():
    assert "rlvr/ToolUse-v0" in gym.registry
    e = gym.make("rlvr/ToolUse-v0")
    check_env(e.unwrapped, skip_render_check=True)
    e.close()


def test_seeded_reset_is_deterministic_and_options_pick_the_task(env):
    a = ToolUseEnv()
    obs1, info1 = env.reset(seed=11)
    obs2, info2 = a.reset(seed=11)
    assert obs1 == obs2 and info1["task_id"] == info2["task_id"] and info1["tools"] == info2["tools"]
    obs, info = env.reset(options={"task_id": "tooluse-42"})
    assert info["task_id"] == "tooluse-42" and env.reset(options={"index": 42})[0] == obs
    assert info["messages"][0]["role"] == "system" and info["messages"][-1] == {"role": "user",
                                                                                "content": env.task_for(42).question}
    with pytest.raises(KeyError):
        env.reset(options={"task_id": "tooluse-x"})
    a.close()


def test_oracle_plan_scores_one_on_seeded_episodes(env):
    agent = OracleAgent(env)
    lengths = set()
    for seed in range(N_EPISODES):
        obs, info = env.reset(seed=seed)
        done, reward, steps = False, 0.0, 0
        while not done:
            obs, reward, terminated, truncated, info = env.step(agent.act([obs], [info])[0])
            done, steps = terminated or truncated, steps + 1
        assert reward == 1.0 and info["correct"] and info["state_correct"], (seed, info["error"])
        assert info["calls_made"] == info["plan_length"] == steps - 1 and info["invalid_calls"] == 0
        lengths.add(info["plan_length"])
    assert lengths == {1, 2, 3, 4}


def test_redundant_call_lowers_reward_and_wrong_outcomes_score_zero(env):
    for index in range(40):
        task = env.task_for(index)
        gold = env.gold_turns(task)
        service = task.metadata["services"][0]
        n = task.metadata["plan_length"]
        assert run(env, gold, options={"index": index})[0] == 1.0
        redundant = [*gold[:-1], call_text(*READ[service]), gold[-1]]
        reward, info, _ = run(env, redundant, options={"index": index})
        assert reward == pytest.approx(n / (n + 1)) and reward < 1.0 and info["correct"]
        wrong_state = [*gold[:-1], call_text(*WRITE[service]), gold[-1]]
        reward, info, _ = run(env, wrong_state, options={"index": index})
        assert reward == 0.0 and not info["state_correct"]
        if task.metadata["answer_kind"] != "none":
            reward, info, _ = run(env, [*gold[:-1], "<answer>definitely not it</answer>"], options={"index": index})
            assert reward == 0.0 and not info["answer_correct"]
        else:  # skipping the last (state-changing) call leaves the wrong state
            reward, info, _ = run(env, [*gold[:-2], gold[-1]], options={"index": index})
            assert reward == 0.0 and not info["state_correct"]


def test_invalid_calls_are_counted_and_penalised_but_recoverable(env):
    index = next(i for i in range(100) if env.task_for(i).metadata["plan_length"] == 1)
    gold = env.gold_turns(env.task_for(index))
    reward, info, rewards = run(env, ["<tool_call>{oops</tool_call>", call_text("no_such_tool", {}), *gold],
                                options={"index": index})
    assert info["invalid_calls"] == 2 and info["calls_made"] == 3 and reward == pytest.approx(1 / 3)
    assert rewards[:2] == [0.0, 0.0]


def test_turn_and_call_caps_truncate_with_zero_reward():
    capped = ToolUseEnv(max_turns=3)
    spam = call_text("find_customers", {"name": "a"})
    reward, info, rewards = run(capped, [spam] * 10, options={"index": 0})
    assert len(rewards) == 3 and reward == 0.0 and info["error"] == "turn or call cap reached"
    with pytest.raises(gym.error.ResetNeeded):
        capped.step("hello")
    few_calls = ToolUseEnv(max_calls=4, max_calls_per_turn=2)
    _, info, rewards = run(few_calls, [spam * 3] * 5, options={"index": 0})
    assert info["calls_made"] >= 4 and len(rewards) == 2 and info["invalid_calls"] >= 1
    capped.close()
    few_calls.close()


def test_invalid_call_streak_ends_the_episode_when_configured():
    strict = ToolUseEnv(max_invalid_streak=2)
    index = next(i for i in range(100) if strict.task_for(i).metadata["plan_length"] >= 2)
    bad, ok = "<tool_call>{oops</tool_call>", strict.gold_turns(strict.task_for(index))[0]  # a valid call
    reward, info, rewards = run(strict, [bad, ok, bad, bad, bad], options={"index": index})
    # a valid call in between resets the streak: the episode ends on the second bad turn in a row (turn 4)
    assert len(rewards) == 4 and reward == 0.0 and info["invalid_streak"] == 2
    assert info["error"] == "2 turns in a row of invalid calls"
    _, info, rewards = run(ToolUseEnv(), [bad] * 5, options={"index": 0})  # off by default
    assert len(rewards) == 5 and info["invalid_streak"] == 5
    with pytest.raises(ValueError, match="max_invalid_streak"):
        ToolUseEnv(max_invalid_streak=0)
    strict.close()


def test_score_replays_the_assistant_turns(env):
    for index in range(3, 9):
        task = env.task_for(index)
        gold = env.gold_turns(task)
        assert env.score(task, gold).reward == 1.0
        assert env.score(task, gold[:-1]).correct is False  # never gave a final answer
        if task.metadata["answer_kind"] == "none":  # answering without acting leaves the state unchanged
            assert env.score(task, gold[-1:]).reward == 0.0


def test_plain_act_loop_and_gold_response_hook():
    env = gym.make("rlvr/ToolUse-v0")
    agent = OracleAgent(env)
    obs, info = env.reset(seed=5)
    assert env.unwrapped.gold_response(env.unwrapped.task) == env.unwrapped.gold_turns(env.unwrapped.task)[0]
    for _ in range(10):
        obs, reward, terminated, truncated, info = env.step(agent.act([obs], [info])[0])
        if terminated or truncated:
            break
        assert obs.startswith("<tool_response>") and info["messages"][-1]["role"] == "tool"
    assert terminated and reward == 1.0
    env.close()


@pytest.mark.parametrize("kwargs", [{"max_steps": 1}, {"min_steps": 4}, {"services": ("files",)},
                                    {"services": ("calendar",), "distractor_tools": 0}])
def test_difficulty_knobs(kwargs):
    env = ToolUseEnv(**kwargs)
    agent = OracleAgent(env)
    for seed in range(8):
        obs, info = env.reset(seed=seed)
        task = env.task
        n = task.metadata["plan_length"]
        assert kwargs.get("min_steps", 1) <= n <= kwargs.get("max_steps", 4)
        assert set(task.metadata["services"]) <= set(kwargs.get("services", ("shop", "calendar", "files")))
        if kwargs.get("distractor_tools") == 0:
            assert {TOOLS[t].service for t in task.metadata["tools"]} == set(task.metadata["services"])
        done = False
        while not done:
            obs, reward, terminated, truncated, info = env.step(agent.act([obs], [info])[0])
            done = terminated or truncated
        assert reward == 1.0
    env.close()
    with pytest.raises(ValueError):
        ToolUseEnv(services=("bank",))


def test_plan_calls_only_use_exposed_tools(env):
    for index in range(30):
        task = env.task_for(index)
        assert {c.name for c in plan_calls(task)} <= set(task.metadata["tools"])
