"""Curriculum: keeps the running success rate in the band by moving difficulty knobs; seeded and resumable."""

import json

import gymnasium as gym
import pytest

import rlvr_envs  # noqa: F401
from rlvr_envs.core import ListSource, Task, TextEnv, Verdict
from rlvr_envs.curriculum import PRESETS, Curriculum

ARITH = "rlvr/Arithmetic-v0"
LEVELS = [{"num_operations": 1}, {"num_operations": 2}, {"num_operations": 3}]


def solves_up_to(operations: int):
    """A policy that answers tasks with at most ``operations`` operations and gives up on longer ones."""

    def act(env: Curriculum) -> str:
        task = env.unwrapped.task
        return env.unwrapped.gold_response(task) if len(task.metadata["operators"]) <= operations else "no idea"

    return act


def run(env: Curriculum, policy, episodes: int) -> list[tuple[int, str, float, int]]:
    played = []
    for _ in range(episodes):
        _, info = env.reset()
        level = info["curriculum"]["level"]
        _, reward, terminated, _, step_info = env.step(policy(env))
        assert terminated and step_info["curriculum"]["level"] == level
        played.append((level, info["task_id"], reward, step_info["curriculum"]["moved"]))
    return played


def test_levels_move_up_above_the_band_and_down_below_it_within_bounds():
    env = Curriculum(gym.make(ARITH), LEVELS, band=(0.3, 0.7), window=8)
    played = run(env, solves_up_to(1), 60)
    levels = [lv for lv, *_ in played]
    assert levels[:8] == [0] * 8 and levels[8] == 1  # 8/8 solved at level 0: up after one full window
    assert levels[16] == 0  # 0/8 at level 1: back down
    assert set(levels) == {0, 1} and env.moves == sum(1 for *_, moved in played if moved)
    always = Curriculum(gym.make(ARITH), LEVELS, window=4)
    assert [lv for lv, *_ in run(always, solves_up_to(99), 30)][-10:] == [2] * 10  # capped at the top level
    never = Curriculum(gym.make(ARITH), LEVELS, window=4)
    assert {lv for lv, *_ in run(never, solves_up_to(0), 20)} == {0}  # floored at the bottom level


def test_the_knobs_reach_the_tasks_and_the_info():
    env = Curriculum(gym.make(ARITH), LEVELS, window=2, start_level=2)
    _, info = env.reset()
    assert info["curriculum"] == {"level": 2, "knobs": {"num_operations": 3}}
    assert len(env.unwrapped.task.metadata["operators"]) == 3
    _, _, _, _, info = env.step("no idea")
    assert info["curriculum"]["success_rate"] == 0.0 and info["curriculum"]["window"] == 1


def test_resumed_curriculum_continues_like_the_uninterrupted_one():
    policy = solves_up_to(1)
    whole = run(Curriculum(gym.make(ARITH), LEVELS, window=6, seed=7), policy, 70)
    first = Curriculum(gym.make(ARITH), LEVELS, window=6, seed=7)
    head = run(first, policy, 27)  # stops mid-window
    state = json.loads(json.dumps(first.state_dict()))  # as a checkpoint would store it
    resumed = Curriculum(gym.make(ARITH), LEVELS, window=6, seed=123)  # the seed is overwritten by the state
    resumed.load_state_dict(state)
    assert head + run(resumed, policy, 43) == whole
    assert len({lv for lv, *_ in whole}) > 1  # the comparison covered level moves


def test_seeds_decide_the_task_sequence():
    def ids(seed):
        return [t for _, t, *_ in run(Curriculum(gym.make(ARITH), LEVELS, seed=seed), solves_up_to(1), 12)]

    assert ids(0) == ids(0) and ids(0) != ids(1)
    env = Curriculum(gym.make(ARITH), LEVELS, seed=0)
    first = env.reset(seed=5)[1]["task_id"]
    assert env.reset(seed=5)[1]["task_id"] == first  # reset(seed=) reseeds the draws
    assert env.reset(options={"index": 3})[1]["task_id"] == "arith-3"


def test_unverifiable_episodes_do_not_count():
    def scorer(task, response):
        return Verdict.could_not_verify("timeout") if response == "hang" else Verdict.failed("wrong")

    def make(**kwargs):
        return TextEnv(ListSource([Task(f"t{i}", "q", "1") for i in range(4)], "toy"), scorer)

    env = Curriculum(make(), [{}, {}], window=2, make_env=make)
    for _ in range(5):
        env.reset()
        info = env.step("hang")[4]
    assert info["curriculum"]["window"] == 0 and env.level == 0 and env.episodes == 5


def test_presets_and_validation():
    for env_id, ladder in PRESETS.items():
        env = Curriculum(gym.make(env_id), window=2)
        assert env.levels == ladder
        for level in range(len(ladder)):
            env.source_for(level).task(0)  # every level builds and generates
    with pytest.raises(ValueError, match="no preset"):
        Curriculum(gym.make("rlvr/ToolUse-v0"))
    with pytest.raises(ValueError, match="band"):
        Curriculum(gym.make(ARITH), LEVELS, band=(0.8, 0.2))
    with pytest.raises(ValueError, match="window"):
        Curriculum(gym.make(ARITH), LEVELS, window=0)
    env = Curriculum(gym.make(ARITH), LEVELS, window=4)
    with pytest.raises(ValueError, match="different levels"):
        Curriculum(gym.make(ARITH), LEVELS[:2], window=4).load_state_dict(env.state_dict())
