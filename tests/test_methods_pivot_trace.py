"""PivotTrace (agents/methods/pivot_trace.py): pivot density, triage by rank, pseudo-labels by majority vote."""

from __future__ import annotations

import re

import pytest
import torch

from agents.grpo.batch import GroupBatch, Sample
from agents.grpo.registry import build
from agents.methods.pivot_trace import DEFAULT_PIVOTS, majority, pivot_density, triage


def test_pivot_density_counts_pivot_words_and_entropy_spikes():
    pattern = re.compile(DEFAULT_PIVOTS)
    flat = torch.ones(10)
    assert pivot_density("Wait, 2+2. But no. Alternatively 4", flat, 10, pattern, 2.0) == pytest.approx(0.3)
    spiky = torch.tensor([1.0] * 9 + [10.0])  # one token 3 std above the mean (z = 2 catches it, z = 4 does not)
    assert pivot_density("plain", spiky, 10, pattern, 2.0) == pytest.approx(0.1)
    assert pivot_density("plain", spiky, 10, pattern, 4.0) == 0.0
    assert pivot_density("Wait", flat, 0, pattern, 2.0) == 0.0
    assert pivot_density("await waiting", flat, 4, pattern, 2.0) == 0.0  # whole words only


def test_triage_by_rank_keeps_one_group_annotated():
    assert triage([0.3, 0.1, 0.9, 0.5, 0.2], 0.4, 0.2) == ["annotate", "pseudo", "skip", "annotate", "pseudo"]
    assert triage([0.1, 0.2], 0.5, 0.5) == ["pseudo", "annotate"]
    assert triage([0.4], 0.5, 0.5) == ["annotate"]
    assert triage([0.2, 0.2, 0.2], 0.0, 0.0) == ["annotate"] * 3
    assert majority(["3", None, "4", "3", ""]) == "3" and majority([None, ""]) is None


def _batch():
    samples = []
    rows = [("g0", "3", True), ("g0", "3", True), ("g0", "5", False),  # calm: pseudo (majority 3)
            ("g1", "Wait 7", False), ("g1", "But 8", True),  # pivots: annotate or skip
            ("g2", "Wait But Hmm 1", False), ("g2", "Alternatively Wait 2", False)]  # most pivots: skip
    for gid, text, correct in rows:
        samples.append(Sample(group_id=gid, prompt="q", prompt_ids=[1], response_ids=[4] * len(text.split()),
                              text=text, reward=float(correct), correct=correct, entropies=[1.0] * len(text.split()),
                              info={"parsed_answer": text.split()[-1]}))
    return GroupBatch.from_samples(samples)


def test_shaper_pays_pseudo_labels_zeroes_skipped_groups_and_keeps_annotated_rewards():
    shaper = build("reward_shaper", "pivot_trace", {"pseudo_frac": 1 / 3, "skip_frac": 1 / 3})
    batch = _batch()
    out = shaper(batch)
    torch.testing.assert_close(out, torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0]))
    m = shaper.metrics()
    assert m["labels_used"] == pytest.approx(1 / 3) and m["pseudo_agreement"] == 1.0
    shaper(batch)
    assert shaper.state_dict() == {"counts": {"pseudo": 2, "annotate": 2, "skip": 2}}
    again = build("reward_shaper", "pivot_trace", {})
    again.load_state_dict(shaper.state_dict())
    assert again.counts == shaper.counts


@pytest.mark.parametrize("bad,key", [({"pseudo_frac": 1.2}, "pseudo_frac"),
                                     ({"pseudo_frac": 0.6, "skip_frac": 0.6}, "pseudo_frac \\+ skip_frac"),
                                     ({"pivot_pattern": "("}, "pivot_pattern"), ({"spike_z": float("nan")}, "spike_z")])
def test_bad_settings_name_the_key(bad, key):
    with pytest.raises(ValueError, match=key):
        build("reward_shaper", "pivot_trace", bad)


def _sample(gid: str, text: str, reward: float, correct: bool, parsed, entropies=None) -> Sample:
    n = len(text.split())
    return Sample(group_id=gid, prompt="q", prompt_ids=[1], response_ids=[4] * n, text=text, reward=reward,
                  correct=correct, entropies=entropies or [1.0] * n, info={"parsed_answer": parsed})


