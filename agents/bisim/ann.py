"""Certified sub-quadratic bisimulation metric: an ANN index picks the pairs, lower and upper runs enclose d*.

1. ``knn_pairs``: a FAISS index (Flat = exact, HNSW / IVF = approximate) over an embedding e(s) returns k neighbours
   per state; the covered set C = {(min, max)} has at most n*k pairs. Lattice ties are broken by a seeded jitter.
2. ``RestrictedRuns``: F_C(d) = F(d) on C and d elsewhere. Values live on C only (sorted int64 keys s*n + t, looked
   up with searchsorted once, at set-up), so memory is O(|C| * A * kappa^2). A successor pair outside C reads its
   arm's default: 0 on the diagonal, l_0 (0 or d_R) for the lower arm, d_max for the upper arm.
3. Each sweep: l_C <- max(l_C, F(l)|_C), u_C <- min(u_C, F(u)|_C). F is monotone and l_0 <= d* <= u_0 with
   u_0 = d_max (1 - I) post-fixed, so l_k <= d* <= u_k at every sweep k. The observable sandwich width is
   max_C (u - l); the error of the lower arm's limit is exactly rho = max over uncovered pairs of (d* - l_0).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from agents.bisim.backup import PairBackup, reward_bound, reward_metric

INDEXES = ("flat", "hnsw", "ivf")


def knn_pairs(emb: np.ndarray, k: int, index: str = "hnsw", seed: int = 0) -> np.ndarray:
    """Covered pairs ``[M, 2]`` (s < t, sorted by key) from the k nearest neighbours of every state."""
    import faiss

    if index not in INDEXES:
        raise ValueError(f"index must be one of {INDEXES}, got {index!r}")
    n = len(emb)
    if k < 1:
        raise ValueError("k must be >= 1")
    k = min(k, n - 1)
    x = np.ascontiguousarray(emb, dtype=np.float32)
    scale = float(np.abs(x).max()) or 1.0
    # break lattice ties (grids): equal distances would make the neighbour lists depend on FAISS internals
    x = x + np.random.default_rng(seed).normal(0.0, 1e-5 * scale, size=x.shape).astype(np.float32)
    dim = x.shape[1]
    if index == "flat":
        ix = faiss.IndexFlatL2(dim)
    elif index == "hnsw":
        ix = faiss.IndexHNSWFlat(dim, 32)
        ix.hnsw.efConstruction = 64
        ix.hnsw.efSearch = max(64, 2 * (k + 1))
    else:
        nlist = max(1, int(np.sqrt(n)))
        ix = faiss.IndexIVFFlat(faiss.IndexFlatL2(dim), dim, nlist)
        ix.cp.seed = seed
        ix.train(x)
        ix.nprobe = min(nlist, 8)
    ix.add(x)
    _, nbrs = ix.search(x, k + 1)
    s = np.repeat(np.arange(n), k + 1)
    t = nbrs.reshape(-1)
    ok = (t >= 0) & (t != s)
    s, t = s[ok], t[ok]
    keys = np.unique(np.minimum(s, t) * n + np.maximum(s, t))
    return np.stack([keys // n, keys % n], axis=1).astype(np.int64)


@dataclass
class RunResult:
    pairs: np.ndarray  # [M, 2]
    lower: np.ndarray  # [M] on C
    upper: np.ndarray  # [M] on C
    sweeps: int
    pair_backups: int  # pair backups done (both arms count once each)
    width: float  # max over C of (u - l)
    seconds: float  # set-up + sweeps (index build is timed by the caller)
    width_history: list[float] = field(default_factory=list)


class RestrictedRuns:
    def __init__(self, idx: np.ndarray, prob: np.ndarray, R: np.ndarray, gamma: float, pairs: np.ndarray,
                 l0: str = "zero", method: str = "auto") -> None:
        if l0 not in ("zero", "reward"):
            raise ValueError("l0 must be 'zero' or 'reward' (d_R = F(0))")
        self.n = idx.shape[0]
        self.pairs = np.asarray(pairs, dtype=np.int64)
        s, t = self.pairs[:, 0], self.pairs[:, 1]
        if (s >= t).any():
            raise ValueError("pairs must have s < t")
        self.keys = s * self.n + t
        if (np.diff(self.keys) <= 0).any():
            raise ValueError("pairs must be sorted and unique")
        self.gamma, self.l0_kind = gamma, l0
        self.d_max = reward_bound(R, gamma)
        self.backup = PairBackup(idx, prob, R, gamma, s, t, method)
        lo = np.minimum(self.backup.succ_s, self.backup.succ_t)
        hi = np.maximum(self.backup.succ_s, self.backup.succ_t)
        succ_keys = lo * self.n + hi
        pos = np.searchsorted(self.keys, succ_keys).clip(max=len(self.keys) - 1)
        hit = self.keys[pos] == succ_keys
        diag = lo == hi
        self.pos = np.where(hit, pos, -1).astype(np.int64)
        self.covered = hit
        self.default_lower = np.where(diag, 0.0, self.initial_lower(R, lo, hi))
        self.default_upper = np.where(diag, 0.0, self.d_max)
        del self.backup.succ_s, self.backup.succ_t, lo, hi, succ_keys  # O(|C|) from here on
        self._R = R
        self.lower = self.initial_lower(R, s, t)
        self.upper = np.full(len(s), self.d_max)

    def initial_lower(self, R: np.ndarray, s: np.ndarray, t: np.ndarray) -> np.ndarray:
        if self.l0_kind == "zero":
            return np.zeros(np.shape(s))
        shape = np.shape(s)
        return reward_metric(R, np.ravel(s), np.ravel(t)).reshape(shape)

    def _ground(self, vals: np.ndarray, default: np.ndarray) -> np.ndarray:
        return np.where(self.covered, vals[self.pos], default)

    def sweep(self) -> None:
        """One Jacobi sweep of both arms (both read the previous iterate)."""
        new_l = self.backup.apply(self._ground(self.lower, self.default_lower))
        new_u = self.backup.apply(self._ground(self.upper, self.default_upper))
        self.lower = np.maximum(self.lower, new_l)
        self.upper = np.minimum(self.upper, new_u)

    def width(self) -> float:
        return float((self.upper - self.lower).max()) if len(self.lower) else 0.0

    def run(self, max_sweeps: int = 500, tol: float = 1e-9,
            on_sweep: Callable[[int, RestrictedRuns], None] | None = None) -> RunResult:
        """Sweep until neither arm moves by more than tol * (1 - gamma) / gamma (or max_sweeps)."""
        start = time.perf_counter()
        widths: list[float] = []
        stop = tol * (1.0 - self.gamma) / max(self.gamma, 1e-12)
        k = 0
        for k in range(1, max_sweeps + 1):
            old_l, old_u = self.lower, self.upper
            self.sweep()
            widths.append(self.width())
            if on_sweep is not None:
                on_sweep(k, self)
            moved = max(float(np.abs(self.lower - old_l).max(initial=0.0)),
                        float(np.abs(self.upper - old_u).max(initial=0.0)))
            if moved <= stop:
                break
        return RunResult(self.pairs, self.lower.copy(), self.upper.copy(), k, 2 * k * len(self.pairs),
                         self.width(), time.perf_counter() - start, widths)

    # -- comparisons against a known d* (benchmarks and tests) -----------------------------------------------------
    def dense(self, arm: str) -> np.ndarray:
        """The arm as an n x n matrix (uncovered pairs at their default). Quadratic: for checks only."""
        s, t = np.triu_indices(self.n, k=1)
        if arm == "lower":
            full = self.initial_lower(self._R, s, t)
            vals = self.lower
        else:
            full = np.full(len(s), self.d_max)
            vals = self.upper
        M = np.zeros((self.n, self.n))
        M[s, t] = full
        M[self.pairs[:, 0], self.pairs[:, 1]] = vals
        return M + M.T

    def rho(self, d_star: np.ndarray) -> float:
        """max over uncovered pairs of d* - l_0 (0 when every pair is covered)."""
        s, t = np.triu_indices(self.n, k=1)
        mask = np.ones(len(s), dtype=bool)
        mask[np.searchsorted(s * self.n + t, self.keys)] = False
        if not mask.any():
            return 0.0
        return float((d_star[s[mask], t[mask]] - self.initial_lower(self._R, s[mask], t[mask])).max())


def against_exact(runs: RestrictedRuns, d_star: np.ndarray) -> dict[str, float]:
    """Compare the current arms with d* (quadratic, for checks): enclosure violations on C and on the uncovered
    defaults, rho, the lower arm's sup error and the identity gap |‖l - d*‖ - rho|."""
    s, t = runs.pairs[:, 0], runs.pairs[:, 1]
    on_c = d_star[s, t]
    rho = runs.rho(d_star)
    s_all, t_all = np.triu_indices(runs.n, k=1)
    uncovered = np.ones(len(s_all), dtype=bool)
    uncovered[np.searchsorted(s_all * runs.n + t_all, runs.keys)] = False
    l0_gap = (runs.initial_lower(runs._R, s_all[uncovered], t_all[uncovered]) - d_star[s_all[uncovered],
                                                                                       t_all[uncovered]])
    lower_error = max(rho, float(np.abs(on_c - runs.lower).max(initial=0.0)))  # ‖l - d*‖_∞ (two-sided)
    return {
        "lower_violation": max(float((runs.lower - on_c).max(initial=0.0)), float(l0_gap.max(initial=0.0))),
        "upper_violation": max(float((on_c - runs.upper).max(initial=0.0)),
                               float((d_star[s_all, t_all] - runs.d_max).max(initial=0.0))),
        "rho": rho,
        "lower_error": lower_error,
        "identity_gap": abs(lower_error - rho),
    }
