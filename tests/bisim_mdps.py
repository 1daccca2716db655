"""Random small MDPs for the bisimulation property tests (hypothesis strategies)."""

import numpy as np
from hypothesis import strategies as st


def random_mdp(seed: int, n_groups: int, group_size: int, n_actions: int, kappa: int):
    """Tensors of a random MDP built from ``n_groups`` bisimilar groups (so certificates can fire): every member of
    a group has the group's reward and sends the group-level mass to a random member of each target group.
    Rewards come from a 3-value set so unrelated groups can tie too."""
    rng = np.random.default_rng(seed)
    n = n_groups * group_size
    R_g = rng.choice([0.0, 0.5, 1.0], size=(n_groups, n_actions))
    idx = np.zeros((n, n_actions, kappa), dtype=np.int64)
    prob = np.zeros((n, n_actions, kappa))
    for g in range(n_groups):
        for a in range(n_actions):
            targets = rng.integers(n_groups, size=kappa)
            w = rng.dirichlet(np.ones(kappa))
            w[rng.random(kappa) < 0.2] = 0.0  # some zero masses: degenerate supports
            if w.sum() == 0:
                w[0] = 1.0
            w /= w.sum()
            for i in range(group_size):
                s = g * group_size + i
                idx[s, a] = targets * group_size + rng.integers(group_size, size=kappa)
                prob[s, a] = w
    R = np.repeat(R_g, group_size, axis=0)
    return idx, prob, R


mdps = st.builds(random_mdp, seed=st.integers(0, 2**31 - 1), n_groups=st.integers(2, 4),
                 group_size=st.integers(1, 3), n_actions=st.integers(1, 3), kappa=st.integers(1, 3))
gammas = st.sampled_from([0.5, 0.8, 0.9])


def random_pairs(n: int, frac: float, seed: int) -> np.ndarray:
    s, t = np.triu_indices(n, k=1)
    keep = np.random.default_rng(seed).random(len(s)) < frac
    return np.stack([s[keep], t[keep]], axis=1).astype(np.int64)
