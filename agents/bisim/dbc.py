"""DBC (Zhang et al. 2021) as a trainable torch representation, the second learned baseline.

Bisimulation loss on permuted batch pairs: (|z_i - z_j|_1 - |r_i - r_j| - gamma * W2)^2 with
W2 = sqrt(|mu_i - mu_j|^2 + |sigma_i - sigma_j|^2) from a Gaussian latent transition model (detached in the target);
the transition model is trained by NLL of the detached next latent; a reward decoder predicts r from (z, a).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F_
from torch import nn

from agents.bisim.representation import TransitionSampler, encoder, state_inputs


class DBC:
    def __init__(self, n: int, n_actions: int, emb: np.ndarray | None = None, gamma: float = 0.9, lr: float = 1e-3,
                 latent: int = 16, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.x = state_inputs(n, emb)
        self.net = encoder(self.x.shape[1], out_dim=latent)
        self.n_actions = n_actions
        self.transition = nn.Sequential(nn.Linear(latent + n_actions, 64), nn.ReLU(), nn.Linear(64, 2 * latent))
        self.reward = nn.Sequential(nn.Linear(latent + n_actions, 64), nn.ReLU(), nn.Linear(64, 1))
        params = [*self.net.parameters(), *self.transition.parameters(), *self.reward.parameters()]
        self.opt = torch.optim.Adam(params, lr=lr)
        self.gamma, self.seed = gamma, seed

    def _gaussian(self, z: torch.Tensor, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.transition(torch.cat([z, F_.one_hot(a, self.n_actions).float()], dim=-1))
        mu, log_sigma = out.chunk(2, dim=-1)
        return mu, log_sigma.clamp(-5.0, 2.0).exp()

    def train(self, idx: np.ndarray, prob: np.ndarray, R: np.ndarray, steps: int = 2000, batch: int = 64) -> list[float]:
        sampler = TransitionSampler(idx, prob, R, self.seed)
        gen = torch.Generator().manual_seed(self.seed)
        losses = []
        for _ in range(steps):
            s, a, r, nxt = sampler.sample(batch)
            z = self.net(self.x[s])
            perm = torch.randperm(batch, generator=gen)
            with torch.no_grad():
                mu, sigma = self._gaussian(z.detach(), a)
                w2 = ((mu - mu[perm]).pow(2).sum(-1) + (sigma - sigma[perm]).pow(2).sum(-1)).sqrt()
                target = (r - r[perm]).abs() + self.gamma * w2
            bisim = ((z - z[perm]).abs().sum(-1) - target).pow(2).mean()
            mu, sigma = self._gaussian(z, a)
            z_next = self.net(self.x[nxt]).detach()
            nll = (0.5 * ((z_next - mu) / sigma).pow(2) + sigma.log()).sum(-1).mean()
            r_hat = self.reward(torch.cat([z, F_.one_hot(a, self.n_actions).float()], dim=-1)).squeeze(-1)
            loss = bisim + nll + F_.mse_loss(r_hat, r)
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            losses.append(float(bisim.detach()))
        return losses

    @torch.no_grad()
    def distance(self, s: np.ndarray, t: np.ndarray) -> np.ndarray:
        z = self.net(self.x)
        return (z[torch.as_tensor(s)] - z[torch.as_tensor(t)]).abs().sum(-1).double().numpy()
