"""Print the regression suite's results (``benchmarks/results/*.json``) as one Markdown table, plus the per-method
figures the result files carry beyond their claim (SAGC's straggler rate and step times, DUET's token share,
replay and hint activity) read from the runs themselves.

    python benchmarks/suite_report.py                 # every result
    python benchmarks/suite_report.py --runs-dir DIR  # where the runs are (default: $RLVR_RUNS_DIR or the cache)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def table(results: list[dict]) -> str:
    rows = ["| comparison | lane | seeds | metric | method | baseline | difference [95%] | final accuracy m / b | "
            "verdict | commit |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lo, hi = r["interval"]
        pool = (r.get("recipes", {}).get("method") or {}).get("train_pool")
        lane = r["lane"] + (f" (train_pool={pool})" if pool and r["lane"] == "micro" else "")
        # a tagged variant (e.g. hint_vs_grpo_hard) is named by its comparison, which the command records
        name = str(r.get("command", "")).partition(" -k ")[2].split(" ")[0]
        tag = name.removeprefix(f"{r['method']}_vs_{r['baseline']}").removeprefix(f"_{r['lane']}").lstrip("_")
        label = f"{r['method']} vs {r['baseline']}" + (f" ({tag})" if tag else "")
        rows.append(f"| {label} | {lane} | {len(r['seeds'])} | {r['metric']} | "
                    f"{r['method_value']:.4g} | {r['baseline_value']:.4g} | {r['difference']:+.4g} "
                    f"[{lo:+.4g}, {hi:+.4g}] | {r['accuracy']['method']:.3f} / {r['accuracy']['baseline']:.3f} | "
                    f"{r['verdict']} | {(r.get('commit') or '?')[:7]} |")
    return "\n".join(rows)


def run_records(runs_dir: Path, result: dict, side: str, seed: str) -> list[dict]:
    from agents.grpo.metrics import MetricsLog

    key = result["run_keys"][f"{side}/{seed}"]
    matches = list(runs_dir.glob(f"*-s{seed}-{key}/metrics.jsonl"))
    return MetricsLog(matches[0]).read() if matches else []


def extras(results: list[dict], runs_dir: Path) -> list[str]:
    out = []
    for r in results:
        for seed in map(str, r["seeds"]):
            m = [x for x in run_records(runs_dir, r, "method", seed) if x.get("kind") == "train"]
            b = [x for x in run_records(runs_dir, r, "baseline", seed) if x.get("kind") == "train"]
            if not m or not b:
                continue
            step_s = statistics.mean(x["gen_s"] + x["train_s"] for x in m)
            base_s = statistics.mean(x["gen_s"] + x["train_s"] for x in b)
            line = (f"{r['method']} vs {r['baseline']} seed {seed}: rollouts {m[-1]['rollouts_total']} vs "
                    f"{b[-1]['rollouts_total']}, response tokens {m[-1]['tokens_total']} vs {b[-1]['tokens_total']} "
                    f"({m[-1]['tokens_total'] / max(1, b[-1]['tokens_total']):.2f}x), FLOPs "
                    f"{m[-1].get('flops_total', 0):.3g} vs {b[-1].get('flops_total', 0):.3g}, s/step {step_s:.1f} vs "
                    f"{base_s:.1f}")
            keys = sorted({k for x in m for k in x if "." in k})
            for k in keys:
                vals = [x[k] for x in m if isinstance(x.get(k), (int, float))]
                if vals:
                    line += f"; {k} mean {statistics.mean(vals):.3g}"
            out.append(line)
    return out


def main(argv: list[str] | None = None) -> int:
    from agents.grpo.regression import default_runs_dir

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results-dir", default=str(ROOT / "benchmarks" / "results"))
    p.add_argument("--runs-dir", default=None)
    args = p.parse_args(argv)
    results = [json.loads(f.read_text()) for f in sorted(Path(args.results_dir).glob("*.json"))]
    # comparison results only (other reports, e.g. countdown_coverage.json, share the folder)
    results = [r for r in results if not r.get("quick") and "interval" in r and "method" in r]
    print(table(results))
    runs_dir = Path(args.runs_dir) if args.runs_dir else default_runs_dir()
    for line in extras(results, runs_dir):
        print("-", line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
