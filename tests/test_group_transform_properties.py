"""Property tests for the group transforms that drop, reweight or add rollouts, on random ragged batches.

Whatever a transform does, its output must stay aligned row by row: every list and per-row field has one entry per
row, a row's mask covers exactly its response tokens (zeros beyond, in every per-token field), a row the transform
kept equals its input row on every field it may not change, an added row sits in a group that already existed
(same prompt) and no group is invented. ``CASES`` lists the transforms; a new one (QLPO, GraphPO) is one more
``TransformCase`` with the fields it may change and its own extra check.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_methods_dre import overthink

from agents.grpo.batch import GroupBatch, Sample
from agents.grpo.registry import build
from agents.policy.micro import micro_tokenizer
from rlvr_envs.tasks.countdown import CountdownSource
from rlvr_envs.verifiers.countdown import verify

LIST_FIELDS = ("group_ids", "prompts", "prompt_ids", "response_ids", "texts", "infos", "finish_reasons")
ROW_FIELDS = ("rewards", "base_rewards", "correct", "weights", "off_policy")
TOKEN_FIELDS = ("response_mask", "behaviour_logprobs", "entropies", "old_logprobs", "ref_logprobs")
ROW_DEFAULTS = {"weights": 1.0, "off_policy": False}  # what a row has when the optional field is None
ALL_FIELDS = (*LIST_FIELDS, *ROW_FIELDS, *TOKEN_FIELDS, "advantages")
TOKENIZER = micro_tokenizer()
SOURCE = CountdownSource(min_numbers=3, max_numbers=3, min_number=1, max_number=9, min_target=2, max_target=40)


# -- the checker -----------------------------------------------------------------------------------------------------
def snapshot(batch: GroupBatch) -> dict[str, Any]:
    """A deep copy of every field (transforms may write into their input's tensors or lists)."""
    return {f: copy.deepcopy(getattr(batch, f)) for f in (*ALL_FIELDS, "step", "temperature")}


def row_of(fields: dict[str, Any], i: int, width: int) -> dict[str, Any]:
    """Row ``i`` as plain values; per-token fields padded with zeros to ``width`` (padding must be zero anyway)."""
    out: dict[str, Any] = {f: fields[f][i] for f in LIST_FIELDS}
    n = len(fields["group_ids"])
    for f in ROW_FIELDS:
        v = fields[f]
        out[f] = ROW_DEFAULTS.get(f) if v is None else v[i].item()
        assert v is None or v.shape == (n,), f"{f} has shape {tuple(v.shape)} for {n} rows"
    for f in (*TOKEN_FIELDS, "advantages"):
        v = fields[f]
        if v is None or (f == "advantages" and v.dim() == 1):
            out[f] = None if v is None else v[i].item()
            continue
        vals = v[i].double().tolist()
        out[f] = vals + [0.0] * (width - len(vals))
    return out


@dataclass
class Report:
    kept: list[tuple[int, int]] = field(default_factory=list)  # (output row, input row)
    added: list[int] = field(default_factory=list)  # output rows that are new


def check_aligned(before: dict[str, Any], after: GroupBatch | None, *, may_change: tuple[str, ...] = (),
                  may_add: bool = False, may_drop: bool = True, whole_groups: bool = True,
                  ordered: bool = True) -> Report:
    """The alignment properties (module docstring). Input rows are told apart by ``infos[i]["row"]`` (unique per
    input row; a transform that copies an info into an added row copies the tag too, which is why a row counts as
    kept only if it equals its input row)."""
    n_in = len(before["group_ids"])
    if after is None:
        assert may_drop, "the transform dropped the whole batch"
        return Report()
    n = len(after)
    assert n > 0
    for f in LIST_FIELDS:
        assert len(getattr(after, f)) == n, f"{f}: {len(getattr(after, f))} entries for {n} rows"
    width = after.response_mask.shape[1]
    for f in (*TOKEN_FIELDS, "advantages"):
        v = getattr(after, f)
        if v is not None and not (f == "advantages" and v.dim() == 1):
            assert v.shape == (n, width), f"{f} has shape {tuple(v.shape)}, mask {(n, width)}"
    assert after.step == before["step"] and after.temperature == before["temperature"]
    groups_in = set(before["group_ids"])
    assert set(after.group_ids) <= groups_in, f"invented groups {set(after.group_ids) - groups_in}"
    # every row: the mask covers exactly its response tokens; nothing but zeros beyond it
    for i in range(n):
        k = len(after.response_ids[i])
        assert after.response_mask[i].tolist() == [True] * k + [False] * (width - k), f"row {i}: mask vs {k} tokens"
        for f in (*TOKEN_FIELDS[1:], "advantages"):
            v = getattr(after, f)
            if v is not None and v.dim() == 2:
                assert not bool(v[i, k:].any()), f"row {i}: {f} not zero beyond its {k} tokens"
        if after.weights is not None:
            assert torch.isfinite(after.weights[i]) and float(after.weights[i]) >= 0
    # kept rows equal their input rows on every field they may not change
    fields_out = {f: getattr(after, f) for f in ALL_FIELDS}
    w = max(width, before["response_mask"].shape[1])
    report, used = Report(), set()
    for i in range(n):
        info = after.infos[i]
        j = info.get("row") if isinstance(info, dict) else None
        mine = row_of(fields_out, i, w)
        if j is not None and j not in used:
            theirs = row_of(before, j, w)
            diff = [f for f in mine if f not in may_change and mine[f] != theirs[f]]
            if not diff:
                used.add(j)
                report.kept.append((i, j))
                continue
            assert may_add, f"output row {i} (input row {j}) changed {diff}"
        assert may_add, f"output row {i} is not an input row"
        report.added.append(i)
    if not may_drop:
        assert len(report.kept) == n_in, f"dropped input rows {sorted(set(range(n_in)) - used)}"
    if ordered:
        kept_in = [j for _, j in report.kept]
        assert kept_in == sorted(kept_in), "kept rows changed order"
    if whole_groups:  # a group is kept whole or dropped whole
        for g in set(after.group_ids):
            rows_in = {j for j in range(n_in) if before["group_ids"][j] == g}
            assert rows_in <= used, f"group {g} lost rows {sorted(rows_in - used)}"
    # added rows sit in an existing group: its prompt, its prompt ids
    for i in report.added:
        g = after.group_ids[i]
        j = before["group_ids"].index(g)
        assert after.prompts[i] == before["prompts"][j] and after.prompt_ids[i] == before["prompt_ids"][j]
        assert isinstance(after.texts[i], str) and isinstance(after.infos[i], dict)
    return report


# -- random ragged batches -------------------------------------------------------------------------------------------
def garbage_row(draw: Callable) -> tuple[list[int], str]:
    k = draw(st.integers(0, 7))
    ids = draw(st.lists(st.integers(4, 2000), min_size=k, max_size=k))
    return ids, TOKENIZER.decode(ids, skip_special_tokens=True)


def countdown_row(draw: Callable, numbers: list[int], target: int) -> tuple[list[int], str, str]:
    """An overthought, plain, re-formatted or garbage Countdown response (the kind says which)."""
    kind = draw(st.sampled_from(["overthought", "plain", "formatted", "garbage"]))
    if kind == "garbage":
        return *garbage_row(draw), kind
    plain, over = overthink(numbers, target, draw(st.integers(0, 10_000)), extra=draw(st.integers(1, 3)))
    text = {"overthought": over, "plain": plain,
            "formatted": plain.replace("<answer>", "<answer>(").replace("</answer>", ")</answer>")}[kind]
    ids = list(TOKENIZER(text, add_special_tokens=False)["input_ids"])
    return ids + ([TOKENIZER.eos_token_id] if draw(st.booleans()) else []), text, kind


@st.composite
def ragged_batches(draw: Callable, countdown: bool = False) -> GroupBatch:
    """1-4 groups of 1-6 rows, responses of 0-7 tokens (Countdown traces when ``countdown``), random rewards,
    correctness, log-probs, entropies, finish reasons, weights, replay flags and extra padding; rows of a group
    interleaved with other groups' rows; duplicate responses within a group now and then."""
    samples = []
    for g in range(draw(st.integers(1, 4))):
        gid = f"1:0:{g}:task-{g}"
        prompt_ids = draw(st.lists(st.integers(4, 50), min_size=1, max_size=4))
        task = SOURCE.task(draw(st.integers(0, 500)))
        numbers, target = task.metadata["numbers"], int(task.answer)
        rewards = draw(st.sampled_from(["binary", "float", "constant"]))
        for j in range(draw(st.integers(1, 6))):
            kind = "random"
            if countdown:
                ids, text, kind = countdown_row(draw, numbers, target)
            elif j and draw(st.integers(0, 3)) == 0:  # a duplicate of the previous response
                ids, text = list(samples[-1].response_ids), samples[-1].text
            else:
                ids, text = garbage_row(draw)
            correct = kind in ("overthought", "plain", "formatted") or draw(st.booleans())
            reward = {"binary": float(correct), "constant": 0.5,
                      "float": draw(st.floats(-2, 2, allow_nan=False, width=32))}[rewards]
            k = len(ids)
            lps = draw(st.lists(st.floats(-8, -0.125, width=32), min_size=k, max_size=k))
            ents = draw(st.lists(st.floats(0.125, 3, width=32), min_size=k, max_size=k))
            samples.append(Sample(gid, f"prompt {g}", prompt_ids, ids, text, reward=reward, correct=correct,
                                  logprobs=lps, entropies=ents, finish_reason=draw(st.sampled_from(
                                      ["stop", "length", "abort"])),
                                  info={"kind": kind, "answer": str(target),
                                        "metadata": {"numbers": numbers, "target": target}}))
    batch = GroupBatch.from_samples(samples, step=3, tokenizer=TOKENIZER if countdown else None)
    perm = draw(st.permutations(range(len(batch))))  # interleave the groups
    batch = batch.select(perm)
    for i in range(len(batch)):
        batch.infos[i] = {**batch.infos[i], "row": i}  # tags in the order the transform sees
    pad = draw(st.integers(0, 3))  # padding past the longest response
    for f in ("response_mask", "behaviour_logprobs", "entropies"):
        v = getattr(batch, f)
        setattr(batch, f, torch.cat([v, torch.zeros(len(batch), pad, dtype=v.dtype)], 1))
    batch.base_rewards = batch.rewards.clone()
    if draw(st.booleans()):
        batch.weights = torch.tensor(draw(st.lists(st.floats(0, 2, width=32), min_size=len(batch),
                                                   max_size=len(batch))))
    if draw(st.booleans()):
        batch.off_policy = torch.tensor(draw(st.lists(st.booleans(), min_size=len(batch), max_size=len(batch))))
    return batch


# -- transform-specific checks -----------------------------------------------------------------------------------------
def drops_zero_variance(tol: float) -> Callable:
    """``dapo`` (tol 1e-8) and the ``drop_zero_variance`` rule (1e-12): a group is dropped iff the population std of
    its rewards is at most ``tol``."""

    def check(before: dict[str, Any], after: GroupBatch | None, report: Report, params: dict) -> None:
        for g in set(before["group_ids"]):
            r = np.array([before["rewards"][j].item() for j in range(len(before["group_ids"]))
                          if before["group_ids"][j] == g], dtype=np.float64)
            kept = after is not None and g in after.group_ids
            assert kept == bool(r.std() > tol), f"group {g} rewards {r.tolist()} kept={kept}"

    return check


def weights(w: torch.Tensor | None, n: int) -> torch.Tensor:
    return torch.ones(n) if w is None else w


def check_reweight_only(before: dict[str, Any], after: GroupBatch | None, report: Report, params: dict) -> None:
    """A pure reweighting keeps every row (weights may only shrink, to a factor in [0, 1])."""
    assert after is not None and len(report.kept) == len(before["group_ids"]) == len(after)
    assert torch.all(weights(after.weights, len(after)) <= weights(before["weights"], len(after)) + 1e-6)


def check_duet(before: dict[str, Any], after: GroupBatch | None, report: Report, params: dict) -> None:
    check_reweight_only(before, after, report, params)
    w0, w1 = weights(before["weights"], len(after)), weights(after.weights, len(after))
    for i, j in report.kept:
        factor = params["abort_weight"] if before["finish_reasons"][j] == "abort" else 1.0
        assert float(w1[i]) == pytest.approx(float(w0[j]) * factor, abs=1e-6)


def check_dre(before: dict[str, Any], after: GroupBatch | None, report: Report, params: dict) -> None:
    """DRE adds edits only: each after a correct, overthought original of its group, at most ``max_edits`` per group,
    shorter, correct, with the original's prefix, info (plus the flag) and a reward above the original's."""
    assert after is not None and [i for i, _ in report.kept] == list(range(len(before["group_ids"])))
    per_group: dict[str, int] = {}
    for i in report.added:
        info = after.infos[i]
        j = info["row"]
        g = before["group_ids"][j]
        per_group[g] = per_group.get(g, 0) + 1
        assert after.group_ids[i] == g and bool(before["correct"][j]) and info["dre_edit"] is True
        assert info == {**before["infos"][j], "parsed_answer": info["parsed_answer"], "dre_edit": True}
        assert info["kind"] == "overthought"
        ids, orig = after.response_ids[i], before["response_ids"][j]
        assert len(ids) < len(orig)
        saved = 1 - len(ids) / len(orig)
        assert float(after.rewards[i]) == pytest.approx(float(before["rewards"][j]) + params["length_bonus"] * saved,
                                                        abs=1e-5)
        assert float(after.rewards[i]) > float(before["rewards"][j])
        assert float(after.base_rewards[i]) == float(before["base_rewards"][j]) and bool(after.correct[i])
        assert after.texts[i] == TOKENIZER.decode(ids, skip_special_tokens=True)
        meta = info["metadata"]
        assert verify(meta["numbers"], meta["target"], after.texts[i]).correct
        common = next((t for t, (a, b) in enumerate(zip(ids, orig)) if a != b), min(len(ids), len(orig)))
        lp, lp0 = after.behaviour_logprobs[i], before["behaviour_logprobs"][j]
        for t in range(len(ids)):  # copy mode: the sampler's value on kept prefix tokens, 0 (unknown) after them
            assert float(lp[t]) in ((float(lp0[t]), 0.0) if t < common else (0.0,))
        assert (ids[-1] == TOKENIZER.eos_token_id) == (orig[-1] == TOKENIZER.eos_token_id)
    for g in set(before["group_ids"]):  # every group got as many edits as it had overthought correct rows, capped
        over = sum(1 for j, gj in enumerate(before["group_ids"]) if gj == g and before["infos"][j]["kind"] ==
                   "overthought" and bool(before["correct"][j]))
        assert per_group.get(g, 0) == min(over, params["max_edits"]), f"group {g}"


@dataclass(frozen=True)
class TransformCase:
    name: str
    params: dict = field(default_factory=dict)
    may_change: tuple[str, ...] = ()  # per-row fields a kept row may change (reweighting: weights)
    may_add: bool = False
    may_drop: bool = True
    whole_groups: bool = True  # drops whole groups only (a within-group resampler sets False)
    ordered: bool = True
    countdown: bool = False  # batches of Countdown traces with a tokenizer (what DRE edits)
    check: Callable | None = None

    @property
    def id(self) -> str:
        return f"{self.name}-{'-'.join(str(v) for v in self.params.values())}" if self.params else self.name


WEIGHTS = ("weights",)
CASES = [
    TransformCase("none", may_drop=False),
    TransformCase("dapo", check=drops_zero_variance(1e-8)),
    TransformCase("data_policy", {"rules": ["drop_zero_variance"]}, check=drops_zero_variance(1e-12)),
    TransformCase("data_policy", {"rules": ["truncated=0.5", "dedupe"]}, WEIGHTS, may_drop=False,
                  check=check_reweight_only),
    TransformCase("data_policy", {"rules": ["cap_group=1.5"]}, WEIGHTS, may_drop=False, check=check_reweight_only),
    TransformCase("data_policy", {"rules": ["drop_zero_variance", "truncated=0.25", "dedupe", "cap_group=2"]},
                  WEIGHTS, check=drops_zero_variance(1e-12)),
    TransformCase("duet_reweight", {"abort_weight": 0.5}, WEIGHTS, may_drop=False, check=check_duet),
    TransformCase("dre", {"logprobs": "copy", "length_bonus": 0.5, "max_edits": 2}, may_add=True, may_drop=False,
                  countdown=True, check=check_dre),
    # QLPO drops rows inside a group (resampling it down to group_size), never whole groups
    TransformCase("qlpo", {"group_size": 3, "beta": 0.5}, whole_groups=False),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_group_transform_keeps_rows_aligned(case: TransformCase, data) -> None:
    batch = data.draw(ragged_batches(countdown=case.countdown))
    before = snapshot(batch)
    after = build("group_transform", case.name, copy.deepcopy(case.params))(batch)
    report = check_aligned(before, after, may_change=case.may_change, may_add=case.may_add, may_drop=case.may_drop,
                           whole_groups=case.whole_groups, ordered=case.ordered)
    if case.check is not None:
        case.check(before, after, report, case.params)


def test_checker_catches_misalignment() -> None:
    """The checker itself: a shifted log-prob row, an invented group and a bad mask are caught."""
    samples = [Sample("a", "p", [1], [5, 6], "x", reward=1.0, logprobs=[-1, -2], info={"row": 0}),
               Sample("a", "p", [1], [7, 8], "y", reward=0.0, logprobs=[-3, -4], info={"row": 1}),
               Sample("a", "p", [1], [9], "z", reward=0.0, logprobs=[-5], info={"row": 2})]
    b = GroupBatch.from_samples(samples)
    before = snapshot(b)
    bad = b.select([0, 1, 2])
    bad.behaviour_logprobs[[0, 1]] = bad.behaviour_logprobs[[1, 0]]  # two rows' log-probs swapped
    with pytest.raises(AssertionError, match="changed"):
        check_aligned(before, bad)
    invented = b.select([0, 1, 2])
    invented.group_ids = ["a", "zzz", "a"]
    with pytest.raises(AssertionError, match="invented"):
        check_aligned(before, invented, may_add=True)
    mask = b.select([0, 1, 2])
    mask.response_mask = torch.ones_like(mask.response_mask)
    with pytest.raises(AssertionError, match="mask"):
        check_aligned(before, mask)
    with pytest.raises(AssertionError, match="lost rows"):
        check_aligned(before, b.select([0, 2]))
    with pytest.raises(AssertionError, match="order"):
        check_aligned(before, b.select([1, 0, 2]))
    with pytest.raises(AssertionError, match="dropped input rows"):
        check_aligned(before, b.select([0, 1]), may_drop=False, whole_groups=False)
    report = check_aligned(before, b.select([0, 1, 2]))
    assert report.kept == [(0, 0), (1, 1), (2, 2)] and report.added == []
