"""Method-vs-baseline comparisons: each method declares its paper's claim once, beside its file; the regression suite
(``benchmarks/test_regression.py``) runs them with paired seeds on a lane and checks the claimed direction.

A ``Comparison`` names two recipes, a lane, the seeds, a metric and the direction the paper claims for
``method - baseline``. A direction is *reproduced* only when the 95% interval of the paired difference lies entirely
on the claimed side of 0; a point estimate on that side whose interval crosses 0 is *inconclusive*. Metrics read the runs' ``metrics.jsonl`` records, so every number in a result can be recomputed
from the runs. Paired: seed ``s`` of the method and seed ``s`` of the baseline start from the same weights, draw the
same prompts, and are scored on the same held-out tasks.

Metrics (``value(records)`` per run; the difference is method minus baseline):

- ``final_accuracy``: held-out accuracy after the last step (as the lane evaluates: greedy, or mean@k at a temperature). Interval: paired bootstrap over seeds and, within
  a seed, over held-out tasks (both runs of a seed answer the same tasks).
- ``accuracy_auc``: mean held-out accuracy over every eval of the run (step 0 included): how fast it learns.
- ``rollouts_to_target``: rollouts generated until held-out accuracy first reaches ``start + gain`` (``gain`` from the
  comparison's ``params``, default 0.10); a run that never reaches it counts as its total rollouts (censored; the
  result says how many were censored). Lower is better.
- ``final_eval_tokens``: mean response length (tokens) of the last held-out eval. Lower is better; the result also
  reports the accuracy difference, since a length claim is "shorter at about equal accuracy".
- ``tokens_to_target``, ``flops_to_target``, ``wall_to_target``: as ``rollouts_to_target`` with response tokens,
  generation + training FLOPs (``agents.grpo.flops``) or seconds of generation + update as the cost.
- ``rollouts_per_useful_group``: rollouts generated per group with any reward variance (counted before any filter).
- ``accuracy_at_flops``: held-out accuracy of each run at the last eval within the smaller of the pair's two FLOP
  totals (the pair read at equal compute).
- ``rollout_kept_fraction``: keys read / keys visible over the run's sparse training decodes (the mean over steps of
  the generation controller's ``kept_fraction``). Lower is better; Sparrow's sparsity at a given alignment threshold.
- ``final_eval_coverage``: Countdown solution coverage of the last held-out eval (distinct correct solutions per task
  over its ``eval_samples``; ``rlvr_envs.harness.coverage``). Interval: paired bootstrap over seeds and tasks.

A claim made "at about equal accuracy" sets ``accuracy_tolerance``: its direction reproduces only if, besides the
metric moving the claimed way, the method's mean final accuracy is at most that far below the baseline's (a method
that answers in fewer tokens by no longer solving the task has not reproduced an efficiency claim).

Intervals over seeds alone use Student's t on the paired differences (3 seeds: wide, and said so).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

DIRECTIONS = ("higher", "lower")


@dataclass(frozen=True)
class Comparison:
    method: str  # recipe of the method (agents/recipes/<method>.toml)
    baseline: str  # recipe of the baseline it is compared with
    metric: str  # a key of METRICS
    direction: str  # what the paper claims for method - baseline: "higher" or "lower"
    claim: str  # the paper's claim, in words, with its figure
    lane: str = "micro"
    seeds: tuple[int, ...] = (0, 1, 2)
    overrides: tuple[str, ...] = ()  # `--set` overrides for both runs (the same budget for both)
    params: dict[str, Any] = field(default_factory=dict)  # the metric's parameters
    # For claims "at about equal accuracy": the most the method's final accuracy may fall below the baseline's.
    accuracy_tolerance: float | None = None
    # Set once measured and not reproduced: the numbers (and commit) of that run. The suite then expects it to fail.
    known_result: str = ""
    # Names a variant when one method has several comparisons against one baseline on one lane (other overrides).
    tag: str = ""

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise ValueError(f"{self.method}: unknown metric {self.metric!r}; metrics: {', '.join(METRICS)}")
        if self.direction not in DIRECTIONS:
            raise ValueError(f"{self.method}: direction must be one of {DIRECTIONS}, got {self.direction!r}")
        if len(set(self.seeds)) != len(self.seeds) or not self.seeds:
            raise ValueError(f"{self.method}: seeds must be distinct and non-empty, got {self.seeds}")
        if self.accuracy_tolerance is not None and not 0 <= self.accuracy_tolerance <= 1:
            raise ValueError(f"{self.method}: accuracy_tolerance must be in [0, 1], got {self.accuracy_tolerance}")

    @property
    def name(self) -> str:
        """``<method>_vs_<baseline>``, with ``_<lane>`` on any lane but the micro lane and ``_<tag>`` for a variant."""
        return (f"{self.method}_vs_{self.baseline}" + ("" if self.lane == "micro" else f"_{self.lane}")
                + (f"_{self.tag}" if self.tag else ""))

    @property
    def result_name(self) -> str:
        """The results file stem: the method's name against GRPO on the micro lane, else the comparison's name."""
        return self.method if self.baseline == "grpo" and self.lane == "micro" and not self.tag else self.name

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["seeds"], d["overrides"] = list(self.seeds), list(self.overrides)
        return d


# The micro lane's finite-data variant: train on the first 512 tasks only (each drawn ~4 times in 60 steps), as in
# multi-epoch RLVR on a fixed data set. Methods that learn from a prompt's history (pass-rate posteriors, headroom,
# hint levels) need prompts that recur; their comparisons put both sides on it, so the baseline trains on it too.
# The other rollout-budget comparisons of that paper family (budget schedules, data policies) share the variant and
# its GRPO baseline runs.
FINITE_POOL = ("train_pool=512",)

_COMPARISONS: dict[str, Comparison] = {}


def declare(comparison: Comparison) -> Comparison:
    """Register a comparison (once per method/baseline pair: a duplicate is an error, not an overwrite)."""
    if comparison.name in _COMPARISONS:
        raise ValueError(f"comparison {comparison.name!r} is declared twice")
    _COMPARISONS[comparison.name] = comparison
    return comparison


def comparisons() -> dict[str, Comparison]:
    """Every declared comparison (importing the baselines and each method file declares theirs)."""
    from agents.grpo.registry import load_builtin

    load_builtin()
    return dict(sorted(_COMPARISONS.items()))


# -- reading runs ------------------------------------------------------------------------------------------------------
def evals(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted((r for r in records if r.get("kind") == "eval" and "eval_accuracy" in r), key=lambda r: r["step"])


def _cumulative_at(records: Sequence[dict[str, Any]], step: int, key: str = "rollouts_total") -> float:
    """A cumulative train-record quantity (rollouts, tokens, FLOPs, wall seconds) after ``step``."""
    if key == "wall_s":
        return float(sum(r.get("gen_s", 0) + r.get("train_s", 0) for r in records
                         if r.get("kind") == "train" and r["step"] <= step))
    done = [r.get(key, 0) for r in records if r.get("kind") == "train" and r["step"] <= step]
    return float(max(done, default=0))


def _rollouts_at(records: Sequence[dict[str, Any]], step: int) -> int:
    return int(_cumulative_at(records, step))


def _last_step(records: Sequence[dict[str, Any]]) -> int:
    return max((r["step"] for r in records if r.get("kind") == "train"), default=0)


def cost_to_target(records: Sequence[dict[str, Any]], *, start: float, gain: float = 0.10,
                   cost: str = "rollouts_total") -> float:
    """``cost`` spent when held-out accuracy first reaches ``start + gain``; the run's total (censored) if never."""
    for r in evals(records):
        if r["eval_accuracy"] >= start + gain - 1e-12:
            return _cumulative_at(records, r["step"], cost)
    return _cumulative_at(records, _last_step(records), cost)


