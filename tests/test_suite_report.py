"""benchmarks/suite_report.py: the results table is recomputed from the result files and marks each row at HEAD."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("suite_report", ROOT / "benchmarks" / "suite_report.py")
suite_report = importlib.util.module_from_spec(spec)
spec.loader.exec_module(suite_report)


def result(method: str, lane: str, train_pool: int, commit: str | None, diffs: list[float]) -> dict:
    seeds = list(range(len(diffs)))
    return {"method": method, "baseline": "grpo", "lane": lane, "seeds": seeds, "metric": "final_accuracy",
            "direction": "higher", "method_value": 0.5, "baseline_value": 0.5 - sum(diffs) / len(diffs),
            "difference": sum(diffs) / len(diffs), "interval": [-0.01, 0.05],
            "per_seed": {str(s): {"method": 0.5, "baseline": 0.5 - d} for s, d in zip(seeds, diffs)},
            "accuracy": {"method": 0.5, "baseline": 0.48}, "accuracy_held": {"tolerance": None}, "verdict": "x",
            "commit": commit, "recipes": {"method": {"train_pool": train_pool}}, "run_keys": {}}


def test_table_recomputes_the_interval_and_marks_rows_stale():
    lines, notes = suite_report.rows({
        "duet": result("duet", "micro", 512, "abcdef123456", [0.02, 0.03, 0.025, 0.02, 0.03]),
        "vigor": result("vigor", "micro", 0, None, [0.05, -0.04, 0.0])})
    duet, vigor, *never = lines[2:]
    # every other declared comparison has no result here: listed as not run, not left out
    assert never and all("| not run |" in line or "| precondition not met |" in line for line in never)
    # five seeds of +0.02..+0.03: the t interval is on the positive side, the table's verdict says so
    assert duet.startswith("| duet vs grpo | micro (pool 512) | 5/5 | final_accuracy | 0.5 | 0.475 | +0.025 [+")
    assert "| reproduced | stale | abcdef1 |" in duet
    # three seeds of the five declared, a wide interval, no commit
    assert "| 3/5 |" in vigor and "| inconclusive | stale | ? |" in vigor
    assert any("vigor" in n and "holds 3 of the 5 declared seeds" in n for n in notes)
    assert all("run keys differ" in n for n in notes if "declared, no result" not in n)  # none is a HEAD key
