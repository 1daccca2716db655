import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import rlvr_envs  # noqa: F401  (registers the IDs)
from rlvr_envs.tasks.arithmetic import ArithmeticSource, evaluate_chain, make_env, parse_integer, score_integer


def test_check_env_and_seed_determinism():
    env = gym.make("rlvr/Arithmetic-v0")
    check_env(env.unwrapped, skip_render_check=True)
    a, _ = env.reset(seed=123)
    b, _ = env.reset(seed=123)
    c, _ = gym.make("rlvr/Arithmetic-v0").reset(seed=123)
    assert a == b == c


def test_default_is_two_operands_0_50_plus_minus():
    src = ArithmeticSource()
    for i in range(300):
        t = src.task(i)
        a, b = t.metadata["operands"]
        assert 0 <= a <= 50 and 0 <= b <= 50 and t.metadata["operators"][0] in "+-"
        assert int(t.answer) == (a + b if t.metadata["operators"][0] == "+" else a - b)
        assert t.question == f"What is {t.metadata['expression']}?"
    ops = {src.task(i).metadata["operators"][0] for i in range(300)}
    assert ops == {"+", "-"}


def test_same_index_same_task_and_seed_base_changes_tasks():
    a, b = ArithmeticSource(), ArithmeticSource()
    assert [a.task(i) for i in (5, 0, 99)] == [b.task(i) for i in (5, 0, 99)]
    other = ArithmeticSource(seed_base=1)
    assert sum(a.task(i).question != other.task(i).question for i in range(50)) > 40
    assert a.fingerprint == b.fingerprint != other.fingerprint
    assert ArithmeticSource(max_operand=9).fingerprint != a.fingerprint


def test_difficulty_knobs():
    src = ArithmeticSource(min_operand=-50, max_operand=1000, num_operations=4, operators="+-*")
    for i in range(200):
        t = src.task(i)
        ops, xs = t.metadata["operators"], t.metadata["operands"]
        assert len(ops) == 4 and len(xs) == 5 and all(-50 <= x <= 1000 for x in xs)
        assert int(t.answer) == evaluate_chain(xs, ops)
    assert "*" in {o for i in range(50) for o in src.task(i).metadata["operators"]}


def test_evaluate_chain_precedence():
    assert evaluate_chain([2, 3, 4], ["+", "*"]) == 14
    assert evaluate_chain([2, 3, 4, 5], ["*", "-", "*"]) == -14
    assert evaluate_chain([10, 3, 2], ["-", "-"]) == 5


@pytest.mark.parametrize("kwargs", [dict(min_operand=5, max_operand=1), dict(num_operations=0),
                                    dict(operators="/"), dict(operators=""), dict(seed_base=-1), dict(size=0)])
def test_bad_config_is_a_clear_error(kwargs):
    with pytest.raises(ValueError):
        ArithmeticSource(**kwargs)


def test_task_ids_round_trip_and_options():
    env = make_env()
    src = env.source
    for i in (0, 7, 123456789):
        assert src.index_of(src.task(i).id) == i
    for bad in ("arith-x", "arith-01", "countdown-3", "arith--1", f"arith-{len(src)}"):
        with pytest.raises(KeyError):
            src.index_of(bad)
    _, info = env.reset(options={"task_id": "arith-42"})
    assert info["task_id"] == "arith-42" and env.task == src.task(42)
    _, info = env.reset(options={"index": 42})
    assert info["task_id"] == "arith-42"


def test_gold_correct_and_neighbour_wrong():
    env = make_env(num_operations=2, operators="+-*")
    for i in range(200):
        task = env.source.task(i)
        env.reset(options={"index": i})
        _, reward, terminated, _, info = env.step(env.gold_response(task))
        assert reward == 1.0 and terminated and info["correct"] and info["format_ok"]
        other = env.source.task(i + 1).answer
        if other != task.answer:
            assert not env.score(task, f"\\boxed{{{other}}}").correct


def test_integer_grading():
    assert score_integer(1234, "so \\boxed{1,234}").correct
    assert score_integer(89, "The answer is 89.").correct
    assert score_integer(89, "\\boxed{89.0}").correct
    assert score_integer(-7, "\\boxed{-7}").correct
    assert not score_integer(89, "\\boxed{89.5}").correct
    assert not score_integer(89, "\\boxed{8 9}").correct
    # no marker: the last integer counts, format_ok is False; strict mode refuses
    v = score_integer(12, "3 + 9 = 12")
    assert v.correct and not v.format_ok
    assert not score_integer(12, "12 is it? no: 13").correct
    assert not score_integer(12, "3 + 9 = 12", strict_format=True).correct
    assert not score_integer(12, "no numbers here").correct
    assert not score_integer(12, "\\boxed{twelve}").correct
    assert not score_integer(1, "\\boxed{" + "1" * 5000 + "}").correct
    assert parse_integer("x") is None and parse_integer("$-3$") == -3


def test_prompt_asks_for_boxed_and_is_configurable():
    env = make_env()
    obs, info = env.reset(seed=0)
    assert "\\boxed{}" in obs and info["messages"][-1]["content"] == obs
    env = make_env(prompt_template="Q: {question}\nA:", system_prompt="Be brief.")
    obs, info = env.reset(seed=0)
    assert info["messages"][0] == {"role": "system", "content": "Be brief."}
    assert info["messages"][1]["content"].startswith("Q: What is")


def test_format_reward():
    env = make_env(format_reward=0.1)
    task = env.source.task(0)
    env.reset(options={"index": 0})
    assert env.step(env.gold_response(task))[1] == pytest.approx(1.1)
    env.reset(options={"index": 0})
    assert env.step(f"{task.answer}")[1] == pytest.approx(1.0)  # right, but no \boxed: no bonus


def test_hostile_responses_return_fast_and_fail():
    import time

    for text in ["9" * 1_000_000, "\\boxed{" + "9" * 1_000_000 + "}", "\\boxed{" * 100_000, "<answer>" * 100_000,
                 "the answer is " * 50_000, "\\boxed{1} \\boxed{2} " * 10_000 + "\\boxed{3}", "٣" * 1000 + "\\boxed{٣}"]:
        t0 = time.perf_counter()
        v = score_integer(12, text)
        assert not v.correct and time.perf_counter() - t0 < 2.0
