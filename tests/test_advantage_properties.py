"""Property tests for the advantage estimators on random ragged batches.

Formulas (checked against numpy, group g of G rows with rewards r, mean mu, unbiased std sigma):
- ``grpo``:              A = (r - mu) / (sigma + eps); a one-row group has sigma 0 and A 0; sum_g A = 0.
- ``dr_grpo``:           A = r - mu; sum_g A = 0.
- ``lampo`` (kappa 0):   A = G / (G - 1) * (r - mu) (0 for a one-row group); sum_g A = 0. For any kappa the pair
  weights are symmetric (w_ij = w_ji) while r_i - r_j is antisymmetric, so the group sum is still 0.
Invariances, for every estimator in ``ESTIMATORS``: permuting the rows permutes the advantages, and a group's
advantages do not depend on the other groups of the batch (each group computed alone gives the same numbers).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.grpo.batch import GroupBatch, Sample
from agents.grpo.registry import build

ESTIMATORS = [("grpo", {}), ("grpo", {"eps": 1e-3, "unbiased": False}), ("dr_grpo", {}), ("lampo", {"kappa": 0.0}),
              ("lampo", {"kappa": 1.0}), ("lampo", {"kappa": 2.0, "logprob": "sum"})]
ATOL = 1e-5
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def ragged_batches(draw: Callable) -> GroupBatch:
    """1-5 groups of 1-6 rows, interleaved; responses of 0-7 tokens with random log-probs; rewards binary, from a
    small set (ties) or any float in [-3, 3]."""
    samples = []
    for g in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(["binary", "ties", "float"]))
        reward = {"binary": st.sampled_from([0.0, 1.0]), "ties": st.sampled_from([0.0, 0.5, 1.0, 1.5]),
                  "float": st.floats(-3, 3, allow_nan=False, width=32)}[kind]
        for _ in range(draw(st.integers(1, 6))):
            k = draw(st.integers(0, 7))
            samples.append(Sample(f"1:0:{g}:t{g}", "p", [1], [2] * k, "", reward=draw(reward),
                                  logprobs=draw(st.lists(st.floats(-6, -0.125, width=32), min_size=k, max_size=k))))
    batch = GroupBatch.from_samples(samples)
    return batch.select(draw(st.permutations(range(len(batch)))))


def by_group(batch: GroupBatch) -> list[list[int]]:
    return list(batch.groups().values())


def close(a: torch.Tensor | np.ndarray, b: torch.Tensor | np.ndarray) -> None:
    np.testing.assert_allclose(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64), atol=ATOL, rtol=1e-5)


# -- the formulas ----------------------------------------------------------------------------------------------------
@SETTINGS
@given(batch=ragged_batches())
def test_grpo_is_the_group_z_score_and_sums_to_zero(batch: GroupBatch) -> None:
    adv = build("advantage", "grpo")(batch).numpy()
    r = batch.rewards.double().numpy()
    for rows in by_group(batch):
        rg = r[rows]
        sigma = rg.std(ddof=1) if len(rows) > 1 else 0.0
        close(adv[rows], (rg - rg.mean()) / (sigma + 1e-6))
        assert abs(float(adv[rows].sum())) <= ATOL * max(1.0, np.abs(adv[rows]).sum())


@SETTINGS
@given(batch=ragged_batches())
def test_dr_grpo_is_centred_and_sums_to_zero(batch: GroupBatch) -> None:
    adv = build("advantage", "dr_grpo")(batch).numpy()
    r = batch.rewards.double().numpy()
    for rows in by_group(batch):
        close(adv[rows], r[rows] - r[rows].mean())
        assert abs(float(adv[rows].sum())) <= ATOL


@SETTINGS
@given(batch=ragged_batches())
def test_lampo_kappa_zero_is_scaled_dr_grpo(batch: GroupBatch) -> None:
    adv = build("advantage", "lampo", {"kappa": 0.0})(batch).numpy()
    r = batch.rewards.double().numpy()
    for rows in by_group(batch):
        g = len(rows)
        want = g / (g - 1) * (r[rows] - r[rows].mean()) if g > 1 else np.zeros(1)
        close(adv[rows], want)
        assert abs(float(adv[rows].sum())) <= ATOL


@SETTINGS
@given(batch=ragged_batches(), kappa=st.floats(-3, 3, allow_nan=False))
def test_lampo_any_kappa_sums_to_zero(batch: GroupBatch, kappa: float) -> None:
    adv = build("advantage", "lampo", {"kappa": kappa})(batch).numpy()
    for rows in by_group(batch):
        assert abs(float(adv[rows].sum())) <= ATOL * max(1.0, np.abs(adv[rows]).sum())


# -- invariances -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, params", ESTIMATORS, ids=[f"{n}-{p}" for n, p in ESTIMATORS])
@SETTINGS
@given(data=st.data())
def test_advantages_permute_with_the_rows(name: str, params: dict, data) -> None:
    batch = data.draw(ragged_batches())
    est = build("advantage", name, params)
    adv = est(batch)
    perm = data.draw(st.permutations(range(len(batch))))
    close(est(batch.select(perm)), adv[perm])


@pytest.mark.parametrize("name, params", ESTIMATORS, ids=[f"{n}-{p}" for n, p in ESTIMATORS])
@SETTINGS
@given(batch=ragged_batches())
def test_advantages_of_a_group_do_not_depend_on_the_others(name: str, params: dict, batch: GroupBatch) -> None:
    est = build("advantage", name, params)
    adv = est(batch)
    for rows in by_group(batch):
        close(est(batch.select(rows)), adv[rows])
