"""GARL / PAFT (the Tsallis q-log loss family): golden scales, weights and losses on a 2-group toy batch, q = 0 is the
PPO-clip loss it builds on, micro-batch and permutation invariance, bad hyper-parameters, garbage rows, the trainer."""

from __future__ import annotations

import math

import pytest
import torch
from grpo_toys import make_env
from hypothesis import given, settings
from hypothesis import strategies as st
from test_grpo_formulas import approx, batch_of, random_batch
from test_grpo_trainer import strip, trainer

from agents.grpo.batch import GroupBatch, Sample
from agents.grpo.comparisons import comparisons
from agents.grpo.config import load_recipe
from agents.grpo.registry import build
from agents.methods.garl import garl_scales, paft_weights


def toy_batch() -> GroupBatch:
    """Two groups of 4: g0 = [1, 0, 0, 0] (P_hat 1/4), g1 = [1, 1, 0, 0] (P_hat 1/2); Dr.GRPO advantages r - mean
    (g0: .75, -.25 x3; g1: +-.5), old log-probs -1, lengths g0 [2, 1, 1, 1], g1 [1, 3, 1, 1]."""
    b = batch_of([[1, 0, 0, 0], [1, 1, 0, 0]], lengths=[[2, 1, 1, 1], [1, 3, 1, 1]])
    b.advantages = torch.tensor([0.75, -0.25, -0.25, -0.25, 0.5, 0.5, -0.5, -0.5])
    b.old_logprobs = b.behaviour_logprobs.clone()  # -1 on every response token
    return b


def current_logprobs(b: GroupBatch) -> torch.Tensor:
    """Current log-probs: row 0 (g0's correct) [-0.2, -0.6]; row 5 (g1's correct) [-0.3, -0.6, -0.9]; row 6 (g1,
    incorrect) -1.3; every other token -1 (ratio 1 against the old log-probs)."""
    lp = b.old_logprobs.clone()
    lp[0, :2] = torch.tensor([-0.2, -0.6])
    lp[5, :3] = torch.tensor([-0.3, -0.6, -0.9])
    lp[6, 0] = -1.3
    return lp * b.response_mask


# -- GARL scales ---------------------------------------------------------------------------------------------------
def test_garl_scales_golden_ragged_with_floor_and_normalization():
    # g0 [1,0,0,0]: P 1/4 -> 4^.75 = 2.828427; g1 [1,1,0]: P 2/3 -> 1.5^.75 = 1.355403;
    # g2 [0,0]: P 0, floor 1/M = 1/2 -> 2^.75 = 1.681793; g3 [1,1]: P 1 -> 1.
    b = batch_of([[1, 0, 0, 0], [1, 1, 0], [0, 0], [1, 1]])
    b.advantages = build("advantage", "grpo")(b)  # g2, g3 constant: advantage 0, no signal
    raw, stats = garl_scales(b, 0.75, normalize=False)
    approx(raw, [2.828427] * 4 + [1.355403] * 3 + [1.681793] * 2 + [1.0] * 2)
    # normalized by the mean over the groups with signal (g0, g1): (2.828427 + 1.355403) / 2 = 2.091915
    scaled, stats = garl_scales(b, 0.75)
    approx(scaled, [1.352076] * 4 + [0.647924] * 3 + [0.803949] * 2 + [0.478031] * 2)
    assert stats["signal_groups"] == 2
    approx(stats["raw_scale_mean"], 2.091915)
    approx(stats["scale_max"], 1.352076)
    approx(stats["p_hat_mean"], (0.25 + 2 / 3 + 0 + 1) / 4)
    # a fixed floor instead of 1/M: g2 gets max(0, 0.1)^-.75 = 10^.75 = 5.623413; g0 max(.25, .1) unchanged
    fixed, _ = garl_scales(b, 0.75, p_min=0.1, normalize=False)
    approx(fixed[[0, 7]], [2.828427, 5.623413])


def test_garl_scale_without_signal_is_the_raw_scale():
    b = batch_of([[0, 0], [1, 1, 1]])
    b.advantages = build("advantage", "grpo")(b)
    scaled, stats = garl_scales(b, 0.5)
    approx(scaled, [2 ** 0.5] * 2 + [1.0] * 3)  # no group with signal: normalizer 1
    assert stats["signal_groups"] == 0 and stats["scale_max"] == 0.0


