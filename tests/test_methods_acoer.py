"""ACOER: the correct-only efficiency reward, its control loop (alpha, EMAs, budget), state, and a run in the trainer."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from test_grpo_trainer import trainer

from agents.grpo.batch import GroupBatch, Sample
from agents.grpo.registry import build
from agents.methods.acoer import efficiency

# ln 6 = 1.7917595; ln 3.5 = 1.2527630; ln 4.75 = 1.5581447
EFF_HALF = 0.6991803  # L/B = 1/2: ln(1 + 5 * 0.5) / ln 6 = 1.2527630 / 1.7917595
EFF_QUARTER = 0.8696171  # L/B = 1/4: ln(1 + 5 * 0.75) / ln 6 = 1.5581447 / 1.7917595


def rows(outcomes: list[int], lengths: list[int], off_policy: list[bool] | None = None) -> GroupBatch:
    b = GroupBatch.from_samples([Sample("1:0:0:t", "p", [1], [2] * n, "x" * n, reward=float(ok), correct=bool(ok))
                                 for ok, n in zip(outcomes, lengths)], step=1)
    if off_policy is not None:
        b.off_policy = torch.tensor(off_policy)
    return b


def test_efficiency_golden():
    out = efficiency(torch.tensor([0, 50, 100, 150]), 100.0)  # L/B = 0, 1/2, 1, capped at 1
    torch.testing.assert_close(out, torch.tensor([1.0, EFF_HALF, 0.0, 0.0], dtype=torch.float64), atol=1e-6, rtol=0)
    assert float(efficiency(torch.tensor([20]), 80.0)[0]) == pytest.approx(EFF_QUARTER, abs=1e-6)


def test_reward_golden_with_the_run_cap_as_first_budget():
    shaper = build("reward_shaper", "acoer", {"b_min": 16})
    # no correct length seen: B = max_new_tokens = 100 (>= b_min 16)
    shaper.bind(SimpleNamespace(cfg=SimpleNamespace(max_new_tokens=100)))
    assert shaper.budget == 100.0
    out = shaper(rows([1, 1, 0, 1], [50, 100, 50, 0]))
    # correct: 1 + 0.02 * eff; L=50 -> eff(1/2); L=100 -> 0; incorrect -> 0 whatever its length; L=0 -> eff 1
    torch.testing.assert_close(out, torch.tensor([1 + 0.02 * EFF_HALF, 1.0, 0.0, 1.02]), atol=1e-6, rtol=0)
    assert shaper.metrics()["bonus_mean"] == pytest.approx(0.02 * (EFF_HALF + 0 + 1) / 3, abs=1e-7)


def test_first_budget_without_a_trainer_is_no_bonus_and_b_init_is_floored():
    plain = build("reward_shaper", "acoer", {})
    torch.testing.assert_close(plain(rows([1, 0, 1], [3, 3, 700])), torch.tensor([1.0, 0.0, 1.0]))
    assert plain.metrics()["budget"] == 0.0
    # b_init 40 under the floor b_min 50: B = 50; L = 25 -> eff(1/2)
    floored = build("reward_shaper", "acoer", {"b_init": 40, "b_min": 50, "alpha0": 0.1})
    floored.bind(SimpleNamespace(cfg=SimpleNamespace(max_new_tokens=100)))  # b_init wins over the cap
    assert floored.budget == 50.0
    assert float(floored(rows([1], [25]))[0]) == pytest.approx(1 + 0.1 * EFF_HALF, abs=1e-6)


def test_control_loop_golden():
    s = build("reward_shaper", "acoer", {"alpha0": 0.1, "alpha_min": 0.01, "alpha_max": 0.3, "growth": 1.5,
                                         "decay": 0.5, "drop": 0.02, "window": 2, "ema": 0.5, "budget_frac": 0.5,
                                         "b_min": 2})
    steps = [  # (outcomes, lengths) -> (acc_ema, len_ema, alpha, budget) after observe
        # acc 1, correct mean len 6: EMAs start there; history [1]: no window yet; B = max(2, .5 * 6) = 3
        (([1, 1, 1, 1], [4, 4, 8, 8]), (1.0, 6.0, 0.1, 3.0)),
        # acc .5, correct lens 2, 6 -> 4: acc .5*1 + .5*.5 = .75, len .5*6 + .5*4 = 5; history [1, .75]; B 2.5
        (([1, 0, 1, 0], [2, 9, 6, 9]), (0.75, 5.0, 0.1, 2.5)),
        # acc .5, lens 2, 2: acc .625, len 3.5; 1 - .625 = .375 > .02 fell: alpha .1 * .5 = .05; B max(2, 1.75) = 2
        (([1, 0, 1, 0], [2, 9, 2, 9]), (0.625, 3.5, 0.05, 2.0)),
        # acc 1, len 4: acc .8125, len 3.75; .75 - .8125 < 0: alpha .05 * 1.5 = .075; B max(2, 1.875) = 2
        (([1, 1, 1, 1], [4, 4, 4, 4]), (0.8125, 3.75, 0.075, 2.0)),
        # acc 0, no correct length (len_ema kept): acc .40625; .625 - .40625 = .21875 fell: alpha .0375
        (([0, 0, 0, 0], [1, 1, 1, 1]), (0.40625, 3.75, 0.0375, 2.0)),
        # acc 1: acc .703125; .8125 - .703125 = .109375 fell: alpha .01875
        (([1, 1, 1, 1], [4, 4, 4, 4]), (0.703125, 3.875, 0.01875, 2.0)),
        # acc 1: acc .8515625; .40625 - .8515625 < 0: alpha .028125; len .5*3.875 + .5*4 = 3.9375, B 2
        (([1, 1, 1, 1], [4, 4, 4, 4]), (0.8515625, 3.9375, 0.028125, 2.0)),
    ]
    for (outcomes, lengths), (acc, length, alpha, budget) in steps:
        s.observe(rows(outcomes, lengths))
        m = s.metrics()
        assert (m["ema_accuracy"], m["ema_correct_len"]) == pytest.approx((acc, length))
        assert (m["alpha"], m["budget"]) == pytest.approx((alpha, budget))
    # the shaped reward uses the state: B = 2, alpha .028125; L = 1 -> eff(1/2), L >= 2 -> 0
    torch.testing.assert_close(s(rows([1, 1, 0], [1, 3, 1])), torch.tensor([1 + 0.028125 * EFF_HALF, 1.0, 0.0]),
                               atol=1e-6, rtol=0)


def test_alpha_is_clamped_and_waits_for_warmup():
    up = build("reward_shaper", "acoer", {"alpha0": 0.4, "alpha_max": 0.5, "growth": 1.5, "window": 1, "ema": 1.0})
    for _ in range(3):
        up.observe(rows([1, 0], [5, 5]))
    assert up.alpha == 0.5  # .4 (history of 1) -> min(.5, .6) -> .5
    down = build("reward_shaper", "acoer", {"alpha0": 0.015, "alpha_min": 0.01, "decay": 0.5, "window": 1,
                                            "ema": 1.0})
    for acc in ([1, 1], [1, 0], [0, 0]):
        down.observe(rows(acc, [5, 5]))
    assert down.alpha == 0.01  # .015 -> (fell .5) max(.01, .0075) -> (fell .5) .01
    late = build("reward_shaper", "acoer", {"growth": 2.0, "window": 1, "warmup": 3, "alpha_max": 0.5})
    for _ in range(4):
        late.observe(rows([1], [5]))
    assert late.alpha == pytest.approx(0.04)  # updates 1-3 in warm-up; update 4 doubles .02


def test_observe_reads_env_flags_of_fresh_rows_only():
    s = build("reward_shaper", "acoer", {"ema": 1.0, "b_min": 1, "budget_frac": 1.0})
    b = rows([1, 0, 1, 1], [2, 9, 30, 40], off_policy=[False, False, True, True])
    b.rewards = torch.tensor([5.0, 5.0, 5.0, 5.0])  # a shaped reward must not matter
    s.observe(b)
    assert s.acc_ema == 0.5 and s.len_ema == 2.0 and s.budget == 2.0  # replayed rows ignored
    s.observe(rows([1], [4], off_policy=[True]))  # nothing fresh: no update
    assert s.updates == 1


def test_state_round_trip():
    params = {"window": 2, "ema": 0.3, "growth": 1.2, "b_min": 1}
    a = build("reward_shaper", "acoer", params)
    a.bind(SimpleNamespace(cfg=SimpleNamespace(max_new_tokens=64)))
    for outcomes, lengths in (([1, 0, 1], [3, 7, 5]), ([0, 0, 1], [2, 2, 9]), ([1, 1, 1], [4, 6, 8]),
                              ([0, 0, 0], [1, 1, 1]), ([1, 0, 0], [2, 3, 4])):
        a(rows(outcomes, lengths))
        a.observe(rows(outcomes, lengths))
    b = build("reward_shaper", "acoer", params)  # never bound: its first budget would be "none"
    b.load_state_dict(a.state_dict())
    for outcomes, lengths in (([1, 1, 0], [1, 2, 3]), ([1, 0, 1], [6, 1, 2])):
        batch = rows(outcomes, lengths)
        assert torch.equal(a(batch), b(batch))
        a.observe(batch)
        b.observe(batch)
        assert a.metrics() == b.metrics() and a.state_dict() == b.state_dict()


@pytest.mark.parametrize("bad", [{"alpha0": 0.9}, {"alpha_min": 0.0}, {"window": 0}, {"ema": 0.0}, {"decay": 1.5},
                                 {"growth": 0.9}, {"b_min": 0}, {"budget_frac": -1}, {"b_init": 0}, {"warmup": -1}])
def test_bad_hyper_parameters_name_the_key(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        build("reward_shaper", "acoer", bad)


def test_malformed_output_never_crashes():
    s = build("reward_shaper", "acoer", {"b_init": 8, "b_min": 1})
    b = GroupBatch.from_samples([Sample("g", "p", [1], [], "", reward=1.0, correct=True),
                                 Sample("g", "p", [1], [2] * 50, "\x00garbage", reward=0.0, correct=False)])
    torch.testing.assert_close(s(b), torch.tensor([1.02, 0.0]))  # empty correct answer: full bonus
    s.observe(b)
    assert s.budget == 1.0  # 0.85 * mean correct length 0, floored at b_min


def test_acoer_runs_in_the_trainer(tmp_path):
    t = trainer(tmp_path, steps=3, max_new_tokens=4, stages={"reward_shaper": "acoer"},
                params={"rollout_allocator": {"n": 4}, "reward_shaper": {"window": 1, "ema": 0.5, "b_min": 1,
                                                                         "growth": 1.5}})
    train = [r for r in t.run(resume=False) if r["kind"] == "train"]
    assert len(train) == 3
    for r in train:
        assert {"reward_shaper.alpha", "reward_shaper.budget", "reward_shaper.ema_accuracy"} <= set(r)
        assert 1 <= r["reward_shaper.budget"] <= 4  # first the run's cap, then .85 * EMA correct length
        assert r["shaped_reward_mean"] >= r["reward_mean"]  # correct: 1 + bonus, incorrect: 0 (toy rewards are 0/1)
    assert train[0]["reward_shaper.alpha"] == pytest.approx(0.02)  # history of one: no window yet