def final_accuracy(records: Sequence[dict[str, Any]], **_: Any) -> float:
    return float(evals(records)[-1]["eval_accuracy"])


def accuracy_auc(records: Sequence[dict[str, Any]], **_: Any) -> float:
    return float(np.mean([r["eval_accuracy"] for r in evals(records)]))


def rollouts_to_target(records: Sequence[dict[str, Any]], *, start: float, gain: float = 0.10, **_: Any) -> float:
    """Rollouts spent when held-out accuracy first reaches ``start + gain``; the total (censored) if never."""
    return cost_to_target(records, start=start, gain=gain, cost="rollouts_total")


def tokens_to_target(records: Sequence[dict[str, Any]], *, start: float, gain: float = 0.10, **_: Any) -> float:
    """Response tokens generated for training until the target (censored at the total)."""
    return cost_to_target(records, start=start, gain=gain, cost="tokens_total")


def flops_to_target(records: Sequence[dict[str, Any]], *, start: float, gain: float = 0.10, **_: Any) -> float:
    """Generation + training FLOPs (agents.grpo.flops) until the target (censored at the total)."""
    return cost_to_target(records, start=start, gain=gain, cost="flops_total")


def wall_to_target(records: Sequence[dict[str, Any]], *, start: float, gain: float = 0.10, **_: Any) -> float:
    """Seconds of generation + update (evaluation excluded) until the target (censored at the total)."""
    return cost_to_target(records, start=start, gain=gain, cost="wall_s")


