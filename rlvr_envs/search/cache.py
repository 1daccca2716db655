"""On-disk index cache: one folder per (retriever kind, corpus content hash, parameters), built once, atomically.

Default location ``~/.cache/rlvr_envs``; ``RLVR_CACHE_DIR`` or a ``cache_dir=`` argument overrides it. A build runs under
a file lock (parallel workers build once) into a temporary folder that is renamed into place when complete, so a
killed build never leaves a half-written index behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

CACHE_ENV_VAR = "RLVR_CACHE_DIR"


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get(CACHE_ENV_VAR)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "rlvr_envs"


def cache_key(kind: str, corpus_hash: str, params: dict[str, Any]) -> str:
    digest = hashlib.sha256(json.dumps(params, sort_keys=True, default=str).encode()).hexdigest()[:12]
    return f"{kind}-{corpus_hash[:16]}-{digest}"


def cached_build(folder: Path, build: Callable[[Path], None]) -> tuple[Path, bool]:
    """Ensure ``folder`` holds a complete build; ``build(tmp)`` writes one into ``tmp``. Returns (folder, built_now)."""
    from filelock import FileLock

    done = folder / "COMPLETE"
    if done.is_file():
        return folder, False
    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder) + ".lock"):
        if done.is_file():  # another process built it while we waited
            return folder, False
        tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".tmp-", dir=folder.parent))
        try:
            build(tmp)
            (tmp / "COMPLETE").write_text("ok\n")
            if folder.exists():  # a stale, incomplete folder from a crashed build
                shutil.rmtree(folder)
            os.replace(tmp, folder)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return folder, True
