"""Adaptive per-prompt rollout budgets from expected signal (seed 003, arXiv 2606.05606). Stage: RolloutAllocator.

A fixed group size spends as much on a prompt the policy always solves as on one at the edge of its ability. This
allocator keeps GRPO's total rollouts per step (``budget_per_prompt`` x prompts) and splits them by how much GRPO
signal each prompt is expected to give.

Our reading (the abstract leaves the rule open; all are hyper-parameters):
- expected signal of ``n`` rollouts of a task = the probability that its group is not saturated times the reward
  variance of one rollout, ``E[p(1-p)] * (1 - E[p^n] - E[(1-p)^n])`` under the task's Beta pass-rate posterior
  (``PassRates.expected_signal``), concave in ``n``: a prompt at the edge of the policy's ability is worth most;
- rollouts are granted ``unit`` at a time to the largest marginal gain (``greedy_allocation``), every prompt getting
  at least ``n_min`` (an unseen or hopeless prompt still gets a look) and at most ``n_max``;
- one round, before generation: the posterior comes from earlier steps only (prompts recur in a finite
  ``train_pool``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agents.grpo.batch import GroupBatch, task_of
from agents.grpo.comparisons import FINITE_POOL, Comparison, declare
from agents.grpo.history import PassRates, greedy_allocation
from agents.grpo.registry import Component, register


@register("signal_budget", stage="rollout_allocator")
class SignalBudgetAllocator(Component):
    def __init__(self, budget_per_prompt: int = 8, n_min: int = 2, n_max: int = 16, unit: int = 2,
                 prior: float = 2.0, decay: float = 1.0):
        if not 1 <= n_min <= budget_per_prompt <= n_max or unit < 1:
            raise ValueError(f"signal_budget: need 1 <= n_min <= budget_per_prompt <= n_max and unit >= 1; got "
                             f"n_min={n_min}, budget_per_prompt={budget_per_prompt}, n_max={n_max}, unit={unit}")
        self.budget_per_prompt, self.n_min, self.n_max, self.unit = int(budget_per_prompt), int(n_min), int(n_max), \
            int(unit)
        self.rates = PassRates(prior=prior, decay=decay)
        self.last: list[int] = []

    def initial(self, group_ids: Sequence[str]) -> dict[str, int]:
        tasks = [task_of(g) for g in group_ids]
        counts = greedy_allocation(list(dict.fromkeys(tasks)), self.rates.expected_signal,
                                   budget=self.budget_per_prompt * len(group_ids), n_min=self.n_min,
                                   n_max=self.n_max, unit=self.unit)
        self.last = [counts[t] for t in tasks]
        return dict(zip(group_ids, self.last))

    def more(self, batch: GroupBatch) -> dict[str, int]:
        return {}

    def budget(self, n_prompts: int) -> int:
        return self.budget_per_prompt * n_prompts

    def observe_rollouts(self, batch: GroupBatch, wall_s: float) -> None:
        self.rates.update(batch)

    def metrics(self) -> dict[str, float]:
        if not self.last:
            return {}
        return {"group_min": float(min(self.last)), "group_max": float(max(self.last)),
                "groups_at_min": float(sum(n == self.n_min for n in self.last))}

    def state_dict(self) -> dict[str, Any]:
        return {"rates": self.rates.state_dict(), "last": list(self.last)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rates.load_state_dict(state["rates"])
        self.last = [int(n) for n in state["last"]]


declare(Comparison(
    method="signal_budget", baseline="grpo", metric="final_accuracy", direction="higher", overrides=FINITE_POOL,
    known_result=(
        "micro lane, finite-pool variant, seeds 0-2, both sides 15,360 rollouts: final mean@4 0.495 vs 0.488, diff "
        "+0.007 [95% -0.014, +0.028]: inconclusive (groups of 2-11 by expected signal, about 3 prompts a step at "
        "the minimum)"),
    claim="rollouts per prompt set by expected training signal beat a fixed group size at the same total rollouts "
          "(arXiv 2606.05606; our reading of the allocation rule)"))
