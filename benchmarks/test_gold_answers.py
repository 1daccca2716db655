"""Full gold-answer sweeps: every reference answer, written as a response, must verify; the next task's answer must not.

``pytest benchmarks/test_gold_answers.py -s`` prints one line per dataset (tasks, gold verified, neighbours accepted,
those accepted one way only, seconds). MATH train (7498 tasks, ~6 min on 2 cores) runs only with ``RLVR_BENCH_FULL=1``.
A neighbour that is accepted must be the same value written differently (``5`` vs ``x=5``, ``120`` vs
``120^\\circ``, ``7\\%`` vs ``7``, ``21\\text{ dogs}`` vs ``21``: Math-Verify drops labels, degrees, percent signs and
text units): as in ``tests/test_verifier_math.py``, every accepted pair must then verify the other way round too (the
neighbour as gold, the task's answer as response); a pair accepted one way only fails the sweep.
"""

import os
import time

import gymnasium as gym
import pytest

import rlvr_envs  # noqa: F401  (registers the IDs)
from rlvr_envs.tasks.countdown import gold_response as countdown_gold
from rlvr_envs.tasks.countdown import make_env as countdown_env
from rlvr_envs.tasks.countdown import score as countdown_score
from rlvr_envs.verifiers.math import verify_many

pytestmark = pytest.mark.slow

CASES = [("rlvr/MATH500-v0", {}), ("rlvr/GSM8K-v0", {}), ("rlvr/GSM8K-v0", {"split": "train"}),
         ("rlvr/AIME24-v0", {}), ("rlvr/AIME25-v0", {}), ("rlvr/AMC23-v0", {}), ("rlvr/OlympiadBench-v0", {}),
         ("rlvr/MATH-v0", {})]
if os.environ.get("RLVR_BENCH_FULL"):
    CASES.append(("rlvr/MATH-v0", {"split": "train"}))


@pytest.mark.parametrize("env_id, kwargs", CASES)
def test_gold_sweep(env_id, kwargs, data_dir):
    t0 = time.perf_counter()
    env = gym.make(env_id, **kwargs).unwrapped
    tasks = [env.source.task(i) for i in range(len(env.source))]
    verdicts = verify_many([(t.answer, env.gold_response(t)) for t in tasks], timeout=10)
    failed = [(t.id, t.answer, v.parsed, v.error) for t, v in zip(tasks, verdicts) if not v.correct]
    pairs = [(a.answer, b.answer) for a, b in zip(tasks, tasks[1:]) if a.answer.strip() != b.answer.strip()]
    wrong = verify_many([(a, f"The answer is \\boxed{{{b}}}.") for a, b in pairs], timeout=10)
    accepted = [p for p, v in zip(pairs, wrong) if v.correct]
    back = verify_many([(b, f"The answer is \\boxed{{{a}}}.") for a, b in accepted], timeout=10)
    one_way = [p for p, v in zip(accepted, back) if not v.correct]
    print(f"\n{env_id} {kwargs or ''}: {len(tasks) - len(failed)}/{len(tasks)} gold verified; "
          f"{len(accepted)}/{len(pairs)} neighbour answers accepted {accepted}; of those {len(one_way)} one way only "
          f"{one_way}; {time.perf_counter() - t0:.1f} s")
    assert not failed, failed[:10]
    assert not one_way, one_way  # accepted, but not the same value both ways round


def test_countdown_gold_sweep(data_dir):
    t0 = time.perf_counter()
    procedural = countdown_env(min_numbers=3, max_numbers=6).source
    cd3 = countdown_env(split="cd3_test").source
    tasks = [procedural.task(i) for i in range(5000)] + [cd3.task(i) for i in range(len(cd3))]
    ok = sum(countdown_score(t, countdown_gold(t)).correct for t in tasks)
    print(f"\ncountdown: {ok}/{len(tasks)} gold verified (5000 procedural 3-6 numbers + 256 cd3_test); "
          f"{time.perf_counter() - t0:.1f} s")
    assert ok == len(tasks)
