"""``seed_base``: the one split option every env family takes (single-turn, tool use, search, tabular MDPs).

The trainer evaluates on ``env_kwargs + {"seed_base": 1}`` (its held-out default), the harness and the TRL adapter
pass env kwargs through, so every family must accept the kwarg and give it one meaning: ``seed_base=0`` is the env as
it always was, and another value is *another stream of tasks* drawn by the same rules:

- procedural sources (Arithmetic, Countdown, ToolUse, MultiHopSynth's questions): another random stream;
- fixed data sets (BFCL, HotpotQA): the same tasks in an order seeded by ``seed_base``, so "the first n tasks" is
  another seeded sample of the set. A fixed set has no held-out part; this sample overlaps what ``seed_base=0``
  trains on, and the docs say so;
- tabular MDPs: ``reset(seed=s)`` draws episodes from the stream ``(s, seed_base)`` instead of ``s``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from rlvr_envs.core import ListSource, Task


def check_seed_base(seed_base: Any) -> int:
    """``seed_base`` as an int, or ``ValueError`` (the rule ``ProceduralSource`` applies: a non-negative integer)."""
    if isinstance(seed_base, bool) or not isinstance(seed_base, (int, np.integer)) or seed_base < 0:
        raise ValueError(f"seed_base must be a non-negative integer, got {seed_base!r}")
    return int(seed_base)


def seeded_order(tasks: Sequence[Task], seed_base: int) -> list[Task]:
    """``tasks`` as given for ``seed_base=0``; otherwise sorted by a hash keyed by ``seed_base`` (a fixed shuffle that
    depends on the task ids only, not on the order they were loaded in)."""
    seed_base = check_seed_base(seed_base)
    if seed_base == 0:
        return list(tasks)
    return sorted(tasks, key=lambda t: hashlib.sha256(f"{seed_base}\x1f{t.id}".encode()).digest())


def split_fingerprint(fingerprint: str, seed_base: int) -> str:
    """A data fingerprint that tells split orders apart (unchanged for ``seed_base=0``, so old records still match)."""
    if seed_base == 0:
        return fingerprint
    return hashlib.sha256(f"{fingerprint}|seed_base={seed_base}".encode()).hexdigest()


def seeded_source(tasks: Sequence[Task], name: str, fingerprint: str | None, seed_base: int) -> ListSource:
    """A fixed data set's source under ``seed_base``: its tasks in ``seeded_order``, the split in its name and in
    its fingerprint (both unchanged for ``seed_base=0``)."""
    seed_base = check_seed_base(seed_base)
    if seed_base:
        name = f"{name}[seed_base={seed_base}]"
        fingerprint = split_fingerprint(fingerprint, seed_base) if fingerprint is not None else None
    return ListSource(seeded_order(tasks, seed_base), name, fingerprint=fingerprint)
