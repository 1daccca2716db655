"""Bisimulation metrics: exact sweeps, the certified ANN-restricted runs, the clustering certificate, aggregation,
and the learned MICo / DBC baselines (torch; import ``agents.bisim.mico`` / ``agents.bisim.dbc`` directly)."""

from agents.bisim.aggregation import aggregation_error, merge_to_k, q_star
from agents.bisim.ann import RestrictedRuns, RunResult, knn_pairs
from agents.bisim.certificate import adjusted_rand_index, certify, components
from agents.bisim.exact import ExactResult, exact_metric

__all__ = ["ExactResult", "RestrictedRuns", "RunResult", "adjusted_rand_index", "aggregation_error", "certify",
           "components", "exact_metric", "knn_pairs", "merge_to_k", "q_star"]
