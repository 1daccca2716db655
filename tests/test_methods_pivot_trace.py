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
