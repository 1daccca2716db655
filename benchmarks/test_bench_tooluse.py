"""ToolUse-v0 over 1,000 seeded episodes: every synthesized plan executes and scores 1.0, the plan plus one redundant
call scores lower, a wrong final state scores 0. Prints the figures (run with -s)."""

import collections
import json
import time

import pytest

from rlvr_envs.tools.env import ToolUseEnv

N = 1000
READ = {"shop": ("find_customers", {"name": "a"}), "calendar": ("list_events", {"date": "2025-03-05"}),
        "files": ("list_files", {"folder": "/docs"})}
WRITE = {"shop": ("restock_product", {"product_id": 501, "quantity": 1}),
         "calendar": ("create_event", {"title": "x", "date": "2025-03-05", "start_time": "10:00", "duration_minutes": 30}),
         "files": ("write_file", {"path": "/tmp/x.txt", "content": "x"})}


def call_text(name, arguments):
    return f'<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'


def play(env, seed, turns):
    env.reset(seed=seed)
    for turn in turns:
        _, reward, terminated, truncated, info = env.step(turn)
        if terminated or truncated:
            return reward, info
    raise AssertionError("episode did not end")


@pytest.mark.slow
def test_thousand_seeded_episodes():
    env = ToolUseEnv()
    templates, lengths = collections.Counter(), collections.Counter()
    redundant_rewards, failures = [], []
    start = time.perf_counter()
    for seed in range(N):
        env.reset(seed=seed)
        task = env.task
        gold = env.gold_turns(task)
        service = task.metadata["services"][0]
        n = task.metadata["plan_length"]
        templates[task.metadata["template"]] += 1
        lengths[n] += 1
        reward, info = play(env, seed, gold)
        if reward != 1.0 or info["calls_made"] != n:
            failures.append((seed, "gold", reward, info["error"]))
        r_red, _ = play(env, seed, [*gold[:-1], call_text(*READ[service]), gold[-1]])
        redundant_rewards.append(r_red)
        if not r_red < 1.0:
            failures.append((seed, "redundant", r_red))
        r_wrong, info = play(env, seed, [*gold[:-1], call_text(*WRITE[service]), gold[-1]])
        if r_wrong != 0.0 or info["state_correct"]:
            failures.append((seed, "wrong state", r_wrong))
    elapsed = time.perf_counter() - start
    env.close()
    print(f"\nToolUse-v0: {N} seeded episodes x 3 scripted policies in {elapsed:.1f} s "
          f"({elapsed / (3 * N) * 1000:.1f} ms per episode)")
    print(f"  gold plan reward 1.0: {N - sum(f[1] == 'gold' for f in failures)}/{N}")
    print(f"  plan + 1 redundant call: mean reward {sum(redundant_rewards) / N:.3f}, "
          f"all < 1: {all(r < 1 for r in redundant_rewards)}")
    print(f"  plan + 1 wrong state change: reward 0 on {N - sum(f[1] == 'wrong state' for f in failures)}/{N}")
    print(f"  plan lengths: {dict(sorted(lengths.items()))}; templates: {dict(templates.most_common())}")
    assert not failures, failures[:5]
