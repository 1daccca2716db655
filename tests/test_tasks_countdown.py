from fractions import Fraction

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import rlvr_envs  # noqa: F401  (registers the IDs)
from rlvr_envs.tasks.countdown import CountdownSource, gold_response, make_env, score, solve
from rlvr_envs.verifiers.countdown import evaluate_expression


def test_check_env_and_seed_determinism():
    env = gym.make("rlvr/Countdown-v0")
    check_env(env.unwrapped, skip_render_check=True)
    a, _ = env.reset(seed=7)
    b, _ = gym.make("rlvr/Countdown-v0").reset(seed=7)
    assert a == b and "<answer>" in a


def test_generated_tasks_are_solvable_in_range_and_gold_verifies():
    src = CountdownSource(min_numbers=3, max_numbers=6)
    counts = set()
    for i in range(400):
        t = src.task(i)
        nums, target = t.metadata["numbers"], t.metadata["target"]
        counts.add(len(nums))
        assert 3 <= len(nums) <= 6 and all(1 <= n <= 100 for n in nums) and 1 <= target <= 100
        assert str(target) == t.answer and str(nums) in t.question
        # the stored solution really uses each number once and hits the target (checked by the verifier's evaluator)
        assert evaluate_expression(t.metadata["solution"], nums) == target
        assert score(t, gold_response(t)).correct
    assert counts == {3, 4, 5, 6}


def test_knobs_and_determinism():
    src = CountdownSource(min_numbers=5, max_numbers=5, min_number=1, max_number=10, min_target=50, max_target=60)
    for i in range(50):
        t = src.task(i)
        assert len(t.metadata["numbers"]) == 5 and max(t.metadata["numbers"]) <= 10 and 50 <= int(t.answer) <= 60
    again = CountdownSource(min_numbers=5, max_numbers=5, min_number=1, max_number=10, min_target=50, max_target=60)
    assert [src.task(i) for i in (3, 1, 2)] == [again.task(i) for i in (3, 1, 2)]
    assert src.fingerprint == again.fingerprint != CountdownSource().fingerprint
    assert CountdownSource(seed_base=5).task(0) != CountdownSource().task(0)
    for bad in (dict(min_numbers=2), dict(max_numbers=7), dict(min_target=9, max_target=3)):
        with pytest.raises(ValueError):
            CountdownSource(**bad)
    with pytest.raises(RuntimeError, match="widen the target range"):
        CountdownSource(min_number=1, max_number=2, min_target=10**6, max_target=10**6, max_attempts=50).task(0)


def test_ids_and_options():
    env = make_env()
    assert env.source.index_of("countdown-31") == 31
    _, info = env.reset(options={"task_id": "countdown-31"})
    assert env.task == env.source.task(31) and info["task_id"] == "countdown-31"
    with pytest.raises(KeyError):
        env.source.index_of("cd3-1")


def test_step_rewards_and_next_task_answer_fails():
    env = make_env()
    for i in range(50):
        t = env.source.task(i)
        env.reset(options={"index": i})
        _, r, term, _, info = env.step(gold_response(t))
        assert r == 1.0 and term and info["correct"] and info["format_ok"]
        nxt = env.source.task(i + 1)
        if nxt.metadata["numbers"] != t.metadata["numbers"]:
            assert not env.score(t, gold_response(nxt)).correct


def test_solver():
    assert evaluate_expression(solve([30, 100, 93], 23), [30, 100, 93]) == 23
    assert evaluate_expression(solve([1, 3, 4, 6], 24), [1, 3, 4, 6]) == 24  # needs a fraction: 6 / (1 - 3/4)
    assert solve([1, 1, 1], 100) is None


def test_cd3_split(data_dir):
    env = make_env(split="cd3_test", data_dir=str(data_dir))
    assert len(env.source) == 256
    check_env(env, skip_render_check=True)
    tasks = [env.source.task(i) for i in range(256)]
    assert all(len(t.metadata["numbers"]) == 3 for t in tasks)
    assert all(score(t, gold_response(t)).correct for t in tasks)  # every task solvable, gold verifies
    assert tasks[0].metadata["numbers"] == [30, 100, 93] and tasks[0].answer == "23"
    _, info = env.reset(options={"task_id": "cd3-5"})
    assert env.task is tasks[5]
    with pytest.raises(ValueError, match="split"):
        make_env(split="dev")


def test_evaluate_expression_is_exact():
    assert evaluate_expression("6 / (1 - 3 / 4)", [6, 1, 3, 4]) == 24
    assert evaluate_expression("(1/3)*3", [1, 3, 3]) == Fraction(1)
