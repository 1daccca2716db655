"""Rollout allocation, prompt selection and budgets: PassRates, greedy allocation, saturated-group prediction,
signal budgets, budget schedules, DUET and SAGC. Golden values for every formula; bad hyper-parameters name the key."""

from __future__ import annotations

import pytest
import torch

from agents.grpo.batch import GroupBatch, Sample
from agents.grpo.history import PassRates, greedy_allocation
from agents.grpo.registry import build
from agents.methods.budget_schedule import group_size_at
from agents.methods.sagc import straggler_stats


def batch(groups: dict[str, list[int]], *, step: int = 1, lengths: dict[str, list[int]] | None = None,
          index: dict[str, int] | None = None, finish: dict[str, list[str]] | None = None) -> GroupBatch:
    """Rows of 0/1 outcomes per task; group ids as the trainer writes them (``step:round:j:task``)."""
    samples = []
    for j, (task, outcomes) in enumerate(groups.items()):
        for k, ok in enumerate(outcomes):
            n = (lengths or {}).get(task, [1] * len(outcomes))[k]
            samples.append(Sample(group_id=f"{step}:0:{j}:{task}", prompt="p", prompt_ids=[1], response_ids=[2] * n,
                                  text="", reward=float(ok), correct=bool(ok),
                                  finish_reason=(finish or {}).get(task, ["stop"] * len(outcomes))[k],
                                  info={"task_id": task, "index": (index or {}).get(task, j)}))
    return GroupBatch.from_samples(samples, step=step)


# -- PassRates and greedy allocation -------------------------------------------------------------------------------
def test_pass_rates_golden():
    r = PassRates(prior=2.0)
    assert r.posterior("t") == pytest.approx((1.0, 1.0))  # global prior 0.5 x 2 pseudo-rollouts
    assert r.saturation("t", 2) == pytest.approx(2 / 3)  # E[p^2] = E[(1-p)^2] = 1*2 / (2*3)
    assert r.informativeness("t") == pytest.approx(1 / 6)  # E[p(1-p)] = ab / ((a+b)(a+b+1))
    r.update(batch({"t": [1, 1, 1, 0]}, index={"t": 7}))
    assert r.global_rate == pytest.approx(3.5 / 5)
    assert r.posterior("t") == pytest.approx((2 * 0.7 + 3, 2 * 0.3 + 1))
    assert r.mean("t") == pytest.approx(4.4 / 6)
    assert r.task_id(7) == "t" and r.task_id(8) is None
    r2 = PassRates(prior=2.0, decay=0.5)
    r2.update(batch({"t": [1, 1]}))
    r2.update(batch({"t": [0, 0]}, step=2))
    assert r2.counts["t"][:2] == [1.0, 3.0]  # old counts halved on the revisit
    r3 = PassRates()
    r3.load_state_dict(r.state_dict())
    assert r3.posterior("t") == r.posterior("t") and r3.task_id(7) == "t"
    with pytest.raises(ValueError, match="prior"):
        PassRates(prior=0)


def test_greedy_allocation_golden():
    value = {"a": [0, 0.5, 0.75, 0.875], "b": [0, 0.9, 0.95, 0.96]}  # concave in the number of grants
    counts = greedy_allocation(["a", "b"], lambda t, n: value[t][n], budget=4, n_min=0, n_max=3)
    assert counts == {"a": 3, "b": 1}  # gains in order: b .9, a .5, a .25, a .125 (b's next only .05)
    costs = {"a": 1.0, "b": 2.0}
    counts = greedy_allocation(["a", "b"], lambda t, n: value[t][n], budget=4, n_min=0, n_max=3, cost=costs.get)
    assert counts == {"a": 2, "b": 1}  # per cost: a .5, b .45, a .25 (cost 4 spent); a's .125 is over budget
    assert greedy_allocation(["a"], lambda t, n: 0.0, budget=100, n_min=2, n_max=9) == {"a": 2}
    with pytest.raises(ValueError, match="n_min"):
        greedy_allocation(["a"], lambda t, n: 0.0, budget=1, n_min=3, n_max=2)


