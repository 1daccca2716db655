"""ERR+'s mechanism (issue 45, build item 5): the entropy-relief bonus pays traces whose entropy drops, not traces whose
entropy stays flat, and the logged bonus statistics (agents/methods/err_plus.py) say how often the cap cuts the
reward, on constructed batches whose answers are known by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agents.grpo.batch import GroupBatch, Sample
from agents.grpo.registry import build
from agents.methods.err_plus import entropy_relief


def _sample(entropies: list[float], correct: bool, group: str = "g") -> Sample:
    n = len(entropies)
    return Sample(group, "p", [9], [5] * n, "t" * n, reward=float(correct), correct=correct, entropies=entropies)


def _batch(samples: list[Sample], step: int = 0) -> GroupBatch:
    return GroupBatch.from_samples(samples, step=step)


def test_relief_pays_an_entropy_drop_and_not_a_flat_or_rising_trace():
    length = 32
    flat = torch.full((length,), 2.0)
    rising = torch.linspace(0.5, 3.0, length)
    dropping = torch.linspace(3.0, 0.5, length)  # resolves its uncertainty: 2.5 nats down over the trace
    # steps of 2.5 / 31 nats clear delta = 0.01: the relief is the whole drop less 31 deltas, over log(T + 1)
    assert entropy_relief(dropping) == pytest.approx((2.5 - 31 * 0.01) / np.log(length + 1), rel=1e-5)
    assert entropy_relief(flat) == 0.0 and entropy_relief(rising) == 0.0
    # the shaper: same base reward, the dropping trace is the only one lifted
    shaped = build("reward_shaper", "err", {})(_batch([_sample(t.tolist(), False) for t in (flat, rising, dropping)]))
    assert float(shaped[0]) == float(shaped[1]) == 0.0
    assert float(shaped[2]) == pytest.approx(0.3 * entropy_relief(dropping), rel=1e-6)
    # noise below delta is no relief: an oscillation of 0.005 nats earns nothing however long the trace
    jitter = torch.tensor([2.0, 1.995] * 40)
    assert entropy_relief(jitter) == 0.0


def test_logged_bonus_distribution_and_share_at_the_cap():
    # bonuses 0.3 * drop / log(3) on 2-token traces: drop d -> relief (d - 0.01) / log 3
    drops = [0.01, 1.0, 3.0, 6.0, 10.0]  # the first earns nothing (the drop does not clear delta)
    correct = [True, False, True, False, False]
    samples = [_sample([d + 1.0, 1.0], c) for d, c in zip(drops, correct)]
    comp = build("reward_shaper", "err", {})
    shaped = comp(_batch(samples))
    bonus = np.array([0.3 * max(0.0, d - 0.01) / np.log(3) for d in drops])
    raw = np.array(correct, dtype=float) + bonus
    np.testing.assert_allclose(shaped.double().numpy(), np.minimum(raw, 1.5), rtol=1e-5)
    m = comp.metrics()
    assert m["bonus_mean"] == pytest.approx(bonus.mean(), rel=1e-6)
    assert m["bonus_p10"] == pytest.approx(np.quantile(bonus, 0.1), rel=1e-6)
    assert m["bonus_p90"] == pytest.approx(np.quantile(bonus, 0.9), rel=1e-6)
    assert m["bonus_max"] == pytest.approx(bonus.max(), rel=1e-6)
    # raw rewards 1.00, 0.27, 1.82, 1.64, 2.73: three above the 1.5 cap, two of them among the three incorrect ones
    assert m["cap_share"] == pytest.approx(3 / 5)
    assert m["cap_share_incorrect"] == pytest.approx(2 / 3)
    assert m["incorrect_at_or_above_correct"] == pytest.approx(2 / 3)
    assert comp.metrics() == {}  # read once per step


def test_bonus_length_correlation_and_the_err_plus_phases():
    # longer traces drop further here: the bonus grows with length (correlation close to 1)
    samples = [_sample(torch.linspace(1.0 + n / 8, 1.0, n).tolist(), False) for n in (4, 8, 16, 32)]
    comp = build("reward_shaper", "err_plus", {"switch_step": 3})
    comp(_batch(samples, step=1))
    m = comp.metrics()
    lengths = np.array([4, 8, 16, 32])
    bonus = np.array([0.3 * entropy_relief(torch.linspace(1.0 + n / 8, 1.0, n)) for n in lengths])
    assert m["bonus_len_corr"] == pytest.approx(np.corrcoef(bonus, lengths)[0, 1], rel=1e-6)
    assert m["bonus_len_corr"] > 0.9
    comp(_batch(samples, step=3))  # the RRER phase: no entropy bonus, nothing to report
    assert comp.metrics() == {}


def test_constant_bonus_has_no_correlation_and_faithful_rewards_are_unchanged():
    flat = [_sample([1.0] * n, True) for n in (3, 5)]
    comp = build("reward_shaper", "err", {})
    torch.testing.assert_close(comp(_batch(flat)), torch.ones(2))
    m = comp.metrics()
    assert "bonus_len_corr" not in m and "cap_share_incorrect" not in m
    assert m["cap_share"] == 0.0 and m["bonus_max"] == 0.0


def test_the_bonus_statistics_reach_the_trainers_step_records(tmp_path):
    from test_grpo_trainer import trainer

    t = trainer(tmp_path, steps=3, max_new_tokens=4, stages={"reward_shaper": "err_plus"},
                params={"rollout_allocator": {"n": 4}, "reward_shaper": {"switch_step": 3}})
    train = [r for r in t.run(resume=False) if r["kind"] == "train"]
    assert [r["step"] for r in train] == [1, 2, 3]
    for r in train[:2]:  # the ERR phase
        assert {"reward_shaper.bonus_mean", "reward_shaper.bonus_p90", "reward_shaper.cap_share"} <= set(r)
        assert 0.0 <= r["reward_shaper.cap_share"] <= 1.0
        assert r["reward_shaper.bonus_max"] >= r["reward_shaper.bonus_p90"] >= r["reward_shaper.bonus_p10"] >= 0.0
    assert not any(k.startswith("reward_shaper.") for k in train[2])  # RRER: no entropy bonus


def test_per_token_rescaling_does_not_pay_length_and_keeps_the_reward_gap():
    """The declared rescaling (``normalize = "tokens"``, recipe err_plus_per_token): a trace that repeats the same
    entropy saw-tooth twice as long earns more under the paper's log(T + 1) normalization and the same per token."""
    tooth = [3.0, 2.0, 1.0]  # two 1-nat drops, then a rise back to 3
    short, long = torch.tensor(tooth * 8), torch.tensor(tooth * 32)
    assert entropy_relief(long) > 2 * entropy_relief(short)  # the paper's bonus grows with length
    per_token = entropy_relief(short, normalize="tokens")
    assert entropy_relief(long, normalize="tokens") == pytest.approx(per_token, rel=0.05)
    # two drops of (1 - delta) per 3 transitions
    assert per_token == pytest.approx(16 * 0.99 / 23, rel=1e-6)
    shaper = build("reward_shaper", "err", {"normalize": "tokens"})
    shaped = shaper(_batch([_sample(long.tolist(), False), _sample(short.tolist(), True)]))
    assert float(shaped[0]) < 0.5 < 1.0 <= float(shaped[1])  # a wrong trace stays under a right one
    with pytest.raises(ValueError, match="normalize"):
        build("reward_shaper", "err", {"normalize": "length"})


def test_the_rescaled_recipe_differs_from_the_faithful_one_only_in_its_normalization():
    from agents.grpo.config import load_recipe

    faithful, rescaled = load_recipe("err_plus", lane="micro").to_dict(), load_recipe("err_plus_per_token",
                                                                                      lane="micro").to_dict()
    assert rescaled["params"]["reward_shaper"]["err"].pop("normalize") == "tokens"
    for cfg in (faithful, rescaled):
        cfg.pop("out_dir"), cfg.pop("description")
    assert faithful == rescaled
