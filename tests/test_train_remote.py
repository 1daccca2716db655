"""Training against ``rlvr serve`` (``rlvr train --env-url``): a GRPO run whose env is a served session writes the
records of the same run in-process (same tasks by index, same rewards, same updates), and its steps really go
through the server."""

from __future__ import annotations

import gymnasium as gym
import pytest
from grpo_toys import make_env
from harness_toy import MULTI_ID
from test_grpo_trainer import strip, trainer

pytest.importorskip("openenv")
pytest.importorskip("websockets")

from agents.grpo.multiturn import is_multiturn  # noqa: E402
from rlvr_envs.remote import REMOTE_ID  # noqa: E402
from rlvr_envs.serve import create_app, running_server  # noqa: E402

GRPO_TOY_ID = "rlvrtest/GrpoToy-v0"
if GRPO_TOY_ID not in gym.registry:
    gym.register(GRPO_TOY_ID, entry_point=make_env, kwargs={"n_tasks": 8})


@pytest.fixture(scope="module")
def served():
    app = create_app([GRPO_TOY_ID, MULTI_ID], max_sessions=8, step_timeout_s=30, idle_timeout_s=60)
    with running_server(app) as url:
        yield url, app.state.rlvr


def session(url: str, env_id: str) -> gym.Env:
    return gym.make(f"rlvr_envs.remote:{REMOTE_ID}", url=url, env_id=env_id, disable_env_checker=True)


def test_a_run_against_the_server_writes_the_in_process_records(served, tmp_path):
    url, server = served
    settings = dict(steps=3, train_pool=8, precision="fp32")
    local = trainer(tmp_path / "local", env=make_env(8), eval_env=make_env(8), **settings).run(resume=False)
    before = server.metrics.counters.get("steps_total", 0)
    env, eval_env = session(url, GRPO_TOY_ID), session(url, GRPO_TOY_ID)
    remote_trainer = trainer(tmp_path / "remote", env=env, eval_env=eval_env, **settings)
    assert not remote_trainer.multiturn  # the server says its env is single-turn: one response per episode
    remote = remote_trainer.run(resume=False)
    train = [r for r in local if r["kind"] == "train"]
    assert 0 < sum(r["reward_mean"] for r in train)  # real rewards, not all zeros
    assert strip(remote) == strip(local)
    served_steps = server.metrics.counters.get("steps_total", 0) - before
    assert served_steps >= sum(r["rollouts"] for r in train)  # every rollout was scored by the server
    env.close()
    eval_env.close()


def test_a_served_env_says_how_many_tasks_and_turns_it_has(served):
    url, _ = served
    single, multi = session(url, GRPO_TOY_ID), session(url, MULTI_ID)
    try:
        assert len(single.unwrapped.source) == 8 and not is_multiturn(single)
        assert is_multiturn(multi)
        assert single.unwrapped.source.task(3).metadata == {}  # no references or metadata leave the server
        with pytest.raises(IndexError):
            single.unwrapped.source.task(8)
    finally:
        single.close()
        multi.close()
