"""Method-vs-baseline comparisons: each method declares its paper's claim once, beside its file; the regression suite
(``benchmarks/test_regression.py``) runs them with paired seeds on a lane and checks the claimed direction.

A ``Comparison`` names two recipes, a lane, the seeds, a metric and the direction the paper claims for
``method - baseline``. A direction is *reproduced* only when the 95% interval of the paired difference lies entirely
on the claimed side of 0; a point estimate on that side whose interval crosses 0 is *inconclusive*. Metrics read the runs' ``metrics.jsonl`` records, so every number in a result can be recomputed
from the runs. Paired: seed ``s`` of the method and seed ``s`` of the baseline start from the same weights, draw the
same prompts, and are scored on the same held-out tasks.

Metrics (``value(records)`` per run; the difference is method minus baseline):

- ``final_accuracy``: held-out accuracy after the last step (as the lane evaluates: greedy, or mean@k at a temperature),
  on the lane's final eval set (``final_eval_size`` tasks where set). Both runs of a seed answer the same tasks.
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

Every interval is Student's t over the per-seed paired differences (the seed is the unit of replication; eval noise is
nested inside each seed's difference). A result also reports the two variance components (between seeds, eval) and
the minimum detectable effect at 80% power, and commits the per-seed, per-task outcomes of the final evals
(``evidence``) from which ``recheck`` recomputes its interval and verdict.
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
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)  # at least 5 paired seeds: tests/test_interval_calibration.py
    overrides: tuple[str, ...] = ()  # `--set` overrides for both runs (the same budget for both)
    params: dict[str, Any] = field(default_factory=dict)  # the metric's parameters
    # For claims "at about equal accuracy": the most the method's final accuracy may fall below the baseline's.
    accuracy_tolerance: float | None = None
    # Set once measured and not reproduced: the numbers (and commit) of that run. The suite then expects it to fail.
    known_result: str = ""
    # Names a variant when one method has several comparisons against one baseline on one lane (other overrides).
    tag: str = ""
    # Set when a mechanism check shows the method's premise does not hold on this lane (with the measurement and its
    # file): the comparison is not a test of the paper's claim there; the suite skips it and the table says so.
    precondition_not_met: str = ""

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
                   cost: str = "rollouts_total", interpolate: bool = False) -> float:
    """``cost`` spent when held-out accuracy first reaches ``start + gain``; the run's total (censored) if never.
    ``interpolate``: the crossing is placed by linear interpolation of accuracy between the last eval below the
    target and the first at or above it, so that two runs crossing between the same two evals are told apart (at
    the eval grid alone they tie at the later eval's cost)."""
    target = start + gain - 1e-12
    previous = None
    for r in evals(records):
        at = _cumulative_at(records, r["step"], cost)
        if r["eval_accuracy"] >= target:
            if not interpolate or previous is None:
                return at
            acc0, cost0 = previous
            frac = (target - acc0) / max(1e-12, r["eval_accuracy"] - acc0)
            return cost0 + frac * (at - cost0)
        previous = (r["eval_accuracy"], at)
    return _cumulative_at(records, _last_step(records), cost)


def final_accuracy(records: Sequence[dict[str, Any]], **_: Any) -> float:
    """Held-out accuracy of the last eval: on its larger final set where the lane has one (``final_eval_size``)."""
    last = evals(records)[-1]
    return float(last.get("final_eval_accuracy", last["eval_accuracy"]))


def accuracy_auc(records: Sequence[dict[str, Any]], **_: Any) -> float:
    return float(np.mean([r["eval_accuracy"] for r in evals(records)]))


def _to_target(cost: str, doc: str) -> Callable[..., float]:
    """A cost-to-target metric over ``cost`` (a cumulative train-record quantity; see ``cost_to_target``)."""
    def metric(records: Sequence[dict[str, Any]], *, start: float, gain: float = 0.10, interpolate: bool = False,
               **_: Any) -> float:
        return cost_to_target(records, start=start, gain=gain, cost=cost, interpolate=interpolate)

    metric.__doc__ = doc
    return metric


rollouts_to_target = _to_target(
    "rollouts_total", "Rollouts spent when held-out accuracy first reaches ``start + gain``; the total (censored) if never.")
tokens_to_target = _to_target("tokens_total", "Response tokens generated for training until the target (censored).")
flops_to_target = _to_target("flops_total", "Generation + training FLOPs (agents.grpo.flops) until the target (censored).")
wall_to_target = _to_target("wall_s", "Seconds of generation + update (evaluation excluded) until the target (censored).")


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
# The seed is the unit of replication: each seed's paired difference d_s = method_s - baseline_s already carries that
# seed's training randomness and its eval noise (the same held-out tasks on both sides, so the eval noise of d_s is
# that of per-task *differences*). The interval is Student's t over the d_s, which holds its level at 2-5 seeds
# (tests/test_interval_calibration.py simulates it); a bootstrap over seeds and tasks does not (3 seeds give 10
# distinct seed resamples: 12.7% false positives at nominal 5% in the audit that replaced it).
POWER = 0.8  # for the minimum detectable effect
# Metrics that are a mean over the final eval's tasks: their per-seed values and eval noise come from the evidence.
PER_TASK_METRICS = frozenset({"final_accuracy", "final_eval_coverage"})


def t_quantile(q: float, df: int) -> float:
    from scipy.stats import t

    return float(t.ppf(q, df))


def t_interval(diffs: Sequence[float]) -> tuple[float, float]:
    """95% Student-t interval of the mean of paired differences (a single pair has no interval: +-inf)."""
    d = np.asarray(diffs, dtype=float)
    if len(d) < 2:
        return (-float("inf"), float("inf"))
    half = t_quantile(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d))
    return (float(d.mean() - half), float(d.mean() + half))


