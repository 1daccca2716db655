"""Every environment ID in one table.

``import rlvr_envs`` registers each row with Gymnasium under the ``rlvr/`` namespace; ``gymnasium.make(
"rlvr_envs:rlvr/MATH-v0")`` works without the import because Gymnasium imports the module named before the colon.
A dataset fix or a changed verifier adds a new version (``-v1``) row; old rows keep their behaviour. Rows with an
``extra`` need ``pip install 'rlvr-envs[EXTRA]'``; rows from other distributions come through the ``rlvr_envs.envs``
entry point (``rlvr_envs/plugins.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import gymnasium as gym

PACKAGE = "rlvr-envs"


@dataclass(frozen=True)
class EnvEntry:
    id: str
    entry_point: str | Callable[..., gym.Env]  # "module:attr" (imported at gymnasium.make) or the callable itself
    source: str  # where the tasks come from, for `rlvr list`
    size: str  # how many tasks (or "procedural")
    verifier: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    max_episode_steps: int | None = None
    extra: str | None = None  # the pip extra its dependencies come with (rlvr_envs.extras); None: the core install
    package: str = PACKAGE  # the distribution that provides it (a plugin's, for rows from an entry point)
    # Text envs (True): ``gymnasium.make_vec(id, n)`` and ``rlvr_envs.make_vec`` autoreset a finished sub-env in the
    # same step, so no step is a wasted reset; tabular MDP rows (False) keep gymnasium's next-step default.
    same_step_autoreset: bool = True


_MATH = "rlvr_envs.tasks.math:make_env"
_MV = "math-verify (process pool, hard timeout)"

ENVS: list[EnvEntry] = [
    # -- math benchmarks (rlvr_envs/tasks/math.py, gsm8k.py) ---------------------------------------------------
    EnvEntry("rlvr/MATH-v0", _MATH, "Hendrycks MATH (math/test.jsonl; split='train')", "5000 test / 7498 train", _MV,
             {"dataset": "math"}),
    EnvEntry("rlvr/MATH500-v0", _MATH, "MATH-500 (PRM800K split)", "500", _MV, {"dataset": "math500"}),
    EnvEntry("rlvr/AIME24-v0", _MATH, "AIME 2024", "30", _MV, {"dataset": "aime24"}),
    EnvEntry("rlvr/AIME25-v0", _MATH, "AIME 2025", "30", _MV, {"dataset": "aime25"}),
    EnvEntry("rlvr/AMC23-v0", _MATH, "AMC 2023", "40", _MV, {"dataset": "amc23"}),
    EnvEntry("rlvr/OlympiadBench-v0", _MATH, "OlympiadBench OE_TO_maths_en_COMP, single-answer subset",
             "579 of 675", _MV, {"dataset": "olympiadbench"}),
    EnvEntry("rlvr/GSM8K-v0", "rlvr_envs.tasks.gsm8k:make_env", "GSM8K (split test/train)", "1319 test / 7473 train",
             _MV),
    # -- procedural (rlvr_envs/tasks/arithmetic.py, countdown.py) ------------------------------------------------
    EnvEntry("rlvr/Arithmetic-v0", "rlvr_envs.tasks.arithmetic:make_env",
             "procedural, seeded (default a +/- b, 0-50)", "procedural", "exact integer"),
    EnvEntry("rlvr/Countdown-v0", "rlvr_envs.tasks.countdown:make_env",
             "procedural, seeded, 3-4 numbers (up to 6; split='cd3_test': 256)", "procedural",
             "ast whitelist, exact rationals"),
    # -- agentic search (rlvr_envs/search; multi-turn, BM25 / dense / hybrid retriever=) --------------------------
    EnvEntry("rlvr/HotpotQA-v0", "rlvr_envs.search.hotpotqa:make_env",
             "HotpotQA dev distractor over its 1000 paragraphs (multihop/)", "100", "qa EM (reward='f1': token F1)",
             extra="search"),
    EnvEntry("rlvr/MultiHopSynth-v0", "rlvr_envs.search.synth:make_env",
             "procedural fictional KB, seeded (corpus_size=, hops=)", "procedural", "qa EM (reward='f1': token F1)",
             extra="search"),
    # -- tool use (rlvr_envs/tools; ToolUse is multi-turn, BFCL single-turn) ------------------------------------------
    EnvEntry("rlvr/ToolUse-v0", "rlvr_envs.tools.env:make_env",
             "procedural SQLite sandbox (shop, calendar, files), state-grounded queries, 1-4 step plans (seed=)",
             "procedural", "final state + answer x precision (plan / calls)"),
    EnvEntry("rlvr/BFCL-v0", "rlvr_envs.tools.bfcl:make_env",
             "BFCL v4 (bfcl/; category=simple_python|multiple|parallel|parallel_multiple|irrelevance|live_simple|"
             "live_multiple|all)", "400 simple_python; 2551 all", "BFCL AST match", {"category": "simple_python"}),
    # -- wrappers around another single-turn text env (rlvr_envs/modes.py) --------------------------------------
    EnvEntry("rlvr/Modes-v0", "rlvr_envs.modes:make_env",
             "any single-turn text env (base=, default rlvr/Arithmetic-v0) answered in a NoThink/Short/Long mode "
             "chosen by the response's first word", "the base env's", "base verifier on the capped response x mode "
             "weight"),
    # -- tabular bisimulation testbeds (rlvr_envs/mdp; Discrete observations, not text) ---------------------------
    EnvEntry("rlvr/Grouped64-v0", "rlvr_envs.mdp.grouped:GroupedEnv", "procedural MDP, 8 bisimilar groups x 8 (mdp_seed=)",
             "64 states", "MDP reward", {}, max_episode_steps=200, same_step_autoreset=False),
    EnvEntry("rlvr/Taxi-v0", "rlvr_envs.mdp.taxi:TaxiEnv", "Gymnasium Taxi-v4 model (rainy=True: slippery moves)",
             "500 states", "MDP reward", {}, max_episode_steps=200, same_step_autoreset=False),
    EnvEntry("rlvr/Grid50-v0", "rlvr_envs.mdp.grid:GridEnv", "50x50 gridworld, +1 goal, -1 wall bump (size=)",
             "2500 states", "MDP reward", {}, max_episode_steps=1000, same_step_autoreset=False),
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


# Rows added by plugins (rlvr_envs.envs entry points), in load order.
_PLUGIN_ENTRIES: list[EnvEntry] = []


def all_entries() -> list[EnvEntry]:
    return ENVS + _extra_entries() + _PLUGIN_ENTRIES


def _register(e: EnvEntry) -> None:
    from rlvr_envs.spaces import TextVectorEntryPoint

    gym.register(id=e.id, entry_point=e.entry_point, kwargs=dict(e.kwargs),
                 max_episode_steps=e.max_episode_steps, disable_env_checker=False,
                 vector_entry_point=TextVectorEntryPoint(e.id) if e.same_step_autoreset else None)


def register_all() -> None:
    """Register every built-in row, then load the env plugins (each entry point once per process)."""
    seen: set[str] = set()
    for e in all_entries():
        if e.id in seen:
            raise ValueError(f"duplicate env id in the table: {e.id}")
        seen.add(e.id)
        if e.id in gym.registry:
            continue
        _register(e)
    from rlvr_envs.plugins import load_env_plugins  # here, not at the top: plugins imports this module

    load_env_plugins()


def add_plugin_entries(rows: Iterable[EnvEntry], *, package: str) -> list[EnvEntry]:
    """Register a plugin's rows, all or none: an ID already taken (by the table, another plugin or a direct
    ``gymnasium.register``) or a row that is not an ``EnvEntry`` rejects the whole plugin."""
    rows = list(rows)
    not_rows = [type(r).__name__ for r in rows if not isinstance(r, EnvEntry)]
    if not_rows:
        raise TypeError(f"a rlvr_envs.envs entry point must give EnvEntry rows, got {', '.join(sorted(set(not_rows)))}")
    ids = [r.id for r in rows]
    taken = {e.id for e in all_entries()}
    clashes = sorted({i for i in ids if i in taken or i in gym.registry or ids.count(i) > 1})
    if clashes:
        raise ValueError(f"env id(s) already registered: {', '.join(clashes)}")
    entries = [replace(r, package=package) for r in rows]
    done: list[str] = []
    try:
        for e in entries:
            _register(e)
            done.append(e.id)
    except Exception:  # a malformed ID: undo this plugin's other rows so it is all or none
        for env_id in done:
            del gym.registry[env_id]
        raise
    _PLUGIN_ENTRIES.extend(entries)
    return entries
