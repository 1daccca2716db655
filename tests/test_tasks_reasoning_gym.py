"""The reasoning-gym bridge: every generator registered, gold answers score 1, hackable scorers are guarded."""

import inspect
import re

import gymnasium as gym
import pytest

import rlvr_envs  # noqa: F401
from rlvr_envs.tasks.reasoning_gym import EXACT_MATCH_ONLY, RG_TASKS

reasoning_gym = pytest.importorskip("reasoning_gym")
from reasoning_gym.factory import DATASETS  # noqa: E402

NO_REFERENCE = {"boxnet", "rush_hour"}
# Read by hand: number_sorting's scorer evals only the generator's own oracle answer, never the model's text.
EVALS_ORACLE_ONLY = {"number_sorting"}


def test_static_name_table_matches_the_installed_library():
    assert RG_TASKS == tuple(sorted(DATASETS)), "regenerate RG_TASKS for this reasoning-gym version"
    ids = [e for e in gym.registry if e.startswith("rlvr/rg-")]
    assert len(ids) == len(RG_TASKS) == 106


def test_every_scorer_that_evals_model_text_is_bypassed():
    unsafe = set()
    for name, (dataset_cls, _config_cls) in DATASETS.items():
        src = inspect.getsource(dataset_cls.score_answer)
        if re.search(r"(?<![\w.])eval\(|exec\(|bool\(answer\)", src):
            unsafe.add(name)
    assert unsafe - EVALS_ORACLE_ONLY <= EXACT_MATCH_ONLY, f"new hackable scorers: {sorted(unsafe - EVALS_ORACLE_ONLY - EXACT_MATCH_ONLY)}"


@pytest.mark.parametrize("name", RG_TASKS)
def test_gold_scores_one_and_junk_scores_zero(name):
    env = gym.make(f"rlvr/rg-{name}-v0", size=20)
    base = env.unwrapped
    for i in range(2):
        env.reset(options={"index": i})
        if name in NO_REFERENCE:
            with pytest.raises(NotImplementedError):
                base.gold_response(base.task)
            break
        assert env.step(base.gold_response(base.task))[1] == 1.0
    env.reset(options={"index": 0})
    assert env.step("<answer>zzq 12345</answer>")[1] == 0.0
    env.reset(options={"index": 0})
    *_, info = env.step("no answer at all")
    assert info["format_ok"] is False and info["correct"] is False


def test_partial_credit_is_not_passed_on():
    env = gym.make("rlvr/rg-propositional_logic-v0", size=5)
    base = env.unwrapped
    env.reset(options={"index": 0})
    entry = base.task.metadata["entry"]
    partial = base.source._dataset.score_answer("zzq", entry)
    assert 0 < partial < 1  # the library gives partial credit for any text ...
    *_, info = env.step("<answer>zzq</answer>")
    assert info["correct"] is False  # ... we do not


def test_game_of_life_halting_any_text_is_not_accepted():
    env = gym.make("rlvr/rg-game_of_life_halting-v0", size=10)
    for i in range(5):
        env.reset(options={"index": i})
        assert env.step("<answer>anything</answer>")[1] == 0.0


def test_eval_scorers_never_run_model_text(tmp_path):
    marker = tmp_path / "pwned"
    payload = f"__import__('pathlib').Path({str(marker)!r}).write_text('x')"
    for name in ("string_insertion", "spiral_matrix", "binary_matrix", "n_queens"):
        env = gym.make(f"rlvr/rg-{name}-v0", size=3)
        env.reset(options={"index": 0})
        assert env.step(f"<answer>{payload}</answer>")[1] == 0.0
    assert not marker.exists()


def test_same_index_same_task_and_task_id_roundtrip():
    a = gym.make("rlvr/rg-leg_counting-v0", size=50, seed=3)
    b = gym.make("rlvr/ReasoningGym-v0", task="leg_counting", size=50, seed=3)
    oa, ia = a.reset(options={"index": 7})
    ob, ib = b.reset(options={"task_id": ia["task_id"]})
    assert oa == ob and ia["task_id"] == ib["task_id"] == "rg-leg_counting-7"
    with pytest.raises(ValueError, match="unknown reasoning-gym task"):
        gym.make("rlvr/ReasoningGym-v0", task="no_such_task")


@pytest.mark.parametrize("name", ["simple_integration", "intermediate_integration", "polynomial_equations"])
def test_hostile_answers_to_sympy_scorers_return_within_the_limit(name):
    import time

    env = gym.make(f"rlvr/rg-{name}-v0", size=3, timeout=2.0)
    env.reset(options={"index": 0})
    env.step(env.unwrapped.gold_response(env.unwrapped.task))  # first call: worker imports reasoning-gym
    for probe in ("exp(exp(exp(exp(100))))", "x**(10**100)", "factorial(10**9)", "(" * 500):
        env.reset(options={"index": 0})
        start = time.perf_counter()
        _, reward, *_ = env.step(f"<answer>{probe}</answer>")
        assert reward == 0.0 and time.perf_counter() - start < 2.0 + 1.5


def test_generators_using_global_random_are_repeatable_and_leave_it_alone():
    import random

    env = gym.make("rlvr/rg-list_functions-v0", size=200)
    random.seed(7)
    expected_next = random.random()
    random.seed(7)
    for i in range(0, 200, 7):  # list_functions' generators call the global `random` module
        assert env.unwrapped.source.task(i).question == env.unwrapped.source.task(i).question
    assert random.random() == expected_next
