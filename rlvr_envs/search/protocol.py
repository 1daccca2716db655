"""The search episode's text protocol: parse the model's turn, format what the env sends back.

The model acts with the first complete tag of its turn: ``<search>query</search>``, a tool call
``<tool_call>{"name": "search", "arguments": {"query": "..."}}</tool_call>``, or ``<answer>...</answer>``. A turn
that ends inside an open tag counts as closed: generation stopped at ``</search>`` / ``</answer>`` / ``</tool_call>``
and the engine dropped the stop string from the text (vLLM's convention); the env appends it to the record.
Retrieved passages come back as ``<information>Doc 1 (Title: "...") text ...</information>``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

MAX_QUERY_CHARS = 500

SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the corpus; returns the top passages with their titles.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string", "description": "search query"}},
                       "required": ["query"]},
    },
}

_TAG = re.compile(r"<(search|answer|tool_call)>(.*?)</\1>", re.DOTALL | re.IGNORECASE)
# A turn that ends inside an open tag: generation stopped at the closing tag, which engines drop from the text.
_OPEN_AT_END = re.compile(r"<(search|answer|tool_call)>((?:(?!<(?:search|answer|tool_call)>).)*)\Z",
                          re.DOTALL | re.IGNORECASE)


@dataclass(frozen=True)
class Action:
    kind: str  # "search" | "answer" | "invalid"
    text: str = ""  # the query or the answer
    end: int = 0  # index in the turn just after the acting tag (0 for invalid)
    via_tool_call: bool = False
    error: str | None = None
    closing: str = ""  # the closing tag the turn lacked (stopped generation), to append to the record


def _tool_call_query(payload: str) -> tuple[str | None, str | None]:
    """(query, error) from a tool-call JSON body."""
    try:
        call = json.loads(payload.strip())
    except json.JSONDecodeError as exc:
        return None, f"tool call is not valid JSON ({exc.msg})"
    if not isinstance(call, dict):
        return None, "tool call must be a JSON object with 'name' and 'arguments'"
    if call.get("name") != "search":
        return None, f"unknown tool {call.get('name')!r}; the only tool is 'search'"
    args = call.get("arguments", call.get("parameters", {}))
    if isinstance(args, str):  # OpenAI style: arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None, "tool call 'arguments' is a string that is not valid JSON"
    if not isinstance(args, dict) or not isinstance(args.get("query"), str):
        return None, "search tool call needs arguments {\"query\": \"...\"}"
    return args["query"], None


def parse_action(turn: str) -> Action:
    """The first complete action tag of a model turn."""
    closing = ""
    m = _TAG.search(turn)
    if m is None:
        m = _OPEN_AT_END.search(turn)
        if m is None:
            return Action("invalid", error="no <search>...</search>, <tool_call>...</tool_call> or <answer>...</answer>")
        closing = f"</{m.group(1)}>"
    tag, body, end = m.group(1).lower(), m.group(2), m.end()
    if tag == "answer":
        return Action("answer", body.strip(), end, closing=closing)
    if tag == "tool_call":
        query, error = _tool_call_query(body)
        if query is None:
            return Action("invalid", end=end, via_tool_call=True, error=error, closing=closing)
        body = query
    query = " ".join(body.split())[:MAX_QUERY_CHARS]
    if not query:
        return Action("invalid", end=end, via_tool_call=tag == "tool_call", error="empty search query",
                      closing=closing)
    return Action("search", query, end, via_tool_call=tag == "tool_call", closing=closing)


def format_information(passages: Sequence[tuple[str, str]], max_passage_chars: int = 600) -> str:
    """``<information>`` block of (title, text) passages, numbered from 1."""
    lines = []
    for i, (title, text) in enumerate(passages, 1):
        if len(text) > max_passage_chars:
            text = text[:max_passage_chars].rstrip() + " ..."
        lines.append(f'Doc {i} (Title: "{title}") {text}')
    body = "\n".join(lines) if lines else "No results."
    return f"<information>\n{body}\n</information>"


def format_notice(message: str) -> str:
    """Env feedback (invalid action, search limit) goes in the same block, so all env text is maskable alike."""
    return f"<information>\n{message}\n</information>"