def minimum_detectable_effect(n_seeds: int, sd: float, *, power: float = POWER) -> float:
    """The smallest true mean difference that a two-sided 95% t-test over ``n_seeds`` paired seeds with per-seed
    difference spread ``sd`` detects with probability ``power`` (the usual (t_.975 + t_power) sd / sqrt(n))."""
    if n_seeds < 2 or not np.isfinite(sd):
        return float("inf")
    df = n_seeds - 1
    return float((t_quantile(0.975, df) + t_quantile(power, df)) * sd / np.sqrt(n_seeds))


def variance_components(diffs: Sequence[float], per_task_diffs: Sequence[Sequence[float]] | None = None
                        ) -> dict[str, float | None]:
    """Split the variance of the per-seed differences into eval noise (within a seed: the variance of the mean of its
    per-task paired differences, averaged over seeds) and between-seed variance (training randomness: the rest,
    clipped at 0). Without per-task outcomes only the total is known."""
    d = np.asarray(diffs, dtype=float)
    total = float(d.var(ddof=1)) if len(d) > 1 else None
    if per_task_diffs is None:
        return {"total": total, "eval": None, "between_seed": None}
    eval_var = float(np.mean([np.var(np.asarray(x, dtype=float), ddof=1) / len(x) for x in per_task_diffs]))
    between = None if total is None else max(0.0, total - eval_var)
    return {"total": total, "eval": eval_var, "between_seed": between}


def paired_bootstrap(method_bits: Sequence[Sequence[int]], baseline_bits: Sequence[Sequence[int]], *,
                     reps: int = 4000, seed: int = 0) -> tuple[float, float]:
    """95% interval of mean accuracy difference: resample seeds, then tasks within each seed (pairs kept). Kept for
    one-seed task-level reports (benchmarks/agentic_training.py); comparison verdicts use ``t_interval`` over seeds."""
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


