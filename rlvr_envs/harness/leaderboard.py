"""Leaderboards that cannot be gamed by editing a results file.

A board is one JSON file per benchmark (``<boards_dir>/<NAME>.json``) bound to one env ID (version included), its env
kwargs and a pin: the task set (how many tasks, and ``task_ids_sha256``, the SHA-256 of the sorted task ids as a JSON
list) and the number of samples per task. The pin is set when the board is created, by ``create_board`` or by its
first submission, and a submission on another task set or sample count is rejected: a run on fewer, easier tasks
cannot outrank the others.
``submit`` validates the results schema, re-scores every per-sample record with the env's own verifier
(``env.unwrapped.score``), recomputes every metric and rejects any disagreement with the claimed numbers, then appends
under a file lock with an atomic replace: concurrent submits lose nothing and a crash mid-write leaves the old board.
Tiers (``rlvr_envs.harness.reproduce``): when the evaluated policy loads here with the claimed weights hash, a seeded
sample of records is decoded again and must match exactly, and token counts are recounted with its tokenizer (a false
model name, a rewritten response or a made-up count is rejected); the entry is *reproduced*. Otherwise the model name,
responses and token counts are the agent's own report, taken as claimed and marked *self-reported*, field by field, in
``show`` and on the page. Taken as claimed too is the split of incorrect records into "wrong" and "unverifiable" (a
record's ``status``): whether a check times out depends on the machine, so the board re-verifies ``correct`` (which
wins over a status that contradicts it) and keeps the claimed split; ``unverifiable_rate`` is recomputed from it (entries submitted before it existed show "n/a").
An entry may carry a ``training`` block (a trained run's method, seed, cost and learning curve; see
``agents.grpo.publish``): it is reported metadata, shape-checked (``validate_training``) and stored as given, never
re-verified. It does not loosen anything above: the records are re-scored and the pin applies exactly as without it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rlvr_envs.harness.metrics import answer_equivalence, compute_metrics, metrics_match
from rlvr_envs.harness.reproduce import (
    PolicyResolver,
    check_reproduced,
    evidence_text,
    resolve_loadable_policy,
    self_reported,
)
from rlvr_envs.harness.results import SchemaError, atomic_write_json, env_version, now_iso, validate

BOARD_SCHEMA = "rlvr-board"
BOARD_SCHEMA_VERSION = 2  # 2: boards carry the task-set pin; 1 (no pin) is read for show/render, see migrate_board
BOARDS_ENV_VAR = "RLVR_BOARDS_DIR"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
LOCK_TIMEOUT_S = 120.0


class SubmissionRejected(ValueError):
    """A results file a board refuses, with the reason."""


def check_board_name(name: str) -> str:
    """A board name is a plain file stem: letters, digits, ``_ . -``; no separators, no ``..``, no leading dot."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or ".." in name or name.endswith(".json"):
        raise SubmissionRejected(
            f"invalid board name {name!r}: use 1-64 letters, digits, '_', '.', '-' (starting with a letter or digit, "
            "no '..', no path separators, no .json suffix)")
    return name


def default_boards_dir() -> Path:
    """``$RLVR_BOARDS_DIR``, else ``leaderboards/boards`` of the checkout this package lives in, else of the cwd."""
    if os.environ.get(BOARDS_ENV_VAR):
        return Path(os.environ[BOARDS_ENV_VAR]).expanduser()
    repo = Path(__file__).resolve().parents[2]
    if (repo / "leaderboards").is_dir():
        return repo / "leaderboards" / "boards"
    return Path.cwd() / "leaderboards" / "boards"


def board_path(name: str, boards_dir: str | os.PathLike | None = None) -> Path:
    root = Path(boards_dir) if boards_dir is not None else default_boards_dir()
    return root / f"{check_board_name(name)}.json"


