"""The tabular testbeds: Gymnasium conformance, the tensor form, the sink, embeddings, the Grouped bisimulation."""

import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import rlvr_envs  # noqa: F401
from rlvr_envs.mdp import GridEnv, GroupedEnv, TaxiEnv

IDS = ["rlvr/Grouped64-v0", "rlvr/Taxi-v0", "rlvr/Grid50-v0"]


@pytest.mark.parametrize("env_id", IDS)
def test_check_env_and_discrete_spaces(env_id):
    env = gym.make(env_id)
    check_env(env.unwrapped)
    assert isinstance(env.observation_space, gym.spaces.Discrete)
    assert isinstance(env.action_space, gym.spaces.Discrete)


def test_rainy_taxi_passes_check_env():
    check_env(gym.make("rlvr/Taxi-v0", rainy=True).unwrapped)


@pytest.mark.parametrize("env_id", IDS)
def test_same_seed_same_trajectory(env_id):
    def rollout(seed):
        env = gym.make(env_id)
        obs, _ = env.reset(seed=seed)
        env.action_space.seed(seed)
        out = [obs]
        for _ in range(30):
            obs, r, term, trunc, _ = env.step(env.action_space.sample())
            out += [obs, r]
            if term or trunc:
                obs, _ = env.reset()
                out.append(obs)
        return out

    assert rollout(3) == rollout(3)


@pytest.mark.parametrize("env", [GroupedEnv(), TaxiEnv(), TaxiEnv(rainy=True), GridEnv(size=7)], ids=str)
def test_tensors_match_the_table(env):
    idx, prob, R = env.to_tensors()
    n, A, _ = idx.shape
    assert n == env.n_tensor_states and A == env.n_actions
    np.testing.assert_allclose(prob.sum(axis=2), 1.0, atol=1e-12)
    assert (prob >= 0).all() and (idx >= 0).all() and (idx < n).all()
    for s in range(env.n_states):
        for a in range(A):
            expect_r = sum(p * r for p, _, r, _ in env.P[s][a])
            assert R[s, a] == pytest.approx(expect_r)
            mass = {}
            for p, nxt, _, term in env.P[s][a]:
                key = env.n_states if term else nxt
                mass[key] = mass.get(key, 0.0) + p
            got = {}
            for j in range(idx.shape[2]):
                got[int(idx[s, a, j])] = got.get(int(idx[s, a, j]), 0.0) + prob[s, a, j]
            assert {k: v for k, v in got.items() if v > 0} == pytest.approx(mass)
    if env.has_sink:  # absorbing, zero reward
        assert (idx[-1] == n - 1).all() and (R[-1] == 0).all()


def test_taxi_sizes_and_sink():
    assert TaxiEnv().to_tensors()[0].shape == (501, 6, 1)
    assert TaxiEnv(rainy=True).to_tensors()[0].shape == (501, 6, 3)
    assert GroupedEnv().to_tensors()[0].shape == (64, 4, 2)  # nothing terminates: no sink
    assert GridEnv(size=50).n_tensor_states == 2501


def test_grid_rewards():
    env = GridEnv(size=4)
    assert env.P[0][0] == [(1.0, 0, -1.0, False)]  # bump the top wall
    assert env.P[14][1] == [(1.0, 15, 1.0, True)]  # enter the goal
    assert env.P[5][2] == [(1.0, 9, 0.0, False)]


def test_grouped_partition_is_a_bisimulation():
    env = GroupedEnv(mdp_seed=4)
    idx, prob, R = env.to_tensors()
    g = env.true_groups()
    for s in range(len(g)):
        group_mass = np.zeros((env.n_actions, env.n_groups))
        np.add.at(group_mass, (np.arange(env.n_actions)[:, None].repeat(2, 1), g[idx[s]]), prob[s])
        first = g == g[s]
        s0 = int(np.flatnonzero(first)[0])
        ref = np.zeros_like(group_mass)
        np.add.at(ref, (np.arange(env.n_actions)[:, None].repeat(2, 1), g[idx[s0]]), prob[s0])
        np.testing.assert_allclose(group_mass, ref)
        np.testing.assert_allclose(R[s], R[s0])
    gaps = np.abs(env.group_reward[:, None] - env.group_reward[None]).max(axis=2)
    assert (gaps[~np.eye(env.n_groups, dtype=bool)] >= 0.1).all()


@pytest.mark.parametrize("env", [GroupedEnv(), TaxiEnv(), GridEnv(size=6)], ids=str)
def test_embeddings(env):
    for kind in ("informative", "uninformative"):
        e = env.embedding(kind, seed=1)
        assert e.dtype == np.float32 and e.shape[0] == env.n_tensor_states and 2 <= e.shape[1] <= 8
        np.testing.assert_array_equal(e, env.embedding(kind, seed=1))
    with pytest.raises(ValueError, match="embedding kind"):
        env.embedding("oracle")


def test_informative_grouped_embedding_separates_groups():
    env = GroupedEnv()
    e, g = env.embedding("informative", 0), env.true_groups()
    d = np.linalg.norm(e[:, None] - e[None], axis=2)
    assert d[g[:, None] == g[None]].max() < d[g[:, None] != g[None]].min()


def test_bad_arguments():
    with pytest.raises(ValueError):
        GroupedEnv(n_groups=1)
    with pytest.raises(ValueError):
        GridEnv(size=1)
    env = GridEnv(size=3)
    with pytest.raises(ValueError):
        env.reset(options={"state": 99})
    env.reset(seed=0)
    with pytest.raises(ValueError):
        env.step(7)


def test_registry_rows_and_light_import():
    ids = {e.id for e in rlvr_envs.registration.ENVS}
    assert set(IDS) <= ids
    code = "import sys, rlvr_envs; bad = [m for m in ('agents', 'torch', 'faiss', 'ot') if m in sys.modules]; print(bad)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
