"""Clustering certificate: agreement of the lower and upper clusterings certifies the covered aggregation of d*.

G_tau(d) has the covered edges with d <= tau; clusters are its connected components. l <= d* <= u gives
Part(u) refines Part(d*) refines Part(l) (fewer edges survive under a larger metric), so Part(l) = Part(u) pins
Part(d*) exactly; otherwise the method abstains.
"""

from __future__ import annotations

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components


def components(n: int, pairs: np.ndarray, values: np.ndarray, tau: float) -> np.ndarray:
    """Labels of the connected components of {(s, t) in pairs : value <= tau}, canonical (first-seen order)."""
    keep = values <= tau
    e = pairs[keep]
    graph = coo_matrix((np.ones(len(e)), (e[:, 0], e[:, 1])), shape=(n, n))
    _, labels = connected_components(graph, directed=False)
    return canonical(labels)


def canonical(labels: np.ndarray) -> np.ndarray:
    _, first, inv = np.unique(labels, return_index=True, return_inverse=True)
    order = np.argsort(np.argsort(first))
    return order[inv.reshape(-1)]


def certify(n: int, pairs: np.ndarray, lower: np.ndarray, upper: np.ndarray, tau: float = 1e-6) -> dict:
    part_l = components(n, pairs, lower, tau)
    part_u = components(n, pairs, upper, tau)
    certified = bool(np.array_equal(part_l, part_u))
    return {"certificate": "certified" if certified else "abstained", "labels": part_u if certified else None,
            "part_lower": part_l, "part_upper": part_u}


def adjusted_rand_index(a: np.ndarray, b: np.ndarray) -> float:
    """ARI (Hubert and Arabie) of two labelings."""
    _, a = np.unique(a, return_inverse=True)
    _, b = np.unique(b, return_inverse=True)
    table = np.zeros((a.max() + 1, b.max() + 1))
    np.add.at(table, (a, b), 1)
    comb = lambda x: x * (x - 1) / 2.0  # noqa: E731
    sum_ij = comb(table).sum()
    sum_a, sum_b = comb(table.sum(axis=1)).sum(), comb(table.sum(axis=0)).sum()
    total = comb(float(len(a)))
    expected = sum_a * sum_b / total if total else 0.0
    maximum = 0.5 * (sum_a + sum_b)
    if maximum == expected:
        return 1.0
    return float((sum_ij - expected) / (maximum - expected))
