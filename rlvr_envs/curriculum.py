"""``Curriculum``: a wrapper that moves an env's difficulty knobs to keep the running success rate in a target band.

A curriculum is a ladder of ``levels``, easiest first; each level is a set of ``gym.make`` keyword arguments (the
knobs) over the wrapped env's own. After every finished episode its outcome (``info["correct"]``; unverifiable
episodes are left out: the verifier, not the policy, failed) enters a window of the last ``window`` outcomes; once
the window is full, a success rate above ``band[1]`` moves one level up, below ``band[0]`` one level down (within
the ladder), and the window starts afresh at the new level. A move takes effect at the next ``reset``.

Tasks: the wrapper draws each episode's task index and the inner env's reset seed from its own generator
(``seed=``, or ``reset(seed=...)``, which reseeds it), so a run is reproducible, and ``state_dict()`` /
``load_state_dict()`` (JSON-serializable: level, window, generator state, counters) resume it exactly: a restored
curriculum continues as the uninterrupted one would have. ``reset(options={"index" | "task_id": ...})`` plays that
task instead, drawing nothing.

How a level is applied: the level's env is built once (``gym.make`` of the wrapped env's ID with its kwargs and the
level's knobs, or ``make_env(**kwargs)``) and its task source replaces the wrapped env's, so prompts, verifier and
wrappers stay those of the env you wrapped. That covers every env whose knobs shape its tasks: the procedural ones
(``PRESETS`` has ladders for Arithmetic and Countdown; reasoning-gym generators take ``{"config": {...}}`` levels)
and the datasets' filters (``rlvr/MATH-v0`` with ``{"level": 1}`` .. ``{"level": 5}``).

``info["curriculum"]`` reports ``level`` (the level the episode is played at), ``knobs``, and after a finished
episode ``success_rate`` (of the current window), ``window`` (outcomes in it) and ``moved`` (+1, -1 or 0).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from rlvr_envs.core import UNVERIFIABLE

PRESETS: dict[str, tuple[dict[str, Any], ...]] = {
    "rlvr/Arithmetic-v0": (
        {"num_operations": 1, "max_operand": 20, "operators": "+-"},
        {"num_operations": 1, "max_operand": 50, "operators": "+-"},  # the env's default
        {"num_operations": 2, "max_operand": 50, "operators": "+-"},
        {"num_operations": 2, "max_operand": 99, "operators": "+-*"},
        {"num_operations": 3, "max_operand": 99, "operators": "+-*"},
        {"num_operations": 4, "max_operand": 999, "operators": "+-*"},
    ),
    "rlvr/Countdown-v0": (
        {"min_numbers": 3, "max_numbers": 3, "max_number": 9, "max_target": 40},  # the micro lane's tasks
        {"min_numbers": 3, "max_numbers": 3, "max_number": 25, "max_target": 100},
        {"min_numbers": 3, "max_numbers": 4, "max_number": 100, "max_target": 100},  # the env's default
        {"min_numbers": 4, "max_numbers": 4, "max_number": 100, "max_target": 100},
        {"min_numbers": 4, "max_numbers": 5, "max_number": 100, "max_target": 500},
        {"min_numbers": 5, "max_numbers": 6, "max_number": 100, "max_target": 1000},
    ),
}


class Curriculum(gym.Wrapper):
    """Keeps the running success rate in ``band`` by stepping through ``levels`` (see the module docstring)."""

    def __init__(self, env: gym.Env, levels: Sequence[Mapping[str, Any]] | None = None, *,
                 band: tuple[float, float] = (0.3, 0.7), window: int = 32, start_level: int = 0, seed: int = 0,
                 make_env: Callable[..., gym.Env] | None = None):
        super().__init__(env)
        spec = env.spec
        if levels is None:
            if spec is None or spec.id not in PRESETS:
                raise ValueError(f"no preset ladder for {getattr(spec, 'id', 'this env')!r}; pass levels= "
                                 f"(presets: {sorted(PRESETS)})")
            levels = PRESETS[spec.id]
        self.levels = tuple(dict(level) for level in levels)
        if not self.levels:
            raise ValueError("levels must hold at least one level")
        low, high = (float(b) for b in band)
        if not 0.0 <= low < high <= 1.0:
            raise ValueError(f"band must be (low, high) with 0 <= low < high <= 1, got {band!r}")
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"window must be a positive int, got {window!r}")
        if not 0 <= start_level < len(self.levels):
            raise ValueError(f"start_level must be in [0, {len(self.levels)}), got {start_level!r}")
        if make_env is None and spec is None:
            raise ValueError("the env has no spec (not built by gym.make): pass make_env=callable(**kwargs)")
        if not hasattr(env.unwrapped, "source"):
            raise ValueError(f"{type(env.unwrapped).__name__} has no task source for a curriculum to change")
        self.band, self.window = (low, high), window
        self._base_kwargs = dict(spec.kwargs) if spec is not None else {}
        self._make = make_env or (lambda **kwargs: gym.make(spec.id, **kwargs))
        self._sources: dict[int, Any] = {}
        self.level = start_level
        self._outcomes: deque[bool] = deque(maxlen=window)
        self._rng = np.random.default_rng(seed)
        self.episodes = 0
        self.moves = 0
        self._played_level = start_level

    # -- levels ---------------------------------------------------------------------------------------------------
    def source_for(self, level: int) -> Any:
        """The task source of ``level`` (its env is built on first use)."""
        if level not in self._sources:
            env = self._make(**{**self._base_kwargs, **self.levels[level]})
            self._sources[level] = env.unwrapped.source
            env.close()
        return self._sources[level]

    @property
    def success_rate(self) -> float | None:
        return sum(self._outcomes) / len(self._outcomes) if self._outcomes else None

    def _report(self) -> dict[str, Any]:
        return {"level": self._played_level, "knobs": dict(self.levels[self._played_level])}

    # -- gymnasium API --------------------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        source = self.source_for(self.level)
        self.env.unwrapped.source = source
        self._played_level = self.level
        options = dict(options or {})
        if "index" in options or "task_id" in options:
            obs, info = self.env.reset(seed=seed, options=options)
        else:
            options["index"] = int(self._rng.integers(len(source)))
            obs, info = self.env.reset(seed=int(self._rng.integers(2**31)), options=options)
        return obs, {**info, "curriculum": self._report()}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        report = self._report()
        if terminated or truncated:
            report.update(self._record(info))
        return obs, reward, terminated, truncated, {**info, "curriculum": report}

    def _record(self, info: Mapping[str, Any]) -> dict[str, Any]:
        """Take one finished episode into the window and move a level if the full window is out of the band."""
        self.episodes += 1
        if info.get("verdict") != UNVERIFIABLE:
            self._outcomes.append(bool(info.get("correct", False)))
        rate, n = self.success_rate, len(self._outcomes)
        moved = 0
        if n >= self.window and rate is not None:
            if rate > self.band[1] and self.level < len(self.levels) - 1:
                moved = 1
            elif rate < self.band[0] and self.level > 0:
                moved = -1
        if moved:
            self.level += moved
            self.moves += 1
            self._outcomes.clear()
        return {"success_rate": rate, "window": n, "moved": moved}

    # -- resuming -------------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything that decides the rest of the run (JSON-serializable)."""
        return {"level": self.level, "outcomes": list(self._outcomes), "rng": self._rng.bit_generator.state,
                "episodes": self.episodes, "moves": self.moves, "levels": [dict(lv) for lv in self.levels],
                "band": list(self.band), "window": self.window}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state_dict()``'s output; the ladder, band and window must be the ones it was saved with."""
        if [dict(lv) for lv in state["levels"]] != [dict(lv) for lv in self.levels] or \
                tuple(state["band"]) != self.band or int(state["window"]) != self.window:
            raise ValueError("the saved curriculum has different levels, band or window than this one")
        self.level = int(state["level"])
        self._outcomes = deque((bool(o) for o in state["outcomes"]), maxlen=self.window)
        rng = np.random.default_rng()
        rng.bit_generator.state = state["rng"]
        self._rng = rng
        self.episodes, self.moves = int(state["episodes"]), int(state["moves"])
        self._played_level = self.level