# -- GARL loss -----------------------------------------------------------------------------------------------------
# Token losses on toy_batch with current_logprobs (PPO-clip, eps .2; ratio 1 unless said):
#   row 0 (A .75): tokens ratio e^.8 = 2.225541 -> clipped 1.2: max(-.75 * 2.2255, -.75 * 1.2) = -.9;
#                  e^.4 = 1.491825 -> clipped 1.2: -.9; per-seq mean -.9
#   rows 1-3 (A -.25): .25 each.  g0 sum: -.9 + .75 = -.15
#   row 4 (A .5): -.5;  row 5 (A .5): ratios e^.7, e^.4, e^.1 = 2.0138 (1.2), 1.4918 (1.2), 1.105171:
#                  (-.6 - .6 - .552585) / 3 = -.584195;  row 6 (A -.5, ratio e^-.3 = .740818 < .8):
#                  max(.5 * .740818, .5 * .8) = .4;  row 7: .5.  g1 sum: -.5 - .584195 + .4 + .5 = -.184195
# Scales (q .75): g0 4^.75 = 2.828427, g1 2^.75 = 1.681793, mean 2.255110 -> normalized 1.254230, 0.745770.
G0_SUM, G1_SUM = -0.15, -0.184195


def test_garl_loss_golden_two_groups():
    b = toy_batch()
    lp = current_logprobs(b)
    loss, m = build("loss", "garl")(b, lp)  # seq-mean-token-mean over B = 8 responses
    approx(loss, (1.254230 * G0_SUM + 0.745770 * G1_SUM) / 8)  # = -0.040688
    loss_raw, _ = build("loss", "garl", {"normalize": False})(b, lp)
    approx(loss_raw, (2.828427 * G0_SUM + 1.681793 * G1_SUM) / 8)  # = -0.091755
    grpo, _ = build("loss", "grpo")(b, lp)
    approx(grpo, (G0_SUM + G1_SUM) / 8)
    assert m["tokens"] == 11 and m["clipped_tokens"] == 5  # row 0 x2, row 5 x2, row 6


def test_garl_gradient_golden_at_ratio_one():
    # at ratio 1 (unclipped) d loss / d logp_it = -s_g A_i / (B L_i): row 0 (L 2) -1.254230 * .75 / 16 = -0.058792;
    # row 5 (L 3) -0.745770 * .5 / 24 = -0.015537; row 1 (L 1) 1.254230 * .25 / 8 = 0.039195
    b = toy_batch()
    lp = b.old_logprobs.clone().requires_grad_(True)
    loss, _ = build("loss", "garl")(b, lp)
    (g,) = torch.autograd.grad(loss, lp)
    approx(g[0, :2], [-0.058792, -0.058792])
    approx(g[5, :3], [-0.015537] * 3)
    approx(g[1, :1], [0.039195])
    assert float(g[~b.response_mask].abs().sum()) == 0.0


def test_garl_q_zero_is_the_ppo_clip_loss_it_builds_on():
    for seed in range(3):
        b = random_batch(seed)
        b.advantages = build("advantage", "grpo")(b)
        g = torch.Generator().manual_seed(seed)
        b.weights = torch.rand(len(b), generator=g) * 2
        new = (b.old_logprobs + 0.3 * torch.randn(b.old_logprobs.shape, generator=g)) * b.response_mask
        for agg, base in (("seq-mean-token-mean", build("loss", "grpo", {"kl_coef": 0.1})),
                          ("token-mean", build("loss", "ppo_clip", {"kl_coef": 0.1})),
                          ("seq-mean-token-sum-norm", build("loss", "ppo_clip", {"aggregation": "seq-mean-token-sum-norm",
                                                                                  "norm_len": 8, "kl_coef": 0.1}))):
            for normalize in (True, False):
                garl = build("loss", "garl", {"q": 0.0, "aggregation": agg, "norm_len": 8, "kl_coef": 0.1,
                                              "normalize": normalize})
                x1, x2 = new.clone().requires_grad_(True), new.clone().requires_grad_(True)
                (l1, m1), (l2, m2) = garl(b, x1), base(b, x2)
                assert torch.equal(l1, l2) and m1 == m2
                l1.backward()
                l2.backward()
                assert torch.equal(x1.grad, x2.grad)


def test_garl_scales_the_policy_gradient_not_the_kl_term():
    b = toy_batch()
    b.ref_logprobs = b.old_logprobs - 0.5 * b.response_mask  # k3 = e^-.5 + .5 - 1 = 0.106531 on every token
    b.advantages = torch.zeros(len(b))  # no policy gradient: only the KL term is left
    loss, _ = build("loss", "garl", {"kl_coef": 1.0})(b, b.old_logprobs.clone())
    approx(loss, 0.106531)  # seq-mean-token-mean of a constant, unscaled


