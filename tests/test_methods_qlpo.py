"""QLPO: ratio-keeping counts, rank weights, the resampling draw (golden, statistical, property), state, trainer."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_grpo_trainer import trainer

from agents.grpo.batch import GroupBatch, Sample
from agents.grpo.registry import build
from agents.methods.qlpo import kept_correct, length_probs, mean_ranks


def group_batch(groups: list[list[tuple[int, int]]], *, seed: int = 0) -> GroupBatch:
    """Groups of (correct, length) rows, with distinct random per-token log-probs and entropies and per-row weights;
    ``infos[i]["row"]`` names the input row."""
    gen = np.random.default_rng(seed)
    samples, k = [], 0
    for j, rows in enumerate(groups):
        for ok, n in rows:
            samples.append(Sample(f"1:0:{j}:t{j}", "p", [1], [2 + k % 5] * n, f"r{k}", reward=float(ok),
                                  correct=bool(ok), logprobs=list(-gen.random(n)), entropies=list(gen.random(n)),
                                  info={"row": k}))
            k += 1
    b = GroupBatch.from_samples(samples, step=1)
    b.weights = torch.as_tensor(gen.random(len(b)), dtype=torch.float32)
    return b


def test_kept_correct_golden():
    assert kept_correct(3, 16, 8) == 2  # 8 * 3/16 = 1.5, half up -> 2
    assert kept_correct(5, 16, 8) == 3  # 2.5 -> 3
    assert kept_correct(7, 12, 8) == 5  # 4.67 -> 5
    assert kept_correct(1, 16, 8) == 1  # 0.5 -> 1
    assert kept_correct(15, 16, 8) == 7  # 7.5 -> 8, but a mixed group keeps one incorrect row
    assert kept_correct(0, 16, 8) == 0 and kept_correct(16, 16, 8) == 8
    assert kept_correct(1, 32, 4) == 1  # 0.125 -> 0, a mixed group keeps one correct row
    assert kept_correct(1, 32, 4, keep_mixed=False) == 0


def test_rank_weights_golden():
    # ranks 0, 1, 2: exp(0), exp(-1), exp(-2) = 1, .367879, .135335 over 1.503214
    torch.testing.assert_close(torch.tensor(length_probs(np.array([10, 20, 30]), 1.0, prefer="short")),
                               torch.tensor([0.665241, 0.244728, 0.090031], dtype=torch.float64), atol=1e-6, rtol=0)
    torch.testing.assert_close(torch.tensor(length_probs(np.array([10, 20, 30]), 1.0, prefer="long")),
                               torch.tensor([0.090031, 0.244728, 0.665241], dtype=torch.float64), atol=1e-6, rtol=0)
    # ties share the mean rank .5: exp(-.5), exp(-.5), exp(-2) = .606531, .606531, .135335 over 1.348397
    assert mean_ranks(np.array([10.0, 10.0, 30.0])).tolist() == [0.5, 0.5, 2.0]
    torch.testing.assert_close(torch.tensor(length_probs(np.array([10, 10, 30]), 1.0, prefer="short")),
                               torch.tensor([0.449816, 0.449816, 0.100368], dtype=torch.float64), atol=1e-6, rtol=0)
    assert length_probs(np.array([3, 1, 2]), 0.0, prefer="short").tolist() == pytest.approx([1 / 3] * 3)


def test_large_beta_keeps_shortest_correct_and_longest_incorrect():
    # M = 6, c = 3, G = 4: k = floor(4 * 3/6 + .5) = 2 correct, 2 incorrect
    b = group_batch([[(1, 5), (1, 1), (1, 3), (0, 2), (0, 8), (0, 4)]])
    q = build("group_transform", "qlpo", {"group_size": 4, "beta": 1e6})
    out = q(b)
    assert [info["row"] for info in out.infos] == [1, 2, 4, 5]  # correct lengths 1, 3; incorrect 8, 4; input order
    m = q.metrics()
    # kept lengths 1, 3, 8, 4 -> 4.0; dropped 5, 2 -> 3.5; accuracy of kept 2/4
    assert m == {"kept_rows": 4, "dropped_rows": 2, "resampled_groups": 1, "kept_len_mean": 4.0,
                 "dropped_len_mean": 3.5, "kept_accuracy": 0.5}
    assert q.metrics()["kept_rows"] == 0  # counts restart each step


def test_draw_frequencies_follow_the_rank_weights():
    # one all-correct group of 4 cut to G = 1 at beta = 1: P(shortest) = 1 / (1 + e^-1 + e^-2 + e^-3) = 1/1.553001
    q = build("group_transform", "qlpo", {"group_size": 1, "beta": 1.0, "seed": 3})
    b = group_batch([[(1, 4), (1, 1), (1, 3), (1, 2)]])
    picks = [q(b).infos[0]["row"] for _ in range(3000)]
    freq = np.bincount(picks, minlength=4) / len(picks)
    # rows by length 4, 1, 3, 2 -> ranks 3, 0, 2, 1: e^-3, 1, e^-2, e^-1 over 1.553001
    assert freq == pytest.approx([0.032059, 0.643914, 0.087144, 0.236883], abs=0.03)


def test_small_groups_pass_through_and_state_round_trip():
    b = group_batch([[(1, 2), (0, 3)], [(1, 1), (1, 2), (0, 3), (0, 4), (1, 5), (0, 6)]])
    q = build("group_transform", "qlpo", {"group_size": 3, "beta": 0.5, "seed": 7})
    first = q(b)
    assert [info["row"] for info in first.infos][:2] == [0, 1] and len(first) == 5
    other = build("group_transform", "qlpo", {"group_size": 3, "beta": 0.5, "seed": 99})
    other.load_state_dict(q.state_dict())
    for _ in range(5):  # the restored generator draws the same rows as the original, call after call
        assert [i["row"] for i in q(b).infos] == [i["row"] for i in other(b).infos]
    assert q.metrics() == other.metrics()
    untouched = build("group_transform", "qlpo", {"group_size": 8})
    assert untouched(b) is b


@pytest.mark.parametrize("bad", [{"group_size": 0}, {"group_size": 2.5}, {"beta": -1.0}, {"beta": float("nan")}])
def test_bad_hyper_parameters_name_the_key(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        build("group_transform", "qlpo", bad)


def test_malformed_output_never_crashes():
    b = GroupBatch.from_samples([Sample("g", "p", [1], [], "", reward=0.0) for _ in range(3)]
                                + [Sample("g", "p", [1], [5] * 9, "\x00??", reward=0.0)])
    out = build("group_transform", "qlpo", {"group_size": 2, "beta": 50.0})(b)
    assert len(out) == 2 and 9 in out.response_lengths.tolist()  # all incorrect: the longest is favoured


@settings(max_examples=60, deadline=None)
@given(groups=st.lists(st.lists(st.tuples(st.integers(0, 1), st.integers(0, 9)), min_size=1, max_size=12),
                       min_size=1, max_size=5),
       g=st.integers(1, 6), beta=st.floats(0, 3), keep_mixed=st.booleans(), seed=st.integers(0, 2**31))
def test_resampling_properties(groups, g, beta, keep_mixed, seed):
    b = group_batch(groups, seed=seed)
    q = build("group_transform", "qlpo", {"group_size": g, "beta": beta, "keep_mixed": keep_mixed, "seed": seed})
    out = q(b)
    rows = [info["row"] for info in out.infos]
    assert rows == sorted(rows) and len(set(rows)) == len(rows)  # input order, no duplicates
    width = out.response_mask.shape[1]
    for k, i in enumerate(rows):  # every kept row is its input row, all fields aligned
        assert out.group_ids[k] == b.group_ids[i] and out.response_ids[k] == b.response_ids[i]
        assert out.texts[k] == b.texts[i] and out.prompt_ids[k] == b.prompt_ids[i]
        for f in ("rewards", "base_rewards", "correct", "weights"):
            assert torch.equal(getattr(out, f)[k], getattr(b, f)[i]), f
        for f in ("response_mask", "behaviour_logprobs", "entropies"):
            assert torch.equal(getattr(out, f)[k], getattr(b, f)[i, :width]), f
            assert not getattr(b, f)[i, width:].any()  # nothing cut off but padding
    kept = out.groups()
    for gid, idx in b.groups().items():
        m, c = len(idx), int(b.correct[idx].sum())
        mine = kept.get(gid, [])
        assert len(mine) == min(m, g)  # at most G rows, small groups whole
        kc = int(out.correct[mine].sum()) if mine else 0
        if m <= g:
            assert kc == c
            continue
        assert kc == kept_correct(c, m, g, keep_mixed=keep_mixed)
        assert abs(kc - g * c / m) < 1  # the group's correct ratio, to within the rounding
        if not keep_mixed:
            assert abs(kc - g * c / m) <= 0.5


def test_qlpo_runs_in_the_trainer(tmp_path):
    t = trainer(tmp_path, steps=2, prompts_per_step=3, stages={"group_transform": "qlpo"},
                params={"rollout_allocator": {"n": 6}, "group_transform": {"group_size": 4, "beta": 0.5}})
    train = [r for r in t.run(resume=False) if r["kind"] == "train"]
    for r in train:  # 3 prompts x 6 generated, 3 x 4 trained
        assert r["rollouts"] == 18 and r["samples"] == 12
        assert r["group_transform.kept_rows"] == 12 and r["group_transform.dropped_rows"] == 6
