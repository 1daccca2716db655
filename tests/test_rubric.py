"""Rubrics: named, weighted reward terms reported in info; the default rubric gives the rewards envs always gave."""

import json

import gymnasium as gym
import numpy as np
import pytest

import rlvr_envs  # noqa: F401
from rlvr_envs.core import ListSource, Task, TextEnv, Verdict
from rlvr_envs.rubric import TERMS, Rubric, Term, build_rubric, register_term

ARITH = "rlvr/Arithmetic-v0"


def play(env, response, index=0):
    env.reset(options={"index": index})
    _, reward, terminated, _, info = env.step(response)
    assert terminated
    return reward, info


def test_default_rubric_reproduces_the_old_reward_exactly():
    env = gym.make(ARITH, format_reward=0.25)
    base = env.unwrapped
    rng = np.random.default_rng(0)
    for index in range(60):
        task = base.source.task(index)
        response = [f"\\boxed{{{task.answer}}}", f"It is {task.answer}", f"\\boxed{{{int(task.answer) + 1}}}",
                    "no idea", base.action_space.sample(), f"The answer is {rng.integers(100)}"][index % 6]
        verdict = base.score(task, response)
        reward, info = play(env, response, index)
        assert reward == float(verdict.reward) + (0.25 if verdict.format_ok else 0.0)  # the pre-rubric formula
        assert info["rubric"] == {"correctness": float(verdict.reward), "format": float(verdict.format_ok)}
    reward, info = play(gym.make(ARITH), "\\boxed{1}")
    assert info["rubric"] == {"correctness": 0.0} and reward == 0.0  # no format term without format_reward


def test_golden_values_of_a_rubric_from_a_mapping():
    env = gym.make(ARITH, rubric={"correctness": 1.0, "format": 0.1, "length": {"weight": 0.5, "budget": 20}})
    answer = env.unwrapped.source.task(0).answer
    boxed = f"\\boxed{{{answer}}}"  # short: within the budget
    reward, info = play(env, boxed)
    assert info["rubric"] == {"correctness": 1.0, "format": 1.0, "length": 0.0} and reward == pytest.approx(1.1)
    padded = "x" * (30 - len(boxed)) + boxed  # 30 characters: 10 over a budget of 20 -> length -0.5
    reward, info = play(env, padded)
    assert info["rubric"] == {"correctness": 1.0, "format": 1.0, "length": -0.5}
    assert reward == pytest.approx(1.0 + 0.1 - 0.25)
    reward, info = play(env, "y" * 100 + f"so {answer}")  # right by the last-integer fallback, unformatted, long
    assert info["rubric"] == {"correctness": 1.0, "format": 0.0, "length": -1.0}
    assert reward == pytest.approx(0.5)


def test_unverifiable_keeps_correctness_zero_and_other_terms_still_count():
    def scorer(task, response):
        return Verdict.could_not_verify("verifier timed out", parsed="7", format_ok=True)

    env = TextEnv(ListSource([Task("t", "q", "7")], "one"), scorer, rubric={"correctness": 1.0, "format": 0.2})
    reward, info = play(env, "\\boxed{7}")
    assert info["verdict"] == "unverifiable"
    assert info["rubric"] == {"correctness": 0.0, "format": 1.0} and reward == pytest.approx(0.2)


def test_tool_precision_term_on_tool_use():
    env = gym.make("rlvr/ToolUse-v0", precision_penalty=False,
                   rubric={"correctness": 1.0, "tool_precision": 0.5}).unwrapped
    index = next(i for i in range(200) if env.task_for(i).metadata["plan_length"] == 1
                 and env.task_for(i).metadata["answer_kind"] == "none")  # one state-changing call
    gold = env.gold_turns(env.task_for(index))
    turns = ['<tool_call>{"name": "no_such_tool", "arguments": {}}</tool_call>', *gold]
    env.reset(options={"index": index})
    for turn in turns:
        _, reward, terminated, _, info = env.step(turn)
    assert terminated and info["correct"] and info["calls_made"] == 2
    assert info["rubric"] == {"correctness": 1.0, "tool_precision": 0.5} and reward == pytest.approx(1.25)
    env.reset(options={"index": index})
    _, reward, terminated, _, info = env.step(gold[-1])  # skips the call: wrong state, no precision
    assert terminated and info["rubric"] == {"correctness": 0.0, "tool_precision": 0.0} and reward == 0.0


