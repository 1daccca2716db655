"""The certified ANN runs on the testbeds, the index, aggregation, the learned baselines and `rlvr bisim`."""

import json

import numpy as np
import pytest
import torch

from agents.bisim import (
    RestrictedRuns,
    aggregation_error,
    certify,
    components,
    exact_metric,
    knn_pairs,
    merge_to_k,
    q_star,
)
from agents.bisim.ann import against_exact
from rlvr_envs.mdp import GroupedEnv, TaxiEnv

GAMMA = 0.9


@pytest.fixture(scope="module")
def grouped():
    env = GroupedEnv()
    idx, prob, R = env.to_tensors()
    return env, (idx, prob, R), exact_metric(idx, prob, R, GAMMA, tol=1e-9).d


def test_grouped_exact_metric_matches_the_construction(grouped):
    env, _, d = grouped
    g = env.true_groups()
    same = g[:, None] == g[None]
    assert d[same].max() == 0.0
    assert d[~same].min() >= 0.1


@pytest.mark.parametrize("index", ["flat", "hnsw", "ivf"])
def test_knn_pairs(index):
    rng = np.random.default_rng(0)
    emb = rng.normal(size=(300, 3)).astype(np.float32)
    pairs = knn_pairs(emb, 5, index, seed=0)
    assert (pairs[:, 0] < pairs[:, 1]).all() and len(pairs) <= 300 * 5
    keys = pairs[:, 0] * 300 + pairs[:, 1]
    assert (np.diff(keys) > 0).all()
    d = ((emb[:, None] - emb[None]) ** 2).sum(-1)
    np.fill_diagonal(d, np.inf)
    nn = np.argsort(d, axis=1)[:, :5]
    truth = {(min(s, t), max(s, t)) for s in range(300) for t in nn[s]}
    found = set(map(tuple, pairs.tolist()))
    recall = len(truth & found) / len(truth)
    assert recall == 1.0 if index == "flat" else recall >= 0.9
    with pytest.raises(ValueError):
        knn_pairs(emb, 5, "annoy")


def test_storage_is_linear_in_covered_pairs(grouped):
    _, (idx, prob, R), _ = grouped
    pairs = knn_pairs(GroupedEnv().embedding("informative", 0), 7, "flat")
    runs = RestrictedRuns(idx, prob, R, GAMMA, pairs)
    per_pair = idx.shape[1] * idx.shape[2] ** 2
    assert runs.lower.shape == runs.upper.shape == (len(pairs),)
    for arr in (runs.pos, runs.default_lower, runs.default_upper):
        assert arr.size == len(pairs) * per_pair
    assert not hasattr(runs.backup, "succ_s")


@pytest.mark.parametrize("seed", range(5))
def test_grouped_enclosure_and_certificate(grouped, seed):
    env, (idx, prob, R), d = grouped
    n = idx.shape[0]
    fired_below_full = {}
    for kind in ("informative", "uninformative"):
        pairs_by_k = {k: knn_pairs(env.embedding(kind, seed), k, "hnsw", seed) for k in (3, 7, 15, 31)}
        for k, pairs in pairs_by_k.items():
            runs = RestrictedRuns(idx, prob, R, GAMMA, pairs)
            worst = []
            res = runs.run(400, 1e-9, lambda _k, r, w=worst: w.append(against_exact(r, d)))
            assert max(max(c["lower_violation"], c["upper_violation"]) for c in worst) <= 1e-8
            assert against_exact(runs, d)["identity_gap"] <= 1e-7
            cert = certify(n, pairs, res.lower, res.upper, 1e-6)
            if cert["certificate"] == "certified":
                truth = components(n, pairs, d[pairs[:, 0], pairs[:, 1]], 1e-6)
                np.testing.assert_array_equal(cert["labels"], truth)
                fired_below_full.setdefault(kind, k)
    # informative: the groups are found well below full coverage; uninformative: abstains up to k = 31
    assert fired_below_full.get("informative", 99) <= 15
    assert "uninformative" not in fired_below_full


@pytest.mark.parametrize("kind", ["informative", "uninformative"])
def test_taxi_abstains(kind):
    env = TaxiEnv()
    idx, prob, R = env.to_tensors()
    pairs = knn_pairs(env.embedding(kind, 0), 15, "hnsw", 0)
    res = RestrictedRuns(idx, prob, R, GAMMA, pairs).run(300, 1e-6)
    assert certify(idx.shape[0], pairs, res.lower, res.upper, 1e-6)["certificate"] == "abstained"


def test_aggregation(grouped):
    env, (idx, prob, R), d = grouped
    Q = q_star(idx, prob, R, GAMMA)
    V = Q.max(axis=1)
    np.testing.assert_allclose(Q, R + GAMMA * (prob * V[idx]).sum(2), atol=1e-8)
    assert aggregation_error(idx, prob, R, GAMMA, env.true_groups(), Q) < 1e-8  # a bisimulation loses nothing
    s, t = np.triu_indices(64, 1)
    labels = merge_to_k(64, np.stack([s, t], 1), d[s, t], 4, env.embedding())
    assert len(np.unique(labels)) == 4
    assert aggregation_error(idx, prob, R, GAMMA, labels, Q) > 0
    few = merge_to_k(64, np.array([[0, 1]]), np.array([0.0]), 4, env.embedding())  # fallback merges the rest
    assert len(np.unique(few)) == 4 and few[0] == few[1]


@pytest.mark.parametrize("name", ["mico", "dbc"])
def test_learned_baselines_train(grouped, name):
    from agents.bisim.dbc import DBC
    from agents.bisim.mico import MICo

    torch.set_num_threads(1)
    _, (idx, prob, R), _ = grouped
    make = (lambda: MICo(64, seed=1)) if name == "mico" else (lambda: DBC(64, 4, seed=1))
    model = make()
    losses = model.train(idx, prob, R, steps=100, batch=16)
    assert np.mean(losses[-20:]) < np.mean(losses[:20])
    dist = model.distance(np.array([0, 1]), np.array([2, 3]))
    assert dist.shape == (2,) and np.isfinite(dist).all()
    again = make()
    again.train(idx, prob, R, steps=100, batch=16)
    np.testing.assert_allclose(again.distance(np.array([0, 1]), np.array([2, 3])), dist)


def test_cli_bisim(tmp_path, capsys):
    from rlvr_envs.cli import main

    out = tmp_path / "out.json"
    assert main(["bisim", "--env", "rlvr/Grouped64-v0", "--k", "15", "--index", "hnsw", "--seed", "0",
                 "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    for key in ("coverage", "sweeps", "pair_backups", "width", "rho", "enclosure_ok", "identity_gap", "certificate",
                "ari", "aggregation_error", "seconds"):
        assert key in report
    assert report["enclosure_ok"] and report["certificate"] == "certified" and report["certificate_correct"]
    assert report["ari"] == 1.0 and 0 < report["coverage"] < 0.5
    assert "certificate" in capsys.readouterr().out


def test_cli_rejects_non_tabular_env(capsys):
    from rlvr_envs.cli import main

    assert main(["bisim", "--env", "rlvr/NoSuchEnv-v0"]) == 2
    assert "cannot make" in capsys.readouterr().err
    assert main(["bisim", "--env", "rlvr/Arithmetic-v0"]) == 2
    assert "not a tabular MDP" in capsys.readouterr().err
