"""The regression suite's runner: every declared comparison on its lane, with paired seeds, results reused by key.

``run_comparison`` trains each (recipe, seed) of a comparison on its lane (``<runs_dir>/<recipe>-s<seed>-<key>``,
resumed from its checkpoint if a run was interrupted), summarizes them (``agents.grpo.comparisons.summarize``) and writes
``benchmarks/results/<method>.json`` plus a PNG of the held-out accuracy curves.

Keys: a run's key hashes its resolved recipe (less where it writes and how it reports) and the source of the code that
decides what it computes (``CODE_PATHS``); a result's key hashes its comparison and its runs' keys. A result file whose
key matches is reused without running anything, so a second ``pytest benchmarks/`` with nothing changed takes
seconds. Baseline runs are shared: VIGOR-vs-GRPO and ERR+-vs-GRPO train the same GRPO runs once.

``quick=True`` swaps in the ``tiny`` model and a few steps (``QUICK_OVERRIDES``): it proves a comparison runs end to
end (``make test`` does this for every comparison) and says nothing about the claim.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

from agents.grpo.comparisons import PER_TASK_METRICS, Comparison, evals, summarize
from agents.grpo.config import TrainConfig, load_recipe

ROOT = Path(__file__).resolve().parents[2]
# The code that decides what a run computes. The resolved recipe (lane included) is hashed separately, so recipe and
# lane files are not listed; reporting code (this file, comparisons, publishing, plots) is left out, and so are the
# `declare(...)` statements in method files: recording a measured result must not invalidate the runs it came from.
# Method files (agents/methods/) are hashed per run, only those whose components the run's recipe names (and the
# method files they import): adding or changing one method must not retrain every other method's runs.
CODE_PATHS = ("agents/grpo/trainer.py", "agents/grpo/batch.py", "agents/grpo/logprobs.py", "agents/grpo/registry.py",
              "agents/grpo/flops.py", "agents/grpo/history.py", "agents/grpo/segments.py", "agents/grpo/rows.py",
              "agents/grpo/distill.py", "agents/grpo/config.py", "agents/grpo/checkpoint.py", "agents/grpo/baselines.py", "agents/policy",
              "rlvr_envs/core.py", "rlvr_envs/extract.py", "rlvr_envs/modes.py", "rlvr_envs/tasks", "rlvr_envs/verifiers")
# Fields that do not change what a run computes.
_NOT_KEYED = frozenset({"out_dir", "progress", "plot", "description", "checkpoint_every", "keep_checkpoints"})
QUICK_OVERRIDES = ("model=tiny", "steps=2", "prompts_per_step=2", "max_new_tokens=12", "eval_size=4", "final_eval_size=0",
                   "eval_every=1",
                   "eval_max_new_tokens=12", "micro_batch=16", "checkpoint_every=0")
QUICK_SEEDS = (0, 1)


def default_runs_dir() -> Path:
    """Where suite runs train: ``$RLVR_RUNS_DIR``, else ``$RLVR_CACHE_DIR/regression-runs`` (outside the checkout, so a
    fresh clone of the repository on the same machine reuses and resumes them)."""
    from agents.policy.models import cache_dir

    return Path(os.environ.get("RLVR_RUNS_DIR") or cache_dir() / "regression-runs")


def _without_declarations(source: str) -> str:
    """Python source less its top-level ``declare(...)`` statements and its docstrings (normalized through the AST,
    which also drops comments): documenting code, or recording a result, must not retrain the runs it describes."""
    tree = ast.parse(source)
    tree.body = [node for node in tree.body if not (
        isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
        and getattr(node.value.func, "id", None) == "declare")]
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return ast.unparse(tree)


def code_hash(paths: tuple[str, ...] = CODE_PATHS) -> str:
    h = hashlib.sha256()
    for rel in paths:
        base = ROOT / rel
        files = sorted(base.rglob("*.py")) if base.is_dir() else [base]
        for f in files:
            if f.is_file() and "__pycache__" not in f.parts:
                h.update(str(f.relative_to(ROOT)).encode())
                h.update(_without_declarations(f.read_text()).encode())
    return h.hexdigest()[:16]


def method_files(cfg: TrainConfig) -> list[str]:
    """The files under ``agents/methods/`` that a run executes: those defining its recipe's components, and the
    ``agents.methods`` modules they import (transitively)."""
    import sys

    from agents.grpo import registry

    methods_dir = ROOT / "agents" / "methods"
    defining = []
    for stage, name in cfg.stages.items():
        module = sys.modules.get(registry.get(stage, name).__module__)
        path = Path(getattr(module, "__file__", "") or "").resolve()
        if path.is_file() and path.is_relative_to(methods_dir.resolve()):
            defining.append(path)
    return sorted(str(p.relative_to(ROOT.resolve())) for p in _with_imports(defining, methods_dir.resolve()))


def _with_imports(paths: list[Path], methods_dir: Path) -> set[Path]:
    """``paths`` plus every module of ``methods_dir`` (the ``agents.methods`` package) they import, transitively."""
    todo, seen = list(paths), set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                names = [base, *(f"{base}.{a.name}" for a in node.names)]  # `from agents.methods import x`
            else:
                continue
            for mod in names:
                if mod.startswith("agents.methods."):
                    dep = methods_dir / (mod.removeprefix("agents.methods.").replace(".", "/") + ".py")
                    if dep.is_file():
                        todo.append(dep)
    return seen


def run_code_hash(cfg: TrainConfig, shared: str | None = None) -> str:
    """The code key of one run: the shared training code (``CODE_PATHS``) plus the method files it uses."""
    files = method_files(cfg)
    return f"{shared or code_hash()}+{code_hash(tuple(files))}" if files else shared or code_hash()


def run_key(cfg: TrainConfig, code: str) -> str:
    keyed = {k: v for k, v in cfg.to_dict().items() if k not in _NOT_KEYED}
    return hashlib.sha256(json.dumps([keyed, code], sort_keys=True, default=str).encode()).hexdigest()[:16]


def resolve(comparison: Comparison, recipe: str, seed: int, *, quick: bool = False) -> TrainConfig:
    overrides = [*comparison.overrides, *(QUICK_OVERRIDES if quick else ()), f"seed={seed}", "progress=false"]
    return load_recipe(recipe, overrides, lane=comparison.lane)


def machine_fingerprint() -> dict[str, Any]:
    """What besides the key can change a run's floating point: torch's version, its thread count and the CPU's
    vector extensions (a run is bit-exact across processes on one kind of machine; tests/test_determinism.py)."""
    import platform

    import torch

    flags: list[str] = []
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = sorted(f for f in line.split(":", 1)[1].split() if f.startswith(("avx", "amx", "fma")))
                break
    except OSError:
        pass
    return {"torch": torch.__version__, "threads": torch.get_num_threads(), "machine": platform.machine(),
            "cpu_flags": " ".join(flags)}


def train_run(cfg: TrainConfig, runs_dir: Path, code: str, *, log: Any = None, archive: Path | None = None
              ) -> tuple[list[dict[str, Any]], str, dict[str, Any]]:
    """Train (or reuse, or resume) one run; returns its metrics records, its key and its ``done.json`` (wall time, the
    warm start's and the final policy's weights hashes, the machine fingerprint). ``archive``: a folder of committed
    run archives (``ARCHIVE_DIR`` for suite runs) read before training and written when the run finishes."""
    from filelock import FileLock

    from agents.grpo.metrics import MetricsLog
    from agents.grpo.trainer import Trainer
    from agents.policy.models import weights_hash

    key = run_key(cfg, code)
    out = runs_dir / f"{Path(cfg.out_dir).name}-s{cfg.seed}-{key}"
    done = out / "done.json"
    runs_dir.mkdir(parents=True, exist_ok=True)
    # Comparisons share baseline runs; two suite processes wait for each other instead of training one run twice.
    with FileLock(str(out) + ".lock"):
        if done.is_file():
            return MetricsLog(out / "metrics.jsonl").read(), key, json.loads(done.read_text())
        archived = read_archive(out.name, key, archive) if archive is not None else None
        if archived is not None:  # trained on another machine and committed: the same weights (a keyed, exact run)
            if log:
                log(f"reuse {out.name} from {archive}")
            return archived
        cfg.out_dir = str(out)
        t0 = time.perf_counter()
        if log:
            log(f"train {out.name} ({cfg.steps} steps)")
        trainer = Trainer(cfg)
        records = trainer.run(resume=True)
        info = {"key": key, "wall_s": time.perf_counter() - t0, "warmstart_weights_hash": trainer.policy.weights_hash,
                "final_weights_hash": weights_hash(trainer.model), **machine_fingerprint()}
        tmp = done.with_suffix(".tmp")
        tmp.write_text(json.dumps(info))
        os.replace(tmp, done)
        if archive is not None:
            write_archive(out.name, records, info, archive)
    return records, key, info


# Each finished run's metrics (every train and eval record, per-task eval outcomes included; never weights) are
# archived in the repository at once, gzipped, so that a finished run outlives the machine that trained it and a
# later session on another machine reuses it by key instead of retraining.
ARCHIVE_DIR = ROOT / "benchmarks" / "results" / "runs"


def write_archive(name: str, records: list[dict[str, Any]], info: dict[str, Any],
                  directory: Path | None = None) -> Path:
    """``<name>.jsonl.gz``: a first line ``{"done": info}``, then the run's records (atomic: temporary, rename)."""
    import gzip

    path = (directory or ARCHIVE_DIR) / f"{name}.jsonl.gz"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with gzip.GzipFile(tmp, "wb", mtime=0) as f:  # mtime 0: the same run gives the same bytes
        for line in ({"done": info}, *records):
            f.write((json.dumps(line, sort_keys=True) + "\n").encode())
    os.replace(tmp, path)
    return path


