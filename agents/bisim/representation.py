"""Shared pieces of the learned baselines: the encoder and uniform-policy transition sampling."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


def encoder(in_dim: int, hidden: int = 64, out_dim: int = 16) -> nn.Module:
    """The MLP both baselines use: input (one-hot or e(s)) -> 2 x 64 ReLU -> z in R^16."""
    return nn.Sequential(nn.Linear(in_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, out_dim))


def state_inputs(n: int, emb: np.ndarray | None) -> torch.Tensor:
    """One-hot rows when no embedding is given, else e(s)."""
    if emb is None:
        return torch.eye(n)
    return torch.as_tensor(np.asarray(emb), dtype=torch.float32)


class TransitionSampler:
    """(s, a, r, s') with s uniform, a uniform (the uniform policy), s' ~ P(s, a), r = R(s, a)."""

    def __init__(self, idx: np.ndarray, prob: np.ndarray, R: np.ndarray, seed: int) -> None:
        self.idx, self.cum, self.R = idx, np.cumsum(prob, axis=2), R
        self.rng = np.random.default_rng(seed)

    def sample(self, batch: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        n, A, _ = self.idx.shape
        s = self.rng.integers(n, size=batch)
        a = self.rng.integers(A, size=batch)
        u = self.rng.random(batch)[:, None]
        j = (u > self.cum[s, a]).sum(axis=1).clip(max=self.idx.shape[2] - 1)
        nxt = self.idx[s, a, j]
        as_t = lambda x: torch.as_tensor(x)  # noqa: E731
        return as_t(s), as_t(a), torch.as_tensor(self.R[s, a], dtype=torch.float32), as_t(nxt)