# -- verification -----------------------------------------------------------------------------------------------------
def verify_results(doc: Any, *, max_reports: int = 5) -> dict[str, Any]:
    """Re-verify a results document with the env's own verifier; return the recomputed metrics or raise."""
    import gymnasium as gym

    import rlvr_envs  # noqa: F401  (registers the IDs)
    from rlvr_envs.harness.evaluate import sample_seed

    try:
        validate(doc)
    except SchemaError as exc:
        raise SubmissionRejected(f"schema: {exc}") from None
    if not doc["complete"]:
        raise SubmissionRejected("the results file is partial (complete=false); finish it with --resume first")
    cfg, prov = doc["config"], doc["provenance"]
    env_id = cfg["env_id"]
    claimed_version = (prov.get("env") or {}).get("version")
    if claimed_version != env_version(env_id):
        raise SubmissionRejected(f"provenance env version {claimed_version!r} does not match the env ID {env_id!r}")
    try:
        env = gym.make(env_id, **cfg["env_kwargs"])
    except (gym.error.Error, ImportError, TypeError) as exc:
        raise SubmissionRejected(f"cannot make env {env_id!r} with the recorded kwargs to re-verify: {exc}") from None
    try:
        base = env.unwrapped
        source = base.source
        fingerprint = (prov.get("data") or {}).get("fingerprint")
        if fingerprint != source.fingerprint:
            raise SubmissionRejected(
                f"data fingerprint {fingerprint!r} differs from this install's {env_id} tasks ({source.fingerprint!r}): "
                "the results were produced on different data or another env version")
        if cfg["n_tasks"] > len(source):
            raise SubmissionRejected(f"n_tasks={cfg['n_tasks']} exceeds the {len(source)} tasks of {env_id}")
        problems: list[str] = []
        rescored = []
        # A wrapper of the project's own around the text env (rlvr/Modes-v0 caps and pays by mode) changes the
        # verdict: re-score through env.step, as the harness did, not through the bare env's score.
        scoring_wrapped = has_scoring_wrapper(env)
        for rec in doc["records"]:
            where = f"task {rec['task_id']!r} sample {rec['sample_index']}"
            try:
                index = source.index_of(rec["task_id"])
            except (KeyError, ValueError) as exc:
                problems.append(f"{where}: unknown task id ({exc})")
                continue
            if index != rec["task_index"]:
                problems.append(f"{where}: task_index {rec['task_index']} but the id is task {index}")
            if rec["seed"] != sample_seed(cfg["seed"], rec["task_index"], rec["sample_index"]):
                problems.append(f"{where}: seed {rec['seed']} is not the one derived from the run seed")
            if "turns" in rec or not callable(getattr(base, "score", None)) or scoring_wrapped:
                correct, parsed, format_ok, problem = replay(env, rec, index)
                if problem:
                    problems.append(f"{where}: {problem}")
                    continue
            else:
                verdict = base.score(source.task(index), rec["response"])
                correct, parsed, format_ok = bool(verdict.correct), verdict.parsed, bool(verdict.format_ok)
            parsed = None if parsed is None else str(parsed)
            if correct != rec["correct"]:
                problems.append(f"{where}: claimed correct={rec['correct']}, verifier says {correct}")
            elif parsed != rec["parsed_answer"]:
                problems.append(f"{where}: claimed parsed answer {rec['parsed_answer']!r}, verifier parsed {parsed!r}")
            elif format_ok != rec["format_ok"]:
                problems.append(f"{where}: claimed format_ok={rec['format_ok']}, verifier says {format_ok}")
            rescored.append({**rec, "correct": correct, "parsed_answer": parsed, "format_ok": format_ok})
        if problems:
            more = f" (and {len(problems) - max_reports} more)" if len(problems) > max_reports else ""
            raise SubmissionRejected(f"{len(problems)} record(s) disagree with the {env_id} verifier: "
                                     + "; ".join(problems[:max_reports]) + more)
        # maj@n votes with the env's answer equivalence, exactly as evaluate() computed it.
        recomputed = compute_metrics(rescored, cfg["n_samples"], n_params=(prov.get("agent") or {}).get("n_params"),
                                     same_answer=answer_equivalence(env))
    finally:
        env.close()
    diffs = metrics_match(doc["metrics"], recomputed)
    if diffs:
        raise SubmissionRejected("claimed metrics do not match the re-verified records: " + "; ".join(diffs[:max_reports]))
    return recomputed


