"""Rollouts spread over Ray actors (agents/distributed/rollout_workers.py): the same rollouts for 1 or 2 workers, the
same as the in-process engine given the same per-prompt seeds, new weights after ``sync_weights``, the same training
run through the trainer, and a dead worker reported by name. One local Ray (``num_cpus=2``) for the module."""

from __future__ import annotations

import functools

import pytest
import torch
from grpo_toys import make_env, make_policy
from test_grpo_trainer import trainer

from agents.distributed.rollout_workers import RayRolloutEngine, prompt_seeds, split_evenly
from agents.policy.engine import HFEngine, SamplingParams

ray = pytest.importorskip("ray")
PROMPTS = ["p0", "p1", "p2", "p3", "p1 p2", "p3 p0 p1"]
SAMPLING = SamplingParams(temperature=1.0, max_new_tokens=5, seed=11)


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=100 * 2**20)
    yield
    ray.shutdown()


def pool(policy, workers: int) -> RayRolloutEngine:
    # half a CPU each: a 1-worker and a 2-worker pool fit side by side in the module's 2-CPU Ray
    return RayRolloutEngine(policy, workers, engine_kwargs={"precision": "fp32"}, cpus_per_worker=0.5)


@pytest.fixture(scope="module")
def pools():
    """A 1-worker and a 2-worker pool, started once (an actor's start costs seconds)."""
    policy = make_policy()
    made = {1: pool(policy, 1), 2: pool(policy, 2)}
    yield made
    for p in made.values():
        p.shutdown()


def as_tuples(rollouts) -> list[tuple]:
    return [(tuple(r.response_ids), r.finish_reason, r.seed) for r in rollouts]


def assert_same(a, b) -> None:
    """The same tokens, ends and seeds; log-probs to fp32 tolerance (a decode batch of 6 prompts and two of 3 pad
    differently)."""
    assert as_tuples(a) == as_tuples(b)
    for x, y in zip(a, b):
        assert x.logprobs == pytest.approx(y.logprobs, abs=1e-5)


def test_split_evenly_and_prompt_seeds():
    assert [list(r) for r in split_evenly(5, 2)] == [[0, 1, 2], [3, 4]]
    assert [list(r) for r in split_evenly(1, 3)] == [[0]]
    assert prompt_seeds(3, SAMPLING, None) == prompt_seeds(3, SAMPLING, None)
    assert len(set(prompt_seeds(3, SAMPLING, None))) == 3
    assert prompt_seeds(2, SAMPLING, [5, 6]) == [5, 6]
    with pytest.raises(ValueError, match="seeds has 1 entries for 2 prompts"):
        prompt_seeds(2, SAMPLING, [5])


def test_two_workers_give_the_rollouts_of_one_and_of_the_local_engine(pools):
    policy = make_policy()
    one, two = pools[1], pools[2]
    for p in (one, two):
        p.sync_weights(policy.model)
    a, b = one.generate(PROMPTS, 3, SAMPLING), two.generate(PROMPTS, 3, SAMPLING)
    assert len(a) == len(PROMPTS) * 3
    assert_same(a, b)
    local = HFEngine(policy, precision="fp32").generate(PROMPTS, 3, SAMPLING,
                                                        seeds=prompt_seeds(len(PROMPTS), SAMPLING, None))
    assert_same(local, a)
    assert len({r.seed for r in a}) == len(a)  # every rollout its own stream
    assert two.describe()["workers"] == 2 and len(set(two.describe()["worker_pids"])) == 2

    # new weights reach every worker: rollouts change, and stay equal between the pools
    with torch.no_grad():
        policy.model.lm_head.weight.mul_(-3.0)
    one.sync_weights(policy.model)
    two.sync_weights(policy.model)
    c, d = one.generate(PROMPTS, 3, SAMPLING), two.generate(PROMPTS, 3, SAMPLING)
    assert_same(c, d)
    assert as_tuples(c) != as_tuples(a)


def _synced(policy, engine: RayRolloutEngine) -> RayRolloutEngine:
    engine.sync_weights(policy.model)  # the pool starts from this run's initial weights
    return engine


def test_a_training_run_is_the_same_with_one_or_two_rollout_workers(pools, tmp_path):
    runs = {}
    for workers in (1, 2):
        t = trainer(tmp_path / str(workers), engine=functools.partial(_synced, engine=pools[workers]),
                    env=make_env(8), eval_env=make_env(8), steps=3, precision="fp32", max_new_tokens=3, lr=1e-2)
        runs[workers] = t.run(resume=False)
    train = {w: [r for r in runs[w] if r["kind"] == "train"] for w in runs}
    for a, b in zip(train[1], train[2]):
        assert (a["rollouts"], a["reward_mean"], a["gen_tokens"]) == (b["rollouts"], b["reward_mean"], b["gen_tokens"])
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-6) and b["grad_norm"] == pytest.approx(a["grad_norm"],
                                                                                                   rel=1e-4)
    rewards = [r["reward_mean"] for r in runs[1] if r["kind"] == "train"]
    assert len(rewards) == 3


def test_workers_that_cannot_be_placed_give_an_error_not_a_hang():
    with pytest.raises(RuntimeError, match="3 rollout workers .* did not start within 3 s"):
        RayRolloutEngine(make_policy(), 3, cpus_per_worker=1, start_timeout_s=3)


def test_a_dead_worker_is_reported(pools):
    victim = pools.pop(2)  # the module's last test: the pool is spent
    ray.kill(victim.workers[1], no_restart=True)
    with pytest.raises(RuntimeError, match="a rollout worker died"):
        victim.generate(PROMPTS, 2, SAMPLING)
    victim.shutdown()