def test_tool_recall_term_pays_each_plan_call_once_and_ignores_extra_calls():
    rubric = {"correctness": 1.0, "tool_recall": 0.5}
    env = gym.make("rlvr/ToolUse-v0", precision_penalty=False, rubric=rubric).unwrapped
    index = next(i for i in range(200) if env.task_for(i).metadata["plan_length"] == 2)
    gold = env.gold_turns(env.task_for(index))
    first, second, final = gold[0], gold[1], gold[-1]
    cases = [
        ([first, second, final], 1.0, 2),  # the plan, then the answer: solved, full recall
        ([first, first, first, second, final], 1.0, 2),  # the first call three times: still solved, counted once
        ([first, final], 0.5, 1),  # half the plan: wrong state, yet half the recall is paid
        (['<tool_call>{"name": "no_such_tool", "arguments": {}}</tool_call>', final], 0.0, 0),
    ]
    for turns, recall, hits in cases:
        env.reset(options={"index": index})
        for turn in turns:
            _, reward, terminated, truncated, info = env.step(turn)
            if terminated or truncated:
                break
        correct = float(info["correct"])
        assert info["plan_calls_hit"] == hits and info["rubric"] == {"correctness": correct, "tool_recall": recall}
        assert reward == pytest.approx(correct + 0.5 * recall)
    # the precision reward pays the verbose episode less than the minimal one; the recall reward pays both 1.5
    precise = gym.make("rlvr/ToolUse-v0").unwrapped
    rewards = []
    for turns in ([first, second, final], [first, first, first, second, final]):
        precise.reset(options={"index": index})
        for turn in turns:
            _, reward, *_ = precise.step(turn)
        rewards.append(reward)
    assert rewards == [1.0, 0.5]


def test_rubric_errors():
    with pytest.raises(ValueError, match="not both"):
        gym.make(ARITH, format_reward=0.1, rubric={"correctness": 1.0})
    with pytest.raises(ValueError, match="unknown rubric term"):
        gym.make(ARITH, rubric={"correctnes": 1.0})
    with pytest.raises(ValueError, match="weight must be a number"):
        build_rubric({"correctness": "1"})
    with pytest.raises(ValueError, match="budget"):
        build_rubric({"length": {"weight": 1.0, "budget": 0}})
    with pytest.raises(ValueError, match="unique"):
        Rubric([Term("a", lambda x: 1.0), Term("a", lambda x: 0.0)])


def test_custom_terms_and_json_spec():
    if "mentions_check" not in TERMS:
        register_term("mentions_check", lambda word="check": (lambda x: float(word in x.response)))
    spec = json.loads('{"correctness": 1.0, "mentions_check": {"weight": 0.3, "word": "verify"}}')
    env = gym.make(ARITH, rubric=spec)
    answer = env.unwrapped.source.task(0).answer
    reward, info = play(env, f"Let me verify: \\boxed{{{answer}}}")
    assert info["rubric"] == {"correctness": 1.0, "mentions_check": 1.0} and reward == pytest.approx(1.3)
    rubric = Rubric([Term("half", lambda x: 0.5, 2.0)])
    env = TextEnv(ListSource([Task("t", "q", "7")], "one"), lambda t, r: Verdict.failed("no"), rubric=rubric)
    assert play(env, "x") == (1.0, play(env, "x")[1])


def test_search_env_scores_the_episode_with_its_rubric():
    from rlvr_envs.search.env import OracleAgent, run_episode

    env = gym.make("rlvr/MultiHopSynth-v0", corpus_size=200, hops=2, num_tasks=20,
                   rubric={"correctness": 1.0, "length": {"weight": 1.0, "budget": 10}}).unwrapped
    total, info = run_episode(env, OracleAgent(env), seed=0)
    model_chars = len("\n".join(m["content"] for m in info["messages"] if m["role"] == "assistant"))
    length = -min(1.0, max(0, model_chars - 10) / 10)
    assert info["correct"] and info["rubric"] == {"correctness": 1.0, "length": pytest.approx(length)}
    assert total == pytest.approx(1.0 + length)
