"""Every environment ID in one table.

``import rlvr_envs`` registers each row with Gymnasium under the ``rlvr/`` namespace; ``gymnasium.make(
"rlvr_envs:rlvr/MATH-v0")`` works without the import because Gymnasium imports the module named before the colon.
A dataset fix or a changed verifier adds a new version (``-v1``) row; old rows keep their behaviour.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym


@dataclass(frozen=True)
class EnvEntry:
    id: str
    entry_point: str
    source: str  # where the tasks come from, for `rlvr list`
    size: str  # how many tasks (or "procedural")
    verifier: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    max_episode_steps: int | None = None


_MATH = "rlvr_envs.tasks.math:make_env"
_MV = "math-verify (process pool, hard timeout)"

ENVS: list[EnvEntry] = [
    # -- math benchmarks (rlvr_envs/tasks/math.py, gsm8k.py) ---------------------------------------------------
    EnvEntry("rlvr/MATH-v0", _MATH, "Hendrycks MATH (math/test.jsonl; split='train')", "5000 test / 7500 train", _MV,
             {"dataset": "math"}),
    EnvEntry("rlvr/MATH500-v0", _MATH, "MATH-500 (PRM800K split)", "500", _MV, {"dataset": "math500"}),
    EnvEntry("rlvr/AIME24-v0", _MATH, "AIME 2024", "30", _MV, {"dataset": "aime24"}),
    EnvEntry("rlvr/AIME25-v0", _MATH, "AIME 2025", "30", _MV, {"dataset": "aime25"}),
    EnvEntry("rlvr/AMC23-v0", _MATH, "AMC 2023", "40", _MV, {"dataset": "amc23"}),
    EnvEntry("rlvr/OlympiadBench-v0", _MATH, "OlympiadBench (single-answer, text-only)", "see `rlvr list`", _MV,
             {"dataset": "olympiadbench"}),
    EnvEntry("rlvr/GSM8K-v0", "rlvr_envs.tasks.gsm8k:make_env", "GSM8K (split test/train)", "1319 test / 7473 train",
             _MV),
    # -- procedural (rlvr_envs/tasks/arithmetic.py, countdown.py) ------------------------------------------------
    EnvEntry("rlvr/Arithmetic-v0", "rlvr_envs.tasks.arithmetic:make_env", "procedural, seeded", "procedural",
             "exact integer"),
    EnvEntry("rlvr/Countdown-v0", "rlvr_envs.tasks.countdown:make_env", "procedural, seeded (split='cd3_test': 256)",
             "procedural", "ast whitelist, exact rationals"),
]


def _extra_entries() -> list[EnvEntry]:
    """Families whose rows are generated (one per reasoning-gym task) or live with their package."""
    entries: list[EnvEntry] = []
    try:
        from rlvr_envs.tasks.reasoning_gym import registry_entries
    except ImportError:
        return entries
    entries.extend(registry_entries())
    return entries


def all_entries() -> list[EnvEntry]:
    return ENVS + _extra_entries()


def register_all() -> None:
    seen: set[str] = set()
    for e in all_entries():
        if e.id in seen:
            raise ValueError(f"duplicate env id in the table: {e.id}")
        seen.add(e.id)
        if e.id in gym.registry:
            continue
        gym.register(id=e.id, entry_point=e.entry_point, kwargs=dict(e.kwargs),
                     max_episode_steps=e.max_episode_steps, disable_env_checker=False)