def rollouts_per_useful_group(records: Sequence[dict[str, Any]], **_: Any) -> float:
    """Rollouts generated per group with any reward variance (before any filter): what a group with signal costs.
    A run without one counts as all its rollouts for one group (censored, like a target never reached)."""
    train = [r for r in records if r.get("kind") == "train"]
    useful = sum(r.get("groups_useful", 0) for r in train)
    return float(sum(r.get("rollouts", 0) for r in train) / max(1, useful))


def accuracy_at_flops(records: Sequence[dict[str, Any]], *, flops: float | None = None, **_: Any) -> float:
    """Held-out accuracy of the last eval whose cumulative FLOPs are at most ``flops`` (the comparison passes the
    smaller of the two paired runs' totals): the two runs read at equal compute."""
    if flops is None:
        return final_accuracy(records)
    ok = [r for r in evals(records) if _cumulative_at(records, r["step"], "flops_total") <= flops * (1 + 1e-9)]
    return float((ok or evals(records)[:1])[-1]["eval_accuracy"])


def reached_target(records: Sequence[dict[str, Any]], *, start: float, gain: float = 0.10, **_: Any) -> bool:
    return any(r["eval_accuracy"] >= start + gain - 1e-12 for r in evals(records))


def final_eval_tokens(records: Sequence[dict[str, Any]], **_: Any) -> float:
    return float(evals(records)[-1]["eval_len_mean"])


def final_eval_coverage(records: Sequence[dict[str, Any]], **_: Any) -> float:
    """Distinct correct solutions per held-out task at the last eval (Countdown evals with several samples only)."""
    last = evals(records)[-1]
    if "eval_coverage" not in last:
        raise ValueError("final_eval_coverage needs Countdown evals with eval_samples > 1 (no eval_coverage recorded)")
    return float(last["eval_coverage"])


def rollout_kept_fraction(records: Sequence[dict[str, Any]], **_: Any) -> float:
    """Mean over training steps of the share of visible keys the sparse rollouts read (Sparrow's controllers)."""
    kept = [r["generation_controller.kept_fraction"] for r in records
            if r.get("kind") == "train" and "generation_controller.kept_fraction" in r]
    if not kept:
        raise ValueError("rollout_kept_fraction needs a sparse generation controller (no kept_fraction recorded)")
    return float(np.mean(kept))


