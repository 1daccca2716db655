"""TRL as a client: ``reward_fn(env_id)`` is a reward function for ``trl.GRPOTrainer``.

TRL calls reward functions as ``f(prompts=..., completions=..., **columns)`` where ``columns`` are the dataset's
other columns, one value per completion. The env's task for each completion comes from a column (``task_id`` by
default), so every completion is scored by the env's own verifier exactly as in ``rlvr eval``::

    from rlvr_envs.integrations.trl import dataset, reward_fn
    trainer = GRPOTrainer(model=..., reward_funcs=reward_fn("rlvr/Arithmetic-v0"),
                          train_dataset=dataset("rlvr/Arithmetic-v0", 512), args=GRPOConfig(...))

Nothing here imports TRL: a plain callable is what it accepts.

Task ids do not encode env kwargs (``arith-7`` names a different task under ``max_operand=999``), so ``dataset``
adds two columns, ``env_kwargs`` (the kwargs as canonical JSON) and ``env_fingerprint`` (a hash of that text), and a
``reward_fn`` built with other kwargs raises, showing both, instead of scoring gold answers 0.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

RewardFunc = Callable[..., list[float]]

KWARGS_COLUMN = "env_kwargs"
FINGERPRINT_COLUMN = "env_fingerprint"


def effective_env_kwargs(env_id: str, env_kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
    """The kwargs that decide ``gym.make(env_id, **env_kwargs)``'s tasks: the row's registered kwargs under the
    caller's, less any equal to the entry point's own default (``max_operand=50`` and nothing are one env)."""
    import inspect

    import gymnasium as gym

    import rlvr_envs  # noqa: F401  (registers the rlvr/ ids)

    spec = gym.spec(env_id)
    merged = {**spec.kwargs, **dict(env_kwargs or {})}
    entry = spec.entry_point
    try:
        factory = gym.envs.registration.load_env_creator(entry) if isinstance(entry, str) else entry
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError, ImportError, AttributeError):  # no readable signature: compare kwargs as given
        return merged
    defaults = {name: p.default for name, p in params.items() if p.default is not inspect.Parameter.empty}
    return {k: v for k, v in merged.items() if not (k in defaults and _same_value(defaults[k], v))}


def _same_value(a: Any, b: Any) -> bool:
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:  # an object whose == is not a plain bool (an array): never treated as the default
        return False


def canonical_env_kwargs(env_id: str, env_kwargs: Mapping[str, Any] | None) -> str:
    """Effective env kwargs as JSON with sorted keys; a value JSON cannot hold is written as its ``repr``."""
    return json.dumps(effective_env_kwargs(env_id, env_kwargs), sort_keys=True, default=repr)


def fingerprint_of(kwargs_text: str) -> str:
    """A short hash of canonical kwargs text: rows of one dataset carry it, ``reward_fn`` compares it."""
    return hashlib.sha256(kwargs_text.encode()).hexdigest()[:16]


def env_kwargs_fingerprint(env_id: str, env_kwargs: Mapping[str, Any] | None) -> str:
    return fingerprint_of(canonical_env_kwargs(env_id, env_kwargs))


def check_env_fingerprints(env_id: str, ours: str, fingerprints: Sequence[Any] | None,
                           dataset_kwargs: Sequence[Any] | None = None) -> None:
    """Raise ``ValueError`` when a row's fingerprint is not that of ``ours`` (canonical kwargs text), showing both
    kwargs. Rows without the column (a dataset built by hand) are not checked."""
    if fingerprints is None:
        return
    expected = fingerprint_of(ours)
    for i, fingerprint in enumerate(fingerprints):
        if str(fingerprint) != expected:
            theirs = (str(dataset_kwargs[i]) if dataset_kwargs is not None and i < len(dataset_kwargs)
                      else f"unknown (fingerprint {fingerprint})")
            raise ValueError(f"{env_id}: the dataset's tasks were built with env_kwargs={theirs} but this reward "
                             f"function scores with env_kwargs={ours}; task ids do not encode kwargs, so the same "
                             f"id is another task. Pass the dataset's env_kwargs to reward_fn (or rebuild the "
                             f"dataset with this function's)")


def completion_text(completion: Any) -> str:
    """TRL passes a string (standard format) or a list of messages (conversational): the assistant's text."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Sequence) and completion and isinstance(completion[-1], dict):
        return "".join(str(m.get("content", "")) for m in completion if m.get("role", "assistant") == "assistant")
    raise TypeError(f"completion must be a string or a list of chat messages, got {type(completion).__name__}")


def reward_fn(env_id: str, *, task_column: str = "task_id", env_kwargs: dict[str, Any] | None = None) -> RewardFunc:
    """A TRL reward function scoring each completion with ``env_id``'s verifier (``env.reset(task_id)`` + ``step``).
    Single-turn only: a completion that leaves a multi-turn env's episode open (a tool or search call) raises
    ``NotImplementedError``."""
    import gymnasium as gym

    import rlvr_envs  # noqa: F401  (registers the rlvr/ ids)
    from rlvr_envs.core import step_single_turn

    env = gym.make(env_id, **(env_kwargs or {}))
    kwargs_text = canonical_env_kwargs(env_id, env_kwargs)

    def reward(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
        task_ids = kwargs.get(task_column)
        if task_ids is None:
            raise KeyError(f"{env_id} reward: the dataset needs a {task_column!r} column mapping each prompt to its "
                           f"task (columns seen: {sorted(kwargs)}); build one with rlvr_envs.integrations.trl.dataset")
        if len(task_ids) != len(completions):
            raise ValueError(f"{len(completions)} completions but {len(task_ids)} {task_column!r} values")
        check_env_fingerprints(env_id, kwargs_text, kwargs.get(FINGERPRINT_COLUMN), kwargs.get(KWARGS_COLUMN))
        rewards = []
        for task_id, completion in zip(task_ids, completions):
            env.reset(options={"task_id": str(task_id)})
            r, _ = step_single_turn(env, completion_text(completion))
            rewards.append(r)
        return rewards

    reward.__name__ = f"rlvr_{env_id.split('/')[-1].replace('-', '_')}"
    return reward


def dataset(env_id: str, n: int, *, start: int = 0, conversational: bool = True,
            env_kwargs: dict[str, Any] | None = None) -> Any:
    """A ``datasets.Dataset`` of tasks ``start .. start+n-1`` with ``prompt`` (chat messages, or the rendered text
    when ``conversational=False``), ``task_id``, ``env_kwargs`` and ``env_fingerprint`` columns (the last two are
    what ``reward_fn`` checks its own kwargs against)."""
    import gymnasium as gym

    import rlvr_envs  # noqa: F401
    from rlvr_envs.extras import require
    from rlvr_envs.integrations._scoring import task_indices

    Dataset = require("datasets", "trl", "rlvr_envs.integrations.trl.dataset").Dataset

    env = gym.make(env_id, **(env_kwargs or {}))
    rows: dict[str, list[Any]] = {"prompt": [], "task_id": []}
    for i in task_indices(env, start, n):
        obs, info = env.reset(options={"index": i})
        rows["prompt"].append(info["messages"] if conversational else obs)
        rows["task_id"].append(info["task_id"])
    env.close()
    kwargs_text = canonical_env_kwargs(env_id, env_kwargs)
    rows[KWARGS_COLUMN] = [kwargs_text] * len(rows["task_id"])
    rows[FINGERPRINT_COLUMN] = [fingerprint_of(kwargs_text)] * len(rows["task_id"])
    return Dataset.from_dict(rows)
