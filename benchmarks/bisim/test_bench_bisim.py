"""Smoke run of the bisimulation tables (small sizes, 2 seeds) with the claims they must show.

The full tables: ``python benchmarks/bisim/tables.py`` (writes benchmarks/bisim/results/)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import tables  # noqa: E402


@pytest.mark.slow
def test_grouped_and_taxi_claims(tmp_path):
    res = tables.grouped(tmp_path, seeds=[0, 1], train_steps=100)
    assert res["enclosure_fraction"] == 1.0
    tol = tables.GAMMA / (1 - tables.GAMMA) * tables.EXACT_TOL + 1e-9
    assert all(gap <= tol for vals in res["identity"].values() for gap, _ in vals)
    rows = res["rows"]
    fired = [k for k in tables.BUDGETS if k < 63 and all(v["certified"] and v["right"] for v in rows[("informative", k)])]
    assert fired, "the certificate never fired below full coverage with the informative embedding"
    assert not any(v["certified"] for k in tables.BUDGETS if k <= 31 for v in rows[("uninformative", k)])
    for row in tables.taxi(tmp_path, [15], rainy_budgets=[]):  # deterministic model only: quick
        assert row[5] == "abstained"
    assert (tmp_path / "4_grouped64.png").exists()
