"""Policies (model + tokenizer), rollout engines (``hf``, ``vllm``) and the ``PolicyAgent`` used by the harness."""

from agents.policy.agent import PolicyAgent
from agents.policy.engine import HFEngine, Rollout, RolloutEngine, SamplingParams, make_engine
from agents.policy.models import Policy, load_policy, weights_hash

__all__ = [
    "HFEngine", "Policy", "PolicyAgent", "Rollout", "RolloutEngine", "SamplingParams", "load_policy", "make_engine",
    "weights_hash",
]
