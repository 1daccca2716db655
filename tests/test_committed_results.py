"""Every committed regression result can be recomputed from the repository alone, and the results page says so.

- each comparison result in ``benchmarks/results/`` gives back its interval and verdict from its own committed
  evidence (``comparisons.recheck``: the per-seed, per-task outcomes of the final evals);
- a result written before evidence was committed is still recomputed, from its per-seed values, with the seed-level
  interval the suite uses now (the table shows that, not the file's old bootstrap interval);
- every archived run (``benchmarks/results/runs/*.jsonl.gz``) is readable and carries the key its name says;
- ``docs/results.md`` is exactly what ``benchmarks/suite_report.py`` makes of these files at HEAD.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest

from agents.grpo.comparisons import recheck
from agents.grpo.regression import ARCHIVE_DIR, read_archive

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def _results() -> dict[str, dict]:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from suite_report import load_results

    return load_results(RESULTS)


@pytest.mark.parametrize("stem", sorted(_results()))
def test_a_committed_result_is_recomputed_from_its_file(stem: str) -> None:
    result = _results()[stem]
    again = recheck(result)
    assert set(again["per_seed"]) == {str(s) for s in result["seeds"]}
    if again["evidence"] == "per-task outcomes":
        assert again["difference"] == pytest.approx(result["difference"], abs=1e-9)
        assert again["interval"] == pytest.approx(result["interval"], abs=1e-9)
        assert again["verdict"] == result["verdict"]
        assert again["variance_components"] == pytest.approx(result["variance_components"])
        for s, v in again["per_seed"].items():
            assert v == pytest.approx(result["per_seed"][s], abs=1e-9)
    else:  # written before per-task evidence: the per-seed values give the difference back
        assert again["difference"] == pytest.approx(result["difference"], abs=1e-9)


def test_tampered_evidence_changes_the_recomputed_result() -> None:
    """The check reads the evidence: a rewritten per-task outcome string moves the recomputed accuracy (read as an
    accuracy comparison, whatever the file's own metric, so that the per-task outcomes are what it recomputes)."""
    with_evidence = {k: r for k, r in _results().items() if (r.get("evidence") or {}).get("per_task")}
    if not with_evidence:
        pytest.skip("no committed result carries per-task evidence yet")
    result = json.loads(json.dumps(next(iter(with_evidence.values()))))
    result["metric"] = "final_accuracy"
    honest = recheck(result)
    seed = str(result["seeds"][0])
    text = result["evidence"]["per_task"]["method"][seed]
    k = int(result["evidence"]["samples"])
    result["evidence"]["per_task"]["method"][seed] = "".join(str(k) for _ in text)  # every sample right
    tampered = recheck(result)
    assert tampered["per_seed"][seed]["method"] == pytest.approx(1.0)
    assert honest["per_seed"][seed]["method"] < 1.0 and tampered["difference"] > honest["difference"]


def test_archived_runs_are_readable_and_keyed() -> None:
    archives = sorted(ARCHIVE_DIR.glob("*.jsonl.gz"))
    for path in archives:
        name = path.name.removesuffix(".jsonl.gz")
        key = name.rsplit("-", 1)[1]
        got = read_archive(name, key)
        assert got is not None, path
        records, _, info = got
        assert info["key"] == key and info["final_weights_hash"] and records
        assert any(r.get("kind") == "eval" for r in records)


def test_a_broken_archive_is_ignored_with_a_warning(tmp_path: Path) -> None:
    (tmp_path / "grpo-s0-abc.jsonl.gz").write_bytes(gzip.compress(b"not json\n"))
    with pytest.warns(UserWarning, match="unreadable run archive"):
        assert read_archive("grpo-s0-abc", "abc", tmp_path) is None
    assert read_archive("grpo-s0-missing", "abc", tmp_path) is None


def test_the_results_page_is_current() -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from suite_report import DOC, page

    assert DOC.is_file(), "docs/results.md is missing: python benchmarks/suite_report.py --write"
    assert DOC.read_text() == page(RESULTS), "docs/results.md is out of date: python benchmarks/suite_report.py --write"
