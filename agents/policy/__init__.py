"""Policies (model + tokenizer), rollout engines (``hf``, ``vllm``) and the ``PolicyAgent`` used by the harness."""

from rlvr_envs.extras import require_extra

require_extra("agents", "agents.policy (models and rollout engines)", ("torch", "transformers"))

from agents.policy.agent import PolicyAgent  # noqa: E402
from agents.policy.engine import HFEngine, Rollout, RolloutEngine, SamplingParams, make_engine  # noqa: E402
from agents.policy.models import Policy, load_policy, weights_hash  # noqa: E402

__all__ = [
    "HFEngine", "Policy", "PolicyAgent", "Rollout", "RolloutEngine", "SamplingParams", "load_policy", "make_engine",
    "weights_hash",
]
