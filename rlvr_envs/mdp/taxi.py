"""Taxi (``rlvr/Taxi-v0``): Gymnasium's Taxi model (``Taxi-v4``; v3 is deprecated in gymnasium 1.4) as a tabular MDP.

500 states, 6 actions. ``rainy=True`` makes moves slip sideways (support 3). A successful drop-off terminates, so the
tensors have a 501st sink state. No two states are exactly bisimilar.
"""

from __future__ import annotations

import numpy as np
from gymnasium.envs.toy_text.taxi import TaxiEnv as _GymTaxi

from rlvr_envs.mdp.base import TabularMDPEnv, TransitionTable, check_kind


class TaxiEnv(TabularMDPEnv):
    def __init__(self, rainy: bool = False, render_mode: str | None = None, seed_base: int = 0) -> None:
        self._model = _GymTaxi(is_rainy=rainy)
        P: TransitionTable = {int(s): {int(a): [(float(p), int(t), float(r), bool(d)) for p, t, r, d in ts]
                                       for a, ts in row.items()} for s, row in self._model.P.items()}
        super().__init__(P, 6, np.asarray(self._model.initial_state_distrib, dtype=np.float64), seed_base=seed_base)
        self.rainy = rainy
        self.render_mode = render_mode

    def embedding(self, kind: str = "informative", seed: int = 0) -> np.ndarray:
        """informative: decoded (row/4, col/4, passenger/4, destination/3), sink at -1; uninformative: N(0, I_8)."""
        check_kind(kind)
        n = self.n_tensor_states
        if kind == "uninformative":
            return np.random.default_rng(seed).standard_normal((n, 8)).astype(np.float32)
        decoded = np.array([list(self._model.decode(s)) for s in range(self.n_states)], dtype=np.float64)
        decoded /= np.array([4.0, 4.0, 4.0, 3.0])
        return np.concatenate([decoded, -np.ones((1, 4))]).astype(np.float32)