METRICS: dict[str, Callable[..., float]] = {
    "final_accuracy": final_accuracy, "accuracy_auc": accuracy_auc, "rollouts_to_target": rollouts_to_target,
    "final_eval_tokens": final_eval_tokens, "tokens_to_target": tokens_to_target, "flops_to_target": flops_to_target,
    "wall_to_target": wall_to_target, "rollouts_per_useful_group": rollouts_per_useful_group,
    "accuracy_at_flops": accuracy_at_flops, "final_eval_coverage": final_eval_coverage,
    "rollout_kept_fraction": rollout_kept_fraction,
}
# Metrics whose value needs a target accuracy (start + gain).
TARGET_METRICS = frozenset({"rollouts_to_target", "tokens_to_target", "flops_to_target", "wall_to_target"})


# -- statistics --------------------------------------------------------------------------------------------------------
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}


def t_interval(diffs: Sequence[float]) -> tuple[float, float]:
    """95% Student-t interval of the mean of paired differences (a single pair has no interval: +-inf)."""
    d = np.asarray(diffs, dtype=float)
    if len(d) < 2:
        return (-float("inf"), float("inf"))
    half = _T975.get(len(d) - 1, 1.96) * d.std(ddof=1) / np.sqrt(len(d))
    return (float(d.mean() - half), float(d.mean() + half))


def paired_bootstrap(method_bits: Sequence[Sequence[int]], baseline_bits: Sequence[Sequence[int]], *,
                     reps: int = 4000, seed: int = 0) -> tuple[float, float]:
    """95% interval of mean accuracy difference: resample seeds, then tasks within each seed (pairs kept)."""
    rng = np.random.default_rng(seed)
    m = [np.asarray(b, dtype=float) for b in method_bits]
    b = [np.asarray(x, dtype=float) for x in baseline_bits]
    if any(len(x) != len(y) for x, y in zip(m, b)):
        raise ValueError("paired runs must be scored on the same held-out tasks")
    diffs = [x - y for x, y in zip(m, b)]
    out = np.empty(reps)
    for k in range(reps):
        seeds = rng.integers(0, len(diffs), len(diffs))
        out[k] = np.mean([diffs[s][rng.integers(0, len(diffs[s]), len(diffs[s]))].mean() for s in seeds])
    lo, hi = np.quantile(out, [0.025, 0.975])
    return (float(lo), float(hi))


def final_bits(records: Sequence[dict[str, Any]]) -> list[float] | None:
    """Per-task accuracy of the last held-out eval, if recorded (``eval_correct``: a 0/1 string for one sample per
    task, else correct counts out of ``eval_samples``)."""
    last = evals(records)[-1]
    per_task = last.get("eval_correct")
    if per_task is None:
        return None
    k = int(last.get("eval_samples", 1))
    return [int(c) / k for c in per_task]


def final_solutions(records: Sequence[dict[str, Any]]) -> list[float] | None:
    """Per-task distinct correct solutions of the last held-out eval (``eval_solutions``), if recorded."""
    per_task = evals(records)[-1].get("eval_solutions")
    return None if per_task is None else [float(v) for v in per_task]


def _secondary(fn: Callable[..., float], method_runs: dict[int, list[dict[str, Any]]],
               baseline_runs: dict[int, list[dict[str, Any]]], seeds: Sequence[int], starts: dict[int, float],
               params: dict[str, Any], flops: dict[int, float]) -> dict[str, float] | None:
    """Both sides' paired means of a metric that is not the comparison's own; None where the runs do not record it
    (coverage outside Countdown)."""
    try:
        return {side: float(np.mean([fn(runs[s], start=starts[s], **params, flops=flops[s]) for s in seeds]))
                for side, runs in (("method", method_runs), ("baseline", baseline_runs))}
    except (ValueError, KeyError):
        return None


