"""verl as a client: the parquet dataset verl's ``RLHFDataset`` reads, and a ``compute_score`` that scores with our
env verifiers (verl's ``reward.custom_reward_function``).

``rlvr export --format verl --env rlvr/Countdown-v0 --n 1024 --out train.parquet`` writes one row per task::

    {"data_source": "rlvr/Countdown-v0", "prompt": [{"role": "user", "content": ...}], "ability": "math",
     "reward_model": {"style": "rule", "ground_truth": "<the gold answer>"},
     "extra_info": {"split": "train", "index": 0, "task_id": "countdown-0", "env_id": "rlvr/Countdown-v0",
                    "env_kwargs": "{}"}}

and verl scores each response with ``compute_score`` from this module (verl loads ``pkg://`` module paths, or
this file's path)::

    reward.custom_reward_function.path=pkg://rlvr_envs.integrations.verl
    reward.custom_reward_function.name=compute_score

``compute_score`` rebuilds the task from ``extra_info`` (env id, env kwargs, task id), so verifiers that need more
than the gold answer (Countdown's numbers, BFCL's function specs) score exactly as ``rlvr eval`` does, rubric
included; without ``extra_info["task_id"]`` (a dataset written elsewhere) it scores ``solution_str`` against
``ground_truth`` alone with the env's verifier. Single-turn envs only: a tool-use or search episode needs an agent
loop, not one response.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from rlvr_envs.integrations._scoring import env_kwargs_text, make_env, score_response, task_indices

# verl's `ability` column (a label it logs), by the module that implements the env
ABILITIES: dict[str, str] = {
    "rlvr_envs.tasks.math": "math", "rlvr_envs.tasks.gsm8k": "math", "rlvr_envs.tasks.arithmetic": "math",
    "rlvr_envs.tasks.countdown": "math", "rlvr_envs.tasks.reasoning_gym": "reasoning",
    "rlvr_envs.tools.bfcl": "function_calling", "rlvr_envs.modes": "math",
}

def ability_of(env: Any) -> str:
    return ABILITIES.get(type(env.unwrapped).__module__, "rlvr")


def rows(env_id: str, n: int, *, start: int = 0, split: str = "train", env_kwargs: Mapping[str, Any] | None = None,
         ability: str | None = None, env_url: str | None = None) -> list[dict[str, Any]]:
    """verl rows for tasks ``start .. start+n-1`` of ``env_id`` (fewer where the env has fewer tasks). With
    ``env_url`` (an ``rlvr serve`` server), rows name the ``rlvr_env`` agent loop
    (``rlvr_envs.integrations.verl_agent_loop``) and the server: the way tool-use and search envs, which need whole
    episodes, are trained in verl."""
    env = make_env(env_id, env_kwargs, "verl's compute_score (give --env-url to train it through the rlvr_env agent "
                                       "loop)", multi_turn_ok=env_url is not None)
    indices = task_indices(env, start, n)
    kwargs_text = env_kwargs_text(env_kwargs)
    label = ability or ability_of(env)
    out = []
    for i in indices:
        _, info = env.reset(options={"index": i})
        task = env.unwrapped.task
        out.append({
            "data_source": env_id,
            "prompt": [{"role": m["role"], "content": m["content"]} for m in info["messages"]],
            "ability": label,
            "reward_model": {"style": "rule", "ground_truth": str(task.answer)},
            "extra_info": {"split": split, "index": i, "task_id": info["task_id"], "env_id": env_id,
                           "env_kwargs": kwargs_text},
        })
        if env_url is not None:
            from rlvr_envs.integrations.verl_agent_loop import AGENT_NAME  # noqa: F401  (needs verl; checked early)

            out[-1]["agent_name"] = "rlvr_env"
            out[-1]["extra_info"]["env_url"] = env_url
    env.close()
    return out


def write_parquet(records: list[dict[str, Any]], path: str | os.PathLike[str]) -> None:
    """Write ``rows(...)`` as the parquet file verl's ``data.train_files`` / ``data.val_files`` read."""
    from rlvr_envs.extras import require

    pa = require("pyarrow", "hub", "rlvr export --format verl")
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(records), str(path))


def export(env_id: str, n: int, out: str | os.PathLike[str], *, start: int = 0, split: str = "train",
           env_kwargs: Mapping[str, Any] | None = None, ability: str | None = None, env_url: str | None = None) -> int:
    """``rows`` + ``write_parquet``; returns the number of rows written."""
    records = rows(env_id, n, start=start, split=split, env_kwargs=env_kwargs, ability=ability, env_url=env_url)
    write_parquet(records, out)
    return len(records)


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Mapping[str, Any] | None = None,
                  **kwargs: Any) -> dict[str, float]:
    """verl's reward function: ``{"score": reward, "acc": 1.0 if correct, "unverifiable": ..., "format_ok": ...}``
    (numbers only: verl averages every key over a batch).

    The task is ``extra_info["task_id"]`` of ``extra_info["env_id"]`` (else ``data_source``) made with
    ``extra_info["env_kwargs"]``; its gold answer must equal ``ground_truth``. Without a task id, ``solution_str`` is
    scored against ``ground_truth`` alone."""
    info = dict(extra_info or {})
    env_id = str(info.get("env_id") or data_source)
    result = score_response(env_id, info.get("env_kwargs") or "{}", info.get("task_id"), str(solution_str),
                            ground_truth, who="verl's compute_score")
    return {"score": result["reward"], "acc": float(result["correct"]),
            "unverifiable": float(result["verdict"] == "unverifiable"), "format_ok": float(result["format_ok"])}