def reproduction_evidence(doc: Mapping[str, Any], digest: str, sample_size: int,
                          resolve_policy: PolicyResolver | None = None) -> dict[str, Any]:
    """The entry's tier: reproduced (model, responses and token counts checked against the policy loaded here) or
    self-reported with the reason; raises ``SubmissionRejected`` when a loadable policy contradicts the file."""
    if sample_size < 1:
        return self_reported("reproduction not requested (submit --reproduce)")
    agent = (doc.get("provenance") or {}).get("agent") or {}
    loadable = (resolve_policy or resolve_loadable_policy)(agent)
    if loadable is None:
        # asked for, so not silently downgraded: the submitter resubmits without it for the self-reported tier
        raise SubmissionRejected(
            f"the reproduced tier needs the evaluated policy loadable here; {agent.get('model') or agent.get('class')!r}"
            " is not (a PolicyAgent on the hf engine with its precision recorded, and a model that loads without a "
            "download: tiny-seed<N>, smollm2 or a local directory). Submit without --reproduce: the entry is then "
            "self-reported")
    evidence, problems = check_reproduced(doc, loadable, digest, sample_size=sample_size)
    if problems:
        raise SubmissionRejected(f"reproduction with the loadable policy {agent.get('model')!r} failed: "
                                 + "; ".join(problems[:5]) + (f" (and {len(problems) - 5} more)" if len(problems) > 5
                                                              else ""))
    return evidence


def has_scoring_wrapper(env: Any) -> bool:
    """Whether a wrapper that is not one of gymnasium's own (order enforcing, env checker, time limit) sits between
    ``env`` and the text env: such a wrapper may change what a response scores."""
    import gymnasium as gym

    while isinstance(env, gym.Wrapper):
        if not type(env).__module__.startswith("gymnasium."):
            return True
        env = env.env
    return False


def replay(env: Any, rec: Mapping[str, Any], index: int) -> tuple[bool, Any, bool, str | None]:
    """Play a record's turns through a fresh episode (same seed and task): the final verdict fields, and a problem
    description when the turns do not replay as recorded."""
    from rlvr_envs.harness.evaluate import MAX_TURNS

    env.reset(seed=rec["seed"], options={"index": index})
    turns = rec.get("turns") or [rec["response"]]
    for i, text in enumerate(turns[:MAX_TURNS]):
        _, _, terminated, truncated, info = env.step(text)
        if terminated or truncated:
            verdict = bool(info.get("correct", False)), info.get("parsed_answer"), bool(info.get("format_ok", False))
            if i != len(turns) - 1:
                return (*verdict, f"the episode ended after turn {i + 1} of the {len(turns)} recorded")
            return (*verdict, None)
    if len(turns) < MAX_TURNS:
        return False, None, False, f"the episode had not ended after the {len(turns)} recorded turns"
    return False, None, False, None  # the harness's turn cap: scored as failed


# -- the task-set pin -------------------------------------------------------------------------------------------------
PIN_FIELDS: dict[str, type] = {"n_tasks": int, "task_ids_sha256": str, "n_samples": int}


def task_ids_sha256(task_ids: Iterable[str]) -> str:
    """SHA-256 of the distinct task ids, sorted, written as a compact JSON list (order and repeats do not matter)."""
    ids = sorted({str(t) for t in task_ids})
    return hashlib.sha256(json.dumps(ids, ensure_ascii=False, separators=(",", ":")).encode()).hexdigest()


