"""The results file: one versioned JSON document with per-sample records, metrics, timing and provenance.

Layout (``schema = "rlvr-results"``, ``schema_version = 1``)::

    {"schema", "schema_version", "complete",
     "config":     {env_id, env_kwargs, n_samples, seed, n_tasks, batch_size, seed_derivation},
     "provenance": {package, env, data, agent, machine, created_at, argv},
     "metrics":    compute_metrics(records)        (absent while the run is partial)
     "timing":     {wall_time_s, act_s, verify_s, batches},
     "records":    [{task_index, task_id, sample_index, seed, response, parsed_answer, correct, reward,
                     format_ok, error, truncated_response, tokens, metadata[, status, turns (multi-turn envs),
                     answer]}, ...]}

Records are sorted by (task_index, sample_index). ``validate`` checks the shape before anything trusts a file.
``status`` ("correct", "wrong" or "unverifiable": the verifier could not decide) is optional, so files written before
it existed still load: a record without it has the status its ``correct`` implies. ``correct`` is the field a board
re-verifies and every accuracy counts, so it wins where the two disagree: ``status`` only tells the records that are
not correct apart into wrong and unverifiable (``rlvr_envs.core.verdict_status``).
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlvr_envs.core import VERDICT_STATUSES

SCHEMA = "rlvr-results"
SCHEMA_VERSION = 1
SEED_DERIVATION = "numpy.random.SeedSequence(seed, spawn_key=(task_index, sample_index)).generate_state(1)[0]"


class SchemaError(ValueError):
    """A results file that does not have the documented shape."""


# field -> allowed types (None allowed where listed)
RECORD_FIELDS: dict[str, tuple[type, ...]] = {
    "task_index": (int,),
    "task_id": (str,),
    "sample_index": (int,),
    "seed": (int,),
    "response": (str,),
    "parsed_answer": (str, type(None)),
    "correct": (bool,),
    "reward": (int, float),
    "format_ok": (bool,),
    "error": (str, type(None)),
    "truncated_response": (bool,),
    "tokens": (int, type(None)),
    "metadata": (dict,),
}
CONFIG_FIELDS: dict[str, tuple[type, ...]] = {
    "env_id": (str,),
    "env_kwargs": (dict,),
    "n_samples": (int,),
    "seed": (int,),
    "n_tasks": (int,),
    "batch_size": (int,),
}


def _check_fields(obj: Any, fields: dict[str, tuple[type, ...]], where: str) -> None:
    if not isinstance(obj, dict):
        raise SchemaError(f"{where}: expected an object, got {type(obj).__name__}")
    for name, types in fields.items():
        if name not in obj:
            raise SchemaError(f"{where}: missing field {name!r}")
        value = obj[name]
        # bool is an int subclass; an int field must not accept True/False.
        if isinstance(value, bool) and bool not in types:
            raise SchemaError(f"{where}.{name}: expected {'/'.join(t.__name__ for t in types)}, got bool")
        if not isinstance(value, types):
            raise SchemaError(f"{where}.{name}: expected {'/'.join(t.__name__ for t in types)}, "
                              f"got {type(value).__name__}")


def validate(doc: Any) -> None:
    """Raise ``SchemaError`` naming the first problem if ``doc`` is not a results document of this schema version."""
    if not isinstance(doc, dict):
        raise SchemaError(f"results: expected a JSON object, got {type(doc).__name__}")
    if doc.get("schema") != SCHEMA:
        raise SchemaError(f"results: 'schema' is {doc.get('schema')!r}, expected {SCHEMA!r}")
    if doc.get("schema_version") != SCHEMA_VERSION:
        raise SchemaError(f"results: schema_version {doc.get('schema_version')!r} is not supported "
                          f"(this version reads {SCHEMA_VERSION})")
    for key, typ in (("complete", bool), ("config", dict), ("provenance", dict), ("timing", dict),
                     ("records", list)):
        if not isinstance(doc.get(key), typ):
            raise SchemaError(f"results: field {key!r} must be a {typ.__name__}")
    _check_fields(doc["config"], CONFIG_FIELDS, "config")
    cfg = doc["config"]
    if cfg["n_samples"] < 1 or cfg["n_tasks"] < 1 or cfg["batch_size"] < 1:
        raise SchemaError("config: n_samples, n_tasks and batch_size must be >= 1")
    seen: set[tuple[int, int]] = set()
    for i, rec in enumerate(doc["records"]):
        _check_fields(rec, RECORD_FIELDS, f"records[{i}]")
        if "status" in rec and rec["status"] not in VERDICT_STATUSES:
            raise SchemaError(f"records[{i}].status: expected one of {', '.join(VERDICT_STATUSES)}, "
                              f"got {rec['status']!r}")
        turns = rec.get("turns")
        if turns is not None and (not isinstance(turns, list) or not turns or
                                  not all(isinstance(t, str) for t in turns) or turns[-1] != rec["response"]):
            raise SchemaError(f"records[{i}].turns: expected a non-empty list of strings ending with the response")
        key = (rec["task_index"], rec["sample_index"])
        if not (0 <= key[0] < cfg["n_tasks"] and 0 <= key[1] < cfg["n_samples"]):
            raise SchemaError(f"records[{i}]: (task_index, sample_index) = {key} outside the configured run")
        if key in seen:
            raise SchemaError(f"records[{i}]: duplicate record for (task_index, sample_index) = {key}")
        seen.add(key)
    if doc["complete"]:
        expected = cfg["n_tasks"] * cfg["n_samples"]
        if len(doc["records"]) != expected:
            raise SchemaError(f"results: marked complete but holds {len(doc['records'])} records, expected {expected}")
        if not isinstance(doc.get("metrics"), dict):
            raise SchemaError("results: marked complete but has no 'metrics' object")


@dataclass
class Results:
    """A results document; ``data`` is exactly what goes into the JSON file."""

    data: dict[str, Any]

    @property
    def records(self) -> list[dict[str, Any]]:
        return self.data["records"]

    @property
    def metrics(self) -> dict[str, Any]:
        return self.data.get("metrics") or {}

    @property
    def config(self) -> dict[str, Any]:
        return self.data["config"]

    @property
    def provenance(self) -> dict[str, Any]:
        return self.data["provenance"]

    @property
    def complete(self) -> bool:
        return bool(self.data["complete"])

    def save(self, path: str | os.PathLike) -> None:
        atomic_write_json(Path(path), self.data)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Results:
        path = Path(path)
        try:
            with open(path, encoding="utf-8") as f:
                doc = json.load(f)
        except json.JSONDecodeError as exc:
            raise SchemaError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
        validate(doc)
        return cls(doc)

    def summary(self) -> str:
        m, cfg = self.metrics, self.config
        agent = self.provenance.get("agent", {})
        head = f"{cfg['env_id']}  model={agent.get('model', agent.get('class', '?'))}  " \
               f"tasks={cfg['n_tasks']} samples={cfg['n_samples']} seed={cfg['seed']}"
        if not m:
            return head + f"\n(partial: {len(self.records)} of {cfg['n_tasks'] * cfg['n_samples']} samples)"
        keys = [k for k in m if k.startswith(("pass@", "mean@", "maj@"))]
        lines = [head, "  " + "  ".join(f"{k}={m[k]:.4f}" for k in keys),
                 f"  length {m['length_unit']}: mean={m['length_mean']:.1f} median={m['length_median']:.1f}  "
                 f"format_error_rate={m['format_error_rate']:.3f}  "
                 f"unverifiable_rate={_rate(m.get('unverifiable_rate'))}  tokens={m['tokens_generated'] or 'n/a'}  "
                 f"flops={'n/a' if m['flops_estimate'] is None else format(m['flops_estimate'], '.3g')}",
                 f"  wall time {self.data['timing'].get('wall_time_s', 0):.1f}s"]
        n = cfg["n_samples"]
        if n > 1 and f"coverage@{n}" in m:  # Countdown: solution coverage and entrances (rlvr_envs.harness.coverage)
            lines.append(f"  solutions per task: coverage@{n}={m[f'coverage@{n}']:.3f}  "
                         f"entrances@{n}={m[f'entrances@{n}']:.3f}  "
                         f"entrance_entropy@{n}={m[f'entrance_entropy@{n}']:.3f} bits "
                         f"(all samples {m[f'entrance_entropy_all@{n}']:.3f})")
        for key in [k for k in m if k.startswith("accuracy_by_")]:
            parts = ", ".join(f"{v}: {d['accuracy']:.3f} (n={d['n']})" for v, d in m[key].items())
            lines.append(f"  {key}: {parts}")
        return "\n".join(lines)


def _rate(value: Any) -> str:
    return "n/a" if value is None else f"{value:.3f}"  # n/a: a file from before the metric existed


def atomic_write_json(path: Path, doc: Any) -> None:
    """Write to a temp file in the same directory, fsync, then ``os.replace``: readers see the old or the new file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        # mkstemp creates 0600; results and boards are meant to be shared, so honour the umask like open() would.
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(doc, f, ensure_ascii=False, indent=1)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


# -- provenance -------------------------------------------------------------------------------------------------------
def env_version(env_id: str) -> int | None:
    m = re.search(r"-v(\d+)$", env_id)
    return int(m.group(1)) if m else None


def git_info(path: Path | None = None) -> dict[str, Any]:
    """Commit and dirty flag of the checkout holding this package (None outside a git checkout)."""
    root = path or Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=5, check=True).stdout.strip()
        status = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=5, check=True).stdout
        return {"commit": commit, "dirty": bool(status.strip())}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
    }
    torch = sys.modules.get("torch")  # only report what is already loaded; the harness never imports torch itself
    if torch is not None:
        info["torch"] = getattr(torch, "__version__", None)
        try:
            if torch.cuda.is_available():
                info["gpu"] = torch.cuda.get_device_name(0)
        except Exception:  # a broken CUDA install must not break a results file
            pass
    return info


def package_info() -> dict[str, Any]:
    import rlvr_envs

    return {"name": "rlvr-envs", "version": rlvr_envs.__version__, **git_info()}


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
