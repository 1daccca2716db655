"""Per-task outcome history: what history-based selectors, allocators and replay learn pass rates from.

``PassRates`` keeps, for every task id it has seen, discounted counts of correct and total rollouts, and a running
global pass rate. A task's pass rate is a Beta posterior: prior mean the global rate, prior strength ``prior``
pseudo-rollouts, plus the task's own counts. ``decay`` discounts a task's old counts each time new rollouts of it
arrive (the policy has moved since). Plain data, so a checkpoint restores it exactly.

``greedy_allocation`` spends a rollout (or token) budget across tasks by marginal value per cost.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from agents.grpo.batch import GroupBatch, task_of


class PassRates:
    def __init__(self, prior: float = 2.0, decay: float = 1.0, global_prior: float = 0.5):
        if prior <= 0 or not 0 < decay <= 1 or not 0 <= global_prior <= 1:
            raise ValueError(f"need prior > 0, 0 < decay <= 1, 0 <= global_prior <= 1; got {prior}, {decay}, "
                             f"{global_prior}")
        self.prior, self.decay = float(prior), float(decay)
        self.counts: dict[str, list[float]] = {}  # task id -> [correct, total, last step seen]
        self.task_at: dict[int, str] = {}  # task index -> task id (selectors draw indices, history keys ids)
        self.global_correct, self.global_total = float(global_prior), 1.0  # one pseudo-rollout at global_prior

    def update(self, batch: GroupBatch) -> None:
        """Add every rollout of ``batch`` (``batch.correct``) to its task's counts."""
        fresh: dict[str, list[float]] = {}
        for gid, ok, info in zip(batch.group_ids, batch.correct.tolist(), batch.infos):
            task = task_of(gid)
            if "index" in info:
                self.task_at[int(info["index"])] = task
            c = fresh.setdefault(task, [0.0, 0.0])
            c[0] += float(ok)
            c[1] += 1.0
        for task, (s, n) in fresh.items():
            old = self.counts.get(task)
            if old is None:
                self.counts[task] = [s, n, float(batch.step)]
            else:
                self.counts[task] = [old[0] * self.decay + s, old[1] * self.decay + n, float(batch.step)]
            self.global_correct += s
            self.global_total += n

    @property
    def global_rate(self) -> float:
        return self.global_correct / self.global_total

    def task_id(self, index: int) -> str | None:
        """The id of the task at ``index``, once a rollout of it was seen."""
        return self.task_at.get(int(index))

    def seen(self, task: str | None) -> bool:
        return task in self.counts

    def trials(self, task: str) -> float:
        return self.counts.get(task, [0.0, 0.0])[1]

    def last_step(self, task: str) -> int | None:
        c = self.counts.get(task)
        return None if c is None else int(c[2])

    def posterior(self, task: str | None) -> tuple[float, float]:
        """Beta(a, b) of the task's pass rate."""
        s, n = self.counts.get(task, [0.0, 0.0])[:2]
        g = min(max(self.global_rate, 1e-6), 1 - 1e-6)
        return self.prior * g + s, self.prior * (1 - g) + (n - s)

    def mean(self, task: str) -> float:
        a, b = self.posterior(task)
        return a / (a + b)

    def informativeness(self, task: str) -> float:
        """Posterior expectation of p(1 - p): the reward variance of one rollout, the size of its GRPO signal."""
        a, b = self.posterior(task)
        return a * b / ((a + b) * (a + b + 1))

    def saturation(self, task: str, group_size: int) -> float:
        """Posterior probability that a group of ``group_size`` rollouts is all-correct or all-wrong:
        E[p^G] + E[(1-p)^G] under Beta(a, b), each a product of G ratios."""
        a, b = self.posterior(task)
        all_right = all_wrong = 1.0
        for k in range(int(group_size)):
            all_right *= (a + k) / (a + b + k)
            all_wrong *= (b + k) / (a + b + k)
        return all_right + all_wrong

    def expected_signal(self, task: str | None, n: int) -> float:
        """The GRPO signal ``n`` rollouts of a task are expected to give: the probability that the group has reward
        variance times the reward variance of one rollout, ``E[p(1-p)] * (1 - E[p^n] - E[(1-p)^n])`` (0 for n < 2).
        Concave in ``n``; a prompt the policy always or never solves is worth little at any size."""
        return 0.0 if n < 2 else self.informativeness(task) * (1.0 - self.saturation(task, n))

    def state_dict(self) -> dict[str, Any]:
        return {"counts": {k: list(v) for k, v in self.counts.items()}, "task_at": dict(self.task_at),
                "global": [self.global_correct, self.global_total]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.counts = {k: [float(x) for x in v] for k, v in state["counts"].items()}
        self.task_at = {int(k): str(v) for k, v in state.get("task_at", {}).items()}
        self.global_correct, self.global_total = (float(x) for x in state["global"])


def greedy_allocation(tasks: Sequence[str], value: Callable[[str, int], float], *, budget: float, n_min: int,
                      n_max: int, unit: int = 1, cost: Callable[[str], float] | None = None) -> dict[str, int]:
    """Rollouts per task: every task starts at ``n_min``; then ``unit`` more go, one grant at a time, to the task with
    the largest gain ``value(task, n + unit) - value(task, n)`` per unit of cost (``cost(task)`` per rollout, default
    1) while the total cost stays within ``budget`` and no task passes ``n_max``. Ties go to the earlier task.
    With a concave ``value`` this is the optimal integer allocation (the greedy of a separable concave knapsack)."""
    if n_min < 0 or n_max < n_min or unit < 1:
        raise ValueError(f"need 0 <= n_min <= n_max and unit >= 1; got {n_min}, {n_max}, {unit}")
    cost = cost or (lambda _t: 1.0)
    counts = {t: n_min for t in tasks}
    spent = sum(cost(t) * n_min for t in tasks)
    while True:
        best, best_gain = None, 0.0
        for t in tasks:
            n = counts[t]
            step_cost = cost(t) * unit
            if n + unit > n_max or spent + step_cost > budget + 1e-9:
                continue
            gain = (value(t, n + unit) - value(t, n)) / max(step_cost, 1e-12)
            if gain > best_gain + 1e-15:
                best, best_gain = t, gain
        if best is None:
            return counts
        counts[best] += unit
        spent += cost(best) * unit