def test_garl_all_wrong_group_has_no_gradient():
    """r - mean_g = 0 in an all-wrong group: its amplification (M^q, the largest) multiplies zero."""
    b = batch_of([[0, 0, 0], [1, 0]])
    b.advantages = build("advantage", "grpo")(b)
    lp = b.behaviour_logprobs.clone().requires_grad_(True)
    loss, _ = build("loss", "garl")(b, lp)
    (g,) = torch.autograd.grad(loss, lp)
    assert float(g[:3].abs().sum()) == 0.0 and float(g[3:].abs().sum()) > 0


def test_garl_per_token_advantages_are_scaled_per_row():
    b = toy_batch()
    b.advantages = b.advantages[:, None].expand(-1, b.response_mask.shape[1]).clone()
    lp = current_logprobs(b)
    loss, _ = build("loss", "garl")(b, lp)
    approx(loss, (1.254230 * G0_SUM + 0.745770 * G1_SUM) / 8)


# -- PAFT ----------------------------------------------------------------------------------------------------------
def test_paft_weights_golden():
    # q .75: g0 P 1/4, K 1 -> (1/4)^.25 / 1 = 0.707107; g1 P 1/2, K 2 -> (1/2)^.25 / 2 = 0.840896 / 2 = 0.420448
    b = toy_batch()
    approx(paft_weights(b, 0.75), [0.707107, 0, 0, 0, 0.420448, 0.420448, 0, 0])
    approx(paft_weights(b, 0.75, "sum"), [0.707107, 0, 0, 0, 0.840896, 0.840896, 0, 0])
    approx(paft_weights(b, 1.0), [1, 0, 0, 0, 0.5, 0.5, 0, 0])  # q = 1: each prompt with a success weighs 1
    approx(paft_weights(b, 0.0), [0.25, 0, 0, 0, 0.25, 0.25, 0, 0])  # q = 0: 1/M each (rejection sampling FT)
    approx(paft_weights(batch_of([[0, 0], [1, 0]]), 1.0), [0, 0, 1, 0])  # all-wrong group: nothing, even at q = 1


def test_paft_loss_golden_two_groups():
    # mean token log-probs: row 0 (-.2 - .6) / 2 = -.4, row 4 -1, row 5 (-.3 - .6 - .9) / 3 = -.6; G = 2 groups
    b = toy_batch()
    lp = current_logprobs(b)
    loss, m = build("loss", "paft")(b, lp)
    approx(loss, -(0.707107 * -0.4 + 0.420448 * -1.0 + 0.420448 * -0.6) / 2)  # = 0.477780
    assert m["tokens"] == 11 and m["sft_rows"] == 3 and m["sft_tokens"] == 6
    loss, _ = build("loss", "paft", {"within_group": "sum"})(b, lp)
    approx(loss, -(0.707107 * -0.4 + 0.840896 * -1.0 + 0.840896 * -0.6) / 2)  # = 0.814138
    loss, _ = build("loss", "paft", {"token_agg": "sum"})(b, lp)  # sequence log-probs -.8, -1, -1.8
    approx(loss, -(0.707107 * -0.8 + 0.420448 * -1.0 + 0.420448 * -1.8) / 2)  # = 0.871470
    b.weights = torch.tensor([2.0, 1, 1, 1, 0.5, 1, 1, 1])  # row weights scale a row's term
    loss, _ = build("loss", "paft")(b, lp)
    approx(loss, -(2 * 0.707107 * -0.4 + 0.5 * 0.420448 * -1.0 + 0.420448 * -0.6) / 2)


def test_paft_gradient_golden_only_correct_rows():
    # d loss / d logp_it = -w_i / (G L_i): row 0 -0.707107 / 4 = -0.176777; row 5 -0.420448 / 6 = -0.070075
    b = toy_batch()
    lp = current_logprobs(b).requires_grad_(True)
    loss, _ = build("loss", "paft")(b, lp)
    (g,) = torch.autograd.grad(loss, lp)
    approx(g[0, :2], [-0.176777] * 2)
    approx(g[4, :1], [-0.420448 / 2])
    approx(g[5, :3], [-0.070075] * 3)
    assert float(g[[1, 2, 3, 6, 7]].abs().sum()) == 0.0  # incorrect samples: no gradient


