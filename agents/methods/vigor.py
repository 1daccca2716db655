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
- how many prompts get more each round scales with the step's prompts: ``top_k_fraction`` (default 0.5) of them.
  Then the number of refinement rounds, ``(budget_per_prompt - n0) / (top_k_fraction * per_round)``, the quantity
  the paper's speedup analysis grows with, and the most one prompt can receive are the same at 8 or 32 prompts a
  step. A fixed ``top_k`` does not scale: 4 of 8 prompts gives 6 rounds (at most 14 rollouts on one prompt), 4 of 32
  gives 24 rounds (up to 50, the ~47 a micro-lane step showed, while most prompts stay at n0). The spec bounds
  nothing here, so our guard: a step whose worst case puts more than ``max_concentration`` x ``budget_per_prompt``
  rollouts on one prompt (default 4x, ``None``: no check) is refused with a ValueError, whichever way ``top_k`` was
  set, instead of silently running another method than the recipe was written for.
"""

from __future__ import annotations

import math
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
                 top_k_fraction: float | None = None, prior: float = 1.0, max_per_prompt: int | None = None,
                 max_concentration: float | None = 4.0):
        if n0 < 1 or per_round < 1 or budget_per_prompt < n0:
            raise ValueError(f"need n0 >= 1, per_round >= 1, budget_per_prompt >= n0; got {n0}, {per_round}, "
                             f"{budget_per_prompt}")
        if top_k is not None and top_k_fraction is not None:
            raise ValueError("vigor: set top_k (a fixed count) or top_k_fraction (a share of the step's prompts), "
                             "not both")
        if top_k is not None and int(top_k) < 1:
            raise ValueError(f"vigor: top_k must be >= 1, got {top_k}")
        if top_k_fraction is not None and not 0 < float(top_k_fraction) <= 1:
            raise ValueError(f"vigor: top_k_fraction must be in (0, 1], got {top_k_fraction}")
        if max_concentration is not None and float(max_concentration) < 1:
            raise ValueError(f"vigor: max_concentration must be >= 1 (or None), got {max_concentration}")
        self.n0, self.budget_per_prompt, self.per_round = int(n0), int(budget_per_prompt), int(per_round)
        self.top_k = None if top_k is None else int(top_k)
        self.top_k_fraction = 0.5 if top_k is None and top_k_fraction is None else top_k_fraction
        self.prior, self.max_per_prompt = float(prior), max_per_prompt
        self.max_concentration = None if max_concentration is None else float(max_concentration)
        self._left = 0
        self._order: list[str] = []

    def round_size(self, n_prompts: int) -> int:
        """Prompts that get ``per_round`` more each round: the fixed ``top_k`` or ``top_k_fraction`` of the step's."""
        if self.top_k is not None:
            return max(1, min(self.top_k, n_prompts))
        return max(1, min(n_prompts, int(float(self.top_k_fraction) * n_prompts + 1e-9)))

    def most_on_one_prompt(self, n_prompts: int) -> int:
        """The most rollouts one prompt can receive in a step of ``n_prompts``: n0 plus ``per_round`` in every round
        (the same prompt can top the variance ranking each time), capped by the budget and ``max_per_prompt``."""
        left = (self.budget_per_prompt - self.n0) * n_prompts
        rounds = math.ceil(left / (self.round_size(n_prompts) * self.per_round)) if left > 0 else 0
        most = self.n0 + min(left, rounds * self.per_round)
        return most if self.max_per_prompt is None else min(most, max(self.n0, int(self.max_per_prompt)))

    def initial(self, group_ids: Sequence[str]) -> dict[str, int]:
        n = len(group_ids)
        most = self.most_on_one_prompt(n) if n else 0
        if self.max_concentration is not None and most > self.max_concentration * self.budget_per_prompt:
            raise ValueError(
                f"vigor: {n} prompts a step with {self.round_size(n)} topped up per round can put {most} rollouts on "
                f"one prompt, more than max_concentration={self.max_concentration:g} x budget_per_prompt="
                f"{self.budget_per_prompt}: a fixed top_k written for fewer prompts a step concentrates the budget "
                "(set top_k_fraction, a share of the step's prompts, instead; or raise max_concentration)")
        self._order = list(group_ids)
        self._left = self.budget_per_prompt * n - self.n0 * n
        return {g: self.n0 for g in group_ids}

    def more(self, batch: GroupBatch) -> dict[str, int]:
        if self._left <= 0:
            return {}
        groups = batch.groups()
        rewards = batch.rewards.tolist()
        top_k = self.round_size(len(self._order))
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
    # interpolated between evals: at the lane's eval grid (every 10 steps, 2,560 rollouts) both sides crossed at the
    # same eval on every seed, a tie by construction, not a measured 0
    method="vigor", baseline="grpo", metric="rollouts_to_target", direction="lower",
    params={"gain": 0.10, "interpolate": True},
    claim="VIGOR reaches a target accuracy with 2.3x fewer rollouts than GRPO at the same per-step rollout budget",
    known_result="micro lane at HEAD keys, seeds 0-4 (2026-12-07, top_k_fraction 0.5 of 32 prompts; rollouts to target "
                 "interpolated between the evals every 2,560 rollouts): 5,954 vs GRPO 5,361 rollouts to start + 0.10 "
                 "(mean@4), diff +593 [95% t -1,133, +2,319], MDE 2,310: not reproduced, no run censored (per seed "
                 "-995, -436, +2,552, +1,138, +706); final mean@4 on 1,000 tasks 0.452 vs 0.434. The allocation "
                 "does what the paper says (1.22x uniform's expected signal per rollout, tests/test_mechanism_vigor.py); "
                 "at this scale that does not show in rollouts to target. Before (3 seeds, top_k = 4, no "
                 "interpolation) both sides crossed at the same eval: 0 by construction"))