# -- saturated-group prediction ------------------------------------------------------------------------------------
def test_saturation_skip_skips_predicted_saturated_prompts_and_never_runs_short():
    sel = build("prompt_selector", "saturation_skip", {"group_size": 8, "threshold": 0.6, "explore": 0.0,
                                                       "candidates": 4, "seed": 0})
    # tasks 0..3 were all correct 16 times: predicted saturated; 4..7 mixed; 8.. unseen
    outcomes = {f"t{i}": [1] * 16 if i < 4 else [1, 0] * 8 for i in range(8)}
    sel.observe_rollouts(batch(outcomes, index={f"t{i}": i for i in range(8)}), 0.1)
    assert sel.predicted(0) > 0.6 > sel.predicted(5)
    picked = sel.select(4, 8, step=2)
    m = sel.metrics()
    assert len(picked) == 4 and set(picked) == {4, 5, 6, 7} and 1 <= m["skipped"] == m["predicted_saturated"] <= 4
    picked = sel.select(6, 8, step=3)  # only 4 unsaturated exist: the least saturated skipped ones fill in
    assert len(set(picked)) == 6 and {4, 5, 6, 7} <= set(picked)
    with pytest.raises(ValueError, match="threshold"):
        build("prompt_selector", "saturation_skip", {"threshold": 0})


# -- signal budget and budget schedule ------------------------------------------------------------------------------
def test_signal_budget_gives_informative_prompts_more_at_the_same_total():
    alloc = build("rollout_allocator", "signal_budget", {"budget_per_prompt": 8, "n_min": 2, "n_max": 16})
    alloc.observe_rollouts(batch({"easy": [1] * 16, "mixed": [1, 0] * 8, "hard": [0] * 16}), 0.1)
    groups = ["2:0:0:easy", "2:0:1:mixed", "2:0:2:hard"]
    counts = alloc.initial(groups)
    # mixed outcomes: the most signal per rollout, but it saturates fast; the others' rare failures (successes) are
    # worth a few rollouts too once the mixed group has enough (gains 0.112, 0.086, 0.027, ... vs ~0.003)
    assert sum(counts.values()) == 24 and counts["2:0:1:mixed"] == max(counts.values()) > 8
    assert counts["2:0:0:easy"] >= 2 and counts["2:0:2:hard"] >= 2
    fresh = build("rollout_allocator", "signal_budget", {})
    assert set(fresh.initial(groups).values()) == {8}  # no history: every prompt looks alike
    with pytest.raises(ValueError, match="n_min"):
        build("rollout_allocator", "signal_budget", {"n_min": 10, "budget_per_prompt": 8})


def test_budget_schedule_golden_and_same_total():
    sizes = [group_size_at(s, 60, start=4, end=12, schedule="linear") for s in range(1, 61)]
    assert sizes[0] == 4 and sizes[-1] == 12 and sum(sizes) == 8 * 60
    assert group_size_at(31, 61, start=4, end=12, schedule="cosine") == 8
    assert group_size_at(5, 10, start=6, end=2, schedule="constant") == 6
    alloc = build("rollout_allocator", "budget_schedule", {"start": 4, "end": 12, "steps": 60})
    assert set(alloc.initial(["60:0:0:a", "60:0:1:b"]).values()) == {12}
    assert set(alloc.initial(["1:2:0:a"]).values()) == {4}  # a refill round of step 1: step 1's size
    with pytest.raises(ValueError, match="schedule"):
        build("rollout_allocator", "budget_schedule", {"schedule": "exp"})


# -- DUET ----------------------------------------------------------------------------------------------------------
def test_duet_selector_prefers_informative_prompts():
    sel = build("prompt_selector", "duet", {"candidates": 2, "seed": 1})
    sel.observe_rollouts(batch({f"t{i}": ([1, 0] * 4 if i % 2 else [1] * 8) for i in range(8)},
                               index={f"t{i}": i for i in range(8)}), 0.1)
    picked = sel.select(4, 8, step=2)  # all 8 are candidates: the 4 mixed ones win
    assert sorted(picked) == [1, 3, 5, 7]


