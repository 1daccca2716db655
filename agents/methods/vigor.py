"""VIGOR (seed 000): variance-guided rollout allocation. Stage: RolloutAllocator.

Every prompt starts with ``n0`` rollouts; then, in rounds, the ``top_k`` prompts with the highest group reward
variance each get ``per_round`` more, until the step's total budget ``budget`` (rollouts) is spent. Groups end up
ragged: informative prompts (mixed outcomes) get many samples, saturated ones few.

Our reading (the abstract leaves these open; all are hyper-parameters):
- variance score = population variance of the group's rewards after adding ``prior`` pseudo-rewards at 0 and at 1
  each. For 0/1 rewards this is p(1-p) with p = (s + prior) / (n + 2 prior), the Beta-smoothed pass rate, so a group
  that is all-wrong after two tries still scores above zero and is not starved forever; ``prior = 0`` gives the
  plain variance.
- ties are broken by fewer rollouts so far, then by group order (deterministic).
- ``budget`` is per prompt if ``budget_per_prompt`` is set (total = budget_per_prompt * n_prompts), which lets a
  recipe match GRPO's rollout count for any ``prompts_per_step``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agents.grpo.batch import GroupBatch
from agents.grpo.comparisons import Comparison, declare
from agents.grpo.registry import Component, register


def variance_score(rewards: Sequence[float], prior: float) -> float:
    """Population variance of ``rewards`` plus ``prior`` pseudo-observations at 0 and at 1."""
    n = len(rewards) + 2 * prior
    if n <= 0:
        return 0.0
    total = sum(rewards) + prior
    total_sq = sum(r * r for r in rewards) + prior
    mean = total / n
    return max(0.0, total_sq / n - mean * mean)


@register("vigor", stage="rollout_allocator")
class VigorAllocator(Component):
    def __init__(self, n0: int = 2, budget_per_prompt: int = 8, per_round: int = 2, top_k: int | None = None,
                 prior: float = 1.0, max_per_prompt: int | None = None):
        if n0 < 1 or per_round < 1 or budget_per_prompt < n0:
            raise ValueError(f"need n0 >= 1, per_round >= 1, budget_per_prompt >= n0; got {n0}, {per_round}, "
                             f"{budget_per_prompt}")
        self.n0, self.budget_per_prompt, self.per_round = int(n0), int(budget_per_prompt), int(per_round)
        self.top_k, self.prior, self.max_per_prompt = top_k, float(prior), max_per_prompt
        self._left = 0
        self._order: list[str] = []

    def initial(self, group_ids: Sequence[str]) -> dict[str, int]:
        self._order = list(group_ids)
        self._left = self.budget_per_prompt * len(group_ids) - self.n0 * len(group_ids)
        return {g: self.n0 for g in group_ids}

    def more(self, batch: GroupBatch) -> dict[str, int]:
        if self._left <= 0:
            return {}
        groups = batch.groups()
        rewards = batch.rewards.tolist()
        top_k = self.top_k or max(1, len(self._order) // 2)
        scored = []
        for pos, g in enumerate(self._order):
            rows = groups.get(g, [])
            if self.max_per_prompt is not None and len(rows) >= self.max_per_prompt:
                continue
            scored.append((-variance_score([rewards[i] for i in rows], self.prior), len(rows), pos, g))
        scored.sort()
        out: dict[str, int] = {}
        for _, _, _, g in scored[:top_k]:
            if self._left <= 0:
                break
            k = min(self.per_round, self._left)
            out[g] = k
            self._left -= k
        return out

    def budget(self, n_prompts: int) -> int:
        return self.budget_per_prompt * n_prompts

    def state_dict(self) -> dict[str, Any]:
        return {"left": self._left, "order": list(self._order)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._left, self._order = int(state["left"]), list(state["order"])


declare(Comparison(
    method="vigor", baseline="grpo", metric="rollouts_to_target", direction="lower", params={"gain": 0.10},
    claim="VIGOR reaches a target accuracy with 2.3x fewer rollouts than GRPO at the same per-step rollout budget",
    known_result="micro lane, 3 seeds x 60 steps x 256 rollouts: both reach start + 0.10 (mean@4) at the step-20 eval "
                 "(5120 rollouts) on every seed, difference 0 at the lane's eval resolution (2560 rollouts); final "
                 "mean@4 0.502 vs 0.518, accuracy AUC 0.430 vs 0.443 (VIGOR slightly behind)"))
