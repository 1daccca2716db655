"""Batched 1-Wasserstein distances between small discrete distributions.

A backup needs ``W_d(p, q)`` for millions of (p, q) with support <= kappa, where the ground cost is a lookup in the
current metric. POT's ``ot.emd2`` costs ~200 us a call, so supports 1-3 use exact closed forms instead:

- kappa = 1: the one coupling; W = C[0, 0].
- kappa = 2: couplings have one free mass tau in [max(0, p1 + q1 - 1), min(p1, q1)] and the cost is linear in tau, so
  the better end of that interval is optimal.
- kappa = 3: the optimum of a linear program sits at a vertex of the transportation polytope; every vertex is the
  unique flow on a spanning tree of K_{3,3} (81 trees), so enumerate the feasible tree flows for each distinct
  marginal pair once (they do not depend on d) and take the cheapest per sweep.
- larger supports: ``ot.emd2`` per pair (the oracle the tests compare against).

Supports are padded: probability 0 on a repeated state. Cost tensors are ``C[B, kappa, kappa]``.
"""

from __future__ import annotations

import itertools

import numpy as np
import ot

_FEASIBLE_TOL = 1e-12


def _tree_flows() -> np.ndarray:
    """``M[81, 9, 6]``: the flow on each spanning tree of K_{3,3} as a linear map of the marginals (p, q)."""
    A = np.zeros((6, 9))  # row sums (p) then column sums (q) of a 3x3 coupling
    for i, j in itertools.product(range(3), range(3)):
        A[i, 3 * i + j] = 1.0
        A[3 + j, 3 * i + j] = 1.0
    maps = []
    for edges in itertools.combinations(range(9), 5):
        cols = A[:, edges]
        if np.linalg.matrix_rank(cols) < 5:  # 5 edges on 6 nodes with full rank = a spanning tree
            continue
        M = np.zeros((9, 6))
        M[list(edges)] = np.linalg.pinv(cols)  # exact on consistent marginals (sum p = sum q)
        maps.append(M)
    return np.stack(maps)


_TREES = _tree_flows()


class Kappa3Vertices:
    """Feasible vertices of each distinct 3x3 transportation polytope among the given marginals (d-independent).

    The tree flows of every distinct marginal pair are computed at once; feasible ones are kept (padded with a
    repeat of the first). When few distinct marginal pairs occur (structured MDPs), duplicates are dropped too."""

    def __init__(self, p: np.ndarray, q: np.ndarray) -> None:
        pq = np.concatenate([p, q], axis=1)
        keys, inverse = np.unique(np.round(pq, 12), axis=0, return_inverse=True)
        self.inverse = inverse.reshape(-1)
        flows = (keys @ _TREES.reshape(-1, 6).T).reshape(len(keys), -1, 9)  # [U, 81, 9]
        ok = (flows >= -_FEASIBLE_TOL).all(axis=2)
        if len(keys) <= 2000:  # cheap to deduplicate one key at a time
            per_key = [np.unique(np.round(np.clip(f[m], 0.0, None), 14), axis=0) for f, m in zip(flows, ok)]
        else:
            per_key = None
        self.groups: list[tuple[np.ndarray, np.ndarray]] | None = None
        if per_key is not None:  # few keys: cost each key's rows against its own vertices, no gathered copies
            order = np.argsort(self.inverse, kind="stable")
            bounds = np.searchsorted(self.inverse[order], np.arange(len(keys) + 1))
            self.groups = [(order[bounds[u]:bounds[u + 1]], v.T.copy()) for u, v in enumerate(per_key)]
            return
        order = np.argsort(~ok, axis=1, kind="stable")  # feasible trees first
        counts = ok.sum(axis=1)
        vmax = int(counts.max())
        order = order[:, :vmax]
        order = np.where(np.arange(vmax)[None] < counts[:, None], order, order[:, :1])  # pad with the first vertex
        self.table = np.clip(np.take_along_axis(flows, order[:, :, None], axis=1), 0.0, None)

    def cost(self, C: np.ndarray) -> np.ndarray:
        flat = C.reshape(len(C), 9)
        if self.groups is not None:
            out = np.empty(len(C))
            for rows, verts_t in self.groups:
                out[rows] = (flat[rows] @ verts_t).min(axis=1)
            return out
        out = np.empty(len(C))
        for start in range(0, len(C), 1 << 15):  # bounded temporaries
            sl = slice(start, start + (1 << 15))
            verts = self.table[self.inverse[sl]]  # [b, V, 9]
            out[sl] = np.matmul(verts, flat[sl, :, None])[:, :, 0].min(axis=1)
        return out


def w_kappa1(C: np.ndarray) -> np.ndarray:
    return C[:, 0, 0].copy()


def w_kappa2(C: np.ndarray, p: np.ndarray, q: np.ndarray) -> np.ndarray:
    p1, q1 = p[:, 0], q[:, 0]
    c11, c12, c21, c22 = C[:, 0, 0], C[:, 0, 1], C[:, 1, 0], C[:, 1, 1]
    base = c12 * p1 + c21 * q1 + c22 * (1.0 - p1 - q1)
    slope = c11 - c12 - c21 + c22
    lo, hi = np.maximum(0.0, p1 + q1 - 1.0), np.minimum(p1, q1)
    return base + np.minimum(slope * lo, slope * hi)


def w_emd(C: np.ndarray, p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """The oracle: POT's network simplex, one call per pair."""
    out = np.empty(len(C))
    for b in range(len(C)):
        out[b] = ot.emd2(np.ascontiguousarray(p[b]), np.ascontiguousarray(q[b]), np.ascontiguousarray(C[b]))
    return out


def wasserstein(C: np.ndarray, p: np.ndarray, q: np.ndarray, method: str = "auto") -> np.ndarray:
    """W for each row: ``C[B, k, k]`` ground costs, ``p, q [B, k]`` marginals. ``method``: auto | emd."""
    kappa = C.shape[1]
    if method == "emd" or kappa > 3:
        return w_emd(C, p, q)
    if kappa == 1:
        return w_kappa1(C)
    if kappa == 2:
        return w_kappa2(C, p, q)
    return Kappa3Vertices(p, q).cost(C)
