"""The GRPO core: ``GroupBatch`` (ragged groups), stage registries, the trainer loop, recipes and checkpoints.

Methods live in ``agents/methods/`` (one file each) and plug into named stages with ``@register(name, stage=...)``.
"""

from agents.grpo.batch import GroupBatch, Sample
from agents.grpo.registry import STAGES, Component, register

__all__ = ["STAGES", "Component", "GroupBatch", "Sample", "register"]
