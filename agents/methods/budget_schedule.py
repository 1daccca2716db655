"""A per-update rollout budget that varies across training (seed 003, arXiv 2610.09679). Stage: RolloutAllocator.

Adaptive-rollout methods split a fixed per-update budget across prompts; this one instead varies the per-update
budget itself over the run while keeping the run's total: the group size at step ``t`` of ``T`` follows a schedule
from ``start`` to ``end`` rollouts per prompt.

Our reading (the abstract is truncated before the rule; all are hyper-parameters):
- ``schedule = "linear"`` interpolates ``start -> end`` over the run's steps, ``"cosine"`` follows half a cosine;
  group sizes round to a multiple of ``unit`` (at least 2: a group needs two rollouts for a GRPO signal);
- the default ``4 -> 12`` grows groups as training goes on: early on most groups carry signal and the policy moves
  fast, so small groups and frequent fresh prompts pay; later more groups saturate and a larger group is needed to
  find one that does not. Its mean is 8, GRPO's fixed size, so both spend the same rollouts over the run (the
  result records the totals).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from agents.grpo.batch import GroupBatch
from agents.grpo.comparisons import FINITE_POOL, Comparison, declare
from agents.grpo.registry import Component, register

SCHEDULES = ("linear", "cosine", "constant")


def group_size_at(step: int, steps: int, *, start: int, end: int, schedule: str, unit: int = 2) -> int:
    """The group size at ``step`` (1-based) of a ``steps``-step run."""
    frac = 0.0 if steps <= 1 else min(1.0, max(0.0, (step - 1) / (steps - 1)))
    if schedule == "linear":
        x = start + (end - start) * frac
    elif schedule == "cosine":
        x = start + (end - start) * (1 - math.cos(math.pi * frac)) / 2
    elif schedule == "constant":
        x = start
    else:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    return max(2, unit * int(round(x / unit)))


@register("budget_schedule", stage="rollout_allocator")
class BudgetScheduleAllocator(Component):
    def __init__(self, start: int = 4, end: int = 12, schedule: str = "linear", unit: int = 2,
                 steps: int | None = None):
        if schedule not in SCHEDULES:
            raise ValueError(f"budget_schedule: schedule must be one of {SCHEDULES}, got {schedule!r}")
        if start < 2 or end < 2 or unit < 1:
            raise ValueError(f"budget_schedule: start and end must be >= 2 and unit >= 1; got {start}, {end}, {unit}")
        self.start, self.end, self.schedule, self.unit = int(start), int(end), schedule, int(unit)
        self.steps = steps  # the run's length; default: the trainer's config (bind)
        self.size = self.start

    def bind(self, services: Any) -> None:
        if self.steps is None:
            self.steps = int(services.cfg.steps)

    def initial(self, group_ids: Sequence[str]) -> dict[str, int]:
        if not group_ids:
            return {}
        step = int(str(group_ids[0]).split(":", 1)[0])  # trainer group ids are "step:round:index:task_id"
        self.size = group_size_at(step, int(self.steps or 1), start=self.start, end=self.end,
                                  schedule=self.schedule, unit=self.unit)
        return {g: self.size for g in group_ids}

    def more(self, batch: GroupBatch) -> dict[str, int]:
        return {}

    def metrics(self) -> dict[str, float]:
        return {"group_size": float(self.size)}

    def state_dict(self) -> dict[str, Any]:
        return {"size": self.size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.size = int(state["size"])


declare(Comparison(
    method="budget_schedule", baseline="grpo", metric="final_accuracy", direction="higher", overrides=FINITE_POOL,
    known_result=(
        "micro lane, finite-pool variant, seeds 0-2, 60 steps, 15360 rollouts each: final mean@4 0.482 vs GRPO 0.488, "
        "diff -0.005 [95% paired bootstrap -0.031, +0.018]: not above. An earlier warm-start build gave 0.486 vs "
        "0.497, -0.011 [-0.029, +0.008]"),
    claim="varying the per-update rollout budget across training (here 4 -> 12 per prompt, mean 8) beats a fixed "
          "budget at the same total rollouts (arXiv 2610.09679; our reading of the schedule)"))
