"""One row per method on a board: mean over seeds, 95% Student-t interval (n-1 dof), n; per-seed rows kept."""

import json
import math

import pytest

from rlvr_envs.cli import main as rlvr_main
from rlvr_envs.harness import leaderboard as lb
from rlvr_envs.harness.render import summary_table
from rlvr_envs.harness.summary import format_summary, summarize, t975


def entry(i: int, model: str, acc: float, method: str | None = None, seed: int = 0, base: str = "m",
          steps: int = 60) -> dict:
    e = {"id": f"e{i}", "model": model, "label": None, "n_tasks": 8, "n_samples": 2, "seed": 0,
         "metrics": {"accuracy": acc, "length_mean": 10.0 + i, "length_unit": "tokens"}}
    if method:
        e["training"] = {"method": method, "seed": seed, "base_model": base, "steps": steps}
    return e


def board() -> dict:
    return {"board": "b", "env_id": "toy", "pin": {"task_ids_sha256": "0" * 64, "n_tasks": 8, "n_samples": 2},
            "entries": [entry(0, "m + grpo (seed 0)", 0.50, "grpo", 0), entry(1, "m + dapo (seed 0)", 0.70, "dapo", 0),
                        entry(2, "m + grpo (seed 1)", 0.40, "grpo", 1), entry(3, "m + grpo (seed 2)", 0.45, "grpo", 2),
                        entry(4, "m + dapo (seed 1)", 0.60, "dapo", 1), entry(5, "base", 0.30),
                        entry(6, "base", 0.20), entry(7, "m + solo (seed 0)", 0.55, "solo", 0)]}


def test_t_quantiles():
    assert t975(1) == pytest.approx(12.7062, abs=1e-4) and t975(2) == pytest.approx(4.3027, abs=1e-4)
    assert t975(30) == pytest.approx(2.0423, abs=1e-4) and t975(60) == pytest.approx(2.0003, abs=1e-4)
    assert t975(10 ** 6) == pytest.approx(1.95996, abs=1e-4)


def test_one_row_per_method_with_mean_interval_and_n():
    rows = summarize(board())
    by = {r["name"]: r for r in rows}
    grpo = by["grpo"]
    assert grpo["n"] == 3 and grpo["seeds"] == [0, 1, 2]
    assert grpo["mean"] == pytest.approx(0.45)
    sd = math.sqrt(((0.05) ** 2 + (0.05) ** 2 + 0) / 2)
    half = 4.302653 * sd / math.sqrt(3)
    assert grpo["sd"] == pytest.approx(sd) and grpo["low"] == pytest.approx(0.45 - half)
    assert grpo["high"] == pytest.approx(0.45 + half)
    dapo = by["dapo"]
    assert dapo["n"] == 2 and dapo["mean"] == pytest.approx(0.65)
    assert dapo["high"] - dapo["mean"] == pytest.approx(12.706205 * math.sqrt(0.005) / math.sqrt(2))
    # one run: the mean only, no interval
    solo = by["solo"]
    assert solo["n"] == 1 and solo["low"] is None and solo["high"] is None and solo["sd"] is None
    # entries without a method are rows of their own, even under the same name
    assert [r["n"] for r in rows if r["name"] == "base"] == [1, 1]
    assert len(rows) == 5


def test_rows_sorted_by_mean_and_per_seed_entries_reachable():
    rows = summarize(board())
    assert [r["name"] for r in rows] == ["dapo", "solo", "grpo", "base", "base"]
    assert [r["mean"] for r in rows] == sorted((r["mean"] for r in rows), reverse=True)
    # every entry is in exactly one row, best first within it
    assert sorted(e["id"] for r in rows for e in r["entries"]) == [f"e{i}" for i in range(8)]
    assert [e["id"] for e in rows[2]["entries"]] == ["e0", "e3", "e2"]
    text = format_summary(board())
    lines = text.splitlines()
    assert "5 methods over 8 entries" in lines[0]
    assert [line.split()[1] for line in lines[4:]] == ["dapo", "solo", "grpo", "base", "base"]
    assert "1 seed" in lines[5] and "3 " in lines[6]
    html = summary_table(board())
    assert html.count('<tr class="method">') == 1 + 5 and "1 seed" in html


def test_methods_split_by_base_model_and_steps():
    b = board()
    b["entries"] += [entry(8, "other + grpo (seed 0)", 0.9, "grpo", 0, base="other"),
                     entry(9, "m + dapo (seed 0)", 0.1, "dapo", 0, steps=20)]
    names = {r["name"]: r["n"] for r in summarize(b)}
    assert names["other + grpo"] == 1 and names["m + grpo"] == 3
    assert names["dapo (60 steps)"] == 2 and names["dapo (20 steps)"] == 1


def test_show_leads_with_methods_and_per_seed_flag_adds_entries(tmp_path, capsys):
    b = board()
    b.update(schema=lb.BOARD_SCHEMA, schema_version=lb.BOARD_SCHEMA_VERSION, env_kwargs={})
    (tmp_path / "b.json").write_text(json.dumps(b))
    assert rlvr_main(["leaderboard", "--boards-dir", str(tmp_path), "show", "b"]) == 0
    out = capsys.readouterr().out
    assert "95% t interval" in out and "m + grpo (seed 1)" not in out
    assert rlvr_main(["leaderboard", "--boards-dir", str(tmp_path), "show", "b", "--per-seed"]) == 0
    out = capsys.readouterr().out
    assert "95% t interval" in out and "m + grpo (seed 1)" in out and out.index("95% t") < out.index("(seed 1)")


def test_the_seed_is_the_unit_repeat_runs_of_a_seed_are_averaged_first():
    b = board()
    # two more builds of grpo seed 0 (0.52 and 0.54): seed 0's value becomes the mean of its three runs, 0.52
    b["entries"] += [entry(8, "m + grpo (seed 0)", 0.52, "grpo", 0), entry(9, "m + grpo (seed 0)", 0.54, "grpo", 0)]
    grpo = {r["name"]: r for r in summarize(b)}["grpo"]
    assert grpo["n"] == 3 and grpo["runs"] == 5
    seeds = [0.52, 0.40, 0.45]
    mean = sum(seeds) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in seeds) / 2)
    assert grpo["mean"] == pytest.approx(mean) and grpo["sd"] == pytest.approx(sd)
    assert grpo["high"] == pytest.approx(mean + 4.302653 * sd / math.sqrt(3))
    assert "3 (5 runs)" in format_summary(b)
