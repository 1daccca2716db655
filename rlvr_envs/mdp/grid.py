"""Gridworld (``rlvr/Grid50-v0``): ``size x size`` cells, 4 deterministic moves (up, right, down, left).

Entering the goal (bottom-right corner) pays +1 and terminates; bumping into the outer wall pays -1 and stays put;
every other move pays 0. Episodes start in a uniformly random non-goal cell.
"""

from __future__ import annotations

import numpy as np

from rlvr_envs.mdp.base import TabularMDPEnv, TransitionTable, check_kind

MOVES = ((-1, 0), (0, 1), (1, 0), (0, -1))


class GridEnv(TabularMDPEnv):
    def __init__(self, size: int = 50, render_mode: str | None = None, seed_base: int = 0) -> None:
        if size < 2:
            raise ValueError("size must be at least 2")
        self.size = size
        n = size * size
        self.goal = n - 1
        P: TransitionTable = {}
        for s in range(n):
            r, c = divmod(s, size)
            P[s] = {}
            for a, (dr, dc) in enumerate(MOVES):
                nr, nc = r + dr, c + dc
                if not (0 <= nr < size and 0 <= nc < size):
                    P[s][a] = [(1.0, s, -1.0, False)]
                    continue
                nxt = nr * size + nc
                P[s][a] = [(1.0, nxt, 1.0, True)] if nxt == self.goal else [(1.0, nxt, 0.0, False)]
        initial = np.full(n, 1.0 / (n - 1))
        initial[self.goal] = 0.0
        super().__init__(P, 4, initial, seed_base=seed_base)
        self.render_mode = render_mode

    def embedding(self, kind: str = "informative", seed: int = 0) -> np.ndarray:
        """informative: (row, col) / (size - 1), the sink one step past the goal; uninformative: N(0, I_2)."""
        check_kind(kind)
        n = self.n_tensor_states
        if kind == "uninformative":
            return np.random.default_rng(seed).standard_normal((n, 2)).astype(np.float32)
        cells = np.arange(self.n_states)
        e = np.stack([cells // self.size, cells % self.size], axis=1) / (self.size - 1)
        sink = np.full((1, 2), 1.0 + 1.0 / (self.size - 1))
        return np.concatenate([e, sink]).astype(np.float32)
