"""Scoring one response to one task with the env's own verifier, shared by the verl and verifiers adapters.

Trainers call reward functions from thread pools and event loops, so each thread keeps its own env per (env id,
env kwargs); a task is rebuilt from its id, so verifiers that need more than the gold answer (Countdown's numbers,
BFCL's function specs) score as ``rlvr eval`` does, rubric included.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from typing import Any

_local = threading.local()


def env_kwargs_text(env_kwargs: Mapping[str, Any] | str | None) -> str:
    """The canonical JSON text of env kwargs (what datasets store, and the cache key)."""
    if isinstance(env_kwargs, str):
        env_kwargs = json.loads(env_kwargs or "{}")
    return json.dumps(dict(env_kwargs or {}), sort_keys=True)


def task_indices(env: Any, start: int, n: int, n_name: str = "n") -> range:
    """Indices ``start .. start+n-1`` of ``env``'s tasks (fewer where it has fewer), or ``ValueError``."""
    size = len(env.unwrapped.source)
    if not 0 <= start < size or n < 1:
        raise ValueError(f"need 0 <= start < {size} and {n_name} >= 1, got start={start}, {n_name}={n}")
    return range(start, min(size, start + n))


def require_single_turn(env: Any, env_id: str, who: str) -> None:
    from rlvr_envs.search.env import SearchEnv
    from rlvr_envs.tools.base import ToolEnv

    if isinstance(env.unwrapped, (ToolEnv, SearchEnv)):
        raise NotImplementedError(f"{env_id} is multi-turn (tool use / search): {who} scores one response per prompt; "
                                  f"multi-turn episodes need an agent loop")


def make_env(env_id: str, env_kwargs: Mapping[str, Any] | str | None, who: str, *,
             multi_turn_ok: bool = False) -> Any:
    import gymnasium as gym

    import rlvr_envs  # noqa: F401  (registers the rlvr/ ids)

    env = gym.make(env_id, **json.loads(env_kwargs_text(env_kwargs)))
    if not multi_turn_ok:
        require_single_turn(env, env_id, who)
    return env


def cached_env(env_id: str, env_kwargs: Mapping[str, Any] | str | None, who: str) -> Any:
    envs = getattr(_local, "envs", None)
    if envs is None:
        envs = _local.envs = {}
    key = (env_id, env_kwargs_text(env_kwargs))
    if key not in envs:
        envs[key] = make_env(env_id, key[1], who)
    return envs[key]


def score_response(env_id: str, env_kwargs: Mapping[str, Any] | str | None, task_id: str | None, response: str,
                   ground_truth: Any = None, *, who: str = "this adapter") -> dict[str, Any]:
    """``{"reward", "correct", "verdict", "format_ok", "parsed_answer"}`` of ``response`` to task ``task_id``.

    With a ``task_id`` the env's task is used and, when ``ground_truth`` is given, its gold answer must equal it (a
    dataset from another version of the env fails loudly rather than scoring against the wrong task). Without one,
    ``response`` is scored against ``ground_truth`` alone (answer-only verifiers)."""
    from rlvr_envs.core import Task, step_single_turn

    env = cached_env(env_id, env_kwargs, who)
    if task_id is not None:
        env.reset(options={"task_id": str(task_id)})
        gold = str(env.unwrapped.task.answer)
        if ground_truth is not None and gold != str(ground_truth):
            raise ValueError(f"{env_id} task {task_id}: the env's gold answer {gold!r:.80} is not the dataset's "
                             f"ground truth {str(ground_truth)!r:.80}; re-export the dataset")
        reward, info = step_single_turn(env, str(response))
        return {"reward": float(reward), "correct": bool(info["correct"]), "verdict": info["verdict"],
                "format_ok": bool(info["format_ok"]), "parsed_answer": info.get("parsed_answer")}
    if ground_truth is None:
        raise ValueError("need a task_id or a ground_truth to score against")
    verdict = env.unwrapped.score(Task(id="external", question="", answer=str(ground_truth)), str(response))
    return {"reward": float(verdict.reward), "correct": bool(verdict.correct), "verdict": verdict.status,
            "format_ok": bool(verdict.format_ok), "parsed_answer": verdict.parsed}