# -- micro-batching and permutations -------------------------------------------------------------------------------
LOSSES = [("garl", {}), ("garl", {"normalize": False, "kl_coef": 0.1}),
          ("garl", {"aggregation": "token-mean", "q": 1.0}),
          ("garl", {"aggregation": "seq-mean-token-sum-norm", "norm_len": 8, "p_min": 0.3}),
          ("paft", {}), ("paft", {"within_group": "sum", "token_agg": "sum", "q": 0.3})]


def prepared(seed: int, per_token: bool = False) -> tuple[GroupBatch, torch.Tensor]:
    b = random_batch(seed)
    g = torch.Generator().manual_seed(seed + 11)
    b.advantages = build("advantage", "grpo")(b)
    if per_token:
        b.advantages = b.advantages[:, None] + 0.1 * torch.randn(b.response_mask.shape, generator=g)
    b.weights = torch.rand(len(b), generator=g) * 2
    new = (b.old_logprobs + 0.3 * torch.randn(b.old_logprobs.shape, generator=g)) * b.response_mask
    return b, new


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(("name", "params"), LOSSES)
def test_micro_batches_add_up_to_the_full_batch_loss_and_gradient(seed, name, params):
    """As OpenRLHF's tests/test_loss_aggregation.py: group statistics come from the whole batch, so the parts' losses
    and gradients add up to the full batch's, whatever the micro-batch size."""
    b, new = prepared(seed, per_token=seed % 2 == 1)
    loss_fn = build("loss", name, params)
    leaf = new.clone().requires_grad_(True)
    full, m_full = loss_fn(b, leaf)
    full_value = float(full.detach())
    (g_full,) = torch.autograd.grad(full, leaf)
    for micro in (1, 2, 3, 5):
        leaf2 = new.clone().requires_grad_(True)
        total, tokens = 0.0, 0.0
        for start in range(0, len(b), micro):
            rows = list(range(start, min(len(b), start + micro)))
            part, m = loss_fn(b, leaf2[rows], rows)
            part.backward()
            total += float(part.detach())
            tokens += m["tokens"]
        approx(total, full_value, 1e-6)
        assert tokens == m_full["tokens"]
        assert torch.allclose(leaf2.grad, g_full, atol=1e-7)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 50), assignment=st.lists(st.integers(0, 2), min_size=30, max_size=30),
       which=st.integers(0, len(LOSSES) - 1))
def test_any_partition_of_rows_adds_up(seed, assignment, which):
    name, params = LOSSES[which]
    b, new = prepared(seed)
    loss_fn = build("loss", name, params)
    full, _ = loss_fn(b, new)
    parts = [[i for i in range(len(b)) if assignment[i] == k] for k in range(3)]
    total = sum(float(loss_fn(b, new[rows], rows)[0]) for rows in parts if rows)
    approx(total, float(full), 1e-6)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize(("name", "params"), LOSSES)
def test_loss_invariant_to_row_permutation(seed, name, params):
    b, new = prepared(seed)
    loss_fn = build("loss", name, params)
    full, _ = loss_fn(b, new)
    perm = torch.randperm(len(b), generator=torch.Generator().manual_seed(seed))
    permuted, _ = loss_fn(b.select(perm), new[perm])  # advantages, weights and groups travel with their rows
    approx(permuted, float(full), 1e-6)


# -- properties of the amplification -------------------------------------------------------------------------------
@settings(max_examples=50, deadline=None)
@given(groups=st.lists(st.lists(st.integers(0, 1), min_size=1, max_size=8), min_size=1, max_size=6),
       q=st.floats(0.0, 1.0))
def test_garl_scale_properties(groups, q):
    b = batch_of([[float(r) for r in g] for g in groups])
    b.advantages = build("advantage", "grpo")(b)
    raw, _ = garl_scales(b, q, normalize=False)
    scaled, stats = garl_scales(b, q)
    inverse, keys = b.group_index()
    for gi, g in enumerate(groups):
        row = int((inverse == gi).nonzero()[0])
        p, m = sum(g) / len(g), len(g)
        assert 1.0 - 1e-9 <= float(raw[row]) <= m ** q + 1e-6  # amplification bounded by the 1/M floor
        approx(raw[row], max(p, 1 / m) ** -q, 1e-6)
    signal = [gi for gi, g in enumerate(groups) if 0 < sum(g) < len(g) and len(g) > 1]
    assert stats["signal_groups"] == len(signal)
    if signal:  # mean normalized scale over the groups with signal is 1
        rows = [int((inverse == gi).nonzero()[0]) for gi in signal]
        approx(scaled[rows].double().mean(), 1.0, 1e-6)


