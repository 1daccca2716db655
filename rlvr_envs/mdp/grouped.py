"""Grouped MDP (``rlvr/Grouped64-v0``): groups of states that are exactly bisimilar by construction.

``n_groups`` groups of ``group_size`` states, ``n_actions`` actions. Group rewards ``r_g(a) ~ U[0, 1]`` are resampled
until every two groups differ by at least ``delta`` in some action. A group kernel ``q(g, a)`` puts mass on two target
groups; state ``(g, i)`` sends the mass of target group ``g'`` to one random member of ``g'`` (drawn per state). Every
state of a group then has the same reward and the same distribution over groups, so the group partition is a
bisimulation (d* = 0 inside a group) and groups are at least ``delta`` apart. Nothing terminates: episodes end by
truncation (``max_episode_steps`` in the registry).
"""

from __future__ import annotations

import numpy as np

from rlvr_envs.mdp.base import TabularMDPEnv, TransitionTable, check_kind


def _group_rewards(rng: np.random.Generator, n_groups: int, n_actions: int, delta: float) -> np.ndarray:
    for _ in range(10_000):
        r = rng.uniform(0.0, 1.0, size=(n_groups, n_actions))
        gaps = np.abs(r[:, None, :] - r[None, :, :]).max(axis=2)
        if (gaps[~np.eye(n_groups, dtype=bool)] >= delta).all():
            return r
    raise ValueError(f"could not draw {n_groups} groups {delta} apart; lower delta or the number of groups")


class GroupedEnv(TabularMDPEnv):
    def __init__(self, n_groups: int = 8, group_size: int = 8, n_actions: int = 4, delta: float = 0.1,
                 mdp_seed: int = 0, render_mode: str | None = None, seed_base: int = 0) -> None:
        if n_groups < 2 or group_size < 1 or n_actions < 1:
            raise ValueError("need n_groups >= 2, group_size >= 1, n_actions >= 1")
        rng = np.random.default_rng(mdp_seed)
        self.n_groups, self.group_size = n_groups, group_size
        self.group_reward = _group_rewards(rng, n_groups, n_actions, delta)
        # q(g, a): two distinct target groups with masses (w, 1 - w)
        self.group_targets = np.stack([[rng.choice(n_groups, size=2, replace=False) for _ in range(n_actions)]
                                       for _ in range(n_groups)])
        w = rng.uniform(0.1, 0.9, size=(n_groups, n_actions))
        self.group_mass = np.stack([w, 1.0 - w], axis=2)
        n = n_groups * group_size
        P: TransitionTable = {}
        for s in range(n):
            g = s // group_size
            P[s] = {}
            for a in range(n_actions):
                members = rng.integers(group_size, size=2)  # the member of each target group this state lands on
                P[s][a] = [(float(self.group_mass[g, a, j]), int(self.group_targets[g, a, j] * group_size + members[j]),
                            float(self.group_reward[g, a]), False) for j in range(2)]
        super().__init__(P, n_actions, np.full(n, 1.0 / n), seed_base=seed_base)
        self.render_mode = render_mode

    def true_groups(self) -> np.ndarray:
        return np.arange(self.n_states) // self.group_size

    def embedding(self, kind: str = "informative", seed: int = 0) -> np.ndarray:
        """informative: group centre (on the unit circle) + N(0, 0.05^2) noise; uninformative: N(0, I_2)."""
        check_kind(kind)
        rng = np.random.default_rng(seed)
        if kind == "uninformative":
            return rng.standard_normal((self.n_states, 2)).astype(np.float32)
        angle = 2 * np.pi * self.true_groups() / self.n_groups
        centres = np.stack([np.cos(angle), np.sin(angle)], axis=1)
        return (centres + 0.05 * rng.standard_normal((self.n_states, 2))).astype(np.float32)
