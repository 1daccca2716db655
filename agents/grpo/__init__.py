"""The GRPO core: ``GroupBatch`` (ragged groups), stage registries, the trainer loop, recipes and checkpoints.

Methods live in ``agents/methods/`` (one file each) and plug into named stages with ``@register(name, stage=...)``.
"""

from rlvr_envs.extras import require_extra

# Checked before the imports below so a core-only install says which extra to add, not "No module named torch".
require_extra("agents", "agents.grpo (GRPO training)", ("torch", "transformers"))

from agents.grpo.batch import GroupBatch, Sample  # noqa: E402
from agents.grpo.registry import STAGES, Component, register  # noqa: E402

__all__ = ["STAGES", "Component", "GroupBatch", "Sample", "register"]
