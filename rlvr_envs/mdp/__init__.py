"""Tabular testbeds for bisimulation metrics: ``rlvr/Grouped64-v0``, ``rlvr/Taxi-v0``, ``rlvr/Grid50-v0``.

Each is a Gymnasium env with a toy-text ``P[s][a]``, ``to_tensors()`` and ``embedding(kind, seed)``. They know no solver.
"""

from rlvr_envs.mdp.base import TabularMDPEnv
from rlvr_envs.mdp.grid import GridEnv
from rlvr_envs.mdp.grouped import GroupedEnv
from rlvr_envs.mdp.taxi import TaxiEnv

__all__ = ["GridEnv", "GroupedEnv", "TabularMDPEnv", "TaxiEnv"]