def _final_eval(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    return evals(records)[-1]


def final_counts(records: Sequence[dict[str, Any]]) -> tuple[list[int], int] | None:
    """Per-task correct counts of the last held-out eval and its samples per task, if recorded: the larger final set
    (``final_eval_correct``) when the lane has one, else ``eval_correct``."""
    last = _final_eval(records)
    per_task = last.get("final_eval_correct", last.get("eval_correct"))
    if per_task is None:
        return None
    return [int(c) for c in per_task], int(last.get("eval_samples", 1))


def final_bits(records: Sequence[dict[str, Any]]) -> list[float] | None:
    """Per-task accuracy of the last held-out eval, if recorded (counts out of ``eval_samples``)."""
    counts = final_counts(records)
    return None if counts is None else [c / counts[1] for c in counts[0]]


def final_solutions(records: Sequence[dict[str, Any]]) -> list[float] | None:
    """Per-task distinct correct solutions of the last held-out eval (``eval_solutions``), if recorded."""
    per_task = _final_eval(records).get("eval_solutions")
    return None if per_task is None else [float(v) for v in per_task]


def encode_counts(counts: Sequence[int]) -> str:
    """Per-task counts (each 0..9) as one digit string: the compact evidence a result file commits."""
    if any(not 0 <= int(c) <= 9 for c in counts):
        raise ValueError("per-task counts must be in 0..9 to be stored as digits")
    return "".join(str(int(c)) for c in counts)


def decode_counts(text: str) -> list[int]:
    if not isinstance(text, str) or not text.isdigit():
        raise ValueError(f"per-task evidence must be a string of digits, got {str(text)[:40]!r}")
    return [int(c) for c in text]


def per_task_differences(tasks: dict[str, dict[str, str]], seeds: Sequence[Any], scale: int
                         ) -> list[list[float]]:
    """Per seed, the per-task paired differences (method - baseline) / ``scale`` of digit-string evidence."""
    out = []
    for s in seeds:
        m, b = decode_counts(tasks["method"][str(s)]), decode_counts(tasks["baseline"][str(s)])
        if len(m) != len(b):
            raise ValueError("paired runs must be scored on the same held-out tasks")
        out.append([(x - y) / scale for x, y in zip(m, b)])
    return out


def decide(diffs: Sequence[float], *, direction: str, accuracy: dict[str, float], tolerance: float | None,
           per_task_diffs: Sequence[Sequence[float]] | None = None) -> dict[str, Any]:
    """The verdict of per-seed paired differences: interval, variance components, minimum detectable effect, and
    reproduced / inconclusive / not reproduced. One function for ``summarize`` and for re-checking a committed
    result from its evidence alone (``recheck``)."""
    diff = float(np.mean(diffs))
    interval = t_interval(diffs)
    sign = 1.0 if direction == "higher" else -1.0
    accuracy_held = tolerance is None or accuracy["method"] >= accuracy["baseline"] - tolerance - 1e-12
    significant = bool(interval[0] > 0 if sign > 0 else interval[1] < 0)  # the interval on the claimed side of 0
    components = variance_components(diffs, per_task_diffs)
    sd = float(np.sqrt(components["total"])) if components["total"] is not None else float("inf")
    return {
        "difference": diff, "interval": list(interval),
        "interval_kind": f"student-t over {len(diffs)} paired seeds (eval noise nested in each seed)",
        "variance_components": components,
        "minimum_detectable_effect": minimum_detectable_effect(len(diffs), sd),
        # reproduced: the whole 95% interval of the difference lies on the claimed side of 0 (and, for an "at about
        # equal accuracy" claim, accuracy held); a point estimate on that side with an interval across 0 is
        # "inconclusive", not a reproduction
        "direction_reproduced": bool(significant and accuracy_held),
        "verdict": ("reproduced" if significant and accuracy_held else
                    "inconclusive" if sign * diff > 0 and accuracy_held else "not reproduced"),
        "point_estimate_in_direction": bool(sign * diff > 0),
        "significant": significant,
        "accuracy_held": {"tolerance": tolerance, "held": bool(accuracy_held)},
    }


def recheck(result: dict[str, Any]) -> dict[str, Any]:
    """Recompute a committed result's per-seed values (from its per-task evidence where it has it), difference,
    interval and verdict from the file alone. A file written before per-task evidence was committed is recomputed
    from its per-seed values (``evidence`` "per-seed values only": no eval-noise component)."""
    evidence = result.get("evidence") or {}
    if "per_seed" not in result:
        raise ValueError(f"{result.get('method')} vs {result.get('baseline')}: no per-seed values to recompute from")
    seeds = [str(s) for s in result["seeds"]]
    per_seed = {s: dict(result["per_seed"][s]) for s in seeds}
    per_task_diffs = None
    tasks = evidence.get("per_task")
    if tasks:
        k = int(evidence["samples"])
        per_task_diffs = per_task_differences(tasks, seeds, k)
        if result["metric"] in PER_TASK_METRICS:
            per_seed = {s: {side: float(np.mean(decode_counts(tasks[side][s]))) / k for side in ("method", "baseline")}
                        for s in seeds}
    diffs = [per_seed[s]["method"] - per_seed[s]["baseline"] for s in seeds]
    out = decide(diffs, direction=result["direction"], accuracy=result["accuracy"],
                 tolerance=(result.get("accuracy_held") or {}).get("tolerance"),
                 per_task_diffs=per_task_diffs if result["metric"] in PER_TASK_METRICS else None)
    out["per_seed"] = per_seed
    out["evidence"] = "per-task outcomes" if tasks else "per-seed values only"
    out["method_value"] = float(np.mean([per_seed[s]["method"] for s in seeds]))
    out["baseline_value"] = float(np.mean([per_seed[s]["baseline"] for s in seeds]))
    return out


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
    accuracy = {"method": float(np.mean([final_accuracy(method_runs[s]) for s in seeds])),
                "baseline": float(np.mean([final_accuracy(baseline_runs[s]) for s in seeds]))}
    # the committed evidence: per-seed, per-task outcomes of the final eval (both sides on the same tasks), from which
    # the accuracy values, the eval-noise component and the interval are recomputed (``recheck``)
    evidence: dict[str, Any] = {}
    sides = (("method", method_runs), ("baseline", baseline_runs))
    tasks: dict[str, dict[str, str]] | None = None
    if comparison.metric == "final_eval_coverage" and all(final_solutions(r[s]) is not None for _, r in sides
                                                           for s in seeds):
        tasks = {side: {str(s): encode_counts([int(v) for v in final_solutions(runs[s])]) for s in seeds}
                 for side, runs in sides}
        evidence.update(samples=1, per_task_kind="distinct correct solutions per task (final eval)")
    elif all(final_counts(r[s]) is not None for _, r in sides for s in seeds):
        counts = {side: {s: final_counts(runs[s]) for s in seeds} for side, runs in sides}
        k = {c[1] for side in counts.values() for c in side.values()}
        if len(k) != 1:
            raise ValueError(f"paired runs evaluated with different eval_samples: {sorted(k)}")
        tasks = {side: {str(s): encode_counts(counts[side][s][0]) for s in seeds} for side in counts}
        evidence.update(samples=k.pop(), per_task_kind="correct samples per task (final eval), out of samples")
    per_task_diffs = None
    if tasks is not None:
        evidence["per_task"] = tasks
        per_task_diffs = per_task_differences(tasks, seeds, evidence["samples"])
    out: dict[str, Any] = {
        "method_value": float(np.mean(list(mv.values()))), "baseline_value": float(np.mean(list(bv.values()))),
        "per_seed": {str(s): {"method": mv[s], "baseline": bv[s]} for s in seeds},
        **decide(diffs, direction=comparison.direction, accuracy=accuracy, tolerance=comparison.accuracy_tolerance,
                 per_task_diffs=per_task_diffs if comparison.metric in PER_TASK_METRICS else None),
        "accuracy": accuracy,
        "evidence": evidence,
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