def test_skipped_rewards_are_zeroed_pseudo_labels_replace_env_rewards_and_annotated_ones_pass_through():
    # Groups out of rank order. Pivot densities (flat entropies: no spikes):
    #   hot  (skip):     "Wait But 1" 2/3, "Hmm 2" 1/2         -> group mean 7/12 (most uncertain)
    #   calm (pseudo):   no pivots                             -> 0 (least uncertain)
    #   mid  (annotate): "Wait x 7" 1/3, "y z 8" 0             -> 1/6
    # The env rewards of the skipped and pseudo-labelled groups differ from what the method must pay, so a shaper that
    # passed them through would fail here.
    samples = [_sample("hot", "Wait But 1", 1.0, True, "1"), _sample("hot", "Hmm 2", 0.5, False, "2"),
               _sample("calm", "a b 3", 1.0, True, "3"), _sample("calm", "c d 3", 0.0, False, "3"),
               _sample("calm", "e f 5", 0.0, False, "5"), _sample("calm", "g h", 1.0, True, ""),
               _sample("mid", "Wait x 7", 0.7, True, "7"), _sample("mid", "y z 8", 0.25, False, "8")]
    batch = GroupBatch.from_samples(samples)
    env_rewards = batch.rewards.clone()
    shaper = build("reward_shaper", "pivot_trace", {"pseudo_frac": 1 / 3, "skip_frac": 1 / 3})
    out = shaper(batch)
    # skip: 0, 0 | pseudo: majority "3" -> 1, 1, 0 ("5"), 0 (unparsed) | annotate: the env's 0.7, 0.25
    torch.testing.assert_close(out, torch.tensor([0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.7, 0.25]), atol=0, rtol=0)
    torch.testing.assert_close(batch.rewards, env_rewards, atol=0, rtol=0)  # the batch itself is left alone
    m = shaper.metrics()
    # pseudo reward > 0 vs correct on the calm rows: (T,T) (T,F) (F,F) (F,T) -> 2 of 4 agree
    assert m["pseudo_agreement"] == pytest.approx(0.5)
    assert m["labels_used"] == pytest.approx(1 / 3) and m["step_labels"] == pytest.approx(1 / 3)
    assert m["uncertainty_mean"] == pytest.approx((7 / 12 + 0 + 1 / 6) / 3)
    assert shaper.counts == {"pseudo": 1, "annotate": 1, "skip": 1}


def test_pseudo_label_ties_go_to_the_first_answer_seen_and_an_unparsed_group_pays_nothing():
    # Two calm groups are pseudo-labelled (pseudo_frac 2/3 of 3 groups). "tie": answers 5, 3, 3, 5 -> majority "5"
    # (first seen); the int 5 matches "5" as text. "blank": nothing parses -> 0 throughout although the env paid 1.
    # "spiky": no pivot words, but one entropy spike per response (the micro lane's only pivots): annotated.
    spike = [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 10.0]
    samples = [_sample("tie", "a", 0.0, False, 5), _sample("tie", "b", 1.0, True, "3"),
               _sample("tie", "c", 1.0, True, "3"), _sample("tie", "d", 0.0, False, "5"),
               _sample("spiky", " ".join("x" * 10), 0.4, False, "9", spike),
               _sample("spiky", " ".join("y" * 10), 0.9, True, "9", spike),
               _sample("blank", "e", 1.0, True, None), _sample("blank", "f", 1.0, True, "")]
    shaper = build("reward_shaper", "pivot_trace", {"pseudo_frac": 2 / 3, "skip_frac": 0.0})
    out = shaper(GroupBatch.from_samples(samples))
    torch.testing.assert_close(out, torch.tensor([1.0, 0.0, 0.0, 1.0, 0.4, 0.9, 0.0, 0.0]), atol=0, rtol=0)
    m = shaper.metrics()
    # agreement: tie rows (T,F) (F,T) (F,T) (T,F) -> 0; blank rows (F,T) (F,T) -> 0
    assert m["pseudo_agreement"] == 0.0
    assert m["uncertainty_mean"] == pytest.approx(0.1 / 3)  # spiky: 1 spike / 10 tokens; the others 0


def test_the_most_uncertain_group_is_skipped_by_entropy_spikes_alone():
    # No pivot words anywhere: the spiky group (0.1) outranks the flat one (0) and is skipped whatever it earned.
    spike = [1.0] * 9 + [10.0]
    samples = [_sample("flat", " ".join("a" * 10), 1.0, True, "1"), _sample("flat", " ".join("b" * 10), 0.0, False, "2"),
               _sample("spiky", " ".join("c" * 10), 1.0, True, "3", spike),
               _sample("spiky", " ".join("d" * 10), 1.0, True, "3", spike)]
    shaper = build("reward_shaper", "pivot_trace", {"pseudo_frac": 0.0, "skip_frac": 0.5})
    out = shaper(GroupBatch.from_samples(samples))
    torch.testing.assert_close(out, torch.tensor([1.0, 0.0, 0.0, 0.0]), atol=0, rtol=0)
    assert "pseudo_agreement" not in shaper.metrics()