def summarize(comparison: Comparison, method_runs: dict[int, list[dict[str, Any]]],
              baseline_runs: dict[int, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per-seed values, the paired difference with its 95% interval, and whether the claimed direction holds."""
    seeds = list(comparison.seeds)
    metric = METRICS[comparison.metric]
    params = dict(comparison.params)
    # rollouts_to_target: one target for both runs of a seed, from the baseline's start accuracy (the two runs share
    # their start weights and eval draws, so their step-0 evals are equal)
    starts = {s: float(evals(baseline_runs[s])[0]["eval_accuracy"]) for s in seeds}
    # accuracy_at_flops: both runs of a seed read at the smaller of their two FLOP totals
    flops = {s: min(_cumulative_at(runs[s], _last_step(runs[s]), "flops_total")
                    for runs in (method_runs, baseline_runs)) for s in seeds}
    per_seed = {s: {**params, **({"flops": flops[s]} if comparison.metric == "accuracy_at_flops" else {})}
                for s in seeds}
    mv = {s: metric(method_runs[s], start=starts[s], **per_seed[s]) for s in seeds}
    bv = {s: metric(baseline_runs[s], start=starts[s], **per_seed[s]) for s in seeds}
    diffs = [mv[s] - bv[s] for s in seeds]
    interval = t_interval(diffs)
    interval_kind = "student-t over seeds"
    per_task_values = {"final_accuracy": final_bits, "final_eval_coverage": final_solutions}.get(comparison.metric)
    if per_task_values is not None:
        mb = [per_task_values(method_runs[s]) for s in seeds]
        bb = [per_task_values(baseline_runs[s]) for s in seeds]
        if all(x is not None for x in mb + bb):
            interval, interval_kind = paired_bootstrap(mb, bb), "paired bootstrap over seeds and held-out tasks"
    diff = float(np.mean(diffs))
    sign = 1.0 if comparison.direction == "higher" else -1.0
    accuracy = {"method": float(np.mean([final_accuracy(method_runs[s]) for s in seeds])),
                "baseline": float(np.mean([final_accuracy(baseline_runs[s]) for s in seeds]))}
    accuracy_held = (comparison.accuracy_tolerance is None
                     or accuracy["method"] >= accuracy["baseline"] - comparison.accuracy_tolerance - 1e-12)
    significant = bool(interval[0] > 0 if sign > 0 else interval[1] < 0)  # the interval on the claimed side of 0
    out: dict[str, Any] = {
        "method_value": float(np.mean(list(mv.values()))), "baseline_value": float(np.mean(list(bv.values()))),
        "difference": diff, "interval": list(interval), "interval_kind": interval_kind,
        "per_seed": {str(s): {"method": mv[s], "baseline": bv[s]} for s in seeds},
        # reproduced: the whole 95% interval of the difference lies on the claimed side of 0 (and, for an "at about
        # equal accuracy" claim, accuracy held); a point estimate on that side with an interval across 0 is
        # "inconclusive", not a reproduction
        "direction_reproduced": bool(significant and accuracy_held),
        "verdict": ("reproduced" if significant and accuracy_held else
                    "inconclusive" if sign * diff > 0 and accuracy_held else "not reproduced"),
        "point_estimate_in_direction": bool(sign * diff > 0),
        "significant": significant,
        "accuracy": accuracy,
        "accuracy_held": {"tolerance": comparison.accuracy_tolerance, "held": bool(accuracy_held)},
        # context, not the claim: every metric's paired means, whatever the comparison's own metric is
        "secondary": {name: value for name, fn in METRICS.items() if name != comparison.metric
                      and (value := _secondary(fn, method_runs, baseline_runs, seeds, starts, params, flops))},
    }
    if comparison.metric == "accuracy_at_flops":
        out["flops_read_at"] = {str(s): flops[s] for s in seeds}
    if comparison.metric in TARGET_METRICS:
        gain = params.get("gain", 0.10)
        out["target"] = {str(s): starts[s] + gain for s in seeds}
        out["censored"] = {"method": sum(not reached_target(method_runs[s], start=starts[s], gain=gain) for s in seeds),
                           "baseline": sum(not reached_target(baseline_runs[s], start=starts[s], gain=gain)
                                           for s in seeds)}
        speedups = [bv[s] / mv[s] for s in seeds if mv[s] > 0]
        out["target_cost"] = comparison.metric.removesuffix("_to_target")
        out["ratio_baseline_over_method"] = float(np.mean(speedups)) if speedups else None
    return out
