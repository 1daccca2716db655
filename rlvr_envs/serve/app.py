"""The ``rlvr serve`` application: OpenEnv's ``HTTPEnvServer`` with a session socket that enforces limits.

OpenEnv's server class gives the stateless HTTP routes (``/reset``, ``/step``, ``/state``, ``/health``, ``/schema``,
``/metadata``), its session table (``_create_session`` with the ``max_concurrent_envs`` cap, ``_destroy_session``)
and a per-session single-thread executor, so a session's env always runs on one thread (SQLite sandboxes, caches).
We register our own ``/ws`` ahead of OpenEnv's (Starlette takes the first matching route); it speaks the same
messages (``reset`` / ``step`` / ``state`` / ``close`` in, ``observation`` / ``state`` / ``error`` out), so
OpenEnv's ``GenericEnvClient`` works unchanged, and adds what the stock socket lacks: a per-step time limit, an idle
timeout that closes the socket (the stock reaper drops the env but leaves the socket open), error messages that say
what to send instead, and the counters behind ``/metrics``. ``/envs`` lists the served IDs and their spaces
(``RemoteEnv`` reads it).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import uvicorn
from fastapi import FastAPI, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse
from openenv.core.env_server.exceptions import EnvironmentFactoryError, SessionCapacityError
from openenv.core.env_server.http_server import HTTPEnvServer
from openenv.core.env_server.types import ConcurrencyConfig, WSErrorCode
from pydantic import ValidationError

from rlvr_envs.serve.environment import ServedEnvs, ServeError, SessionEnv
from rlvr_envs.serve.metrics import ServeMetrics
from rlvr_envs.serve.models import TextAction, TextObservation

log = logging.getLogger(__name__)

# WebSocket close codes: 1013 "try again later" for a full server, 1008 "policy violation" for a broken limit.
CLOSE_TRY_LATER, CLOSE_POLICY = 1013, 1008
# What the socket loop does after a message.
CONTINUE, CLOSE, ABORT = "continue", "close", "abort"


class StepTimeout(ServeError):
    def __init__(self, message: str):
        super().__init__(message, code="EXECUTION_ERROR")


def action_error(errors: list[Mapping[str, Any]]) -> str:
    """A ``TextAction`` validation failure as one sentence that says what a good action looks like."""
    reasons = []
    for error in errors:
        field = ".".join(str(p) for p in error.get("loc", ())) or "action"
        kind = error.get("type", "")
        if kind == "missing":
            reasons.append(f"missing '{field}'")
        elif kind == "extra_forbidden":
            reasons.append(f"unknown field '{field}'")
        elif kind == "string_type":
            reasons.append(f"'{field}' must be a string, got {type(error.get('input')).__name__}")
        else:
            reasons.append(f"'{field}': {error.get('msg', kind)}")
    return f"bad action ({'; '.join(reasons)}): send {{\"text\": \"<the model's turn>\"}}"


class RlvrEnvServer(HTTPEnvServer):
    """OpenEnv's ``HTTPEnvServer`` over ``SessionEnv`` with time limits, an idle timeout and metrics."""

    def __init__(self, served: ServedEnvs, *, max_sessions: int = 64, step_timeout_s: float = 60.0,
                 reset_timeout_s: float = 300.0, idle_timeout_s: float = 300.0, metrics: ServeMetrics | None = None):
        for name, value in (("max_sessions", max_sessions), ("step_timeout_s", step_timeout_s),
                            ("reset_timeout_s", reset_timeout_s), ("idle_timeout_s", idle_timeout_s)):
            if value <= 0:
                raise ValueError(f"{name} must be > 0, got {value}")
        self.served = served
        self.metrics = metrics or ServeMetrics()
        self.step_timeout_s = float(step_timeout_s)
        self.reset_timeout_s = float(reset_timeout_s)
        self.idle_timeout_s = float(idle_timeout_s)
        self._cleanups: set[asyncio.Task] = set()  # teardown of sessions whose step overran (see _release)
        self._live: dict[str, LiveSession] = {}  # open sockets, for the idle reaper
        self._reaper: asyncio.Task | None = None
        # session_timeout=None: the WebSocket loop below owns idle handling (OpenEnv's reaper would close the env
        # under a socket it leaves open).
        super().__init__(functools.partial(SessionEnv, served, self.metrics), TextAction, TextObservation,
                         concurrency_config=ConcurrencyConfig(max_concurrent_envs=max_sessions, session_timeout=None))

    # -- the stateless HTTP routes (OpenEnv's) run their env calls here: give them the time limit too ---------------
    async def _run_sync_in_thread_pool(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return await asyncio.wait_for(super()._run_sync_in_thread_pool(func, *args, **kwargs),
                                          self._limit_for(func))
        except asyncio.TimeoutError:
            raise self._timed_out(func) from None

    def _limit_for(self, func: Callable[..., Any]) -> float:
        """A step's time limit, or a reset's (the first reset makes the env, so it gets longer)."""
        return self.step_timeout_s if getattr(func, "__name__", "") == "step" else self.reset_timeout_s

    def _timed_out(self, func: Callable[..., Any]) -> StepTimeout:
        self.metrics.count("step_timeouts_total")
        what = getattr(func, "__name__", "call")
        flag = "--step-timeout" if what == "step" else "--reset-timeout"
        return StepTimeout(f"{what} took longer than the server's limit of {self._limit_for(func):g} s ({flag}); "
                           f"this session is closed: reconnect and reset")

    async def _in_session(self, session_id: str, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``func`` on the session's own thread, under the time limit. One timer per call rather than
        ``asyncio.wait_for`` (which wraps the call in more futures and callbacks: a measurable share of a fast
        env's served step)."""
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._session_executors.get(session_id, self._executor),
                                      functools.partial(func, *args, **kwargs))
        expired: list[bool] = []
        timer = loop.call_later(self._limit_for(func), _expire, future, expired)
        try:
            return await future
        except asyncio.CancelledError:
            if not expired:  # the session's task was cancelled (idle reaping, shutdown), not the call
                raise
            raise self._timed_out(func) from None
        finally:
            timer.cancel()

    async def _release(self, session_id: str, *, wait: bool) -> None:
        """Free the session's slot now; close its env (on its own thread) now or, when a step overran and still
        holds that thread, in the background once it returns."""
        async with self._session_lock:
            env = self._sessions.pop(session_id, None)
            executor = self._session_executors.pop(session_id, None)
            stack = self._session_stacks.pop(session_id, None)
            self._session_info.pop(session_id, None)
        cleanup = self._cleanup_session_resources(env, executor, stack)
        if wait:
            await cleanup
        else:
            task = asyncio.ensure_future(cleanup)
            self._cleanups.add(task)
            task.add_done_callback(self._cleanups.discard)

    # -- the session socket ---------------------------------------------------------------------------------------
    async def websocket_session(self, websocket: WebSocket) -> None:
        await websocket.accept()
        try:
            session_id, env = await self._create_session()
        except SessionCapacityError as exc:
            self.metrics.count("sessions_rejected_total")
            reason = (f"server at capacity: {exc.active_sessions} of {exc.max_sessions} sessions open "
                      f"(--max-sessions {exc.max_sessions}); close a session or retry later")
            await _send_error(websocket, WSErrorCode.CAPACITY_REACHED, reason,
                              active_sessions=exc.active_sessions, max_sessions=exc.max_sessions)
            await _close(websocket, CLOSE_TRY_LATER, reason)
            return
        except EnvironmentFactoryError as exc:
            await _send_error(websocket, WSErrorCode.FACTORY_ERROR, f"could not create the session's env: {exc}")
            await _close(websocket, CLOSE_POLICY, "could not create the session's env")
            return
        self.metrics.count("sessions_opened_total")
        live = self._live[session_id] = LiveSession(asyncio.current_task(), time.monotonic())
        self._start_idle_reaper()
        close_code, close_reason, timed_out = 1000, "", False
        try:
            while True:
                try:
                    message = await websocket.receive()
                except asyncio.CancelledError:
                    if live.idle_reason is None:
                        raise
                    task = asyncio.current_task()
                    if hasattr(task, "uncancel"):  # Python >= 3.11: our own reaper's cancel is handled here
                        task.uncancel()
                    self.metrics.count("idle_closed_total")
                    # Said twice: as a message (for a client reading) and as the close reason (for one sending).
                    close_code, close_reason = CLOSE_POLICY, live.idle_reason
                    await _send_error(websocket, WSErrorCode.SESSION_ERROR, close_reason)
                    break
                if message["type"] == "websocket.disconnect":
                    break
                live.busy = True
                raw = message.get("text")
                if raw is None:
                    raw = (message.get("bytes") or b"").decode("utf-8", errors="replace")
                reply, then = await self._handle(session_id, env, raw)
                if reply is not None:
                    await websocket.send_text(reply)
                live.busy, live.last = False, time.monotonic()
                if then == ABORT:
                    timed_out = True
                    close_code, close_reason = CLOSE_POLICY, "a step overran the time limit (--step-timeout); reconnect"
                if then != CONTINUE:
                    break
        except WebSocketDisconnect:
            pass
        except Exception as exc:  # a server bug must not leak the session: report it, then release
            log.exception("session %s failed", session_id)
            with contextlib.suppress(Exception):
                await _send_error(websocket, WSErrorCode.SESSION_ERROR, f"session failed: {exc}")
        finally:
            self._live.pop(session_id, None)
            await _close(websocket, close_code, close_reason)
            await self._release(session_id, wait=not timed_out)

    def _start_idle_reaper(self) -> None:
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.ensure_future(self._reap_idle())

    async def _reap_idle(self) -> None:
        """Close sessions silent for ``idle_timeout_s`` (not those inside a call: the time limits bound those).
        One task for all sessions, rather than a timeout on every receive; it ends when no session is open."""
        interval = min(max(self.idle_timeout_s / 4, 0.05), 1.0)
        while self._live:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for live in list(self._live.values()):
                if not live.busy and live.idle_reason is None and now - live.last > self.idle_timeout_s:
                    live.idle_reason = (f"session closed after {self.idle_timeout_s:g} s without a message "
                                        f"(--idle-timeout); reconnect")
                    live.task.cancel()

    async def _handle(self, session_id: str, env: SessionEnv, raw: str) -> tuple[str | None, str]:
        """One client message -> (the reply, then: CONTINUE, CLOSE, or ABORT after an overrun step)."""
        try:
            message = json.loads(raw)
        except json.JSONDecodeError as exc:
            return _error(WSErrorCode.INVALID_JSON, f"message is not JSON ({exc.msg})"), CONTINUE
        if not isinstance(message, dict):
            return _error(WSErrorCode.INVALID_JSON, "a message is a JSON object with a 'type'"), CONTINUE
        kind, data = message.get("type"), message.get("data", {})
        if kind == "close":
            return None, CLOSE
        if kind not in ("reset", "step", "state"):
            return _error(WSErrorCode.UNKNOWN_TYPE, f"unknown message type {kind!r}: send reset, step, state or "
                                                    f"close"), CONTINUE
        if not isinstance(data, dict):
            return _error(WSErrorCode.VALIDATION_ERROR, f"a {kind} message's 'data' must be a JSON object, got "
                                                        f"{type(data).__name__}"), CONTINUE
        self._update_session_activity(session_id, increment_step=kind == "step")
        try:
            if kind == "state":
                return json.dumps({"type": "state", "data": env.state.model_dump()}), CONTINUE
            if kind == "reset":
                observation = await self._in_session(session_id, env.reset, **data)
            else:
                try:
                    action = TextAction.model_validate(data)
                except ValidationError as exc:
                    return _error(WSErrorCode.VALIDATION_ERROR, action_error(exc.errors()),
                                  errors=json.loads(exc.json())), CONTINUE
                observation = await self._in_session(session_id, env.step, action)
        except StepTimeout as exc:
            return _error(WSErrorCode.EXECUTION_ERROR, str(exc)), ABORT
        except ServeError as exc:
            return _error(exc.code, str(exc)), CONTINUE
        except TypeError as exc:  # reset(**data) with a key that clashes with a parameter's kind
            return _error(WSErrorCode.VALIDATION_ERROR, f"bad {kind} arguments: {exc}"), CONTINUE
        except Exception as exc:
            self.metrics.count("errors_total")
            log.exception("%s failed in session %s", kind, session_id)
            return _error(WSErrorCode.EXECUTION_ERROR, f"{kind} failed: {type(exc).__name__}: {exc}"), CONTINUE
        self._update_session_activity(session_id)
        return observation_message(observation), CONTINUE

    def metrics_snapshot(self) -> dict[str, Any]:
        return self.metrics.snapshot(sessions_open=self.active_sessions, max_sessions=self.max_concurrent_envs,
                                     env_ids=list(self.served.envs))


def observation_message(observation: TextObservation) -> str:
    """The ``observation`` reply, as OpenEnv's ``serialize_observation`` + ``WSObservationResponse`` would write
    it, with pydantic's own JSON writer for the observation (the bulk of the bytes)."""
    fields = observation.model_dump_json(exclude={"reward", "done", "metadata"})
    return (f'{{"type":"observation","data":{{"observation":{fields},"reward":{json.dumps(observation.reward)},'
            f'"done":{"true" if observation.done else "false"}}}}}')


def _expire(future: asyncio.Future, expired: list[bool]) -> None:
    expired.append(True)
    future.cancel()


@dataclass
class LiveSession:
    """An open socket as the idle reaper sees it."""

    task: asyncio.Task
    last: float  # time.monotonic() of the last reply (or of the connection)
    busy: bool = False  # inside a message: reset / step time limits apply, not the idle timeout
    idle_reason: str | None = None  # set by the reaper just before it cancels ``task``


def _error(code: str, message: str, **extra: Any) -> str:
    return json.dumps({"type": "error", "data": {"message": message, "code": str(getattr(code, "value", code)),
                                                 **extra}})


async def _send_error(websocket: WebSocket, code: str, message: str, **extra: Any) -> None:
    with contextlib.suppress(Exception):  # the client may already be gone
        await websocket.send_text(_error(code, message, **extra))


async def _close(websocket: WebSocket, code: int, reason: str = "") -> None:
    reason = reason.encode()[:123].decode(errors="ignore")  # a close frame's reason holds at most 123 bytes
    with contextlib.suppress(Exception):
        await websocket.close(code=code, reason=reason)


def create_app(env_ids: list[str] | str, *, max_sessions: int = 64, step_timeout_s: float = 60.0,
               reset_timeout_s: float = 300.0, idle_timeout_s: float = 300.0,
               env_kwargs: Mapping[str, Any] | None = None, allow_client_env_kwargs: bool = True) -> FastAPI:
    """The FastAPI app serving ``env_ids`` (the first is the default of a reset that names none).

    Each env is made once here, so an unknown ID, a missing extra or missing data fails before the server starts.
    The ``RlvrEnvServer`` is at ``app.state.rlvr``."""
    served = ServedEnvs.probe([env_ids] if isinstance(env_ids, str) else list(env_ids), env_kwargs,
                              allow_client_env_kwargs=allow_client_env_kwargs)
    server = RlvrEnvServer(served, max_sessions=max_sessions, step_timeout_s=step_timeout_s,
                           reset_timeout_s=reset_timeout_s, idle_timeout_s=idle_timeout_s)
    app = FastAPI(title="rlvr serve", version="0.1.0",
                  description="RLVR text environments over the OpenEnv protocol: " + ", ".join(served.envs))
    app.state.rlvr = server

    # Registered before OpenEnv's routes, so this /ws is the one that answers.
    @app.websocket("/ws")
    async def ws(websocket: WebSocket) -> None:
        await server.websocket_session(websocket)

    @app.get("/metrics", tags=["Health"], summary="sessions, steps, steps/s, step and verify latency")
    async def metrics() -> dict[str, Any]:
        return server.metrics_snapshot()

    @app.get("/envs", tags=["Environment Info"], summary="the served env IDs, their spaces and limits")
    async def envs() -> dict[str, Any]:
        return {"default": served.default_id, "envs": {i: e.describe() for i, e in served.envs.items()},
                "limits": {"max_sessions": server.max_concurrent_envs, "step_timeout_s": server.step_timeout_s,
                           "reset_timeout_s": server.reset_timeout_s, "idle_timeout_s": server.idle_timeout_s}}

    @app.exception_handler(ServeError)
    async def serve_error(request: Request, exc: ServeError) -> JSONResponse:
        status = 504 if isinstance(exc, StepTimeout) else 400
        return JSONResponse({"detail": str(exc), "code": exc.code}, status_code=status)

    server.register_routes(app)
    return app


@contextlib.contextmanager
def running_server(app: FastAPI, host: str = "127.0.0.1", port: int = 0,
                   log_level: str = "warning") -> Iterator[str]:
    """Serve ``app`` from a background thread for the ``with`` block; yields its base URL (``port=0``: a free one).

    For tests, benchmarks and notebooks; ``rlvr serve`` runs uvicorn in the foreground instead."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    # No permessage-deflate, as `rlvr serve` by default: compressing small frames only costs CPU on loopback.
    config = uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=5, ws_per_message_deflate=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="rlvr-serve", daemon=True)
    thread.start()
    try:
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("the server thread exited before it started (see the log above)")
            thread.join(0.01)
        yield f"http://{host}:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
