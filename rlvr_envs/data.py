"""Where data comes from: ``data_dir=`` kwarg > ``RLVR_DATA_DIR`` > Hugging Face ``datasets`` (the ``[hub]`` extra) >
a clear error.

Files are JSON lines laid out as ``<data_dir>/<family>/<file>.jsonl`` (e.g. ``math/test.jsonl``); the content hash of
the file read becomes part of every results file's provenance.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlvr_envs.extras import require

ENV_VAR = "RLVR_DATA_DIR"


class DataNotFoundError(FileNotFoundError):
    pass


@dataclass(frozen=True)
class HFSource:
    """A Hugging Face dataset that holds the same rows; ``convert`` maps one HF row to the local file's schema."""

    path: str
    split: str
    name: str | None = None
    convert: Callable[[dict[str, Any]], dict[str, Any]] | None = None


def data_root(data_dir: str | os.PathLike | None = None) -> Path | None:
    if data_dir is not None:
        return Path(data_dir).expanduser()
    env = os.environ.get(ENV_VAR)
    return Path(env).expanduser() if env else None


@functools.lru_cache(maxsize=64)
def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
    return rows


def _hub_allowed() -> bool:
    return not any(os.environ.get(v, "0") not in ("", "0", "false") for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def load_rows(relpath: str, *, data_dir: str | os.PathLike | None = None,
              hf: HFSource | None = None) -> tuple[list[dict[str, Any]], str, str]:
    """``(rows, content_hash, origin)`` for ``relpath`` under the data directory, or from the hub as a fallback."""
    root = data_root(data_dir)
    tried = []
    if root is not None:
        path = root / relpath
        if path.is_file():
            return read_jsonl(path), file_sha256(path.resolve()), str(path)
        tried.append(str(path))
    if hf is not None and _hub_allowed():
        try:
            # datasets is the [hub] extra: the local data directory, the usual path, needs none of it.
            datasets = require("datasets", "hub", f"loading {hf.path!r} from the Hugging Face hub")
            ds = datasets.load_dataset(hf.path, hf.name, split=hf.split)
            rows = [hf.convert(dict(r)) if hf.convert else dict(r) for r in ds]
            return rows, f"hf:{hf.path}:{getattr(ds, '_fingerprint', '')}", f"hf://{hf.path}/{hf.split}"
        except Exception as exc:  # no network, no such dataset: fall through to the explanation below
            tried.append(f"Hugging Face {hf.path!r} ({type(exc).__name__}: {str(exc)[:200]})")
    hint = (f"Put {relpath} under a directory and pass data_dir=... or set {ENV_VAR}=that directory"
            + (f", or allow network access to the Hugging Face hub for {hf.path!r}" if hf else "") + ".")
    raise DataNotFoundError(f"data file {relpath!r} not found (tried: {'; '.join(tried) or 'nothing'}). {hint}")
