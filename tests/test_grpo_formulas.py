"""Golden values (hand-computed small groups) for the baselines, loss invariances, and the registry rules."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from agents.grpo import registry
from agents.grpo.batch import GroupBatch, Sample
from agents.grpo.registry import Component, RegistryError, build, register


def batch_of(groups: list[list[float]], lengths: list[list[int]] | None = None, step: int = 0) -> GroupBatch:
    samples = []
    for g, rewards in enumerate(groups):
        for k, r in enumerate(rewards):
            n = lengths[g][k] if lengths else 2
            samples.append(Sample(group_id=f"g{g}", prompt="p", prompt_ids=[1], response_ids=[3] * n, text="x",
                                  reward=r, correct=r > 0, logprobs=[-1.0] * n, entropies=[0.5] * n))
    return GroupBatch.from_samples(samples, step=step)


def approx(values, expected, tol=1e-5):
    assert torch.allclose(torch.as_tensor(values, dtype=torch.float64), torch.tensor(expected, dtype=torch.float64),
                          atol=tol), (values, expected)


# -- advantages ----------------------------------------------------------------------------------------------------
def test_grpo_advantage_golden_ragged():
    # [1,0,0,1]: mean .5, unbiased std sqrt(1/3) -> +-0.866025; [1,0,0]: mean 1/3, std sqrt(1/3); [1]: alone -> 0
    adv = build("advantage", "grpo")(batch_of([[1, 0, 0, 1], [1, 0, 0], [1]]))
    approx(adv, [0.866025, -0.866025, -0.866025, 0.866025, 1.154700, -0.577350, -0.577350, 0.0])


def test_grpo_advantage_zero_variance_group_is_zero():
    approx(build("advantage", "grpo")(batch_of([[1, 1, 1], [0, 0]])), [0] * 5)


def test_dr_grpo_advantage_golden():
    approx(build("advantage", "dr_grpo")(batch_of([[1, 0, 0], [0.5, 0.5]])), [2 / 3, -1 / 3, -1 / 3, 0, 0])


# -- PPO-clip loss -------------------------------------------------------------------------------------------------
def one_sample(adv: float, old=(-1.0, -1.0)) -> GroupBatch:
    b = batch_of([[1.0]])
    b.old_logprobs = torch.tensor([list(old)])
    b.advantages = torch.tensor([adv])
    return b


def test_ppo_clip_golden_positive_and_negative_advantage():
    new = torch.tensor([[-0.5, -1.5]])  # ratios e^.5 = 1.6487 (clipped to 1.2), e^-.5 = 0.6065
    loss, m = build("loss", "ppo_clip")(one_sample(1.0), new)
    approx(loss, -0.903265)  # (max(-1.6487,-1.2) + max(-0.6065,-0.8)) / 2 = (-1.2 - 0.6065) / 2
    assert m["clipped_tokens"] == 1
    loss, _ = build("loss", "ppo_clip")(one_sample(-1.0), new)
    approx(loss, 1.224361)  # (1.6487 + 0.8) / 2


def test_dapo_clip_higher_golden():
    loss, _ = build("loss", "dapo")(one_sample(1.0), torch.tensor([[-0.5, -1.0]]))
    approx(loss, (-1.28 - 1.0) / 2)  # upper clip at 1 + 0.28


def test_kl_k3_golden():
    b = one_sample(0.0)
    b.ref_logprobs = torch.tensor([[-1.0, -1.0]])
    loss, m = build("loss", "ppo_clip", {"kl_coef": 1.0})(b, torch.tensor([[-0.5, -1.0]]))
    approx(loss, 0.106531 / 2)  # k3 = e^-0.5 + 0.5 - 1 on token 0, 0 on token 1; token-mean over 2 tokens


@pytest.mark.parametrize(("aggregation", "expected"), [
    ("token-mean", 1.25),  # (2 + 1 + 1 + 1) / 4 tokens
    ("seq-mean-token-mean", 1.5),  # (2/1 + 3/3) / 2 responses
    ("seq-mean-token-sum-norm", 0.625),  # 5 / (2 responses * norm_len 4)
])
def test_aggregation_golden(aggregation, expected):
    b = batch_of([[1.0, 0.0]], lengths=[[1, 3]])
    b.advantages = -torch.tensor([[2.0, 0, 0], [1.0, 1.0, 1.0]])  # ratio 1 -> token loss = -A
    lp = b.behaviour_logprobs.clone()
    b.old_logprobs = lp.clone()
    loss, _ = build("loss", "ppo_clip", {"aggregation": aggregation, "norm_len": 4})(b, lp)
    approx(loss, expected)


# -- invariances ---------------------------------------------------------------------------------------------------
def random_batch(seed: int) -> GroupBatch:
    g = torch.Generator().manual_seed(seed)
    sizes = [1 + int(torch.randint(5, (1,), generator=g)) for _ in range(5)]
    groups = [[float(torch.randint(2, (1,), generator=g)) for _ in range(s)] for s in sizes]
    lengths = [[1 + int(torch.randint(6, (1,), generator=g)) for _ in range(s)] for s in sizes]
    b = batch_of(groups, lengths)
    b.old_logprobs = -torch.rand(b.response_mask.shape, generator=g) * b.response_mask
    b.ref_logprobs = -torch.rand(b.response_mask.shape, generator=g) * b.response_mask
    b.behaviour_logprobs = b.old_logprobs.clone()
    return b


LOSSES = [("ppo_clip", {"aggregation": a, "kl_coef": 0.1, "norm_len": 8}) for a in
          ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(("loss_name", "params"), LOSSES)
def test_loss_invariant_to_group_permutation_and_batch_split(seed, loss_name, params):
    b = random_batch(seed)
    b.advantages = build("advantage", "grpo")(b)
    loss_fn = build("loss", loss_name, params)
    new = (b.old_logprobs + 0.3 * torch.randn(b.old_logprobs.shape, generator=torch.Generator().manual_seed(seed)))
    full, _ = loss_fn(b, new * b.response_mask)
    # permuted rows (groups reordered, rows shuffled): recompute advantages on the permuted batch too
    perm = torch.randperm(len(b), generator=torch.Generator().manual_seed(seed + 100))
    pb = b.select(perm)
    pb.advantages = build("advantage", "grpo")(pb)
    permuted, _ = loss_fn(pb, (new * b.response_mask)[perm])
    approx(permuted, float(full), 1e-6)
    # split into micro-batches of any size: the parts add up to the full loss (and so do gradients)
    leaf = (new * b.response_mask).clone().requires_grad_(True)
    full_leaf, _ = loss_fn(b, leaf)
    (g_full,) = torch.autograd.grad(full_leaf, leaf)
    for micro in (1, 2, 3):
        leaf2 = (new * b.response_mask).clone().requires_grad_(True)
        total = 0.0
        for start in range(0, len(b), micro):
            rows = list(range(start, min(len(b), start + micro)))
            part, _ = loss_fn(b, leaf2[rows], rows)
            part.backward()
            total += float(part.detach())
        approx(total, float(full), 1e-6)
        assert torch.allclose(leaf2.grad, g_full, atol=1e-7)


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "lampo"])
@pytest.mark.parametrize("seed", range(3))
def test_ragged_advantages_equal_per_group_loop(name, seed):
    b = random_batch(seed)
    est = build("advantage", name)
    together = est(b)
    for rows in b.groups().values():
        alone = est(b.select(rows))
        approx(together[rows], alone.tolist(), 1e-6)


# -- registries ----------------------------------------------------------------------------------------------------
def test_duplicate_name_rejected_and_unknown_name_listed():
    registry.load_builtin()

    with pytest.raises(RegistryError, match="already registered"):
        @register("grpo", stage="advantage")
        class Again(Component):
            pass

    @register("_test_only", stage="advantage")
    class Fresh(Component):
        pass

    try:
        with pytest.raises(RegistryError, match="already registered"):
            register("_test_only", stage="advantage")(type("Other", (Component,), {}))
    finally:
        registry.unregister("_test_only", stage="advantage")
    with pytest.raises(RegistryError, match="registered: .*dr_grpo"):
        registry.get("advantage", "nope")
    with pytest.raises(RegistryError, match="unknown stage"):
        register("x", stage="not_a_stage")


def test_every_stage_has_a_default_and_methods_sit_in_named_stages():
    names = registry.names()
    assert set(names) == set(registry.STAGES)
    assert all(names[s] for s in names)
    assert "vigor" in names["rollout_allocator"] and "lampo" in names["advantage"]
    assert {"err", "rrer", "err_plus"} <= set(names["reward_shaper"])
    assert {"grpo", "dr_grpo", "dapo", "ppo_clip"} <= set(names["loss"])


def test_bad_hyper_parameter_is_a_clear_error():
    with pytest.raises(TypeError, match="loss/ppo_clip: bad hyper-parameters"):
        build("loss", "ppo_clip", {"clip": 0.1})
    with pytest.raises(ValueError, match="aggregation"):
        build("loss", "ppo_clip", {"aggregation": "mean"})


def test_dapo_transform_drops_zero_variance_groups():
    b = batch_of([[1, 1], [1, 0], [0, 0, 0], [0, 1, 1]])
    kept = build("group_transform", "dapo")(b)
    assert sorted(set(kept.group_ids)) == ["g1", "g3"] and len(kept) == 5
    assert build("group_transform", "dapo")(batch_of([[1, 1]])) is None


def test_component_state_round_trip():
    sel = build("prompt_selector", "random", {"seed": 3})
    first = sel.select(4, 100, 1)
    state = sel.state_dict()
    again = sel.select(4, 100, 2)
    other = build("prompt_selector", "random", {"seed": 99})
    other.load_state_dict(state)
    assert other.select(4, 100, 2) == again and first != again


def test_batches_sampled_at_different_temperatures_do_not_mix():
    a, b = batch_of([[1.0, 0.0]]), batch_of([[0.0, 1.0]])
    a.temperature = b.temperature = 0.7
    assert GroupBatch.concat([a, b]).temperature == 0.7
    b.temperature = 1.0  # one batch's log-probs are all taken at one temperature
    with pytest.raises(ValueError, match="different temperatures"):
        GroupBatch.concat([a, b])


@pytest.mark.parametrize("field", ["logprobs", "entropies"])
@pytest.mark.parametrize("length", [2, 4])
def test_per_token_values_must_cover_the_response_exactly(field, length):
    ok = Sample(group_id="g", prompt="p", prompt_ids=[1], response_ids=[2, 3, 4], text="", reward=0.0,
                **{field: [-0.1, -0.2, -0.3]})
    values = getattr(GroupBatch.from_samples([ok]), "behaviour_logprobs" if field == "logprobs" else field)
    approx(values[0], [-0.1, -0.2, -0.3])
    for unknown in (None, []):  # what an engine that cannot report them passes: zeros
        b = GroupBatch.from_samples([dataclasses.replace(ok, **{field: unknown})])
        assert float(b.behaviour_logprobs.abs().sum() + b.entropies.abs().sum()) == 0.0
    bad = dataclasses.replace(ok, group_id="h", **{field: [-0.1] * length})
    with pytest.raises(ValueError, match=rf"sample 1 \(group h\): {length} {field} for 3 response tokens"):
        GroupBatch.from_samples([ok, bad])


def test_dr_grpo_loss_of_a_micro_batch_ignores_the_other_responses_lengths():
    """Aggregation invariance (as in OpenRLHF's tests/test_loss_aggregation.py): Dr.GRPO divides token sums by a
    constant, the recipe's max_new_tokens, so a micro-batch's loss and gradient do not change when a response in
    another micro-batch gets longer (and with it the batch's padded width)."""
    from agents.grpo.config import from_dict
    from agents.grpo.trainer import _build_component

    loss_fn = _build_component("loss", from_dict({"model": "toy", "max_new_tokens": 16,
                                                  "stages": {"advantage": "dr_grpo", "loss": "dr_grpo"}}))
    assert loss_fn.norm_len == 16
    results = []
    for last in (2, 9):  # row 3 (the other micro-batch) is 2 or 9 tokens long: padded width 3 or 9
        b = batch_of([[1.0, 0.0], [0.0, 1.0]], lengths=[[2, 3], [1, last]])
        b.advantages = build("advantage", "dr_grpo")(b)
        b.old_logprobs = b.behaviour_logprobs.clone()
        lp = (b.old_logprobs[:2, :3] + torch.tensor([[0.1, -0.2, 0.0], [0.05, 0.3, -0.1]])).requires_grad_(True)
        loss, _ = loss_fn(b, lp, [0, 1])
        results.append((float(loss), torch.autograd.grad(loss, lp)[0]))
    (loss_a, grad_a), (loss_b, grad_b) = results
    assert b.response_mask.shape[1] == 9 and loss_a != 0.0
    assert loss_a == loss_b
    assert torch.equal(grad_a, grad_b)


def test_dr_grpo_loss_needs_a_constant_length():
    with pytest.raises(ValueError, match="norm_len"):
        build("loss", "dr_grpo")
    with pytest.raises(ValueError, match="norm_len"):
        build("loss", "ppo_clip", {"aggregation": "seq-mean-token-sum-norm"})


# -- row weights and replayed rows ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("aggregation", "expected"), [
    ("token-mean", 1.75),  # (0.5 * 2 + 2 * (1 + 1 + 1)) / 4 tokens: weights scale rows, the normalizer still counts tokens
    ("seq-mean-token-mean", 1.5),  # (0.5 * 2/1 + 2 * 3/3) / 2 responses
    ("seq-mean-token-sum-norm", 0.875),  # (0.5 * 2 + 2 * 3) / (2 responses * norm_len 4)
])
def test_row_weights_golden(aggregation, expected):
    b = batch_of([[1.0, 0.0]], lengths=[[1, 3]])
    b.advantages = -torch.tensor([[2.0, 0, 0], [1.0, 1.0, 1.0]])
    b.weights = torch.tensor([0.5, 2.0])
    lp = b.behaviour_logprobs.clone()
    loss, _ = build("loss", "ppo_clip", {"aggregation": aggregation, "norm_len": 4})(b, lp)
    approx(loss, expected)


