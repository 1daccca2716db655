"""The wire types of ``rlvr serve``: OpenEnv ``Action`` / ``Observation`` / ``State`` subclasses and JSON helpers.

One action for every text env: ``{"text": <the model's turn>}`` (a single-turn answer, a tool call, a search query).
An observation carries the env's rendered prompt (``prompt``, the Gymnasium observation), the chat so far
(``messages``, lifted out of ``info`` so it is sent once), every other ``info`` field, and Gymnasium's
``terminated`` / ``truncated`` beside OpenEnv's ``done``.
"""

from __future__ import annotations

from typing import Any

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
    num_tasks: int | None = Field(default=None, description="tasks in the session env's source (None: no source, "
                                                            "or no env made yet)")
    multi_turn: bool | None = Field(default=None, description="whether an episode may take several turns (tool and "
                                                              "search envs); None: no env made yet")
