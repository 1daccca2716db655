"""VIGOR: the variance score and the round-by-round allocation (ragged groups, exact budget)."""

from __future__ import annotations

import pytest

from agents.grpo.batch import GroupBatch, Sample
from agents.grpo.registry import build
from agents.methods.vigor import variance_score


def test_variance_score_golden():
    assert variance_score([1, 0], prior=1) == pytest.approx(0.25)  # [1,0] + pseudo [0,1]
    assert variance_score([0, 0], prior=1) == pytest.approx(0.1875)  # [0,0,0,1]: mean .25, var .25 - .0625
    assert variance_score([0, 0], prior=0) == 0.0
    assert variance_score([1, 0, 0, 0], prior=0) == pytest.approx(0.1875)


def batch(rewards: dict[str, list[float]]) -> GroupBatch:
    return GroupBatch.from_samples([Sample(group_id=g, prompt="p", prompt_ids=[1], response_ids=[2], text="",
                                           reward=r) for g, rs in rewards.items() for r in rs])


def test_allocation_rounds_follow_variance_and_spend_the_budget_exactly():
    alloc = build("rollout_allocator", "vigor", {"n0": 2, "budget_per_prompt": 4, "per_round": 2, "top_k": 2})
    assert alloc.initial(["a", "b", "c", "d"]) == {"a": 2, "b": 2, "c": 2, "d": 2}
    rewards = {"a": [1, 0], "b": [0, 0], "c": [1, 1], "d": [1, 0]}
    # scores: a .25, b .1875, c .1875, d .25 -> a and d (mixed outcomes) get the first extra rollouts
    assert alloc.more(batch(rewards)) == {"a": 2, "d": 2}
    rewards["a"] += [1, 1]  # a: [1,0,1,1] + prior -> var of [1,0,1,1,0,1] = 2/9 ; d: [1,0,0,0] -> 2/9 as well
    rewards["d"] += [0, 0]
    # a, d: 0.2222 (tie broken by fewer rollouts: none, then order); b, c: .1875
    assert alloc.more(batch(rewards)) == {"a": 2, "d": 2}
    assert alloc.more(batch(rewards)) == {}  # 4 prompts x 4 = 16 = 8 initial + 8 extra
    state = alloc.state_dict()
    assert state["left"] == 0


def test_allocator_cuts_the_last_round_to_the_budget():
    alloc = build("rollout_allocator", "vigor", {"n0": 1, "budget_per_prompt": 2, "per_round": 3, "top_k": 1})
    alloc.initial(["a", "b"])
    first = alloc.more(batch({"a": [1], "b": [0]}))
    assert sum(first.values()) == 2  # 4 total - 2 initial: the round is cut to what is left
    with pytest.raises(ValueError):
        build("rollout_allocator", "vigor", {"n0": 4, "budget_per_prompt": 2})


def test_a_group_at_its_cap_gets_nothing_more():
    alloc = build("rollout_allocator", "vigor", {"n0": 2, "budget_per_prompt": 8, "per_round": 2, "top_k": 2,
                                                 "max_per_prompt": 4})
    alloc.initial(["a", "b", "c"])
    rewards = {"a": [1, 0], "b": [0, 1], "c": [1, 1]}
    assert alloc.more(batch(rewards)) == {"a": 2, "b": 2}  # the mixed groups (.25 vs .1875): a and b reach the cap
    rewards["a"] += [1, 0]
    rewards["b"] += [0, 1]
    # a and b still score highest (.25) but sit at the cap of 4: only c gets more
    assert alloc.more(batch(rewards)) == {"c": 2}
    rewards["c"] += [1, 1]
    assert alloc.more(batch(rewards)) == {}  # every group at the cap: the rest of the budget stays unspent
    assert alloc.state_dict()["left"] == 24 - 6 - 4 - 2
