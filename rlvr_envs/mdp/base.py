"""A finite MDP as a Gymnasium env with a toy-text transition table.

``P[s][a] = [(prob, next_state, reward, terminated), ...]`` is the model (as in Gymnasium's toy-text envs);
``to_tensors()`` turns it into dense arrays a solver can sweep. A terminated transition leads, in the tensors, to one
extra absorbing zero-reward *sink* state, so the tensor MDP never stops and every state has a successor.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from rlvr_envs.splits import check_seed_base

Transition = tuple[float, int, float, bool]
TransitionTable = dict[int, dict[int, list[Transition]]]


class TabularMDPEnv(gym.Env):
    """Subclasses fill ``self.P``, ``self.initial`` (start distribution over states) and ``self.n_actions``.

    ``seed_base`` is the split option every env family takes (``rlvr_envs.splits``): ``reset(seed=s)`` seeds the
    episode stream ``(s, seed_base)``; 0 keeps gymnasium's plain ``s``."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, P: TransitionTable, n_actions: int, initial: np.ndarray, *, seed_base: int = 0) -> None:
        self.seed_base = check_seed_base(seed_base)
        self.P = P
        self.n_states = len(P)
        self.n_actions = n_actions
        self.initial = np.asarray(initial, dtype=np.float64)
        if self.initial.shape != (self.n_states,) or not np.isclose(self.initial.sum(), 1.0):
            raise ValueError("initial must be a distribution over the states")
        self.observation_space = gym.spaces.Discrete(self.n_states)
        self.action_space = gym.spaces.Discrete(n_actions)
        self.s = 0

    # -- episodes -------------------------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
        super().reset(seed=seed)  # validates and records the seed
        if seed is not None and self.seed_base:
            # gymnasium seeds from one int; the split is a second word of the same SeedSequence entropy
            self._np_random = np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(seed), self.seed_base])))
        if options and "state" in options:
            state = int(options["state"])
            if not 0 <= state < self.n_states:
                raise ValueError(f"state {state} outside 0..{self.n_states - 1}")
            self.s = state
        else:
            self.s = int(self.np_random.choice(self.n_states, p=self.initial))
        return self.s, {"prob": 1.0}

    def step(self, action: int) -> tuple[int, float, bool, bool, dict[str, Any]]:
        if not self.action_space.contains(action):
            raise ValueError(f"action {action!r} is not in {self.action_space}")
        transitions = self.P[self.s][int(action)]
        i = int(self.np_random.choice(len(transitions), p=[t[0] for t in transitions]))
        prob, nxt, reward, terminated = transitions[i]
        self.s = int(nxt)
        return self.s, float(reward), bool(terminated), False, {"prob": float(prob)}

    # -- the model as arrays --------------------------------------------------------------------------------------
    @property
    def has_sink(self) -> bool:
        return any(t[3] for row in self.P.values() for ts in row.values() for t in ts)

    @property
    def n_tensor_states(self) -> int:
        """States in ``to_tensors()``: the env's states plus the sink when some transition terminates."""
        return self.n_states + int(self.has_sink)

    def to_tensors(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``idx[n, A, k]`` successor states, ``prob[n, A, k]`` their probabilities (padding has prob 0 and repeats
        the first successor), ``R[n, A]`` expected rewards. Duplicate successors are merged; terminated transitions
        go to the sink (index ``n_states``), which loops to itself with reward 0 under every action."""
        n, A = self.n_tensor_states, self.n_actions
        sink = self.n_states
        rows: list[list[dict[int, float]]] = []
        R = np.zeros((n, A))
        for s in range(self.n_states):
            row = []
            for a in range(A):
                mass: dict[int, float] = {}
                for prob, nxt, reward, terminated in self.P[s][a]:
                    target = sink if terminated else int(nxt)
                    mass[target] = mass.get(target, 0.0) + float(prob)
                    R[s, a] += float(prob) * float(reward)
                row.append({t: p for t, p in mass.items() if p > 0})
            rows.append(row)
        if self.has_sink:
            rows.append([{sink: 1.0} for _ in range(A)])
        kappa = max(len(m) for row in rows for m in row)
        idx = np.zeros((n, A, kappa), dtype=np.int64)
        prob = np.zeros((n, A, kappa))
        for s, row in enumerate(rows):
            for a, mass in enumerate(row):
                targets = sorted(mass)
                idx[s, a, :] = targets[0]
                idx[s, a, : len(targets)] = targets
                prob[s, a, : len(targets)] = [mass[t] for t in targets]
        prob /= prob.sum(axis=2, keepdims=True)  # float noise from the table (e.g. 0.8 + 0.1 + 0.1)
        return idx, prob, R

    def embedding(self, kind: str = "informative", seed: int = 0) -> np.ndarray:
        """float32 ``[n_tensor_states, m]``: a representation to index states by (``informative`` / ``uninformative``)."""
        raise NotImplementedError

    def true_groups(self) -> np.ndarray | None:
        """A known bisimulation partition of the tensor states (label per state), or None when there is none."""
        return None


def check_kind(kind: str) -> None:
    if kind not in ("informative", "uninformative"):
        raise ValueError(f"embedding kind must be 'informative' or 'uninformative', got {kind!r}")
