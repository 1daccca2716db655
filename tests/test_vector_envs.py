"""Registered text envs under ``gymnasium.make_vec``: every step of a vector loop is scored (no wasted reset steps)."""

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

import rlvr_envs

ENV_ID = "rlvr/Arithmetic-v0"
NUM_ENVS, STEPS = 3, 6


def _gold_actions(reference: gym.Env, indices: np.ndarray) -> list[str]:
    source = reference.unwrapped.source
    return [f"\\boxed{{{source.task(int(i)).answer}}}" for i in indices]


def _run_gold_loop(envs: gym.vector.VectorEnv) -> tuple[list[float], list[str], list[str]]:
    """Answer every sub-env's current task correctly for STEPS steps; return every reward, the ids answered and the
    ids the scored steps report."""
    reference = gym.make(ENV_ID)
    rewards: list[float] = []
    answered: list[str] = []
    scored: list[str] = []
    _, infos = envs.reset(seed=0)
    for _ in range(STEPS):
        if "index" in infos:
            answered += list(infos["task_id"])
            actions = _gold_actions(reference, infos["index"])
        else:  # next-step autoreset after a finished step: this step is a reset and its actions are ignored
            actions = ["\\boxed{0}"] * envs.num_envs
        _, step_rewards, terminated, _, infos = envs.step(actions)
        rewards += [float(r) for r in step_rewards]
        if "final_info" in infos:  # same-step: the scored step's info; the top level is already the next task
            assert np.all(infos["final_info"]["_task_id"])
            scored += list(infos["final_info"]["task_id"])
        else:
            scored += list(infos.get("task_id", []))
    reference.close()
    return rewards, answered, scored


@pytest.mark.parametrize("make", [
    lambda: gym.make_vec(ENV_ID, num_envs=NUM_ENVS),                                    # the registered default
    lambda: rlvr_envs.make_vec(ENV_ID, NUM_ENVS, vectorization_mode="sync"),
    lambda: rlvr_envs.make_vec(ENV_ID, NUM_ENVS, vectorization_mode="async"),
], ids=["gym.make_vec", "rlvr_envs.make_vec-sync", "rlvr_envs.make_vec-async"])
def test_every_step_of_a_vector_loop_is_scored(make):
    envs = make()
    try:
        assert envs.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
        rewards, answered, scored = _run_gold_loop(envs)
    finally:
        envs.close()
    assert len(rewards) == NUM_ENVS * STEPS
    assert rewards == [1.0] * (NUM_ENVS * STEPS)  # no step was a reset whose gold answer was ignored
    assert scored == answered                       # each step scored exactly the task the loop answered
    assert len(set(answered)) > NUM_ENVS            # and every step brought new tasks


def test_next_step_autoreset_is_still_available_and_wastes_every_other_step():
    """The contrast that makes the default matter: under next-step autoreset half the gold answers score 0."""
    envs = gym.make_vec(ENV_ID, num_envs=NUM_ENVS, autoreset_mode=AutoresetMode.NEXT_STEP)
    try:
        assert envs.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP
        rewards, _, _ = _run_gold_loop(envs)
    finally:
        envs.close()
    assert rewards.count(0.0) == NUM_ENVS * STEPS // 2


def test_explicit_vector_kwargs_override_the_default_and_env_kwargs_reach_the_env():
    envs = rlvr_envs.make_vec(ENV_ID, 2, vector_kwargs={"autoreset_mode": AutoresetMode.NEXT_STEP})
    assert envs.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP
    envs.close()
    envs = gym.make_vec(ENV_ID, num_envs=2, max_operand=5)
    obs, _ = envs.reset(seed=0)
    envs.close()
    numbers = [int(tok.strip("?")) for o in obs for tok in o.split() if tok.strip("?").isdigit()]
    assert numbers and max(numbers) <= 5


def test_tabular_mdp_rows_keep_gymnasium_next_step_default():
    envs = gym.make_vec("rlvr/Taxi-v0", num_envs=2)
    try:
        assert envs.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP
    finally:
        envs.close()
