"""``RemoteEnv``: a Gymnasium env whose episodes run on an ``rlvr serve`` server.

It holds one WebSocket session (the server keeps a multi-turn env's state there) and speaks the OpenEnv messages,
so it is an ordinary ``gymnasium.Env``: ``check_env``, wrappers and vector envs work over the network::

    env = RemoteEnv("http://127.0.0.1:8000", "rlvr/Countdown-v0")
    obs, info = env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step("<answer>(1 + 2) * 3</answer>")

The same seed gives the same task as the in-process env, and the same response the same reward: the server runs
the registered env itself. Spaces mirror the served env's ``TextSpace`` (read from ``GET /envs``). A vector env::

    gym.make_vec("rlvr_envs.remote:rlvr_remote/Remote-v0", num_envs=4, url=url, env_id="rlvr/Arithmetic-v0")

Needs ``websockets`` (the ``[serve]`` extra).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

from rlvr_envs.core import WallTime
from rlvr_envs.extras import require
from rlvr_envs.jsontypes import jsonable
from rlvr_envs.spaces import TextSpace

REMOTE_ID = "rlvr_remote/Remote-v0"


class RemoteEnvError(RuntimeError):
    """The server refused a request (``code`` is its OpenEnv error code) or could not be reached."""

    def __init__(self, message: str, code: str = "CONNECTION_ERROR"):
        super().__init__(message)
        self.code = code


def _space(description: dict[str, Any]) -> TextSpace:
    if description.get("type") != "text":
        raise RemoteEnvError(f"unsupported space {description!r}: RemoteEnv mirrors text spaces only")
    return TextSpace(int(description["max_length"]), min_length=int(description.get("min_length", 0)))


@dataclass(frozen=True)
class RemoteTask:
    """What a client learns of a served task: its position. A server never sends references or metadata (they hold
    answers: a Countdown task's metadata carries a solution)."""

    index: int
    metadata: Mapping[str, Any] = field(default_factory=dict)


class RemoteTasks:
    """``env.unwrapped.source`` of a ``RemoteEnv``: the served env's task count (``len``), as a trainer sizes its
    prompt stream; ``task(i)`` gives a ``RemoteTask``."""

    def __init__(self, env: RemoteEnv):
        self.env = env

    def __len__(self) -> int:
        n = self.env.session_facts()["num_tasks"]
        if n is None:
            raise TypeError(f"{self.env.env_id} served from {self.env.url} has no task source")
        return int(n)

    def task(self, index: int) -> RemoteTask:
        if not 0 <= int(index) < len(self):
            raise IndexError(f"task index {index} out of range for {len(self)} tasks")
        return RemoteTask(int(index))


class RemoteEnv(gym.Env[str, str]):
    """A served text env (``env_id``; default: the server's default) as a local ``gymnasium.Env``."""

    metadata = {"render_modes": []}

    def __init__(self, url: str, env_id: str | None = None, *, env_kwargs: dict[str, Any] | None = None,
                 connect_timeout_s: float = 10.0, message_timeout_s: float = 300.0):
        self._ws_client = require("websockets.sync.client", "serve", "rlvr_envs.remote.RemoteEnv")
        self.url = url.rstrip("/")
        self.env_kwargs = dict(env_kwargs or {})
        self.connect_timeout_s = float(connect_timeout_s)
        self.message_timeout_s = float(message_timeout_s)
        listing = self._get("/envs")
        self.env_id = env_id or listing["default"]
        if self.env_id not in listing["envs"]:
            raise RemoteEnvError(f"unknown env id {self.env_id!r}: {self.url} serves {', '.join(listing['envs'])}",
                                 code="VALIDATION_ERROR")
        described = listing["envs"][self.env_id]
        self.observation_space = _space(described["observation_space"])
        self.action_space = _space(described["action_space"])
        self._ws: Any = None
        self._facts: dict[str, Any] | None = None

    # -- gymnasium API ------------------------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)  # seeds self.np_random too, as check_env expects of any env
        data: dict[str, Any] = {"env_id": self.env_id}
        if seed is not None:
            data["seed"] = int(seed)
        if options:
            data["options"] = jsonable(options)
        if self.env_kwargs:
            data["env_kwargs"] = self.env_kwargs
        observation, _, _, _, info = self._exchange("reset", data)
        return observation, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if not isinstance(action, str):
            raise TypeError(f"action must be the model's turn (str), got {type(action).__name__}")
        return self._exchange("step", {"text": action})

    def close(self) -> None:
        if self._ws is not None:
            ws, self._ws = self._ws, None
            try:
                ws.send(json.dumps({"type": "close"}))
                ws.close()
            except Exception:  # already gone: nothing to release on our side
                pass
        super().close()

    def state(self) -> dict[str, Any]:
        """The server's view of this session (env ID, task, step count, whether an episode is open, the session
        env's task count and whether it is multi-turn)."""
        return self._send("state", None)["data"]

    def session_facts(self) -> dict[str, Any]:
        """``num_tasks`` and ``multi_turn`` of the env this session plays (with this client's env kwargs): the server
        makes a session's env at its first reset, so a session that has none yet resets once (task 0) to learn them.
        Read once per client."""
        if self._facts is None:
            state = self.state()
            if state.get("multi_turn") is None:
                self.reset(options={"index": 0})
                state = self.state()
            self._facts = {"num_tasks": state.get("num_tasks"), "multi_turn": bool(state.get("multi_turn"))}
        return self._facts

    @property
    def source(self) -> RemoteTasks:
        return RemoteTasks(self)

    @property
    def multi_turn(self) -> bool:
        """Whether the served env's episodes may take several turns (what a trainer asks before choosing how to
        play them)."""
        return self.session_facts()["multi_turn"]

    # -- wire ---------------------------------------------------------------------------------------------------------
    def _exchange(self, kind: str, data: dict[str, Any]) -> tuple[str, float, bool, bool, dict[str, Any]]:
        payload = self._send(kind, data)["data"]
        observation = payload["observation"]
        info = dict(observation.get("info") or {})
        if observation.get("messages") is not None:
            info["messages"] = observation["messages"]
        if isinstance(info.get("verify_ms"), (int, float)):
            info["verify_ms"] = WallTime(info["verify_ms"])  # timing, not state: equal across runs, as in-process
        reward = payload.get("reward")
        return (observation.get("prompt", ""), 0.0 if reward is None else float(reward),
                bool(observation.get("terminated")), bool(observation.get("truncated")), info)

    def _send(self, kind: str, data: dict[str, Any] | None) -> dict[str, Any]:
        if self._ws is None:
            self._connect()
        message: dict[str, Any] = {"type": kind} if data is None else {"type": kind, "data": data}
        try:
            self._ws.send(json.dumps(message))
            reply = json.loads(self._ws.recv(timeout=self.message_timeout_s))
        except TimeoutError:
            self.close()
            raise RemoteEnvError(f"no reply to {kind} within {self.message_timeout_s:g} s from {self.url}") from None
        except Exception as exc:  # the connection dropped (server restart, idle timeout, network)
            self._ws = None
            raise RemoteEnvError(f"lost the session with {self.url} during {kind}: {exc}") from exc
        if reply.get("type") == "error":
            error = reply.get("data") or {}
            raise RemoteEnvError(f"server error: {error.get('message', 'unknown error')}",
                                 code=str(error.get("code", "UNKNOWN")))
        return reply

    def _connect(self) -> None:
        ws_url = "ws" + self.url[len("http"):] if self.url.startswith("http") else self.url
        try:
            # __enter__: websockets >= 17.1 warns on a bare connect(); the entered connection closes itself.
            self._ws = self._ws_client.connect(f"{ws_url}/ws", open_timeout=self.connect_timeout_s,
                                               max_size=None).__enter__()
        except Exception as exc:
            raise RemoteEnvError(f"cannot connect to {ws_url}/ws: {exc}") from exc

    def _get(self, path: str) -> dict[str, Any]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=self.connect_timeout_s) as response:
                return json.loads(response.read())
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise RemoteEnvError(f"cannot read {self.url}{path} (is `rlvr serve` running there?): {exc}") from exc


if REMOTE_ID not in gym.registry:
    gym.register(REMOTE_ID, entry_point=RemoteEnv, disable_env_checker=False)
