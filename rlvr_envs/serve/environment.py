"""One served session: an OpenEnv ``Environment`` that owns one Gymnasium env instance.

The server makes one ``SessionEnv`` per WebSocket session (and one per stateless HTTP call), so a multi-turn env's
state (a tool sandbox, the search trajectory) lives with its session. The Gymnasium env is made at the first
``reset``, which names the env ID (one of those the server serves; default: the first) and may pass env kwargs; a
later reset that names another ID or other kwargs closes it and makes a new one.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
from gymnasium import spaces
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import EnvironmentMetadata

from rlvr_envs.core import TextEnv
from rlvr_envs.jsontypes import jsonable
from rlvr_envs.serve.metrics import ServeMetrics
from rlvr_envs.serve.models import TextAction, TextEnvState, TextObservation

log = logging.getLogger(__name__)

# What a reset accepts besides OpenEnv's own seed / episode_id; a step over stateless HTTP may carry them too.
RESET_KEYS = ("env_id", "task_id", "index", "options", "env_kwargs")


class ServeError(ValueError):
    """A request the server cannot carry out, with a message that says what to send instead."""

    def __init__(self, message: str, code: str = "EXECUTION_ERROR"):
        super().__init__(message)
        self.code = code


def describe_space(space: gym.Space, env_id: str, which: str) -> dict[str, Any]:
    """A text space as JSON (what ``RemoteEnv`` rebuilds); the server serves text envs only."""
    if not isinstance(space, spaces.Text):
        raise ServeError(f"{env_id}: its {which} space is {space!r}; rlvr serve serves text envs only "
                         f"(actions are {{'text': ...}})")
    return {"type": "text", "max_length": int(space.max_length), "min_length": int(space.min_length)}


@dataclass(frozen=True)
class ServedEnv:
    """One env ID the server serves, with the spaces and limits of its default instance."""

    env_id: str
    observation_space: dict[str, Any]
    action_space: dict[str, Any]
    max_episode_steps: int | None
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        return {"env_id": self.env_id, "observation_space": self.observation_space,
                "action_space": self.action_space, "max_episode_steps": self.max_episode_steps,
                "server_env_kwargs": dict(self.kwargs)}


@dataclass
class ServedEnvs:
    """The env IDs one server serves (the first is the default), and the policy on client env kwargs."""

    envs: dict[str, ServedEnv]
    allow_client_env_kwargs: bool = True

    @classmethod
    def probe(cls, env_ids: list[str], env_kwargs: Mapping[str, Any] | None = None, *,
              allow_client_env_kwargs: bool = True) -> ServedEnvs:
        """Make each env once (an unknown ID, a missing extra or missing data fails here, at startup, not in a
        session) and record its spaces."""
        import rlvr_envs  # noqa: F401  (registers the rlvr/ IDs)

        if not env_ids:
            raise ServeError("no env IDs to serve")
        envs: dict[str, ServedEnv] = {}
        for env_id in env_ids:
            if env_id in envs:
                continue
            if env_id not in gym.registry:
                raise ServeError(f"unknown env id {env_id!r} (see `rlvr list`)")
            env = gym.make(env_id, **dict(env_kwargs or {}))
            try:
                envs[env_id] = ServedEnv(env_id, describe_space(env.observation_space, env_id, "observation"),
                                         describe_space(env.action_space, env_id, "action"),
                                         env.spec.max_episode_steps if env.spec else None, dict(env_kwargs or {}))
            finally:
                env.close()
        return cls(envs, allow_client_env_kwargs)

    @property
    def default_id(self) -> str:
        return next(iter(self.envs))

    def get(self, env_id: str | None) -> ServedEnv:
        env_id = self.default_id if env_id is None else env_id
        if not isinstance(env_id, str) or env_id not in self.envs:
            raise ServeError(f"unknown env id {env_id!r}: this server serves {', '.join(self.envs)}",
                             code="VALIDATION_ERROR")
        return self.envs[env_id]


class SessionEnv(Environment[TextAction, TextObservation, TextEnvState]):
    """The OpenEnv face of one Gymnasium text env (made lazily, see the module docstring)."""

    # Each session has its own instance and nothing mutable is shared between instances.
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, served: ServedEnvs, metrics: ServeMetrics | None = None):
        super().__init__()
        self.served = served
        self.metrics = metrics
        self._env: gym.Env | None = None
        self._key: tuple[str, str] | None = None  # (env_id, kwargs as JSON) of self._env
        self._env_id: str | None = None
        self._task_id: str | None = None
        self._episode_id: str | None = None
        self._steps = 0
        self._open = False
        self._closed = False

    # -- OpenEnv Environment API ----------------------------------------------------------------------------------
    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> TextObservation:
        unknown = sorted(set(kwargs) - set(RESET_KEYS))
        if unknown:
            raise ServeError(f"unknown reset argument(s) {', '.join(map(repr, unknown))}: a reset takes seed, "
                             f"episode_id, {', '.join(RESET_KEYS)}", code="VALIDATION_ERROR")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise ServeError(f"seed must be a non-negative integer, got {seed!r}", code="VALIDATION_ERROR")
        served = self.served.get(kwargs.get("env_id"))
        env = self._env_for(served, kwargs.get("env_kwargs"))
        options = self._options(kwargs)
        self._open = False
        try:
            obs, info = env.reset(seed=seed, options=options or None)
        except (KeyError, IndexError, ValueError, TypeError) as exc:  # a bad task_id / index / option
            raise ServeError(f"{served.env_id}: reset failed: {_reason(exc)}", code="VALIDATION_ERROR") from None
        self._env_id, self._task_id = served.env_id, info.get("task_id")
        self._episode_id = episode_id or uuid.uuid4().hex
        self._steps, self._open = 0, True
        if self.metrics is not None:
            self.metrics.count("resets_total")
        return self._observation(obs, None, False, False, info)

    def step(self, action: TextAction, timeout_s: float | None = None, **kwargs: Any) -> TextObservation:
        text = action.text if isinstance(action, TextAction) else action
        if not isinstance(text, str):
            raise ServeError(f"the action's text must be a string, got {type(text).__name__}",
                             code="VALIDATION_ERROR")
        kwargs.pop("request_id", None)  # OpenEnv's HTTP StepRequest field, for tracing only
        if kwargs:
            # Stateless HTTP: POST /step with reset arguments plays a one-step episode in one request.
            self.reset(seed=kwargs.pop("seed", None), episode_id=kwargs.pop("episode_id", None), **kwargs)
        if self._closed:
            raise ServeError("this session is closed; open a new one", code="SESSION_ERROR")
        if not self._open or self._env is None:
            raise ServeError("step before reset: this session has no open episode (send a reset first; a finished "
                             "episode needs a new reset)", code="VALIDATION_ERROR")
        start = time.perf_counter()
        try:
            obs, reward, terminated, truncated, info = self._env.step(text)
        except Exception as exc:  # an env bug: report it to this client only, and end the episode
            self._open = False
            if self.metrics is not None:
                self.metrics.count("errors_total")
            raise ServeError(f"{self._env_id}: step failed: {_reason(exc)}") from exc
        step_ms = (time.perf_counter() - start) * 1000.0
        self._steps += 1
        done = bool(terminated or truncated)
        self._open = not done
        if self.metrics is not None:
            verify = info.get("verify_ms")
            self.metrics.record_step(step_ms, float(verify) if isinstance(verify, (int, float)) else None, done)
        return self._observation(obs, float(reward), bool(terminated), bool(truncated), info)

    @property
    def state(self) -> TextEnvState:
        num_tasks = multi_turn = None
        if self._env is not None:
            source = getattr(self._env.unwrapped, "source", None)
            num_tasks = len(source) if source is not None else None
            multi_turn = not isinstance(self._env.unwrapped, TextEnv)
        return TextEnvState(episode_id=self._episode_id, step_count=self._steps, env_id=self._env_id,
                            task_id=self._task_id, episode_open=self._open, num_tasks=num_tasks, multi_turn=multi_turn)

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(name="rlvr-envs", version="0.1.0",
                                   description="RLVR text environments: " + ", ".join(self.served.envs))

    def close(self) -> None:
        self._closed, self._open = True, False
        if self._env is not None:
            env, self._env = self._env, None
            try:
                env.close()
            except Exception as exc:  # closing must never fail a session's teardown
                log.warning("closing %s failed: %s", self._env_id, exc)

    # -- helpers ----------------------------------------------------------------------------------------------------
    def _env_for(self, served: ServedEnv, client_kwargs: Any) -> gym.Env:
        if client_kwargs is not None and not isinstance(client_kwargs, dict):
            raise ServeError(f"env_kwargs must be a JSON object, got {type(client_kwargs).__name__}",
                             code="VALIDATION_ERROR")
        if client_kwargs and not self.served.allow_client_env_kwargs:
            raise ServeError("this server does not take env_kwargs from clients (started with "
                             "--no-client-env-kwargs)", code="VALIDATION_ERROR")
        kwargs = {**served.kwargs, **(client_kwargs or {})}
        key = (served.env_id, json.dumps(jsonable(kwargs), sort_keys=True))
        if self._env is not None and self._key == key:
            return self._env
        self.close()
        self._closed = False
        try:
            self._env = gym.make(served.env_id, **kwargs)
        except Exception as exc:
            raise ServeError(f"gym.make({served.env_id!r}, **{kwargs!r}) failed: {_reason(exc)}",
                             code="VALIDATION_ERROR") from None
        self._key = key
        return self._env

    @staticmethod
    def _options(kwargs: Mapping[str, Any]) -> dict[str, Any]:
        options = kwargs.get("options") or {}
        if not isinstance(options, dict):
            raise ServeError(f"options must be a JSON object, got {type(options).__name__}", code="VALIDATION_ERROR")
        options = dict(options)
        for key in ("task_id", "index"):
            if kwargs.get(key) is not None:
                options[key] = kwargs[key]
        if "index" in options and (isinstance(options["index"], bool) or not isinstance(options["index"], int)):
            raise ServeError(f"index must be an integer, got {options['index']!r}", code="VALIDATION_ERROR")
        return options

    def _observation(self, obs: Any, reward: float | None, terminated: bool, truncated: bool,
                     info: Mapping[str, Any]) -> TextObservation:
        info = dict(info)
        messages = info.pop("messages", None)
        # model_construct: every field is built right here from plain JSON types, so validation would only cost
        return TextObservation.model_construct(
            env_id=self._env_id or "", prompt=obs if isinstance(obs, str) else str(obs),
            messages=jsonable(messages) if messages is not None else None, info=jsonable(info), reward=reward,
            done=terminated or truncated, terminated=terminated, truncated=truncated, metadata={})


def _reason(exc: BaseException) -> str:
    text = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
    return f"{type(exc).__name__}: {text}"
