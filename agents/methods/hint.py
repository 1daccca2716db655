"""Hint scaffolding for sparse rewards (seed 003, arXiv 2607.24833; abstract truncated). Stage: GenerationController.

On tasks where every rollout fails, GRPO gets no signal at all. Scaffolding conditions the next attempts at such a
task on a prefix of its reference solution, and takes the hint away again as the task starts being solved. The
hint is part of the prompt: the policy is trained on its own continuation only, and held-out evaluation never
sees a hint.

Our reading (the abstract stops before the schedule; all are hyper-parameters):
- each training task has a hint level ``0..max_level``, 0 at first. After a group of the task: all wrong -> one
  level up; pass rate at least ``anneal_at`` -> one level down (annealing the hint away); else unchanged. The level
  applies the next time the task is drawn (prompts recur in a finite ``train_pool``).
- ``reference = "countdown_trace"``: the hint at level ``l`` is the first ``l`` lines of the solver's branch that
  reaches the target (``countdown_traces.solution_branch`` of a seeded trace of the task), the exact form a
  micro-lane trace continues from. ``reference = "solution"``: the first ``l / (max_level + 1)`` of the lines of the
  task's ``metadata["solution"]`` text (data sets with written solutions). ``"auto"`` (default) takes whichever the
  task has; a task with neither (procedural arithmetic) gets no hint.
"""

from __future__ import annotations

import math
import zlib
from typing import Any

import numpy as np

from agents.grpo.batch import GroupBatch, task_of
from agents.grpo.comparisons import FINITE_POOL, Comparison, declare
from agents.grpo.registry import Component, register
from agents.policy.countdown_traces import solution_branch, write_trace

REFERENCES = ("auto", "countdown_trace", "solution")


def hint_lines(info: dict[str, Any], reference: str, seed: int = 0) -> list[str]:
    """The reference solution of a task as hint units (lines), from what the trainer puts in a prompt's info."""
    meta = info.get("metadata") or {}
    if reference == "auto":  # whichever reference the task has; none (procedural arithmetic): no hint
        if meta.get("numbers") is not None:
            reference = "countdown_trace"
        elif isinstance(meta.get("solution"), str) and meta["solution"].strip():
            reference = "solution"
        else:
            return []
    if reference == "countdown_trace":
        numbers, target = meta.get("numbers"), meta.get("target", info.get("answer"))
        if numbers is None or target is None:
            raise ValueError(f"hint_scaffold: task {info.get('task_id')!r} has no Countdown numbers/target in its "
                             "metadata; use reference='solution' for tasks with written solutions")
        rng = np.random.default_rng((seed, zlib.crc32(str(info.get("task_id")).encode())))
        return solution_branch(write_trace([int(n) for n in numbers], int(target), rng))
    text = meta.get("solution")
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"hint_scaffold: task {info.get('task_id')!r} has no metadata['solution'] text")
    return [line for line in text.splitlines() if line.strip()]


@register("hint_scaffold", stage="generation_controller")
class HintScaffold(Component):
    def __init__(self, max_level: int = 2, anneal_at: float = 0.5, reference: str = "auto", seed: int = 0):
        if reference not in REFERENCES:
            raise ValueError(f"hint_scaffold: reference must be one of {REFERENCES}, got {reference!r}")
        if max_level < 1 or not 0 < anneal_at <= 1:
            raise ValueError(f"hint_scaffold: need max_level >= 1 and 0 < anneal_at <= 1; got {max_level}, {anneal_at}")
        self.max_level, self.anneal_at, self.reference, self.seed = int(max_level), float(anneal_at), reference, seed
        self.level: dict[str, int] = {}  # task id -> current hint level
        self.used: dict[str, int] = {}  # task id -> the level its latest prompt was written with
        self.hinted = self.groups = 0

    def sampling(self, sampling: Any, step: int) -> Any:
        return sampling

    def hint(self, info: dict[str, Any], level: int) -> str:
        lines = hint_lines(info, self.reference, self.seed)
        if self.reference == "solution" or (self.reference == "auto" and info.get("metadata", {}).get("numbers") is None):
            lines = lines[: math.ceil(len(lines) * level / (self.max_level + 1))]
        else:
            lines = lines[:level]
        return "".join(f"{line}\n" for line in lines)

    def prompt(self, prompt: str, info: dict[str, Any], step: int) -> str:
        task = str(info["task_id"])
        level = self.level.get(task, 0)
        self.used[task] = level
        return prompt + self.hint(info, level) if level else prompt

    def observe_rollouts(self, batch: GroupBatch, wall_s: float) -> None:
        for gid, rows in batch.groups().items():
            task = task_of(gid)
            used = self.used.get(task, 0)
            rate = float(batch.correct[rows].float().mean())
            self.groups += 1
            self.hinted += used > 0
            if rate == 0.0:
                self.level[task] = min(self.max_level, used + 1)
            elif rate >= self.anneal_at:
                self.level[task] = max(0, used - 1)
            else:
                self.level[task] = used

    def metrics(self) -> dict[str, float]:
        out = {"hinted_groups": float(self.hinted), "groups": float(self.groups),
               "tasks_with_hint": float(sum(v > 0 for v in self.level.values()))}
        self.hinted = self.groups = 0
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"level": dict(self.level), "used": dict(self.used)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.level = {k: int(v) for k, v in state["level"].items()}
        self.used = {k: int(v) for k, v in state["used"].items()}


declare(Comparison(
    method="hint", baseline="grpo", metric="final_accuracy", direction="higher", tag="hard",
    overrides=(*FINITE_POOL, "env_kwargs.min_target=60", "env_kwargs.max_target=120"),
    known_result=(
        "micro lane, hard-target finite-pool variant, seeds 0-2 (commit b138fe5 runs): final mean@4 0.283 vs GRPO "
        "0.286, diff -0.003 [95% paired bootstrap -0.020, +0.018]: not reproduced. GRPO is not stuck here: from "
        "0.6-2.1% at step 0 both reach ~0.28 (GRPO's sampled reward 0.05 -> 0.27). Hints were on 14 of 32 groups a "
        "step and halved the rollouts per group with reward variance (20.2 vs 42.2); they reached start + 0.10 at "
        "2,560 vs 3,413 rollouts (at the 10-step eval resolution), but not a higher final accuracy"),
    claim="scaffolding all-wrong prompts with a growing reference-solution prefix learns where GRPO gets almost no "
          "reward (here: Countdown-3 with targets 60-120, beyond the warm start's 2-40: the untrained policy solves "
          "0.9% of samples and 7.5% of tasks ever in 8 samples, measured on 40 tasks)"))
declare(Comparison(
    method="hint", baseline="grpo", metric="final_accuracy", direction="higher", tag="cd4",
    overrides=(*FINITE_POOL, "env_kwargs.min_numbers=4", "env_kwargs.max_numbers=4"),
    claim="scaffolding learns where GRPO gets no reward (here: the micro policy, warm-started on 3 numbers, trained "
          "and evaluated on Countdown with 4)"))