# -- hyper-parameters and garbage ----------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "params", "key"), [
    ("garl", {"q": -0.1}, "q"), ("garl", {"q": 1.5}, "q"), ("garl", {"q": float("nan")}, "q"),
    ("garl", {"p_min": 0.0}, "p_min"), ("garl", {"p_min": 1.5}, "p_min"), ("garl", {"normalize": "yes"}, "normalize"),
    ("garl", {"aggregation": "mean"}, "aggregation"), ("garl", {"aggregation": "seq-mean-token-sum-norm"}, "norm_len"),
    ("paft", {"q": 2.0}, "q"), ("paft", {"within_group": "max"}, "within_group"),
    ("paft", {"token_agg": "median"}, "token_agg")])
def test_bad_hyper_parameters_name_the_key(name, params, key):
    with pytest.raises(ValueError, match=key):
        build("loss", name, params)


@pytest.mark.parametrize("name", ["garl", "paft"])
def test_empty_and_garbage_responses_never_crash(name):
    samples = [Sample("g0", "p", [1], [], "", reward=1.0, correct=True),  # an empty (correct!) response
               Sample("g0", "p", [1], [5, 6], "garbage", reward=0.0),
               Sample("g1", "p", [1], [7], "x", reward=0.0), Sample("g1", "p", [1], [], "", reward=0.0)]
    b = GroupBatch.from_samples(samples)
    b.advantages = build("advantage", "grpo")(b)
    lp = torch.full(b.response_mask.shape, -1.0).requires_grad_(True)
    loss, m = build("loss", name)(b, lp * b.response_mask)
    assert math.isfinite(float(loss.detach())) and m["tokens"] == 3
    loss.backward()
    assert torch.isfinite(lp.grad).all()


def test_garl_needs_advantages():
    b = toy_batch()
    b.advantages = None
    with pytest.raises(ValueError, match="advantages"):
        build("loss", "garl")(b, b.old_logprobs)


# -- declarations, recipes, the trainer ----------------------------------------------------------------------------
def test_comparisons_share_hints_hard_variant_and_recipes_load():
    found = comparisons()
    hint = found["hint_vs_grpo_hard"]
    for method in ("garl", "paft"):
        c = found[f"{method}_vs_grpo_hard"]
        assert c.overrides == hint.overrides and c.tag == "hard" and c.lane == hint.lane
        assert (c.metric, c.direction, c.seeds) == ("final_accuracy", "higher", (0, 1, 2, 3, 4))  # 5 paired seeds
        cfg = load_recipe(method, list(c.overrides), lane="micro")
        assert cfg.stages["loss"] == method and cfg.env_kwargs["min_target"] == 60 and cfg.train_pool == 512
        assert cfg.params["loss"]["q"] == 0.75


@pytest.mark.parametrize(("name", "params", "metric"), [
    ("garl", {"q": 0.75}, "loss.scale_max"), ("paft", {"q": 0.75}, "loss.sft_rows")])
def test_runs_in_the_toy_trainer(tmp_path, name, params, metric):
    records = trainer(tmp_path, steps=3, stages={"loss": name},
                      params={"rollout_allocator": {"n": 8}, "loss": params}).run(resume=False)
    train = [r for r in records if r["kind"] == "train"]
    assert len(train) == 3
    for r in train:
        assert math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) and metric in r
        assert 0.0 <= r["loss.p_hat_mean"] <= 1.0
    if name == "paft":  # the loss is the SFT NLL of the correct samples: positive when there are any
        assert all((r["loss"] > 0) == (r["loss.sft_rows"] > 0) for r in train)


@pytest.mark.parametrize("name", ["garl", "paft"])
def test_resumes_exactly_in_the_trainer(tmp_path, name):
    """The pattern of tests/test_methods_resume.py (the entry proposed for its CASES)."""
    settings_ = dict(steps=5, checkpoint_every=2, eval_every=0, eval_size=2, train_pool=6, prompts_per_step=3,
                     stages={"loss": name}, params={"rollout_allocator": {"n": 4}, "loss": {"q": 0.75}})
    full = trainer(tmp_path / "full", env=make_env(8), **settings_).run(resume=False)
    cut = trainer(tmp_path / "cut", env=make_env(8), **settings_)
    cut.run(resume=False, stop_after=3)
    resumed = trainer(tmp_path / "cut", env=make_env(8), **settings_).run(resume=True)
    assert strip(resumed) == strip(full)
    assert all("loss.p_hat_mean" in r for r in full if r["kind"] == "train")
