"""Checkpoints: model (trainable parameters), optimizer, every component's state and all RNG state, written atomically.

A checkpoint is ``<out>/checkpoints/step-<k>.pt``; ``<out>/checkpoints/latest`` names the newest. Both are written to a
temporary file first and moved into place with ``os.replace``, so a SIGKILL at any moment leaves either the old or
the new checkpoint, never a torn one.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def _atomic_write_bytes(path: Path, write) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as fh:
        write(fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def save(out_dir: Path, step: int, state: dict[str, Any], keep: int = 1) -> Path:
    ckpt_dir = Path(out_dir) / "checkpoints"
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    path = ckpt_dir / f"step-{step}.pt"
    _atomic_write_bytes(path, lambda fh: torch.save(state, fh))
    _atomic_write_bytes(ckpt_dir / "latest", lambda fh: fh.write(path.name.encode()))
    old = sorted(ckpt_dir.glob("step-*.pt"), key=lambda p: int(p.stem.split("-")[1]))
    for p in old[:-keep]:
        if p != path:
            p.unlink(missing_ok=True)
    return path


def latest(out_dir: Path) -> Path | None:
    pointer = Path(out_dir) / "checkpoints" / "latest"
    if not pointer.is_file():
        return None
    path = pointer.parent / pointer.read_text().strip()
    return path if path.is_file() else None


def load(path: Path) -> dict[str, Any]:
    # our own file: it holds numpy RNG tuples and python objects, which weights_only loading refuses
    return torch.load(path, map_location="cpu", weights_only=False)
