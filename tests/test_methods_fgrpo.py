"""FGRPO (agents/methods/fgrpo.py): gain weights, the server round, dropped clients, and Ray actors against
in-process clients on the same seeds."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from test_grpo_trainer import strip, trainer

from agents.grpo.registry import build
from agents.methods.fgrpo import client_config, gain_weights

TESTS = str(Path(__file__).resolve().parent)
CLIENTS = [{"env_kwargs": {"ks": [0, 1]}}, {"env_kwargs": {"ks": [2, 3]}}]


def fed_trainer(out, *, steps: int = 3, seed: int = 0, **aggregator) -> object:
    params = {"clients": CLIENTS, "trainer_factory": "grpo_toys:federated_toy_trainer", "threads": 1, "tau": 0.5,
              **aggregator}
    return trainer(out, steps=steps, seed=seed, stages={"aggregator": "fgrpo"}, checkpoint_every=1, eval_size=4,
                   eval_every=1,
                   params={"rollout_allocator": {"n": 4}, "aggregator": params})


def server_weights(tr) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in tr.model.parameters()])


def test_gain_weights_and_baselines_golden():
    w = gain_weights([0.0, math.log(3) * 0.5], 0.5)  # softmax(0, ln 3) = (1/4, 3/4)
    np.testing.assert_allclose(w, [0.25, 0.75])
    np.testing.assert_allclose(gain_weights([1.0, 5.0], float("inf")), [0.5, 0.5])
    agg = build("aggregator", "fgrpo", {"clients": CLIENTS, "tau": 1.0, "ema": 0.5})
    first = agg.weights([{"client": 0, "reward": 0.2}, {"client": 1, "reward": 0.8}])
    np.testing.assert_allclose(first, [0.5, 0.5])  # first round: every gain is 0
    second = agg.weights([{"client": 0, "reward": 0.6}, {"client": 1, "reward": 0.8}])
    np.testing.assert_allclose(second, gain_weights([0.4, 0.0], 1.0))
    assert agg.baselines == [pytest.approx(0.4), pytest.approx(0.8)]


def test_client_config_layers_the_family_and_splits_the_prompts():
    base = {"env": "rlvr/Countdown-v0", "env_kwargs": {"min_numbers": 3, "max_target": 40}, "seed": 2,
            "prompts_per_step": 32, "stages": {"aggregator": "fgrpo"}, "params": {"aggregator": {"clients": []}}}
    cfg = client_config(base, 1, {"env_kwargs": {"max_target": 14}}, n_clients=3)
    assert cfg["env_kwargs"] == {"min_numbers": 3, "max_target": 14} and cfg["seed"] == 2001
    assert cfg["prompts_per_step"] == 11 and cfg["stages"]["aggregator"] == "none" and "aggregator" not in cfg["params"]
    assert cfg["eval_size"] == 0 and base["env_kwargs"]["max_target"] == 40
    with pytest.raises(ValueError, match="may set env and env_kwargs"):
        client_config(base, 0, {"lr": 1.0})


@pytest.mark.parametrize("bad,match", [({"clients": []}, "clients"), ({"clients": CLIENTS, "tau": 0}, "tau"),
                                       ({"clients": CLIENTS, "backend": "mpi"}, "backend")])
def test_bad_settings_are_clear_errors(bad, match):
    with pytest.raises(ValueError, match=match):
        build("aggregator", "fgrpo", bad)


def test_inprocess_rounds_move_the_server_and_a_failing_client_is_dropped(tmp_path):
    tr = fed_trainer(tmp_path / "a", fail={"1": 1})
    before = server_weights(tr).clone()
    records = tr.run(resume=False)
    train = [r for r in records if r["kind"] == "train"]
    assert [r["clients"] for r in train] == [2, 1, 2]  # client 1 crashed in round 1 (step 2), back in round 2
    assert train[1]["aggregator.clients_dropped"] == 1.0 and "weight_client1" not in train[1]
    assert train[0]["rollouts"] == 2 * 2 * 4  # 2 clients x (4 prompts / 2) x 4 rollouts
    assert train[-1]["rollouts_total"] == sum(r["rollouts"] for r in train)
    assert not torch.equal(before, server_weights(tr))
    assert [r["step"] for r in records if r["kind"] == "eval"] == [0, 1, 2, 3]


def test_rounds_with_no_client_warn_and_stop_the_run_past_the_limit(tmp_path):
    with pytest.warns(RuntimeWarning, match="client 1 dropped from round 0"):
        records = fed_trainer(tmp_path / "a", fail={"0": 0, "1": 0}).run(resume=False)  # one empty round: goes on
    assert [r["clients"] for r in records if r["kind"] == "train"] == [0, 2, 2]
    with pytest.warns(RuntimeWarning), pytest.raises(RuntimeError, match="no client answered in 1 rounds"):
        fed_trainer(tmp_path / "b", fail={"0": 0, "1": 0}, max_empty_rounds=1).run(resume=False)


def test_run_seeds_past_zero_train_every_client(tmp_path):
    # the clients' derived seeds once overflowed torch.manual_seed for every run seed >= 1 (all clients dropped)
    records = fed_trainer(tmp_path / "s", steps=2, seed=7).run(resume=False)
    assert [r["clients"] for r in records if r["kind"] == "train"] == [2, 2]


def test_resumed_federated_run_equals_the_uninterrupted_one(tmp_path):
    whole = strip(fed_trainer(tmp_path / "whole").run(resume=False))
    fed_trainer(tmp_path / "cut").run(resume=False, stop_after=2)
    resumed = strip(fed_trainer(tmp_path / "cut").run(resume=True))
    assert resumed == whole


def test_ray_actors_match_inprocess_clients_and_survive_a_killed_actor(tmp_path, monkeypatch):
    ray = pytest.importorskip("ray")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(x for x in (TESTS, os.environ.get("PYTHONPATH", "")) if x))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=100 * 2**20)
    try:
        local = fed_trainer(tmp_path / "local", fail={"1": 1})
        local_records = strip(local.run(resume=False))
        remote = fed_trainer(tmp_path / "ray", backend="ray", fail={"1": 1})  # client 1's actor exits in round 1
        remote_records = strip(remote.run(resume=False))
    finally:
        ray.shutdown()
    assert [r["clients"] for r in remote_records if r["kind"] == "train"] == [2, 1, 2]
    assert remote_records == local_records
    torch.testing.assert_close(server_weights(remote), server_weights(local), atol=0, rtol=0)


class _StubTrainer:
    """The parts of a Trainer that ``federated_step`` reads, with a plain SGD(lr=1) server optimizer: a server step
    is then ``theta <- theta - g = theta + sum_k w_k Delta_k``, so the merged update can be checked exactly."""

    def __init__(self, theta: torch.Tensor):
        self.model = torch.nn.Module()
        self.model.theta = torch.nn.Parameter(theta.clone())
        self.trainable = ["theta"]
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=1.0)
        self.cfg = type("Cfg", (), {"to_dict": staticmethod(lambda: {})})()
        self.engine = type("Engine", (), {"sync_weights": staticmethod(lambda model: None)})()
        self.step, self.rollouts_total, self.tokens_total = 1, 0, 0
        self.flops = {"generation": 0.0, "training": 0.0}

    def flop_record(self) -> dict:
        return {}


def _result(client: int, reward: float, delta: list[float]) -> dict:
    return {"client": client, "reward": reward, "delta": {"theta": torch.tensor(delta, dtype=torch.float64)},
            "means": {"reward_mean": reward}, "rollouts": 4, "tokens": 8, "flops_generation": 0.0,
            "flops_training": 0.0}


def test_server_step_merges_the_client_updates_with_the_gain_weights(monkeypatch):
    agg = build("aggregator", "fgrpo", {"clients": CLIENTS, "tau": 0.5, "ema": 0.5})
    theta0 = torch.tensor([1.0, -2.0], dtype=torch.float64)
    tr = _StubTrainer(theta0)
    rounds = iter([
        # round 0: first rewards set the baselines (0.2, 0.8), every gain 0 -> weights 1/2, 1/2
        [_result(0, 0.2, [1.0, 0.0]), _result(1, 0.8, [0.0, 4.0])],
        # round 1: gains 0.2 + ln(3)/2 - 0.2 = ln(3)/2 (client 0) and 0 (client 1); softmax(gain / 0.5) = (3/4, 1/4)
        # although client 1's reward (0.8) is the higher one
        [_result(0, 0.2 + math.log(3) / 2, [2.0, 0.0]), _result(1, 0.8, [0.0, -4.0])],
    ])
    monkeypatch.setattr(agg, "_round", lambda cfg, params, r: next(rounds))

    first = agg.federated_step(tr)
    theta1 = theta0 + 0.5 * torch.tensor([1.0, 0.0], dtype=torch.float64) + 0.5 * torch.tensor([0.0, 4.0],
                                                                                              dtype=torch.float64)
    torch.testing.assert_close(tr.model.theta.detach(), theta1)  # (1.5, 0.0)
    assert first["weight_client0"] == pytest.approx(0.5) and first["weight_client1"] == pytest.approx(0.5)

    tr.step = 2
    second = agg.federated_step(tr)
    theta2 = theta1 + 0.75 * torch.tensor([2.0, 0.0], dtype=torch.float64) + 0.25 * torch.tensor([0.0, -4.0],
                                                                                                dtype=torch.float64)
    torch.testing.assert_close(tr.model.theta.detach(), theta2)  # (3.0, -1.0); a plain average gives (2.5, -2.0)
    assert second["weight_client0"] == pytest.approx(0.75) and second["weight_client1"] == pytest.approx(0.25)
    assert second["weight_max"] == pytest.approx(0.75) and second["weight_min"] == pytest.approx(0.25)
    # baselines: b <- b + 0.5 (r - b)
    assert agg.baselines == [pytest.approx(0.2 + math.log(3) / 4), pytest.approx(0.8)]


def test_recorded_round_weights_are_the_softmax_of_the_clients_gains(tmp_path):
    # The toy run's own rounds: each round's recorded weights, recomputed from the recorded rewards (first round: the
    # baseline, gain 0; then gain = r - b, b <- b + ema (r - b); softmax(gain / tau)).
    tau, ema = 0.5, 0.5
    records = fed_trainer(tmp_path / "w", steps=6, tau=tau, ema=ema).run(resume=False)
    train = [r for r in records if r["kind"] == "train"]
    base = [None, None]
    moved = False
    for rec in train:
        rewards = [rec["reward_client0"], rec["reward_client1"]]
        gains = [0.0 if b is None else r - b for r, b in zip(rewards, base)]
        base = [r if b is None else b + ema * (r - b) for r, b in zip(rewards, base)]
        z = np.exp(np.asarray(gains) / tau - max(gains) / tau)
        np.testing.assert_allclose([rec["weight_client0"], rec["weight_client1"]], z / z.sum(), rtol=1e-12)
        moved |= abs(rec["weight_client0"] - 0.5) > 1e-3
    assert moved  # some round's weights are not uniform (else this test could not tell them from a plain average)
