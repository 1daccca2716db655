import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import rlvr_envs  # noqa: F401  (registers the IDs)
from rlvr_envs.tasks.gsm8k import gold_answer, gold_response, load_tasks, make_env
from rlvr_envs.verifiers.math import verify_many


def test_gold_answer_parsing():
    assert gold_answer("so 2 * 3 = <<2*3=6>>6\n#### 6") == "6"
    assert gold_answer("...\n#### 1,600") == "1600"
    assert gold_answer("#### -3") == "-3"
    for bad in ("no marker", "#### six"):
        with pytest.raises(ValueError):
            gold_answer(bad)


def test_check_env_and_seeding(data_dir):
    env = gym.make("rlvr/GSM8K-v0")
    assert len(env.unwrapped.source) == 1319
    check_env(env.unwrapped, skip_render_check=True)
    a, _ = env.reset(seed=5)
    b, _ = gym.make("rlvr/GSM8K-v0").reset(seed=5)
    assert a == b and "\\boxed{}" in a
    _, info = env.reset(options={"task_id": "gsm8k-test-10"})
    assert env.unwrapped.task is env.unwrapped.source.task(10) and info["task_id"] == "gsm8k-test-10"


def test_splits(data_dir):
    train = load_tasks("train")
    assert len(train) == 7473 and train[0].id == "gsm8k-train-0"
    assert len(make_env(split="train").source) == 7473
    assert any(t.metadata["solution"].rpartition("####")[2].strip() == "1,600" and t.answer == "1600"
               for t in load_tasks("test") + train)
    with pytest.raises(ValueError, match="split"):
        make_env(split="validation")


def test_all_test_gold_answers_verify_and_neighbours_fail(data_dir):
    tasks = load_tasks("test")
    verdicts = verify_many([(t.answer, gold_response(t)) for t in tasks], timeout=10)
    assert sum(v.correct for v in verdicts) == 1319, [(t.id, v) for t, v in zip(tasks, verdicts) if not v.correct][:5]
    # the original "#### N" form of the answer is graded too
    assert all(v.correct for v in verify_many([(t.answer, t.metadata["solution"]) for t in tasks[:50]]))
    pairs = [(a.answer, b.answer) for a, b in zip(tasks, tasks[1:]) if a.answer != b.answer]
    wrong = verify_many([(a, f"\\boxed{{{b}}}") for a, b in pairs], timeout=10)
    assert not any(v.correct for v in wrong)


def test_gold_response_is_the_worked_solution(data_dir):
    task = load_tasks("test")[0]
    text = gold_response(task)
    assert "<<" not in text and "####" not in text and text.endswith("\\boxed{18}.")
    env = make_env()
    env.reset(options={"index": 0})
    _, reward, *_ = env.step(env.gold_response(task))
    assert reward == 1.0
