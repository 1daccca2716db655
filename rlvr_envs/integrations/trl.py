"""TRL as a client: ``reward_fn(env_id)`` is a reward function for ``trl.GRPOTrainer``.

TRL calls reward functions as ``f(prompts=..., completions=..., **columns)`` where ``columns`` are the dataset's
other columns, one value per completion. The env's task for each completion comes from a column (``task_id`` by
default), so every completion is scored by the env's own verifier exactly as in ``rlvr eval``::

    from rlvr_envs.integrations.trl import dataset, reward_fn
    trainer = GRPOTrainer(model=..., reward_funcs=reward_fn("rlvr/Arithmetic-v0"),
                          train_dataset=dataset("rlvr/Arithmetic-v0", 512), args=GRPOConfig(...))

Nothing here imports TRL: a plain callable is what it accepts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

RewardFunc = Callable[..., list[float]]


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

    def reward(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
        task_ids = kwargs.get(task_column)
        if task_ids is None:
            raise KeyError(f"{env_id} reward: the dataset needs a {task_column!r} column mapping each prompt to its "
                           f"task (columns seen: {sorted(kwargs)}); build one with rlvr_envs.integrations.trl.dataset")
        if len(task_ids) != len(completions):
            raise ValueError(f"{len(completions)} completions but {len(task_ids)} {task_column!r} values")
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
    when ``conversational=False``) and ``task_id`` columns."""
    import gymnasium as gym

    import rlvr_envs  # noqa: F401
    from rlvr_envs.extras import require

    Dataset = require("datasets", "trl", "rlvr_envs.integrations.trl.dataset").Dataset

    env = gym.make(env_id, **(env_kwargs or {}))
    size = len(env.unwrapped.source)
    if not 0 <= start < size or n < 1:
        raise ValueError(f"need 0 <= start < {size} and n >= 1, got start={start}, n={n}")
    rows: dict[str, list[Any]] = {"prompt": [], "task_id": []}
    for i in range(start, min(size, start + n)):
        obs, info = env.reset(options={"index": i})
        rows["prompt"].append(info["messages"] if conversational else obs)
        rows["task_id"].append(info["task_id"])
    return Dataset.from_dict(rows)
