"""An agent that answers each MATH / MATH-500 task with the dataset's own worked solution (ending in its own box).

Its results file is what ``rlvr audit`` reads to find where either math verifier rejects a reference solution::

    PYTHONPATH=. rlvr eval --env rlvr/MATH500-v0 --agent benchmarks.audit_reference:ReferenceSolutionAgent \\
        --out ref-math500.json
    rlvr audit ref-math500.json --out benchmarks/results/audit_math500_reference.json
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

import rlvr_envs  # noqa: F401  (registers the IDs)


class ReferenceSolutionAgent:
    def __init__(self, env_id: str = "rlvr/MATH500-v0", **env_kwargs: Any):
        self.env = gym.make(env_id, **env_kwargs).unwrapped

    def act(self, observations: list[str], infos: list[dict[str, Any]]) -> list[str]:
        return [self.env.source.task(info["task_index"]).metadata["solution"] for info in infos]

    def describe(self) -> dict[str, Any]:
        return {"model": "reference-solutions"}