def make_pin(task_ids: Iterable[str], n_samples: int) -> dict[str, Any]:
    ids = {str(t) for t in task_ids}
    return {"n_tasks": len(ids), "task_ids_sha256": task_ids_sha256(ids), "n_samples": int(n_samples)}


def results_pin(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The pin a results document would set: its records' task ids and its samples per task."""
    return make_pin((r["task_id"] for r in doc["records"]), doc["config"]["n_samples"])


def describe_pin(pin: Mapping[str, Any]) -> str:
    return (f"{pin['n_tasks']} tasks (task ids sha256 {pin['task_ids_sha256']}) x {pin['n_samples']} "
            f"sample{'s' if pin['n_samples'] != 1 else ''} per task")


def check_pin(board: Mapping[str, Any], pin: Mapping[str, Any]) -> None:
    """Reject results whose task set or sample count differs from the board's pin."""
    expected = board["pin"]
    if all(expected[k] == pin[k] for k in PIN_FIELDS):
        return
    what = [name for name, keys in (("task set", ("n_tasks", "task_ids_sha256")), ("samples per task", ("n_samples",)))
            if any(expected[k] != pin[k] for k in keys)]
    raise SubmissionRejected(
        f"board {board['board']!r} is pinned to {describe_pin(expected)}; these results have {describe_pin(pin)}. "
        f"Different {' and '.join(what)}: entries of one board must be evaluated on the same tasks with the same "
        f"number of samples. Rerun with: {rerun_flags(board)} (the first {expected['n_tasks']} tasks, the set a "
        "board created by `rlvr leaderboard create` or by an `rlvr eval --limit` run is pinned to), or submit to "
        "another board")


def rerun_flags(board: Mapping[str, Any]) -> str:
    """The ``rlvr eval`` flags that evaluate a board's pinned env, kwargs, task count and samples per task."""
    import shlex

    flags = ["rlvr", "eval", "--env", board["env_id"]]
    if board.get("env_kwargs"):
        flags += ["--env-kwargs", json.dumps(board["env_kwargs"], sort_keys=True)]
    flags += ["--limit", str(board["pin"]["n_tasks"]), "--samples", str(board["pin"]["n_samples"])]
    return shlex.join(flags)


# -- the training block -----------------------------------------------------------------------------------------------
_NUMBER = (int, float)
TRAINING_FIELDS: dict[str, tuple[type, ...]] = {
    "method": (str,), "lane": (str,), "seed": (int,), "steps": (int,), "rollouts": (int,),
    "response_tokens": (int,), "flops_estimate": (*_NUMBER, type(None)), "wall_time_s": (*_NUMBER, type(None)),
    "curve": (list,),
}
CURVE_FIELDS: dict[str, tuple[type, ...]] = {"step": (int,), "rollouts": (int,), "eval_accuracy": _NUMBER}


def _typed(value: Any, types: tuple[type, ...]) -> bool:
    return isinstance(value, types) and not (isinstance(value, bool) and bool not in types) and \
        not (isinstance(value, float) and not math.isfinite(value))


def validate_training(block: Any, results_doc: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Check a ``training`` block's shape (``TRAINING_FIELDS``; curve points ``CURVE_FIELDS``, accuracy in [0, 1],
    steps and rollouts non-decreasing) and, when it names a ``weights_hash``, that it is the evaluated model's.
    Returns a JSON copy. The numbers themselves are the run's report; a board cannot re-derive them."""
    if not isinstance(block, Mapping):
        raise SubmissionRejected(f"training: expected an object, got {type(block).__name__}")
    try:
        block = json.loads(json.dumps(dict(block), allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise SubmissionRejected(f"training: not JSON-serialisable ({exc})") from None
    for name, types in TRAINING_FIELDS.items():
        if name not in block:
            raise SubmissionRejected(f"training: missing field {name!r}")
        if not _typed(block[name], types):
            raise SubmissionRejected(f"training.{name}: expected {'/'.join(t.__name__ for t in types)}, "
                                     f"got {block[name]!r}")
    for name in ("steps", "rollouts", "response_tokens"):
        if block[name] < 0:
            raise SubmissionRejected(f"training.{name}: must be >= 0, got {block[name]}")
    prev = (-1, -1)
    for i, point in enumerate(block["curve"]):
        if not isinstance(point, dict):
            raise SubmissionRejected(f"training.curve[{i}]: expected an object, got {point!r}")
        for name, types in CURVE_FIELDS.items():
            if not _typed(point.get(name), types):
                raise SubmissionRejected(f"training.curve[{i}].{name}: expected "
                                         f"{'/'.join(t.__name__ for t in types)}, got {point.get(name)!r}")
        if not 0.0 <= point["eval_accuracy"] <= 1.0:
            raise SubmissionRejected(f"training.curve[{i}].eval_accuracy: {point['eval_accuracy']} is not in [0, 1]")
        if point["step"] < prev[0] or point["rollouts"] < prev[1]:
            raise SubmissionRejected(f"training.curve[{i}]: steps and rollouts must not decrease along the curve")
        prev = (point["step"], point["rollouts"])
    if results_doc is not None and block.get("weights_hash") is not None:
        evaluated = ((results_doc.get("provenance") or {}).get("agent") or {}).get("weights_hash")
        if block["weights_hash"] != evaluated:
            raise SubmissionRejected(f"training.weights_hash {block['weights_hash']!r} is not the evaluated model's "
                                     f"({evaluated!r}): the training block belongs to another policy")
    return block


# -- boards -----------------------------------------------------------------------------------------------------------
def load_board(path: Path) -> dict[str, Any]:
    """A board file; a schema_version 1 board (made before pins) loads too, for show and render only."""
    try:
        with open(path, encoding="utf-8") as f:
            board = json.load(f)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: board file is not valid JSON ({exc.msg}); refusing to touch it") from None
    if not isinstance(board, dict) or board.get("schema") != BOARD_SCHEMA or not isinstance(board.get("entries"), list):
        raise ValueError(f"{path}: not a {BOARD_SCHEMA} file")
    if board.get("schema_version") not in (1, BOARD_SCHEMA_VERSION):
        raise ValueError(f"{path}: board schema_version {board.get('schema_version')!r} is not supported")
    if board["schema_version"] == BOARD_SCHEMA_VERSION:
        pin = board.get("pin")
        if not isinstance(pin, dict) or not all(type(pin.get(k)) is t for k, t in PIN_FIELDS.items()):
            raise ValueError(f"{path}: the board's 'pin' must hold {', '.join(PIN_FIELDS)}; got {pin!r}")
    return board


def _new_board(name: str, env_id: str, env_kwargs: Mapping[str, Any], pin: Mapping[str, Any]) -> dict[str, Any]:
    return {"schema": BOARD_SCHEMA, "schema_version": BOARD_SCHEMA_VERSION, "board": name, "env_id": env_id,
            "env_kwargs": dict(env_kwargs), "pin": dict(pin), "entries": [], "created_at": now_iso()}


def _require_pin(board: Mapping[str, Any], name: str) -> None:
    if board["schema_version"] != BOARD_SCHEMA_VERSION:
        raise SubmissionRejected(
            f"board {name!r} predates task-set pins (schema_version {board['schema_version']}); pin it from the "
            f"results files of its entries first: rlvr leaderboard migrate {name} RESULTS.json ...")


def _entry(doc: Mapping[str, Any], metrics: Mapping[str, Any], digest: str, label: str | None,
           results_name: str | None, training: Mapping[str, Any] | None = None,
           evidence: Mapping[str, Any] | None = None) -> dict[str, Any]:
    prov, cfg = doc["provenance"], doc["config"]
    agent = prov.get("agent") or {}
    entry = {
        "id": digest[:16],
        "results_sha256": digest,
        "label": label,
        "model": str(agent.get("model") or agent.get("class") or "?"),
        "weights_hash": agent.get("weights_hash"),
        "n_params": agent.get("n_params"),
        "env_id": cfg["env_id"],
        "n_tasks": cfg["n_tasks"],
        "n_samples": cfg["n_samples"],
        "task_ids_sha256": results_pin(doc)["task_ids_sha256"],
        "seed": cfg["seed"],
        "metrics": dict(metrics),  # the re-verified ones
        "wall_time_s": (doc.get("timing") or {}).get("wall_time_s"),
        "submitted_at": now_iso(),
        "results_file": results_name,
        "provenance": {k: prov.get(k) for k in ("package", "env", "data", "agent", "machine", "created_at")},
        "evidence": dict(evidence) if evidence is not None else self_reported("not checked"),
    }
    if training is not None:
        entry["training"] = dict(training)  # reported by the run, not re-verified
    return entry


def _digest(doc: Any) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def submit(results: str | os.PathLike | Mapping[str, Any], board: str, *,
           boards_dir: str | os.PathLike | None = None, label: str | None = None,
           training: Mapping[str, Any] | None = None, reproduce: int = 0,
           resolve_policy: PolicyResolver | None = None) -> dict[str, Any]:
    """Verify ``results`` (a path or a parsed document) and append it to ``board``; return the new entry.

    ``training``: an optional block of the trained run's reported cost and learning curve (``validate_training``),
    stored on the entry beside the re-verified metrics. ``reproduce``: ask for the reproduced tier, decoding this
    many records again with the policy loaded here (``resolve_policy``, default ``resolve_loadable_policy``); a policy
    that cannot be loaded, or that contradicts the file, rejects the submission. 0 (the default): self-reported."""
    from filelock import FileLock

    path = board_path(board, boards_dir)  # the name is checked before any work
    results_name = None
    if isinstance(results, Mapping):
        doc = json.loads(json.dumps(results))
    else:
        results_name = Path(results).name
        try:
            with open(results, encoding="utf-8") as f:
                doc = json.load(f)
        except json.JSONDecodeError as exc:
            raise SubmissionRejected(f"{results}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    metrics = verify_results(doc)
    training = validate_training(training, doc) if training is not None else None
    digest = _digest(doc)
    evidence = reproduction_evidence(doc, digest, reproduce, resolve_policy)
    entry = _entry(doc, metrics, digest, label, results_name, training, evidence)

    pin = results_pin(doc)  # the task ids were checked against the env's source by verify_results

    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock", timeout=LOCK_TIMEOUT_S):
        if path.exists():
            data = load_board(path)
            _require_pin(data, board)
        else:  # the first submission creates the board and pins it to its own task set and sample count
            data = _new_board(board, entry["env_id"], doc["config"]["env_kwargs"], pin)
        if data["env_id"] != entry["env_id"]:
            raise SubmissionRejected(f"board {board!r} ranks {data['env_id']}; these results are for {entry['env_id']}")
        if data.get("env_kwargs", {}) != doc["config"]["env_kwargs"]:
            raise SubmissionRejected(f"board {board!r} ranks {data['env_id']} with env kwargs {data.get('env_kwargs')}; "
                                     f"these results used {doc['config']['env_kwargs']} (a different benchmark)")
        check_pin(data, pin)
        if any(e.get("results_sha256") == digest for e in data["entries"]):
            raise SubmissionRejected(f"these results are already on board {board!r} (entry {digest[:16]})")
        data["entries"].append(entry)
        data["updated_at"] = now_iso()
        atomic_write_json(path, data)
    return entry


def create_board(board: str, env_id: str, *, n_tasks: int, n_samples: int,
                 env_kwargs: Mapping[str, Any] | None = None,
                 boards_dir: str | os.PathLike | None = None) -> dict[str, Any]:
    """Create an empty board pinned to the first ``n_tasks`` tasks of ``env_id`` (the tasks ``rlvr eval --limit
    n_tasks`` runs) and ``n_samples`` samples per task; refuse if the board exists. Returns the board."""
    import gymnasium as gym
    from filelock import FileLock

    import rlvr_envs  # noqa: F401  (registers the IDs)

    path = board_path(board, boards_dir)
    if n_tasks < 1 or n_samples < 1:
        raise ValueError(f"n_tasks and n_samples must be >= 1 (got {n_tasks}, {n_samples})")
    env_kwargs = dict(env_kwargs or {})
    env = gym.make(env_id, **env_kwargs)
    try:
        source = env.unwrapped.source
        if n_tasks > len(source):
            raise ValueError(f"{env_id} has {len(source)} tasks; cannot pin a board to {n_tasks}")
        pin = make_pin((source.task(i).id for i in range(n_tasks)), n_samples)
    finally:
        env.close()
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock", timeout=LOCK_TIMEOUT_S):
        if path.exists():
            raise ValueError(f"board {board!r} already exists ({path})")
        data = _new_board(board, env_id, env_kwargs, pin)
        atomic_write_json(path, data)
    return data


def migrate_board(board: str, results: Sequence[str | os.PathLike], *,
                  boards_dir: str | os.PathLike | None = None) -> dict[str, Any]:
    """Pin a schema_version 1 board from the results files its entries were verified from.

    Every entry must be matched by one of ``results`` (by ``results_sha256``); each file is re-verified, and all of
    them must have one task set and sample count, which becomes the pin. Returns the migrated board."""
    from filelock import FileLock

    path = board_path(board, boards_dir)
    if not path.exists():
        raise ValueError(f"no board {board!r} in {path.parent}")
    docs: dict[str, dict[str, Any]] = {}
    for r in results:
        try:
            with open(r, encoding="utf-8") as f:
                doc = json.load(f)
        except json.JSONDecodeError as exc:
            raise SubmissionRejected(f"{r}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
        docs[_digest(doc)] = {"doc": doc, "name": str(r)}
    with FileLock(str(path) + ".lock", timeout=LOCK_TIMEOUT_S):
        data = load_board(path)
        if data["schema_version"] == BOARD_SCHEMA_VERSION:
            raise ValueError(f"board {board!r} is already pinned to {describe_pin(data['pin'])}")
        if not data["entries"]:
            raise SubmissionRejected(f"board {board!r} has no entries to derive a pin from; delete it and create it "
                                     "again with `rlvr leaderboard create`")
        missing = [e["id"] for e in data["entries"] if e.get("results_sha256") not in docs]
        if missing:
            raise SubmissionRejected(f"board {board!r}: none of the given results files is the one entry/entries "
                                     f"{', '.join(missing)} were verified from (matched by results_sha256)")
        pins = {}
        for e in data["entries"]:
            got = docs[e["results_sha256"]]
            verify_results(got["doc"])
            if got["doc"]["config"]["env_id"] != data["env_id"] or \
                    got["doc"]["config"]["env_kwargs"] != data.get("env_kwargs", {}):
                raise SubmissionRejected(f"{got['name']}: not a run of {data['env_id']} with {data.get('env_kwargs')}")
            pins[got["name"]] = results_pin(got["doc"])
            e["task_ids_sha256"] = pins[got["name"]]["task_ids_sha256"]
        if len({json.dumps(p, sort_keys=True) for p in pins.values()}) > 1:
            raise SubmissionRejected(f"board {board!r} mixes task sets, so it cannot be pinned: "
                                     + "; ".join(f"{n}: {describe_pin(p)}" for n, p in pins.items()))
        pin = next(iter(pins.values()))
        migrated = {k: v for k, v in data.items() if k != "entries"}
        migrated.update(schema_version=BOARD_SCHEMA_VERSION, pin=pin, migrated_at=now_iso())
        migrated["entries"] = data["entries"]
        atomic_write_json(path, migrated)
    return migrated


def list_boards(boards_dir: str | os.PathLike | None = None) -> list[Path]:
    root = Path(boards_dir) if boards_dir is not None else default_boards_dir()
    return sorted(p for p in root.glob("*.json") if _NAME.fullmatch(p.stem)) if root.is_dir() else []


def ranked(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(entries, key=lambda e: (-float(e["metrics"].get("accuracy", 0.0)), e.get("submitted_at", "")))


def pin_summary(board: Mapping[str, Any]) -> str:
    """``pinned to N tasks x K samples, task ids sha256 <first 12 hex>``, or that the board has no pin."""
    pin = board.get("pin")
    if not pin:
        return "no task-set pin (schema_version 1)"
    return (f"pinned to {pin['n_tasks']} tasks x {pin['n_samples']} sample{'s' if pin['n_samples'] != 1 else ''}, "
            f"task ids sha256 {pin['task_ids_sha256'][:12]}")


def has_training(board: Mapping[str, Any]) -> bool:
    return any(isinstance(e.get("training"), dict) for e in board["entries"])


def training_cells(entry: Mapping[str, Any]) -> tuple[str, str, str, str]:
    """Rollouts, response tokens, FLOPs (estimate) and wall time of a trained entry as text; blanks without one."""
    t = entry.get("training")
    if not isinstance(t, dict):
        return "", "", "", ""
    flops, wall = t.get("flops_estimate"), t.get("wall_time_s")
    return (str(t.get("rollouts", "")), str(t.get("response_tokens", "")),
            "" if flops is None else f"{flops:.3g}", "" if wall is None else f"{wall:.1f}")


def unverifiable_cell(metrics: Mapping[str, Any]) -> str:
    """The unverifiable rate as text; "n/a" for an entry submitted before the metric existed (a board keeps its
    published numbers as they were verified, so none is made up for it)."""
    rate = metrics.get("unverifiable_rate")
    return "n/a" if rate is None else f"{rate:.3f}"


def format_board(board: Mapping[str, Any]) -> str:
    """The board as a plain-text table, best accuracy first; trained entries' reported cost when there are any."""
    from rlvr_envs.commands.list import format_table

    entries = ranked(list(board["entries"]))
    trained = has_training(board)
    header = ("#", "model", "label", "tasks", "samples", "accuracy", "pass@n", "maj@n", "len mean", "fmt err",
              "unverif", *(("rollouts", "train tok", "FLOPs~", "train s") if trained else ()), "submitted",
              "evidence")
    rows = []
    for rank, e in enumerate(entries, 1):
        m, n = e["metrics"], e["n_samples"]
        rows.append((str(rank), e["model"], e.get("label") or "", str(e["n_tasks"]), str(n),
                     f"{m.get('accuracy', 0):.4f}", f"{m.get(f'pass@{n}', 0):.4f}", f"{m.get(f'maj@{n}', 0):.4f}",
                     f"{m.get('length_mean', 0):.1f} {'tok' if m.get('length_unit') == 'tokens' else 'words'}",
                     f"{m.get('format_error_rate', 0):.3f}", unverifiable_cell(m),
                     *(training_cells(e) if trained else ()),
                     e.get("submitted_at", ""), evidence_text(e)))
    title = f"board {board['board']}: {board['env_id']} ({len(entries)} entries; {pin_summary(board)})"
    if trained:
        title += "\n(rollouts, train tok, FLOPs~, train s: the training run's own report, not re-verified)"
    return title + "\n" + format_table(rows, header) if rows else title


EVIDENCE_NOTE = ("evidence: every entry's verdicts are re-verified; model name, responses and token counts are "
                 "reproduced only for entries submitted with --reproduce (the policy loaded here), else self-reported")

