"""Env overhead: reset + step through ``gymnasium.make`` with verification stubbed out (target >= 20k steps/s)."""

import time

import gymnasium as gym

from rlvr_envs.core import ListSource, Task, TextEnv, Verdict

TASKS = [Task(id=f"t{i}", question=f"What is {i} + {i}?", answer=str(2 * i)) for i in range(1000)]


def no_verification(task: Task, response: str) -> Verdict:
    return Verdict(correct=False, reward=0.0)


def test_env_overhead_steps_per_second():
    if "bench/NoVerify-v0" not in gym.registry:
        gym.register("bench/NoVerify-v0", entry_point=lambda: TextEnv(ListSource(TASKS, "bench"), no_verification))
    rows = []
    for label, env in (("TextEnv (bare)", TextEnv(ListSource(TASKS, "bench"), no_verification)),
                       ("gymnasium.make (checker + order wrappers)", gym.make("bench/NoVerify-v0"))):
        env.reset(seed=0)
        n = 20_000
        start = time.perf_counter()
        for _ in range(n):
            env.reset()
            env.step("some reasoning ... \\boxed{42}")
        rows.append((label, n / (time.perf_counter() - start)))
    print("\n| env | reset+step per second |\n|---|---|")
    for label, rate in rows:
        print(f"| {label} | {rate:,.0f} |")
    assert min(rate for _, rate in rows) >= 20_000
