"""The bisimulation operator on a fixed list of state pairs.

F(d)(s, t) = max_a [ |R(s, a) - R(t, a)| + gamma * W_d(P(s, a), P(t, a)) ]   (Ferns, Panangaden, Precup 2004)

``PairBackup`` precomputes everything that does not depend on d (successor pairs, reward gaps, the kappa = 3 vertex
tables) so a sweep is a gather of ground costs plus a batched Wasserstein evaluation.
"""

from __future__ import annotations

import numpy as np

from agents.bisim.wasserstein import Kappa3Vertices, w_emd, w_kappa1, w_kappa2


def reward_bound(R: np.ndarray, gamma: float) -> float:
    """d_max = Delta R / (1 - gamma) with Delta R = max_a (max_s R - min_s R): every d* value is below it."""
    return float((R.max(axis=0) - R.min(axis=0)).max() / (1.0 - gamma))


def reward_metric(R: np.ndarray, s: np.ndarray, t: np.ndarray) -> np.ndarray:
    """d_R(s, t) = max_a |R(s, a) - R(t, a)| = F(0)(s, t), a lower bound on d*."""
    return np.abs(R[s] - R[t]).max(axis=1)


class PairBackup:
    def __init__(self, idx: np.ndarray, prob: np.ndarray, R: np.ndarray, gamma: float,
                 s: np.ndarray, t: np.ndarray, method: str = "auto") -> None:
        if not 0.0 <= gamma < 1.0:
            raise ValueError(f"gamma must be in [0, 1), got {gamma}")
        self.gamma, self.method = gamma, method
        self.B, self.A, self.kappa = len(s), idx.shape[1], idx.shape[2]
        k = self.kappa
        # successor pairs of every (pair, action, i, j): the cells of the ground-cost matrix
        self.succ_s = np.broadcast_to(idx[s][:, :, :, None], (self.B, self.A, k, k))
        self.succ_t = np.broadcast_to(idx[t][:, :, None, :], (self.B, self.A, k, k))
        self.reward_gap = np.abs(R[s] - R[t])
        self.p = prob[s].reshape(-1, k)
        self.q = prob[t].reshape(-1, k)
        self.k3 = Kappa3Vertices(self.p, self.q) if (k == 3 and method == "auto") else None

    @property
    def evaluations(self) -> int:
        """Wasserstein evaluations per application (pairs x actions)."""
        return self.B * self.A

    def apply(self, C: np.ndarray) -> np.ndarray:
        """F on the pairs, given the ground costs ``C[B, A, k, k] = d(succ_s, succ_t)``."""
        flat = C.reshape(-1, self.kappa, self.kappa)
        if self.method == "emd" or self.kappa > 3:
            W = w_emd(flat, self.p, self.q)
        elif self.kappa == 1:
            W = w_kappa1(flat)
        elif self.kappa == 2:
            W = w_kappa2(flat, self.p, self.q)
        else:
            W = self.k3.cost(flat)
        # A transport cost over nonnegative ground costs is >= 0; the closed forms' cancellations can land a rounding
        # error below it (-5.6e-17 between bisimilar states), which would make d* fail to be a pseudometric.
        W = np.maximum(W, 0.0)
        return (self.reward_gap + self.gamma * W.reshape(self.B, self.A)).max(axis=1)