def test_off_policy_rows_take_the_ratio_against_the_behaviour_policy():
    b = batch_of([[1.0]])
    b.advantages = torch.tensor([1.0])
    new = torch.tensor([[-0.5, -1.5]])  # behaviour log-probs are -1: ratios e^.5 (clipped to 1.2) and e^-.5
    b.off_policy = torch.tensor([True])
    loss, m = build("loss", "ppo_clip")(b, new)
    approx(loss, -0.903265)  # the golden PPO-clip value above, with the behaviour policy as the denominator
    assert m["clipped_tokens"] == 1
    b.off_policy = torch.tensor([False])  # on-policy rows: ratio 1 against the detached current policy
    loss, m = build("loss", "ppo_clip")(b, new)
    approx(loss, -1.0)
    assert m["clipped_tokens"] == 0


def test_optional_row_fields_survive_select_and_concat():
    a, b = batch_of([[1.0, 0.0]]), batch_of([[0.0, 1.0, 1.0]])
    a.weights = torch.tensor([0.25, 3.0])
    b.off_policy = torch.tensor([True, False, True])
    both = GroupBatch.concat([a, b])
    approx(both.weights, [0.25, 3.0, 1.0, 1.0, 1.0])  # rows without a weight weigh 1
    assert both.off_policy.tolist() == [False, False, True, False, True]  # rows without the flag are on-policy
    picked = both.select([4, 1])
    approx(picked.weights, [1.0, 3.0])
    assert picked.off_policy.tolist() == [True, False]
    assert GroupBatch.concat([batch_of([[1.0]]), batch_of([[0.0]])]).weights is None


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_weighted_replayed_loss_invariant_to_permutation_and_split(seed, aggregation):
    b = random_batch(seed)
    g = torch.Generator().manual_seed(seed + 7)
    b.advantages = build("advantage", "grpo")(b)
    b.weights = torch.rand(len(b), generator=g) * 2
    b.off_policy = torch.rand(len(b), generator=g) < 0.5
    b.behaviour_logprobs = (b.old_logprobs - 0.2 * torch.rand(b.old_logprobs.shape, generator=g)) * b.response_mask
    b.old_logprobs = None  # one epoch: on-policy rows' denominator is the detached current policy
    loss_fn = build("loss", "ppo_clip", {"aggregation": aggregation, "norm_len": 8})
    new = (b.behaviour_logprobs + 0.3 * torch.randn(b.behaviour_logprobs.shape, generator=g)) * b.response_mask
    full, _ = loss_fn(b, new)
    perm = torch.randperm(len(b), generator=g)
    permuted, _ = loss_fn(b.select(perm), new[perm])  # advantages travel with their rows
    approx(permuted, float(full), 1e-6)
    total = sum(float(loss_fn(b, new[rows], rows)[0]) for rows in ([0, 1], list(range(2, len(b)))))
    approx(total, float(full), 1e-6)
