"""Bisimulation metrics: exact sweeps, the certified ANN-restricted runs, the clustering certificate, aggregation,
and the learned MICo / DBC baselines (torch; import ``agents.bisim.mico`` / ``agents.bisim.dbc`` directly)."""

from rlvr_envs.extras import require_extra

require_extra("bisim", "agents.bisim (bisimulation metrics)", ("ot", "scipy"))

from agents.bisim.aggregation import aggregation_error, merge_to_k, q_star  # noqa: E402
from agents.bisim.ann import RestrictedRuns, RunResult, knn_pairs  # noqa: E402
from agents.bisim.certificate import adjusted_rand_index, certify, components  # noqa: E402
from agents.bisim.exact import ExactResult, exact_metric  # noqa: E402

__all__ = ["ExactResult", "RestrictedRuns", "RunResult", "adjusted_rand_index", "aggregation_error", "certify",
           "components", "exact_metric", "knn_pairs", "merge_to_k", "q_star"]
