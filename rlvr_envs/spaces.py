"""Text spaces for prompts and responses.

Gymnasium's ``spaces.Text`` defaults to an alphanumeric charset, so a prompt with a space or a newline fails
``check_env``. ``TextSpace`` accepts any Unicode string up to ``max_length`` characters and samples from printable
ASCII plus whitespace, which keeps ``check_env``'s random actions realistic.

Vectorisation: gymnasium 1.4's shared-memory path for ``Text`` stores charset indices (so any character outside the
charset is dropped) and, with ``shared_memory=False``, its async worker never clears the autoreset flag on an explicit
``reset`` (the next ``step`` silently resets instead of stepping). Worse, ``AsyncVectorEnv`` reads shared memory once
at construction and relies on numpy views to see later writes, which a tuple of ``str`` cannot be: observations stay
stale forever. We register shared-memory handlers for ``TextSpace`` that store a length prefix and UTF-32 code points
and read back a live view whose ``deepcopy`` (what ``AsyncVectorEnv`` returns by default) is a tuple of the current
strings, so the async path works with its default ``shared_memory=True``.
"""

from __future__ import annotations

import multiprocessing as mp
import string
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from types import ModuleType
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import shared_memory as _shm

PRINTABLE = string.ascii_letters + string.digits + string.punctuation + " \n\t"

# Long enough for any benchmark prompt and a long chain-of-thought response; responses beyond it are truncated by envs.
DEFAULT_MAX_CHARS = 1 << 20


class TextSpace(spaces.Text):
    """Any ``str`` of at most ``max_length`` characters (Unicode allowed)."""

    def __init__(self, max_length: int = DEFAULT_MAX_CHARS, *, min_length: int = 0, seed: Any = None):
        super().__init__(max_length=max_length, min_length=min_length, charset=PRINTABLE, seed=seed)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        # Short samples: check_env and random agents do not need megabyte strings.
        length = int(self.np_random.integers(max(self.min_length, 1), min(self.max_length, 64) + 1))
        idx = self.np_random.integers(0, len(PRINTABLE), size=length)
        return "".join(PRINTABLE[i] for i in idx)

    def __repr__(self) -> str:
        return f"TextSpace(max_length={self.max_length})"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, TextSpace) and other.max_length == self.max_length and other.min_length == self.min_length


@_shm.create_shared_memory.register(TextSpace)
def _create_text_memory(space: TextSpace, n: int = 1, ctx: ModuleType = mp):
    # One row per env: [length, code point 0, code point 1, ...].
    return ctx.Array(np.dtype(np.int32).char, n * (space.max_length + 1))


class LiveTexts(Sequence):
    """The strings currently in a text shared-memory block, decoded on access."""

    def __init__(self, rows: np.ndarray):
        self._rows = rows

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return tuple(self)[i]
        row = self._rows[i]
        return row[1 : 1 + row[0]].tobytes().decode("utf-32-le")

    def __deepcopy__(self, memo: dict) -> tuple[str, ...]:
        return tuple(self)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and tuple(self) == tuple(other)

    def __repr__(self) -> str:
        return f"LiveTexts({tuple(self)!r})"


@_shm.read_from_shared_memory.register(TextSpace)
def _read_text_memory(space: TextSpace, shared_memory, n: int = 1) -> LiveTexts:
    return LiveTexts(np.frombuffer(shared_memory.get_obj(), dtype=np.int32).reshape(n, space.max_length + 1))


@_shm.write_to_shared_memory.register(TextSpace)
def _write_text_memory(space: TextSpace, index: int, value: str, shared_memory) -> None:
    codes = np.frombuffer(value.encode("utf-32-le"), dtype=np.int32)
    if len(codes) > space.max_length:
        raise ValueError(f"text of {len(codes)} characters exceeds the space's max_length {space.max_length}")
    row = np.frombuffer(shared_memory.get_obj(), dtype=np.int32)[index * (space.max_length + 1):]
    row[0] = len(codes)
    row[1 : 1 + len(codes)] = codes


def _make_registered(env_id: str, env_kwargs: dict[str, Any]) -> gym.Env:
    # Module level, so an async worker unpickles it by reference, which imports rlvr_envs and registers every ID.
    return gym.make(env_id, **env_kwargs)


@dataclass(frozen=True)
class TextVectorEntryPoint:
    """The ``vector_entry_point`` of every text env row (``rlvr_envs.registration``).

    ``gymnasium.make_vec(env_id, num_envs)`` without ``vectorization_mode`` calls it: a ``SyncVectorEnv`` with
    *same-step* autoreset. A single-turn env ends on every step; under gymnasium's default next-step autoreset every
    other ``step()`` would be a reset whose actions are ignored and whose rewards are 0. ``autoreset_mode=`` (a
    keyword of ``make_vec``) picks another mode; every other keyword goes to the env.
    """

    env_id: str

    def __call__(self, num_envs: int = 1, *, autoreset_mode: AutoresetMode | str | None = None,
                 **env_kwargs: Any) -> gym.vector.VectorEnv:
        mode = AutoresetMode.SAME_STEP if autoreset_mode is None else AutoresetMode(autoreset_mode)
        env_fns = [partial(_make_registered, self.env_id, dict(env_kwargs)) for _ in range(num_envs)]
        return gym.vector.SyncVectorEnv(env_fns, autoreset_mode=mode)


def default_autoreset_mode(env_id: str) -> AutoresetMode:
    """The autoreset mode a row declares (same-step for text envs), else gymnasium's default (next-step)."""
    try:
        entry = gym.spec(env_id).vector_entry_point
    except gym.error.Error:  # an unregistered "module:id" is left for gymnasium.make_vec to import and report
        return AutoresetMode.NEXT_STEP
    return AutoresetMode.SAME_STEP if isinstance(entry, TextVectorEntryPoint) else AutoresetMode.NEXT_STEP


def make_vec(env_id: str, num_envs: int = 1, *, vectorization_mode: str = "sync", vector_kwargs: dict | None = None,
             **env_kwargs: Any) -> gym.vector.VectorEnv:
    """``gymnasium.make_vec`` with the row's autoreset mode as the default (same-step for text envs), so
    ``vectorization_mode="async"`` scores every step too; ``vector_kwargs={"autoreset_mode": ...}`` overrides it."""
    vector_kwargs = dict(vector_kwargs or {})
    if vectorization_mode != "vector_entry_point":  # that mode takes no vector_kwargs (its own keyword instead)
        vector_kwargs.setdefault("autoreset_mode", default_autoreset_mode(env_id))
    return gym.make_vec(env_id, num_envs=num_envs, vectorization_mode=vectorization_mode,
                        vector_kwargs=vector_kwargs, **env_kwargs)
