"""Headroom-Drift replay's per-step counts scale with the prompts a step (``per_prompts``): the replay share of the
trained groups, the buffer's depth and the drift checks stay as the recipe wrote them for 8 prompts when a lane runs
32; without ``per_prompts`` the counts are absolute (the share falls from a third to a ninth)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from agents.grpo.batch import GroupBatch, Sample
from agents.grpo.registry import build

RECIPE = {"replay": 4, "capacity": 64, "candidates": 8, "max_drift": 0.1, "max_age": 10}  # agents/recipes/hd_replay


def fresh(step: int, n_groups: int) -> GroupBatch:
    """``n_groups`` fresh groups of 4 rollouts with mixed rewards (each stored), behaviour log-prob -1 per token."""
    samples = [Sample(group_id=f"{step}:0:{j}:t{step}_{j}", prompt="p", prompt_ids=[1], response_ids=[2, 3], text="",
                      reward=float(r)) for j in range(n_groups) for r in (1, 0, 0, 1)]
    b = GroupBatch.from_samples(samples, step=step)
    b.behaviour_logprobs = torch.full_like(b.behaviour_logprobs, -1.0) * b.response_mask
    b.advantages = b.rewards - 0.5
    return b


def services(prompts: int) -> SimpleNamespace:
    # no drift: the current policy's log-probs equal the behaviour ones, so only the counts decide what is replayed
    return SimpleNamespace(logprobs=lambda part, rows=None: part.behaviour_logprobs.clone(),
                           cfg=SimpleNamespace(prompts_per_step=prompts))


def replay_share(name: str, prompts: int, params: dict, steps: int = 3) -> tuple[float, dict[str, float]]:
    buf = build("replay_buffer", name, {**(RECIPE if name == "headroom_drift" else
                                           {k: RECIPE[k] for k in ("replay", "capacity", "max_age")}), **params})
    buf.bind(services(prompts))
    for step in range(1, steps + 1):
        out = buf(fresh(step, prompts))
    replayed = int(out.off_policy.sum()) // 4 if out.off_policy is not None else 0
    return replayed / (replayed + prompts), buf.metrics()


@pytest.mark.parametrize("name", ["headroom_drift", "replay_uniform"])
def test_replay_share_stays_as_written_when_the_lane_changes_prompts_a_step(name):
    share8, m8 = replay_share(name, 8, {"per_prompts": 8})
    share32, m32 = replay_share(name, 32, {"per_prompts": 8})
    assert share8 == pytest.approx(4 / 12) and share32 == pytest.approx(16 / 48)  # a third of the trained groups
    assert m8["replay_quota"] == 4 and m32["replay_quota"] == 16
    absolute, _ = replay_share(name, 32, {})  # the counts as they were: 4 beside 32 fresh groups
    assert absolute == pytest.approx(4 / 36)
    same, _ = replay_share(name, 8, {})  # at the prompts the counts were written for, scaling changes nothing
    assert same == share8


def test_capacity_and_candidates_scale_too():
    buf = build("replay_buffer", "headroom_drift", {**RECIPE, "replay": 0, "per_prompts": 8})
    buf.bind(services(32))
    for step in range(1, 4):
        buf(fresh(step, 32))
    assert len(buf.groups) == 96  # capacity 64 at 8 prompts = 256 at 32: three steps of 32 all kept
    fixed = build("replay_buffer", "headroom_drift", {**RECIPE, "replay": 0})
    fixed.bind(services(32))
    for step in range(1, 4):
        fixed(fresh(step, 32))
    assert len(fixed.groups) == 64  # absolute: two steps' worth at 32 prompts
    calls = []
    gated = build("replay_buffer", "headroom_drift", {**RECIPE, "per_prompts": 8})
    # every stored group drifted past max_drift: each candidate is checked, none replayed
    gated.bind(SimpleNamespace(logprobs=lambda part, rows=None: calls.append(1) or part.behaviour_logprobs + 1.0,
                               cfg=SimpleNamespace(prompts_per_step=32)))
    gated(fresh(1, 32))
    gated(fresh(2, 32))
    assert len(calls) == 32 and gated.metrics()["drift_gated"] == 32  # candidates 8 at 8 prompts = 32 at 32
    with pytest.raises(ValueError, match="per_prompts"):
        build("replay_buffer", "headroom_drift", {"per_prompts": 0})
