"""Procedurally generated task sources: ``task(i)`` is a pure function of ``(seed_base, i, config)``.

Each task draws from its own generator ``np.random.default_rng((seed_base, i))``, so the same index always gives the
same task (in any process, in any order) and tasks never depend on one another. The source is "virtually" huge
(``size`` tasks, a billion by default); ids are ``<prefix>-<index>`` and parse back with ``index_of``.
"""

from __future__ import annotations

import abc
import hashlib
import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from rlvr_envs.core import Task, TaskSource

DEFAULT_SIZE = 1_000_000_000
_RECENT = 256  # generated tasks kept per source


class ProceduralSource(TaskSource):
    """Base class: subclasses set ``prefix`` and implement ``generate(index, rng)``."""

    prefix: str = "task"

    def __init__(self, *, seed_base: int = 0, size: int = DEFAULT_SIZE, config: Mapping[str, Any] | None = None):
        if isinstance(seed_base, bool) or not isinstance(seed_base, (int, np.integer)) or seed_base < 0:
            raise ValueError(f"seed_base must be a non-negative integer, got {seed_base!r}")
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or not 1 <= size <= 2**62:
            raise ValueError(f"size must be an integer in [1, 2**62], got {size!r}")
        self.seed_base = int(seed_base)
        self.size = int(size)
        self.config = dict(config or {})
        self.name = self.prefix
        self._recent: dict[int, Task] = {}

    def __len__(self) -> int:
        return self.size

    @abc.abstractmethod
    def generate(self, index: int, rng: np.random.Generator) -> Task: ...

    def task(self, index: int) -> Task:
        index = int(index)
        if not 0 <= index < self.size:
            raise IndexError(f"{self.name}: index {index} out of range [0, {self.size})")
        task = self._recent.get(index)
        if task is None:  # GRPO resets the same index once per rollout: keep the last few tasks
            task = self.generate(index, np.random.default_rng((self.seed_base, index)))
            if len(self._recent) >= _RECENT:
                self._recent.clear()  # (no eviction order to maintain: safe when threads share the source)
            self._recent[index] = task
        return task

    def task_id(self, index: int) -> str:
        return f"{self.prefix}-{index}"

    def index_of(self, task_id: str) -> int:
        head, sep, tail = str(task_id).rpartition("-")
        if sep and head == self.prefix and tail.isdigit() and (tail == "0" or not tail.startswith("0")):
            index = int(tail)
            if index < self.size:
                return index
        raise KeyError(f"{self.name}: unknown task id {task_id!r} (expected '{self.prefix}-<index>' with "
                       f"index < {self.size})")

    @property
    def fingerprint(self) -> str:
        blob = {"generator": type(self).__qualname__, "prefix": self.prefix, "seed_base": self.seed_base,
                "size": self.size, "config": self.config}
        return hashlib.sha256(json.dumps(blob, sort_keys=True, default=str).encode()).hexdigest()
