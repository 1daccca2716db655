"""A local policy behind the OpenAI chat-completions API: ``rlvr serve --policy MODEL``.

Harnesses that talk to a model over HTTP (verifiers' ``vf-eval``, agent frameworks, OpenAI clients) can then run
against the suite's own policies (``tiny``, ``smollm2``, a trained checkpoint directory) on this machine::

    rlvr serve --policy smollm2 --port 8001
    vf-eval rlvr-envs-verifiers --env.taskset.env-id rlvr/Countdown-v0 --client.base-url http://127.0.0.1:8001/v1 ...

``POST /v1/chat/completions`` renders ``messages`` with the policy's chat template and decodes with the suite's
engine (``temperature``, ``top_p``, ``max_tokens`` / ``max_completion_tokens``, ``n``, ``seed``, ``stop``); ``GET
/v1/models`` lists the one model. One engine decodes one request at a time (requests queue). ``stream: true`` gets
server-sent events in OpenAI's chunk format (the whole completion in one content chunk once decoded, then the
finish reason, the usage when ``stream_options.include_usage`` asks for it, and ``[DONE]``). Not supported, and
refused with a 400 rather than ignored: ``tools`` (a tool-calling harness needs a model that emits tool calls),
``logprobs``.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

UNSUPPORTED = ("tools", "logprobs", "top_logprobs", "tool_choice", "functions")


class ChatRequest(BaseModel):
    """The fields of an OpenAI chat-completions request this server reads; others are accepted and ignored."""

    model_config = ConfigDict(extra="allow")

    messages: list[dict[str, Any]] = Field(min_length=1)
    model: str | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    n: int = Field(default=1, ge=1, le=64)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "invalid_request_error"}}, status_code=status)


def _events(head: dict[str, Any], rollouts: list[Any], finish: list[str], usage: dict[str, int] | None
            ) -> Iterator[str]:
    """OpenAI's streaming chunks of finished completions: per choice its text, then its finish reason."""
    chunk = {**head, "object": "chat.completion.chunk"}
    for i, r in enumerate(rollouts):
        yield _sse({**chunk, "choices": [{"index": i, "delta": {"role": "assistant", "content": r.text},
                                          "finish_reason": None}]})
        yield _sse({**chunk, "choices": [{"index": i, "delta": {}, "finish_reason": finish[i]}]})
    if usage is not None:
        yield _sse({**chunk, "choices": [], "usage": usage})
    yield "data: [DONE]\n\n"


def _sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def create_policy_app(policy: Any, engine: Any, *, model_name: str | None = None,
                      max_new_tokens: int = 512) -> FastAPI:
    """The app serving ``policy`` (its ``prompt_text(messages)`` chat template) through ``engine.generate``."""
    from agents.policy.engine import SamplingParams

    name = model_name or str(getattr(policy, "name", "policy"))
    app = FastAPI(title="rlvr-envs policy", description=__doc__)
    lock = asyncio.Lock()  # one engine: requests decode one after another
    counter = {"requests": 0}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "rlvr-envs"}]}

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(request: ChatRequest) -> Any:
        asked = request.model_extra or {}
        unsupported = [k for k in UNSUPPORTED if asked.get(k) not in (None, False, [], {})]
        if unsupported:
            return _error(400, f"not supported by this server: {', '.join(unsupported)}")
        if any(not isinstance(m.get("content", ""), (str, type(None))) for m in request.messages):
            return _error(400, "message content must be text")
        messages = [{"role": str(m.get("role", "user")), "content": m.get("content") or ""} for m in request.messages]
        stop = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
        limit = request.max_completion_tokens or request.max_tokens or max_new_tokens
        sampling = SamplingParams(temperature=1.0 if request.temperature is None else request.temperature,
                                  top_p=1.0 if request.top_p is None else request.top_p, max_new_tokens=int(limit),
                                  seed=request.seed, stop=tuple(stop))
        prompt = policy.prompt_text(messages)
        async with lock:
            rollouts = await asyncio.to_thread(engine.generate, [prompt], request.n, sampling)
        counter["requests"] += 1
        prompt_tokens = len(rollouts[0].prompt_ids) if rollouts else 0
        completion_tokens = sum(len(r.response_ids) for r in rollouts)
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                 "total_tokens": prompt_tokens + completion_tokens}
        head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": name}
        finish = ["length" if r.finish_reason == "length" else "stop" for r in rollouts]
        if request.stream:
            include_usage = bool((request.stream_options or {}).get("include_usage"))
            return StreamingResponse(_events(head, rollouts, finish, usage if include_usage else None),
                                     media_type="text/event-stream")
        return {**head, "object": "chat.completion",
                "choices": [{"index": i, "message": {"role": "assistant", "content": r.text}, "finish_reason": f}
                            for i, (r, f) in enumerate(zip(rollouts, finish))],
                "usage": usage}

    app.state.requests = counter
    return app
