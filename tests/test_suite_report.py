"""benchmarks/suite_report.py: the README's regression table is read from the result files as they are."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("suite_report", ROOT / "benchmarks" / "suite_report.py")
suite_report = importlib.util.module_from_spec(spec)
spec.loader.exec_module(suite_report)


def result(method: str, lane: str, train_pool: int, verdict: str, commit: str | None) -> dict:
    return {"method": method, "baseline": "grpo", "lane": lane, "seeds": [0, 1, 2], "metric": "final_accuracy",
            "method_value": 0.5, "baseline_value": 0.48, "difference": 0.02, "interval": [-0.01, 0.05],
            "accuracy": {"method": 0.5, "baseline": 0.48}, "verdict": verdict, "commit": commit,
            "recipes": {"method": {"train_pool": train_pool}}}


def test_table_names_lane_variant_seeds_and_commit():
    rows = suite_report.table([result("duet", "micro", 512, "inconclusive", "abcdef123456"),
                               result("vigor", "micro", 0, "not reproduced", None),
                               result("duet", "smollm2", 256, "reproduced", "0123456789")]).splitlines()
    assert len(rows) == 5
    assert rows[2].startswith("| duet vs grpo | micro (train_pool=512) | 3 | final_accuracy | 0.5 | 0.48 | +0.02 ")
    assert rows[2].endswith("| inconclusive | abcdef1 |")
    assert "| micro | 3 |" in rows[3] and rows[3].endswith("| not reproduced | ? |")
    assert "| smollm2 | 3 |" in rows[4]  # the pool is part of the smollm2 lane itself, not a variant
