"""``rlvr serve --policy``: the suite's policy behind OpenAI's chat-completions API (rlvr_envs/serve/policy.py), read
with the ``openai`` client's wire format: completions, ``n`` choices, seeds, streaming chunks, clear refusals."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("agents.policy")

from fastapi.testclient import TestClient  # noqa: E402

from agents.policy.engine import make_engine  # noqa: E402
from agents.policy.models import load_policy  # noqa: E402
from rlvr_envs.serve.policy import create_policy_app  # noqa: E402

MESSAGES = [{"role": "user", "content": "What is 2 + 3?"}]


@pytest.fixture(scope="module")
def client():
    policy = load_policy("tiny")
    return TestClient(create_policy_app(policy, make_engine(policy, precision="fp32"), model_name="tiny"))


def test_a_completion_has_openais_shape_and_a_seed_repeats_it(client):
    body = {"messages": MESSAGES, "max_tokens": 8, "n": 3, "seed": 4, "temperature": 1.0}
    first, again = client.post("/v1/chat/completions", json=body), client.post("/v1/chat/completions", json=body)
    assert first.status_code == 200
    doc = first.json()
    assert doc["object"] == "chat.completion" and doc["model"] == "tiny" and len(doc["choices"]) == 3
    assert all(c["message"]["role"] == "assistant" and c["finish_reason"] in ("stop", "length") for c in doc["choices"])
    assert 0 < doc["usage"]["completion_tokens"] <= 3 * 8 and doc["usage"]["prompt_tokens"] > 0
    assert [c["message"]["content"] for c in again.json()["choices"]] == [c["message"]["content"] for c in doc["choices"]]
    assert client.get("/v1/models").json()["data"][0]["id"] == "tiny"


def test_streaming_sends_the_same_text_as_chunks(client):
    body = {"messages": MESSAGES, "max_tokens": 8, "seed": 1, "stream": True, "stream_options": {"include_usage": True}}
    plain = client.post("/v1/chat/completions", json={**body, "stream": False}).json()
    streamed = client.post("/v1/chat/completions", json=body)
    assert streamed.headers["content-type"].startswith("text/event-stream")
    events = [line[len("data: "):] for line in streamed.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == plain["choices"][0]["message"]["content"]
    assert chunks[-1]["usage"] == plain["usage"] and all(c["object"] == "chat.completion.chunk" for c in chunks)


@pytest.mark.parametrize(("body", "status", "needle"), [
    ({"messages": MESSAGES, "tools": [{"type": "function", "function": {"name": "f"}}]}, 400, "tools"),
    ({"messages": MESSAGES, "logprobs": True}, 400, "logprobs"),
    ({"messages": []}, 422, "messages"),
    ({"messages": MESSAGES, "temperature": -1}, 422, "temperature"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400, "text"),
])
def test_what_it_cannot_do_is_refused_not_ignored(client, body, status, needle):
    reply = client.post("/v1/chat/completions", json=body)
    assert reply.status_code == status and needle in reply.text
