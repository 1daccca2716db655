"""Headroom-Drift and uniform replay, data policies and hint scaffolding: golden values, state, bad input."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from test_methods_allocation import batch

from agents.grpo.batch import GroupBatch
from agents.grpo.registry import build
from agents.methods.data_policy import parse_rule
from agents.methods.hint import hint_lines
from agents.policy.countdown_traces import check_trace, solution_branch, write_trace


def with_logprobs(b: GroupBatch, value: float) -> GroupBatch:
    b.behaviour_logprobs = torch.full_like(b.behaviour_logprobs, value) * b.response_mask
    b.advantages = b.rewards - b.rewards.mean()
    return b


class FakeService:
    """The trainer's log-prob service: the current policy's log-probs, here a constant shift per task."""

    def __init__(self, shift: dict[str, float]):
        self.shift, self.calls = shift, 0

    def logprobs(self, part: GroupBatch, rows=None) -> torch.Tensor:
        self.calls += 1
        task = part.group_ids[0].split(":", 3)[3]
        return (part.behaviour_logprobs + self.shift.get(task, 0.0)) * part.response_mask


# -- replay --------------------------------------------------------------------------------------------------------
def test_headroom_drift_golden_selection():
    replay = build("replay_buffer", "headroom_drift", {"replay": 2, "max_drift": 0.1, "candidates": 8})
    service = FakeService({"a": 0.05, "b": 0.5, "c": 0.0})
    replay.bind(SimpleNamespace(logprobs=service.logprobs))
    step1 = with_logprobs(batch({"a": [1, 0, 0, 0], "b": [1, 0, 1, 0], "c": [1, 1, 1, 0], "d": [1, 1, 1, 1]}), -1.0)
    out = replay(step1)
    assert out is step1 and len(replay.groups) == 3  # nothing stored yet to replay; d (no variance) not stored
    # headroom = sigma_g * (1 - p_now), p_now the posterior mean after step 1: a .433 * .627, b .5 * .461, c lowest
    h = {g["task"]: replay.headroom(g) for g in replay.groups}
    rates = replay.rates
    assert h["a"] == pytest.approx(np.sqrt(3 / 16) * (1 - rates.mean("a")))
    assert h["b"] == pytest.approx(0.5 * (1 - rates.mean("b")))
    assert h["a"] > h["b"] > h["c"]
    step2 = with_logprobs(batch({"e": [1, 0]}, step=2), -1.0)
    out = replay(step2)
    # by headroom a, b, c: a (drift .05) replayed, b drifted 0.5 > 0.1: gated, c (drift 0) replayed
    assert replay.metrics()["drift_gated"] == 1 and replay.metrics()["replayed_groups"] == 2
    assert [g.split(":", 3)[3] for g in dict.fromkeys(out.group_ids)] == ["e", "a", "c"]
    assert out.off_policy.tolist() == [False] * 2 + [True] * 8 and out.step == 2
    assert torch.equal(out.advantages[2:6], step1.advantages[:4])  # the stored advantages travel with the rows
    assert replay.metrics()["drift_mean"] == pytest.approx((0.5 + 0.05 + 0.0) / 3)


def test_replay_buffer_ages_out_caps_and_restores():
    replay = build("replay_buffer", "replay_uniform", {"replay": 1, "capacity": 2, "max_age": 2, "max_replays": 1})
    for step in range(1, 4):
        replay(with_logprobs(batch({f"t{step}a": [1, 0], f"t{step}b": [0, 1]}, step=step), -1.0))
    assert [g["step"] for g in replay.groups] == [3, 3]  # capacity 2, max age 2: the newest
    other = build("replay_buffer", "replay_uniform", {"replay": 1, "capacity": 2, "max_age": 2, "max_replays": 1})
    other.load_state_dict(replay.state_dict())
    a = replay(with_logprobs(batch({"x": [1, 0]}, step=4), -1.0))
    b = other(with_logprobs(batch({"x": [1, 0]}, step=4), -1.0))
    assert a.group_ids == b.group_ids and len(a) == 4  # same draw after a restore; one group replayed
    with pytest.raises(ValueError, match="capacity"):
        build("replay_buffer", "replay_uniform", {"capacity": 0})


def test_replayed_rows_change_the_loss_through_the_behaviour_ratio():
    """The loss sees replayed rows with ratio pi_now / pi_behaviour: a replayed row whose behaviour log-prob is far
    below the current one is clipped at 1 + eps for a positive advantage."""
    b = with_logprobs(batch({"a": [1, 0]}), -2.0)
    b.off_policy = torch.tensor([True, False])
    b.advantages = torch.tensor([1.0, -1.0])
    now = torch.full_like(b.behaviour_logprobs, -1.0) * b.response_mask
    loss, m = build("loss", "ppo_clip", {"aggregation": "seq-mean-token-mean"})(b, now)
    assert m["clipped_tokens"] == 1  # row 0: ratio e^1 clipped at 1.2; row 1 on-policy: ratio 1
    assert float(loss) == pytest.approx((-1.2 + 1.0) / 2)


# -- data policies -------------------------------------------------------------------------------------------------
def test_data_policy_rules_golden():
    b = batch({"a": [1, 0, 0], "b": [1, 1, 1]}, finish={"a": ["stop", "length", "abort"], "b": ["stop"] * 3})
    b.response_ids = [[5, 6], [7], [7], [5], [5], [9]]  # group a: rows 1, 2 identical; group b: rows 3, 4
    out = build("group_transform", "data_policy", {"rules": ["truncated=0.5", "dedupe"]})(b)
    assert out.weights.tolist() == [1.0, 0.25, 0.25, 0.5, 0.5, 1.0]
    dp = build("group_transform", "data_policy", {"rules": ["drop_zero_variance", "cap_group=2"]})
    out = dp(batch({"a": [1, 0, 0], "b": [1, 1, 1]}))
    assert len(out) == 3 and out.weights.tolist() == pytest.approx([2 / 3] * 3)
    assert dp.metrics() == {"dropped_groups": 1.0, "truncated_rows": 0.0, "duplicate_rows": 0.0, "capped_groups": 1.0}
    assert build("group_transform", "data_policy", {"rules": ["drop_zero_variance"]})(batch({"b": [1, 1]})) is None


@pytest.mark.parametrize(("rule", "message"), [("nope", "unknown rule"), ("truncated", "needs a value"),
                                                ("dedupe=2", "takes no value"), ("truncated=x", "not a number"),
                                                ("truncated=1.5", "0 <= W <= 1"), ("cap_group=0", "C > 0")])
def test_data_policy_bad_rules_name_the_rule(rule, message):
    with pytest.raises(ValueError, match=message):
        parse_rule(rule)


# -- hint scaffolding ----------------------------------------------------------------------------------------------
def test_solution_branch_is_a_valid_path_to_the_target():
    for seed in range(20):
        rng = np.random.default_rng(seed)
        numbers = [int(x) for x in rng.integers(1, 10, size=4)]
        try:
            trace = write_trace(numbers, 24, np.random.default_rng(seed))
        except ValueError:
            continue
        branch = solution_branch(trace)
        assert branch and branch[-1].endswith("!") and [len(x) - len(x.lstrip()) for x in branch] == [0, 1, 2]
        check = check_trace(numbers, 24, "\n".join(branch))
        assert check.reached and check.all_valid
    assert solution_branch("1+2=3 x\n<answer>1+2</answer>") == []


def hint_info(task_id: str = "countdown-3") -> dict:
    return {"task_id": task_id, "answer": "24", "metadata": {"numbers": [3, 7, 2, 5], "target": 24}}


def test_hint_levels_rise_on_all_wrong_groups_and_anneal_away():
    ctrl = build("generation_controller", "hint_scaffold", {"max_level": 2, "anneal_at": 0.5})
    info = hint_info()
    branch = hint_lines(info, "auto")
    assert ctrl.prompt("Q\n", info, 1) == "Q\n"  # level 0
    ctrl.observe_rollouts(batch({"countdown-3": [0, 0, 0]}), 0.1)
    assert ctrl.prompt("Q\n", info, 2) == f"Q\n{branch[0]}\n"
    ctrl.observe_rollouts(batch({"countdown-3": [0, 0]}, step=2), 0.1)
    assert ctrl.prompt("Q\n", info, 3) == f"Q\n{branch[0]}\n{branch[1]}\n"
    ctrl.observe_rollouts(batch({"countdown-3": [0, 0]}, step=3), 0.1)
    assert ctrl.level["countdown-3"] == 2  # capped at max_level
    ctrl.prompt("Q\n", info, 4)
    ctrl.observe_rollouts(batch({"countdown-3": [1, 0, 0, 0]}, step=4), 0.1)
    assert ctrl.level["countdown-3"] == 2  # 0.25 < anneal_at: kept
    ctrl.observe_rollouts(batch({"countdown-3": [1, 1, 0, 0]}, step=5), 0.1)
    assert ctrl.level["countdown-3"] == 1  # solved half the time: one line taken away
    assert ctrl.metrics()["hinted_groups"] == 4
    other = build("generation_controller", "hint_scaffold", {})
    other.load_state_dict(ctrl.state_dict())
    assert other.prompt("Q\n", info, 6) == ctrl.prompt("Q\n", info, 6)


def test_hint_without_a_reference():
    assert hint_lines({"task_id": "arith-1", "metadata": {}}, "auto") == []  # procedural arithmetic: no hint
    assert hint_lines({"task_id": "m", "metadata": {"solution": "a\n\nb\nc"}}, "auto") == ["a", "b", "c"]
    ctrl = build("generation_controller", "hint_scaffold", {"max_level": 2})
    ctrl.level["m"] = 1
    assert ctrl.prompt("Q ", {"task_id": "m", "metadata": {"solution": "a\nb\nc"}}, 1) == "Q a\n"  # 1/3 of 3 lines
    with pytest.raises(ValueError, match="no Countdown numbers"):
        hint_lines({"task_id": "x", "metadata": {}}, "countdown_trace")
    with pytest.raises(ValueError, match="reference"):
        build("generation_controller", "hint_scaffold", {"reference": "oracle"})