def test_duet_allocator_prices_the_first_step_then_spends_half():
    alloc = build("rollout_allocator", "duet", {"budget_fraction": 0.5, "n_ref": 8, "n_min": 2})
    groups = [f"1:0:{j}:t{j}" for j in range(4)]
    assert set(alloc.initial(groups).values()) == {8}  # first step: full budget, to measure its cost
    first = batch({f"t{j}": [1, 0] * 4 if j < 2 else [1] * 8 for j in range(4)},
                  lengths={f"t{j}": [10] * 8 for j in range(4)})
    alloc.observe_rollouts(first, 1.0)
    assert alloc.ref_tokens_per_prompt == 80.0
    counts = alloc.initial([f"2:0:{j}:t{j}" for j in range(4)])
    assert sum(counts.values()) * 10 <= 0.5 * 80 * 4  # the token budget: half of the full budget's 320 tokens
    assert sum(counts.values()) * 10 > 0.5 * 80 * 4 - 2 * 10  # nothing left that buys another pair
    assert counts["2:0:0:t0"] > counts["2:0:2:t2"]  # the informative prompts get the rollouts
    with pytest.raises(ValueError, match="budget_fraction"):
        build("rollout_allocator", "duet", {"budget_fraction": 0})


def test_duet_reweight_golden():
    b = batch({"t": [1, 0, 0]}, finish={"t": ["stop", "abort", "length"]})
    out = build("group_transform", "duet_reweight", {"abort_weight": 0.25})(b)
    assert out.weights.tolist() == [1.0, 0.25, 1.0]
    with pytest.raises(ValueError, match="abort_weight"):
        build("group_transform", "duet_reweight", {"abort_weight": 2})
    with pytest.raises(ValueError, match="markers"):
        build("generation_controller", "duet_abort", {"markers": []})


# -- SAGC ----------------------------------------------------------------------------------------------------------
def test_straggler_stats_golden():
    b = batch({"a": [1, 0, 1, 0], "b": [1, 1, 0, 0]}, lengths={"a": [10, 10, 10, 50], "b": [10, 12, 9, 11]})
    group_rate, rollout_rate = straggler_stats(b, kappa=2.0)  # median 10: only a's 50 is over 20
    assert group_rate == 0.5 and rollout_rate == 1 / 8


def test_sagc_dual_variable_trades_group_size_against_stragglers():
    alloc = build("rollout_allocator", "sagc", {"g_min": 4, "g_max": 16, "epsilon": 0.1, "eta": 2.0, "q0": 0.05})
    groups = ["1:0:0:a", "1:0:1:b"]
    assert set(alloc.initial(groups).values()) == {16}  # lambda 0: the largest group has the most signal
    long_tail = batch({"a": [1, 0, 1, 0], "b": [1, 1, 0, 0]}, lengths={"a": [10, 10, 10, 50], "b": [10, 12, 9, 11]})
    alloc.observe_rollouts(long_tail, 1.0)
    alloc.observe(long_tail)
    assert alloc.lam == pytest.approx(2.0 * (0.5 - 0.1))  # lambda <- max(0, lambda + eta (s - eps))
    assert alloc.q == pytest.approx(0.7 * 0.05 + 0.3 * 0.125)
    u = {g: alloc.utility(["a", "b"], g) - alloc.lam * alloc.straggle_probability(g) for g in alloc.sizes}
    chosen = alloc.initial(["2:0:0:a", "2:0:1:b"])["2:0:0:a"]
    assert chosen == max(u, key=lambda g: (u[g], -g)) and chosen < 16
    calm = batch({"a": [1, 0] * 4}, lengths={"a": [10] * 8})
    for _ in range(3):
        alloc.observe_rollouts(calm, 1.0)
        alloc.observe(calm)
    assert alloc.lam == pytest.approx(max(0.0, 0.8 - 3 * 2.0 * 0.1))  # no stragglers: lambda falls toward 0
    with pytest.raises(ValueError, match="kappa"):
        build("rollout_allocator", "sagc", {"kappa": 1.0})


def test_sagc_state_round_trip():
    alloc = build("rollout_allocator", "sagc", {})
    alloc.initial(["1:0:0:a"])
    b = batch({"a": [1, 0, 1, 1]}, lengths={"a": [3, 30, 3, 3]})
    alloc.observe_rollouts(b, 0.5)
    alloc.observe(b)
    other = build("rollout_allocator", "sagc", {})
    other.load_state_dict(alloc.state_dict())
    assert other.state_dict() == alloc.state_dict()
    assert torch.isfinite(torch.tensor(other.lam))
