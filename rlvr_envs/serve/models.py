"""The wire types of ``rlvr serve``: OpenEnv ``Action`` / ``Observation`` / ``State`` subclasses and JSON helpers.

One action for every text env: ``{"text": <the model's turn>}`` (a single-turn answer, a tool call, a search query).
An observation carries the env's rendered prompt (``prompt``, the Gymnasium observation), the chat so far
(``messages``, lifted out of ``info`` so it is sent once), every other ``info`` field, and Gymnasium's
``terminated`` / ``truncated`` beside OpenEnv's ``done``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field


class TextAction(Action):
    """The model's turn: the response text for a single-turn env, a tool call or a search for a multi-turn one."""

    text: str = Field(..., description="the model's turn (response text)")


class TextObservation(Observation):
    """What a reset or step returns, with ``reward`` and ``done`` from OpenEnv's ``Observation``."""

    env_id: str = Field(default="", description="the served env ID this episode runs on")
    prompt: str = Field(default="", description="the Gymnasium observation: the rendered prompt or tool results")
    messages: list[dict[str, Any]] | None = Field(
        default=None, description="info['messages'], the chat so far (None when the env's info has none)")
    info: dict[str, Any] = Field(default_factory=dict, description="the env's info dict, less 'messages'")
    terminated: bool = Field(default=False, description="Gymnasium's terminated")
    truncated: bool = Field(default=False, description="Gymnasium's truncated (a turn cap or time limit)")


class TextEnvState(State):
    """``/state`` and the WebSocket ``state`` message: where this session's episode stands."""

    env_id: str | None = Field(default=None, description="the env ID of the current episode")
    task_id: str | None = Field(default=None, description="the current task's ID")
    episode_open: bool = Field(default=False, description="whether a step is expected (reset done, not finished)")


def jsonable(value: Any) -> Any:
    """``value`` as plain JSON types: numpy scalars and arrays, tuples, sets, dataclasses and non-finite floats
    (as strings, since JSON has none) are converted; anything else unknown becomes its ``str``."""
    if value is None or isinstance(value, (bool, str, int)):
        return value if type(value) in (bool, str, int) or value is None else _plain_scalar(value)
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else str(value)
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return jsonable(value.item())
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return jsonable(dataclasses.asdict(value))
    return str(value)


def _plain_scalar(value: Any) -> Any:
    # bool / int / str subclasses (an IntEnum, a str Enum): their plain value, so JSON and equality stay simple
    for kind in (bool, int, str):
        if isinstance(value, kind):
            return kind(value)
    return value
