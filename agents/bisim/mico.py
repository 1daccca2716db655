"""MICo (Castro et al. 2021) as a trainable torch representation, the learned baseline for the metric.

U(x, y) = (|phi x|^2 + |phi y|^2) / 2 + beta * angle(phi x, phi y); Huber loss of U(x, y) against
|r_x - r_y| + gamma * U_target(x', y') over all pairs of a batch of uniform-policy transitions; a Polyak target net.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn.functional as F_

from agents.bisim.representation import TransitionSampler, encoder, state_inputs


def mico_distance(za: torch.Tensor, zb: torch.Tensor, beta: float = 0.1) -> torch.Tensor:
    norms = 0.5 * (za.pow(2).sum(-1) + zb.pow(2).sum(-1))
    dot = (za * zb).sum(-1)
    # |a||b| sin(angle) = sqrt(|a|^2 |b|^2 - dot^2); atan2 keeps the gradient finite at angles 0 and pi
    cross = (za.pow(2).sum(-1) * zb.pow(2).sum(-1) - dot.pow(2)).clamp_min(1e-9).sqrt()
    return norms + beta * torch.atan2(cross, dot)


class MICo:
    def __init__(self, n: int, emb: np.ndarray | None = None, gamma: float = 0.9, beta: float = 0.1,
                 lr: float = 1e-3, tau: float = 0.01, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.x = state_inputs(n, emb)
        self.net = encoder(self.x.shape[1])
        self.target = copy.deepcopy(self.net).requires_grad_(False)
        self.opt = torch.optim.Adam(self.net.parameters(), lr=lr)
        self.gamma, self.beta, self.tau, self.seed = gamma, beta, tau, seed

    def train(self, idx: np.ndarray, prob: np.ndarray, R: np.ndarray, steps: int = 2000, batch: int = 64) -> list[float]:
        sampler = TransitionSampler(idx, prob, R, self.seed)
        losses = []
        iu = torch.triu_indices(batch, batch, offset=1)
        for _ in range(steps):
            s, _, r, nxt = sampler.sample(batch)
            z = self.net(self.x[s])
            with torch.no_grad():
                zn = self.target(self.x[nxt])
                target = (r[iu[0]] - r[iu[1]]).abs() + self.gamma * mico_distance(zn[iu[0]], zn[iu[1]], self.beta)
            loss = F_.huber_loss(mico_distance(z[iu[0]], z[iu[1]], self.beta), target)
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            with torch.no_grad():
                for p, tp in zip(self.net.parameters(), self.target.parameters()):
                    tp.lerp_(p, self.tau)
            losses.append(float(loss.detach()))
        return losses

    @torch.no_grad()
    def distance(self, s: np.ndarray, t: np.ndarray) -> np.ndarray:
        z = self.net(self.x)
        return mico_distance(z[torch.as_tensor(s)], z[torch.as_tensor(t)], self.beta).double().numpy()
