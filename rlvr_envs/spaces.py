"""Text spaces for prompts and responses.

Gymnasium's ``spaces.Text`` defaults to an alphanumeric charset, so a prompt with a space or a newline fails
``check_env``. ``TextSpace`` accepts any Unicode string up to ``max_length`` characters and samples from printable
ASCII plus whitespace, which keeps ``check_env``'s random actions realistic.

Vectorisation: gymnasium's shared-memory path for ``Text`` stores fixed-width code points and, in gymnasium 1.x,
returns stale observations for shorter strings. ``rlvr_envs.make_vec`` therefore defaults ``shared_memory=False`` for
the async mode, which sends observations through the pipe (strings are tiny next to model work anyway).
"""

from __future__ import annotations

import string
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

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


def make_vec(env_id: str, num_envs: int = 1, *, vectorization_mode: str = "sync", vector_kwargs: dict | None = None,
             **env_kwargs: Any) -> gym.vector.VectorEnv:
    """``gymnasium.make_vec`` with the async mode made correct for text observations (no shared memory)."""
    vector_kwargs = dict(vector_kwargs or {})
    if vectorization_mode == "async":
        vector_kwargs.setdefault("shared_memory", False)
    return gym.make_vec(env_id, num_envs=num_envs, vectorization_mode=vectorization_mode,
                        vector_kwargs=vector_kwargs, **env_kwargs)


