"""Agon's precondition (issue 45, build item 5): the committed probe (benchmarks/mechanism_agon.py) and the
declarations agree. The micro lane's comparison is marked precondition-not-met because its solver cannot use a draft;
the SmolLM2 lane, where a verified draft lifts the solver, carries the comparison."""

from __future__ import annotations

import json
from pathlib import Path

from agents.grpo.comparisons import comparisons

PROBE = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "mechanism_agon.json"


def test_probe_figures_decide_the_lane_of_agons_comparison():
    data = json.loads(PROBE.read_text())
    for model, res in data["models"].items():
        # the flag is what the figures say, recomputed here
        assert res["precondition_met"] == (res["correct_draft"]["accuracy"] > res["alone"]["accuracy"]), model
        assert res["tasks"] >= 64 and res["samples_per_task"] >= 2
        assert sum(res["alone"]["per_task_correct"]) == round(res["alone"]["accuracy"] * res["tasks"]
                                                              * res["samples_per_task"])
    assert data["models"]["micro-countdown"]["precondition_met"] is False
    assert data["models"]["smollm2"]["precondition_met"] is True
    declared = comparisons()
    assert declared["agon_vs_grpo"].precondition_not_met  # micro: skipped, the table says why
    assert "mechanism_agon.json" in declared["agon_vs_grpo"].precondition_not_met
    assert not declared["agon_vs_grpo_smollm2"].precondition_not_met
    assert len(declared["agon_vs_grpo_smollm2"].seeds) >= 5