def read_archive(name: str, key: str, directory: Path | None = None
                 ) -> tuple[list[dict[str, Any]], str, dict[str, Any]] | None:
    """An archived run's (records, key, done info) when one of that name and key is committed; else None. A broken
    archive is reported and ignored (the run is retrained), never half-read."""
    import gzip
    import warnings

    path = (directory or ARCHIVE_DIR) / f"{name}.jsonl.gz"
    if not path.is_file():
        return None
    try:
        with gzip.open(path, "rt") as f:
            lines = [json.loads(line) for line in f if line.strip()]
        info = lines[0]["done"]
    except (OSError, EOFError, ValueError, KeyError, IndexError, TypeError) as e:
        warnings.warn(f"{path}: unreadable run archive ({e}); the run is trained again", stacklevel=2)
        return None
    if info.get("key") != key:
        return None
    return lines[1:], key, info


def _curves(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    train = {r["step"]: r for r in records if r.get("kind") == "train"}
    return [{"step": r["step"], "rollouts": train.get(r["step"], {}).get("rollouts_total", 0),
             "flops": train.get(r["step"], {}).get("flops_total", 0),
             "tokens": train.get(r["step"], {}).get("tokens_total", 0), "eval_accuracy": r["eval_accuracy"],
             "eval_len_mean": r.get("eval_len_mean")} for r in evals(records)]


def _wall(records: list[dict[str, Any]]) -> float:
    return float(sum(r.get("gen_s", 0) + r.get("train_s", 0) for r in records if r.get("kind") == "train")
                 + sum(r.get("eval_s", 0) for r in records if r.get("kind") == "eval"))


def plot(result: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for side, color in (("baseline", "tab:gray"), ("method", "tab:blue")):
        for i, curve in enumerate(result["curves"][side].values()):
            ax.plot([c["rollouts"] for c in curve], [c["eval_accuracy"] for c in curve], color=color, alpha=0.8,
                    marker=".", label=f"{result[side]} (seeds {', '.join(result['curves'][side])})" if i == 0 else None)
    ax.set_xlabel("rollouts generated")
    ax.set_ylabel("held-out accuracy (the lane's eval)")
    lo, hi = result["interval"]
    ax.set_title(f"{result['method']} vs {result['baseline']} on {result['lane']}: {result['metric']} "
                 f"diff {result['difference']:+.3g} [{lo:+.3g}, {hi:+.3g}]", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run_comparison(comparison: Comparison, *, results_dir: Path, runs_dir: Path, quick: bool = False,
                   log: Any = print) -> dict[str, Any]:
    """Run (or reuse) a comparison and write ``results_dir/<method>.json`` and ``.png``."""
    shared = code_hash()
    seeds = QUICK_SEEDS if quick else comparison.seeds
    cfgs = {(side, s): resolve(comparison, recipe, s, quick=quick) for side, recipe in
            (("method", comparison.method), ("baseline", comparison.baseline)) for s in seeds}
    codes = {k: run_code_hash(cfg, shared) for k, cfg in cfgs.items()}
    keys = {f"{side}/{s}": run_key(cfg, codes[(side, s)]) for (side, s), cfg in cfgs.items()}
    # the summary's code is keyed too: a change to how a result is summarized rewrites it (from the same runs)
    summary_code = code_hash(("agents/grpo/comparisons.py", "agents/grpo/regression.py"))
    result_key = hashlib.sha256(json.dumps([comparison.to_dict(), keys, quick, summary_code],
                                           sort_keys=True).encode()).hexdigest()[:16]
    path = results_dir / f"{comparison.result_name}.json"
    if path.is_file():
        try:
            old = json.loads(path.read_text())
        except json.JSONDecodeError:
            old = {}
        if old.get("key") == result_key:
            if log:
                log(f"{comparison.name}: reusing {path} (key {result_key})")
            return old
    t0 = time.perf_counter()
    runs: dict[str, dict[int, list[dict[str, Any]]]] = {"method": {}, "baseline": {}}
    weights: dict[str, dict[str, dict[str, Any]]] = {"method": {}, "baseline": {}}
    for (side, s), cfg in cfgs.items():
        runs[side][s], _, done = train_run(cfg, runs_dir, codes[(side, s)], log=log,
                                           archive=None if quick else ARCHIVE_DIR)
        weights[side][str(s)] = {k: done.get(k) for k in ("warmstart_weights_hash", "final_weights_hash", "threads",
                                                          "torch", "cpu_flags")}
    if quick:  # a two-seed run of a few steps is a smoke test, not a claim
        comparison = dataclasses.replace(comparison, seeds=tuple(seeds))
    summary = summarize(comparison, runs["method"], runs["baseline"])
    from rlvr_envs.harness.results import git_info

    result = {
        "method": comparison.method, "baseline": comparison.baseline, "lane": comparison.lane,
        "seeds": list(seeds), "metric": comparison.metric, "direction": comparison.direction,
        "claim": comparison.claim, "params": comparison.params, **summary, "quick": quick,
        "commit": git_info().get("commit"), "code_hash": shared, "key": result_key, "run_keys": keys,
        "recipes": {"method": cfgs[("method", seeds[0])].to_dict(), "baseline": cfgs[("baseline", seeds[0])].to_dict()},
        "curves": {side: {str(s): _curves(runs[side][s]) for s in seeds} for side in runs},
        "wall_s": {side: {str(s): round(_wall(runs[side][s]), 1) for s in seeds} for side in runs},
        # which weights the runs started from and ended at (a run key pins them: tests/test_determinism.py)
        "weights": weights,
        "suite_wall_s": round(time.perf_counter() - t0, 1),
        "command": f"pytest benchmarks/test_regression.py -k {comparison.name}" + (" --quick" if quick else ""),
    }
    results_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    os.replace(tmp, path)
    plot(result, path.with_suffix(".png"))
    return result


def status_at_head(result: dict[str, Any], comparison: Comparison | None, *, shared: str | None = None
                   ) -> dict[str, Any]:
    """Whether a committed result still describes the code at HEAD: ``current`` when every run key it was computed
    from equals the key that comparison's runs get now (the key covers only the code and recipe that can change a
    run) and it holds the seeds its declaration asks for; otherwise ``stale`` with the reasons."""
    reasons: list[str] = []
    if comparison is None:
        return {"status": "stale", "reasons": ["no longer declared"]}
    held = [int(s) for s in result.get("seeds", [])]
    if not set(comparison.seeds) <= set(held):
        reasons.append(f"holds {len(held)} of the {len(comparison.seeds)} declared seeds")
    shared = shared or code_hash()
    changed = 0
    for side, recipe in (("method", comparison.method), ("baseline", comparison.baseline)):
        for s in held:
            cfg = resolve(comparison, recipe, s)
            if run_key(cfg, run_code_hash(cfg, shared)) != (result.get("run_keys") or {}).get(f"{side}/{s}"):
                changed += 1
    if changed:
        reasons.append(f"{changed} of {2 * len(held)} run keys differ at HEAD (code or recipe changed)")
    if not (result.get("evidence") or {}).get("per_task") and comparison.metric in PER_TASK_METRICS:
        reasons.append("no per-task evidence committed")
    return {"status": "stale" if reasons else "current", "reasons": reasons}


# -- training many runs at once ----------------------------------------------------------------------------------------
def pending_runs(selected: list[Comparison], *, quick: bool = False) -> list[tuple[TrainConfig, str]]:
    """Every distinct (config, code key) the selected comparisons need, shared baseline runs once."""
    shared = code_hash()
    out: dict[str, tuple[TrainConfig, str]] = {}
    for comparison in selected:
        for recipe in (comparison.method, comparison.baseline):
            for s in QUICK_SEEDS if quick else comparison.seeds:
                cfg = resolve(comparison, recipe, s, quick=quick)
                code = run_code_hash(cfg, shared)
                out.setdefault(run_key(cfg, code), (cfg, code))
    return list(out.values())


def _train_one(args: tuple[dict[str, Any], str, str, int, str | None]) -> tuple[str, float]:
    from agents.grpo.config import from_dict

    data, runs_dir, code, threads, archive = args
    import torch

    torch.set_num_threads(threads)
    cfg = from_dict(data)
    t0 = time.perf_counter()
    _, key, _ = train_run(cfg, Path(runs_dir), code, archive=Path(archive) if archive else None)
    return Path(cfg.out_dir).name, time.perf_counter() - t0  # train_run points out_dir at the keyed run folder


def train_parallel(selected: list[Comparison], *, runs_dir: Path, jobs: int, quick: bool = False,
                   log: Any = print, on_finished: Any = None) -> None:
    """Train the runs of ``selected`` comparisons ``jobs`` at a time (processes with ``cpus // jobs`` threads each);
    finished runs are skipped, interrupted ones resume. Results are then written by ``run_comparison``.
    ``on_finished(name)`` is called in this process as each run finishes (``--commit`` commits its archive)."""
    import concurrent.futures as cf
    import multiprocessing as mp

    todo = pending_runs(selected, quick=quick)
    threads = max(1, (os.cpu_count() or 1) // max(1, jobs))
    archive = None if quick else str(ARCHIVE_DIR)
    args = [(cfg.to_dict(), str(runs_dir), code, threads, archive) for cfg, code in todo]
    if log:
        log(f"{len(todo)} runs for {len(selected)} comparisons, {jobs} at a time x {threads} threads -> {runs_dir}")
    with cf.ProcessPoolExecutor(max_workers=max(1, jobs), mp_context=mp.get_context("spawn")) as pool:
        futures = {pool.submit(_train_one, a): a for a in args}
        for done, fut in enumerate(cf.as_completed(futures), 1):
            name, wall = fut.result()
            if log:
                log(f"[{done}/{len(todo)}] {name}: {wall:.0f} s")
            if on_finished is not None:
                on_finished(name)


def board_for(comparison: Comparison) -> str:
    """The board a comparison's runs go to: ``lane-<lane>``; ``lane-<lane>-pool<N>`` for runs on a finite training
    pool (``train_pool=N``, the same held-out tasks, another training regime); ``lane-<lane>-<result>`` when other
    overrides change the lane's task (env kwargs): a board ranks one task set under one regime."""
    pools = [o.split("=", 1)[1] for o in comparison.overrides if o.startswith("train_pool=")]
    others = [o for o in comparison.overrides if not o.startswith("train_pool=")]
    if others:
        return f"lane-{comparison.lane}-{comparison.result_name}"
    return f"lane-{comparison.lane}" + (f"-pool{pools[0]}" if pools else "")


def publish_runs(selected: list[Comparison], *, runs_dir: Path, boards_dir: Path, results_dir: Path,
                 seeds: tuple[int, ...] | None = None, log: Any = print) -> list[dict[str, Any]]:
    """Evaluate every finished run of ``selected`` through the harness and submit it to its lane's board (each
    (recipe, seed) once; an entry already on the board for the same weights is skipped)."""
    from agents.grpo.publish import describe_entry, publish_run
    from rlvr_envs.harness.leaderboard import load_board

    shared, entries, seen = code_hash(), [], set()
    for comparison in selected:
        board = board_for(comparison)
        for recipe in (comparison.method, comparison.baseline):
            for s in seeds or comparison.seeds:
                cfg = resolve(comparison, recipe, s)
                key = run_key(cfg, run_code_hash(cfg, shared))
                run_dir = runs_dir / f"{Path(cfg.out_dir).name}-s{s}-{key}"
                if (board, run_dir) in seen or not (run_dir / "done.json").is_file():
                    continue
                seen.add((board, run_dir))
                path = boards_dir / f"{board}.json"
                on_board = {e.get("training", {}).get("run_dir") for e in load_board(path)["entries"]} \
                    if path.is_file() else set()
                if run_dir.name in on_board:
                    continue
                entry = publish_run(run_dir, boards_dir=boards_dir, board=board, results_dir=results_dir,
                                    method=recipe)
                entries.append(entry)
                if log:
                    log(f"{board}: {describe_entry(entry)}")
    return entries


def run_names(comparison: Comparison, *, quick: bool = False, shared: str | None = None) -> list[str]:
    """The run folders (and archive names) ``<recipe>-s<seed>-<key>`` of ``comparison``'s runs at HEAD keys."""
    shared = shared or code_hash()
    names = []
    for recipe in (comparison.method, comparison.baseline):
        for s in QUICK_SEEDS if quick else comparison.seeds:
            cfg = resolve(comparison, recipe, s, quick=quick)
            names.append(f"{Path(cfg.out_dir).name}-s{s}-{run_key(cfg, run_code_hash(cfg, shared))}")
    return names


def missing_runs(comparison: Comparison, *, shared: str | None = None) -> int:
    """How many of ``comparison``'s runs at HEAD keys have no committed archive (what running it would train)."""
    return sum(not (ARCHIVE_DIR / f"{name}.jsonl.gz").is_file() for name in run_names(comparison, shared=shared))


def stale_first(selected: list[Comparison], results_dir: Path | None = None) -> list[Comparison]:
    """The comparisons of ``selected`` that are not current at HEAD (no result, or a stale one), less those whose
    precondition is not met, ordered by how many runs they still need (shared baselines counted once each)."""
    results_dir = results_dir or ROOT / "benchmarks" / "results"
    shared, out = code_hash(), []
    for c in selected:
        if c.precondition_not_met:
            continue
        path = results_dir / f"{c.result_name}.json"
        if path.is_file():
            try:
                result = json.loads(path.read_text())
            except json.JSONDecodeError:
                result = {}
            if result.get("lane") == c.lane and status_at_head(result, c, shared=shared)["status"] == "current":
                continue
        out.append((missing_runs(c, shared=shared), c.name, c))
    return [c for _, _, c in sorted(out, key=lambda t: (t[0], t[1]))]


def git_commit(paths: list[Path], message: str, repo: Path = ROOT) -> bool:
    """Commit ``paths`` (those that exist) with ``message``, and nothing else that is staged; a failure is reported,
    never raised: the files stay on disk for the next try."""
    import subprocess
    import warnings

    files = [str(p) for p in paths if Path(p).is_file()]
    if not files:
        return False
    try:
        subprocess.run(["git", "-C", str(repo), "add", "--", *files], check=True, capture_output=True, text=True)
        subprocess.run(["git", "-C", str(repo), "commit", "-q", "-m", message, "--", *files], check=True,
                       capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError) as e:
        warnings.warn(f"could not commit {', '.join(files)}: {getattr(e, 'stderr', '') or e}", stacklevel=2)
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    """``python -m agents.grpo.regression [-k NAME ...] [--stale] [--commit] [--jobs N] [--seeds 0,1] [--quick] [--list]``:
    train the selected comparisons' runs in parallel, then write their results (what ``pytest
    benchmarks/test_regression.py`` reads). ``--stale --commit`` is how a session brings the table to HEAD."""
    import argparse

    from agents.grpo.comparisons import comparisons

    p = argparse.ArgumentParser(prog="python -m agents.grpo.regression", description=main.__doc__)
    p.add_argument("-k", dest="names", action="append", default=[],
                   help="a comparison's name, or a substring of names (repeatable)")
    p.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 1)), help="runs trained at once")
    p.add_argument("--quick", action="store_true", help="tiny model, two steps (a smoke test)")
    p.add_argument("--seeds", default=None,
                   help="comma-separated seeds to run instead of each comparison's own (e.g. 0 when one paired "
                        "seed is what the time allows; the result says which seeds it holds)")
    p.add_argument("--list", action="store_true", help="list the comparisons and exit")
    p.add_argument("--stale", action="store_true",
                   help="only the selected comparisons that are not current at HEAD (stale or never run; those whose "
                        "precondition is not met are left out), the fewest runs still to train first")
    p.add_argument("--commit", action="store_true",
                   help="git-commit each finished run's archive, and each result, as soon as it is written (only "
                        "commits survive a machine that is replaced)")
    p.add_argument("--results-dir", default=str(ROOT / "benchmarks" / "results"))
    p.add_argument("--runs-dir", default=None)
    p.add_argument("--publish", action="store_true",
                   help="then evaluate every finished run through the harness and submit it to its lane's board")
    p.add_argument("--boards-dir", default=str(ROOT / "leaderboards" / "boards"))
    p.add_argument("--board-results-dir", default=str(ROOT / "leaderboards" / "results"))
    args = p.parse_args(argv)
    known = comparisons()
    # -k NAME: that comparison when NAME is one, else every comparison whose name contains it
    selected = [c for n, c in known.items() if not args.names
                or any(k == n or (k not in known and k in n) for k in args.names)]
    if args.stale:
        selected = stale_first(selected)
        if not selected:
            print("every selected comparison is current at HEAD")
            return 0
    if args.list or not selected:
        for c in selected if args.list else known.values():  # --list: what was selected, in the order it would run
            print(f"{c.name:<32} {c.lane:<8} {c.metric:<26} {c.direction}")
        return 0 if args.list else 2
    if args.seeds is not None:
        if args.quick:
            p.error(f"--seeds is for full runs; --quick always runs seeds {', '.join(map(str, QUICK_SEEDS))}")
        try:
            seeds = tuple(int(x) for x in args.seeds.split(",") if x.strip())
        except ValueError:
            p.error(f"--seeds takes comma-separated integers, got {args.seeds!r}")
        if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
            p.error(f"--seeds must be distinct non-negative integers, got {args.seeds!r}")
        selected = [dataclasses.replace(c, seeds=seeds) for c in selected]
    runs_dir = Path(args.runs_dir) if args.runs_dir else default_runs_dir()
    commit = args.commit and not args.quick
    results_dir = Path(args.results_dir)
    written: set[str] = set()
    shared = code_hash()
    names = {c.name: run_names(c, quick=args.quick, shared=shared) for c in selected}

    def write_result(c: Comparison) -> None:
        r = run_comparison(c, results_dir=results_dir, runs_dir=runs_dir, quick=args.quick, log=None)
        written.add(c.name)
        lo, hi = r["interval"]
        print(f"{c.name}: {r['metric']} {r['method_value']:.4g} vs {r['baseline_value']:.4g}, diff "
              f"{r['difference']:+.4g} [{lo:+.4g}, {hi:+.4g}] -> {r['verdict']}", flush=True)
        if commit:
            import subprocess
            import sys

            # the results page is generated from the result files and checked in make test: it lands with them
            subprocess.run([sys.executable, str(ROOT / "benchmarks" / "suite_report.py"), "--write"], check=False,
                           capture_output=True)
            path = results_dir / f"{c.result_name}.json"
            git_commit([path, path.with_suffix(".png"), ROOT / "docs" / "results.md"],
                       f"{c.name} at HEAD, {len(r['seeds'])} paired seeds: {r['metric']} diff {r['difference']:+.4g} "
                       f"[95% {lo:+.4g}, {hi:+.4g}], {r['verdict']}")

    def finished(name: str) -> None:
        if commit:
            git_commit([ARCHIVE_DIR / f"{name}.jsonl.gz"], f"Run archive: {name} at HEAD keys")
        # a comparison's result is written (and committed) as soon as its last run lands, not after every run
        for c in selected:
            if c.name not in written and all((runs_dir / f"{run}/done.json").is_file()
                                             or (ARCHIVE_DIR / f"{run}.jsonl.gz").is_file()
                                             for run in names[c.name]):
                write_result(c)

    train_parallel(selected, runs_dir=runs_dir, jobs=args.jobs, quick=args.quick,
                   on_finished=finished)
    for c in selected:
        if c.name not in written:
            write_result(c)
    if args.publish and not args.quick:
        publish_runs(selected, runs_dir=runs_dir, boards_dir=Path(args.boards_dir),
                     results_dir=Path(args.board_results_dir))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
