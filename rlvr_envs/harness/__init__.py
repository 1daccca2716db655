"""Evaluation harness: ``evaluate(agent, env_id, ...) -> Results``, metrics, the results schema and leaderboards.

Imports nothing from ``agents``: an agent is anything with ``act(observations, infos) -> responses``.
"""

from rlvr_envs.harness.evaluate import evaluate, sample_seed
from rlvr_envs.harness.metrics import compute_metrics, pass_at_k
from rlvr_envs.harness.ray_eval import evaluate_ray
from rlvr_envs.harness.results import Results, SchemaError, validate

__all__ = ["Results", "SchemaError", "compute_metrics", "evaluate", "evaluate_ray", "pass_at_k", "sample_seed",
           "validate"]
