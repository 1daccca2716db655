"""TextEnv, TextSpace and vectorisation on a toy task source (no data, no verifier pool)."""

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from rlvr_envs.core import ListSource, Task, TextEnv, Verdict, WallTime
from rlvr_envs.extract import extract_answer
from rlvr_envs.spaces import TextSpace, make_vec


def exact_scorer(task: Task, response: str) -> Verdict:
    answer, _ = extract_answer(response)
    ok = answer == task.answer
    return Verdict(correct=ok, reward=float(ok), parsed=answer, format_ok=answer is not None)


def toy_env(**kwargs) -> TextEnv:
    tasks = [Task(id=f"t{i}", question=f"What is {i} + 1?\nAnswer in a box.", answer=str(i + 1)) for i in range(20)]
    return TextEnv(ListSource(tasks, "toy"), exact_scorer, **kwargs)


if "toy/Add-v0" not in gym.registry:
    gym.register("toy/Add-v0", entry_point=toy_env)


def test_check_env_passes():
    check_env(toy_env())


def test_text_space_accepts_unicode_and_whitespace():
    space = TextSpace(100)
    assert "a b\n\tc ∑ 🙂" in space
    assert "x" * 101 not in space
    assert 5 not in space
    assert all(s in space for s in (space.sample() for _ in range(50)))


def test_reset_by_seed_is_deterministic_and_options_pick_the_task():
    env = toy_env()
    assert env.reset(seed=7)[0] == env.reset(seed=7)[0]
    obs, info = env.reset(options={"task_id": "t3"})
    assert info["task_id"] == "t3" and "3 + 1" in obs
    obs, info = env.reset(options={"index": 5})
    assert info["task_id"] == "t5" and info["messages"][-1]["content"] == obs
    with pytest.raises(KeyError, match="unknown task id"):
        env.reset(options={"task_id": "nope"})
    with pytest.raises(IndexError):
        env.reset(options={"index": 20})
    with pytest.raises(ValueError, match="either"):
        env.reset(options={"index": 1, "task_id": "t1"})


def test_step_scores_and_terminates():
    env = toy_env(format_reward=0.1)
    env.reset(options={"index": 4})
    obs, reward, terminated, truncated, info = env.step("so \\boxed{5}")
    assert (reward, terminated, truncated) == (1.1, True, False)
    assert info["correct"] and info["parsed_answer"] == "5" and info["format_ok"] and info["verify_ms"] >= 0
    env.reset(options={"index": 4})
    _, reward, *_ , info = env.step("no idea")
    assert reward == 0.0 and not info["format_ok"]
    with pytest.raises(gym.error.ResetNeeded):
        env.step("again")
    with pytest.raises(TypeError):
        env.reset()
        env.step(5)


def test_system_prompt_and_template():
    env = toy_env(system_prompt="Be brief.", prompt_template="Q: {question}\nA:")
    _, info = env.reset(options={"index": 0})
    assert info["messages"][0] == {"role": "system", "content": "Be brief."}
    assert info["messages"][1]["content"].startswith("Q: What is 0 + 1?")
    with pytest.raises(ValueError, match="question"):
        toy_env(prompt_template="no placeholder")


def test_long_response_is_truncated_and_flagged():
    env = toy_env(max_response_chars=50)
    env.reset(options={"index": 0})
    *_, info = env.step("x" * 100 + "\\boxed{1}")
    assert info["truncated_response"] and not info["correct"]


def test_scorer_crash_becomes_error_verdict():
    def broken(task, response):
        raise RuntimeError("boom")

    env = TextEnv(ListSource([Task("a", "q", "1")], "one"), broken)
    env.reset()
    _, reward, terminated, _, info = env.step("x")
    assert reward == 0.0 and terminated and "boom" in info["error"]


def test_walltime_compares_equal_only_to_walltime():
    assert WallTime(1.0) == WallTime(2.0)
    assert WallTime(1.0) != 2.0 and WallTime(1.0) == 1.0


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_vector_envs_return_fresh_text(mode):
    envs = make_vec("toy/Add-v0", num_envs=3, vectorization_mode=mode)
    try:
        for round_ in range(3):
            obs, info = envs.reset(seed=round_)
            # Each observation must be the prompt of the task that env reports, in every round (no stale text).
            for o, tid in zip(obs, info["task_id"]):
                assert f"What is {int(tid[1:])} + 1?" in o
            actions = [f"\\boxed{{{int(t[1:]) + 1}}}" for t in info["task_id"]]
            _, rewards, terms, _, step_info = envs.step(actions)
            assert np.all(rewards == 1.0) and np.all(terms)
    finally:
        envs.close()


def test_async_vector_env_with_plain_gymnasium_make_vec_and_unicode():
    tasks = [Task(id=f"u{i}", question="∑ " * (i + 1) + "é\n", answer=str(i)) for i in range(4)]
    if "toy/Unicode-v0" not in gym.registry:
        gym.register("toy/Unicode-v0", entry_point=lambda: TextEnv(ListSource(tasks, "uni"), exact_scorer))
    envs = gym.make_vec("toy/Unicode-v0", num_envs=2, vectorization_mode="async")
    try:
        for seed in range(3):
            obs, info = envs.reset(seed=seed)
            for o, tid in zip(obs, info["task_id"]):
                assert o == tasks[int(tid[1:])].question
            _, rewards, *_ = envs.step([f"\\boxed{{{t[1:]}}}" for t in info["task_id"]])
            assert list(rewards) == [1.0, 1.0]
    finally:
        envs.close()


@pytest.mark.parametrize("text", [
    "\\boxed 5 " * 200_000,              # unbraced markers: was quadratic (a slice per marker)
    "<answer>" * 100_000 + "x" * 10_000,  # unclosed tags
    "{" * 200_000 + "\\boxed{" * 1000,    # deep, unbalanced braces
    "The answer is " * 50_000,
])
def test_extraction_is_linear_on_hostile_text(text):
    import time

    start = time.perf_counter()
    extract_answer(text)
    assert time.perf_counter() - start < 2.0


def test_extraction_styles():
    assert extract_answer("a \\boxed{\\frac{1}{2}} then \\boxed{x^{2}}")[0] == "x^{2}"
    assert extract_answer("\\boxed{\\{1,2\\}}")[0] == "\\{1,2\\}"
    assert extract_answer("work\n#### 1,234\n") == ("1,234", "hashes")
    assert extract_answer("<answer> 7 </answer>") == ("7", "answer_tag")
    assert extract_answer("So the final answer is 12.") == ("12", "answer_is")
    assert extract_answer("\\boxed{unbalanced") == (None, None)
