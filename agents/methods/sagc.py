"""SAGC, Straggler-Aware Group Control (seed 000). Stage: RolloutAllocator (the group size of each step).

In synchronous GRPO one unusually long rollout stalls its whole step, and the chance of a straggler grows with the
group size. SAGC picks the group size ``G_t`` in ``[g_min, g_max]`` online, trading the benefit of a larger group
against the predicted straggler probability, with a dual variable that holds the long-run straggler rate at a
target ``epsilon``.

Our reading (the abstract states the problem, not the formulas; all are hyper-parameters):
- straggler: a group whose longest rollout is longer than ``kappa`` x the median rollout length of its step.
- predicted straggle probability of a group of ``G``: ``1 - (1 - q)^G``, with ``q`` the running rate (EMA, factor
  ``ema``) at which a single rollout exceeds ``kappa`` x its step's median.
- benefit ``U(G)``: the mean over the step's prompts of the GRPO signal a group of ``G`` is expected to give,
  ``E[p(1-p)] * (1 - E[p^G] - E[(1-p)^G])`` under each task's Beta pass-rate posterior
  (``PassRates.expected_signal``); concave, rising in ``G``.
- choice: ``G_t = argmax_G U(G) - lambda * P(straggle | G)`` over ``G`` in steps of ``unit``; after the step,
  ``lambda <- max(0, lambda + eta * (s_t - epsilon))`` with ``s_t`` the step's observed straggler rate.
Every generation round's wall-clock is in the step record (``rounds``), so wall time per step can be read against a
fixed ``G``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from agents.grpo.batch import GroupBatch, task_of
from agents.grpo.comparisons import FINITE_POOL, Comparison, declare
from agents.grpo.history import PassRates
from agents.grpo.registry import Component, register


def straggler_stats(batch: GroupBatch, kappa: float) -> tuple[float, float]:
    """``(group rate, rollout rate)``: the fraction of groups whose longest rollout exceeds ``kappa`` x the median
    length of the batch, and the fraction of rollouts that do."""
    lengths = batch.response_lengths.float()
    limit = kappa * float(lengths.median())
    over = lengths > limit
    inverse, keys = batch.group_index()
    group_over = torch.zeros(len(keys)).index_add_(0, inverse, over.float()) > 0
    return float(group_over.float().mean()), float(over.float().mean())


@register("sagc", stage="rollout_allocator")
class SAGCAllocator(Component):
    def __init__(self, g_min: int = 4, g_max: int = 16, unit: int = 2, kappa: float = 2.0, epsilon: float = 0.1,
                 eta: float = 1.0, lam: float = 0.0, ema: float = 0.3, q0: float = 0.02, prior: float = 2.0,
                 decay: float = 1.0):
        if not 2 <= g_min <= g_max or unit < 1 or kappa <= 1 or not 0 <= epsilon <= 1 or eta < 0 or lam < 0 \
                or not 0 < ema <= 1 or not 0 <= q0 < 1:
            raise ValueError(f"sagc: need 2 <= g_min <= g_max, unit >= 1, kappa > 1, 0 <= epsilon <= 1, eta >= 0, "
                             f"lam >= 0, 0 < ema <= 1, 0 <= q0 < 1; got g_min={g_min}, g_max={g_max}, unit={unit}, "
                             f"kappa={kappa}, epsilon={epsilon}, eta={eta}, lam={lam}, ema={ema}, q0={q0}")
        self.sizes = list(range(g_min, g_max + 1, unit))
        self.kappa, self.epsilon, self.eta, self.ema = float(kappa), float(epsilon), float(eta), float(ema)
        self.lam, self.q = float(lam), float(q0)
        self.rates = PassRates(prior=prior, decay=decay)
        self.size = self.sizes[0]
        self.rate = self.rollout_rate = 0.0
        self._batch: GroupBatch | None = None

    def straggle_probability(self, g: int) -> float:
        return 1.0 - (1.0 - self.q) ** g

    def utility(self, tasks: Sequence[str], g: int) -> float:
        return sum(self.rates.expected_signal(t, g) for t in tasks) / max(1, len(tasks))

    def choose(self, tasks: Sequence[str]) -> int:
        scored = [(self.utility(tasks, g) - self.lam * self.straggle_probability(g), -g, g) for g in self.sizes]
        return max(scored)[2]  # ties go to the smaller group

    def initial(self, group_ids: Sequence[str]) -> dict[str, int]:
        self.size = self.choose([task_of(g) for g in group_ids])
        self._batch = None
        return {g: self.size for g in group_ids}

    def more(self, batch: GroupBatch) -> dict[str, int]:
        return {}

    def observe_rollouts(self, batch: GroupBatch, wall_s: float) -> None:
        self.rates.update(batch)
        self._batch = batch if self._batch is None else GroupBatch.concat([self._batch, batch])

    def observe(self, batch: GroupBatch) -> None:
        """End of step: the step's straggler rate (over every group generated) moves the dual variable."""
        if self._batch is None:
            return
        self.rate, self.rollout_rate = straggler_stats(self._batch, self.kappa)
        self.q = (1 - self.ema) * self.q + self.ema * self.rollout_rate
        self.lam = max(0.0, self.lam + self.eta * (self.rate - self.epsilon))
        self._batch = None

    def metrics(self) -> dict[str, float]:
        return {"group_size": float(self.size), "lambda": self.lam, "straggler_rate": self.rate,
                "q": self.q, "predicted_straggle": self.straggle_probability(self.size)}

    def state_dict(self) -> dict[str, Any]:
        return {"rates": self.rates.state_dict(), "lam": self.lam, "q": self.q, "size": self.size,
                "rate": self.rate, "rollout_rate": self.rollout_rate}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rates.load_state_dict(state["rates"])
        self.lam, self.q, self.size = float(state["lam"]), float(state["q"]), int(state["size"])
        self.rate, self.rollout_rate = float(state["rate"]), float(state["rollout_rate"])


declare(Comparison(
    method="sagc", baseline="grpo", metric="wall_to_target", direction="lower", overrides=FINITE_POOL,
    known_result=(
        "micro lane, finite-pool variant, seeds 0-2: seconds to start + 0.10 were 788 vs 437, diff +351 [95% +18, "
        "+683]: slower. The straggler rate stayed below its target (mean 0.21-0.27 vs epsilon 0.35; lambda peaked "
        "at 0.31-0.39), so SAGC chose G = 12-14 on average (up to 16) against GRPO's 8: 1.5-1.7x the rollouts per "
        "step, 24.6-28.0 s per step vs 14.5-14.8 s (the SAGC runs also shared the cores with a SmolLM2 run for "
        "most of theirs); final mean@4 0.495 vs 0.488. Two limits of this test: wall time on shared cores moves "
        "with whatever else runs, and the baseline is GRPO at G = 8 while the paper's is the strongest static group "
        "size (a sweep over G that has not been run)"),
    claim="straggler-aware group sizing cuts wall-clock time of synchronous GRPO at competitive reward (our reading: "
          "seconds of generation + update until held-out accuracy reaches start + 0.10)"))
