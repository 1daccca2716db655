"""Downstream use of a metric: merge states into K clusters along covered edges, solve the aggregate MDP, lift.

E = mean_s max_a |Q~(s, a) - Q*(s, a)|, where Q~ is the optimal Q of the aggregate MDP (cluster rewards and
transitions are member averages) read back at each state's cluster.
"""

from __future__ import annotations

import numpy as np


def q_star(idx: np.ndarray, prob: np.ndarray, R: np.ndarray, gamma: float, tol: float = 1e-10) -> np.ndarray:
    """Optimal Q by value iteration, stopped with a certified sup-norm error <= tol."""
    V = np.zeros(R.shape[0])
    while True:
        Q = R + gamma * (prob * V[idx]).sum(axis=2)
        V_new = Q.max(axis=1)
        if gamma / (1 - gamma) * np.abs(V_new - V).max() <= tol or gamma == 0:
            return Q
        V = V_new


def aggregate_q(idx: np.ndarray, prob: np.ndarray, R: np.ndarray, gamma: float, labels: np.ndarray) -> np.ndarray:
    """Q~ [n, A]: optimal Q of the aggregate MDP over ``labels``, lifted back to the states."""
    _, labels = np.unique(labels, return_inverse=True)
    K, A = labels.max() + 1, idx.shape[1]
    size = np.bincount(labels, minlength=K).astype(float)
    R_agg = np.zeros((K, A))
    np.add.at(R_agg, labels, R)
    R_agg /= size[:, None]
    P_agg = np.zeros((K, A, K))
    s_rep = np.broadcast_to(labels[:, None, None], idx.shape)
    a_rep = np.broadcast_to(np.arange(A)[None, :, None], idx.shape)
    np.add.at(P_agg, (s_rep, a_rep, labels[idx]), prob)
    P_agg /= size[:, None, None]
    V = np.zeros(K)
    while True:
        Q = R_agg + gamma * P_agg @ V
        V_new = Q.max(axis=1)
        if gamma / (1 - gamma) * np.abs(V_new - V).max() <= 1e-10 or gamma == 0:
            return Q[labels]
        V = V_new


def aggregation_error(idx: np.ndarray, prob: np.ndarray, R: np.ndarray, gamma: float, labels: np.ndarray,
                      Q: np.ndarray | None = None) -> float:
    Q = q_star(idx, prob, R, gamma) if Q is None else Q
    return float(np.abs(aggregate_q(idx, prob, R, gamma, labels) - Q).max(axis=1).mean())


class _UnionFind:
    def __init__(self, n: int) -> None:
        self.parent = np.arange(n)

    def find(self, x: int) -> int:
        root = x
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[x] != root:
            self.parent[x], x = root, self.parent[x]
        return root


def merge_to_k(n: int, pairs: np.ndarray, values: np.ndarray, K: int, emb: np.ndarray) -> np.ndarray:
    """K clusters: single-linkage merges along covered edges, smallest value first (ties by pair order). When the
    covered graph has more than K components, the rest are merged by the distance between component centroids in
    the embedding, a rule that ignores the metric and so is the same for every method compared."""
    uf = _UnionFind(n)
    clusters = n
    for e in np.lexsort((np.arange(len(values)), values)):
        if clusters <= K:
            break
        a, b = uf.find(int(pairs[e, 0])), uf.find(int(pairs[e, 1]))
        if a != b:
            uf.parent[max(a, b)] = min(a, b)
            clusters -= 1
    while clusters > K:
        roots = np.array([uf.find(i) for i in range(n)])
        ids, inv = np.unique(roots, return_inverse=True)
        cent = np.zeros((len(ids), emb.shape[1]))
        np.add.at(cent, inv, emb)
        cent /= np.bincount(inv)[:, None]
        dist = ((cent[:, None] - cent[None]) ** 2).sum(-1)
        np.fill_diagonal(dist, np.inf)
        i, j = np.unravel_index(np.argmin(dist), dist.shape)
        a, b = int(ids[i]), int(ids[j])
        uf.parent[max(a, b)] = min(a, b)
        clusters -= 1
    roots = np.array([uf.find(i) for i in range(n)])
    return np.unique(roots, return_inverse=True)[1].reshape(-1)
