"""What a row's ``info`` says about its task, for components that read the task (step credit, trace editing), and
how a component shows the policy more context than the task's prompt (a solution, feedback, a rival's draft).

The trainer puts the task's metadata in every row's info (``info["metadata"]``); these helpers read it defensively,
since a component must never crash on a task of another kind or on a malformed record.
"""

from __future__ import annotations

from typing import Any

MAX_COUNTDOWN_NUMBERS = 64  # a Countdown task has a handful; a record claiming more is not one


def countdown_task(info: Any) -> tuple[list[int], int] | None:
    """``(numbers, target)`` from a row's ``info["metadata"]``, or None when it is not a well-formed Countdown task."""
    meta = info.get("metadata") if isinstance(info, dict) else None
    if not isinstance(meta, dict) or "numbers" not in meta or "target" not in meta:
        return None
    try:
        numbers = [int(n) for n in meta["numbers"]][: MAX_COUNTDOWN_NUMBERS + 1]
        target = int(meta["target"])
    except (TypeError, ValueError, OverflowError):
        return None
    if not 1 <= len(numbers) <= MAX_COUNTDOWN_NUMBERS or min(numbers) < 0:
        return None
    return numbers, target


def with_user_suffix(messages: Any, suffix: str) -> list[dict[str, str]]:
    """A copy of a row's chat ``messages`` with ``suffix`` appended to the last user message (the privileged or
    shared context a component adds); ValueError when there is no user message."""
    out = [dict(m) for m in (messages or [])]
    users = [i for i, m in enumerate(out) if m.get("role") == "user"]
    if not users:
        raise ValueError("the prompt has no user message to add context to")
    out[users[-1]]["content"] = out[users[-1]]["content"] + suffix
    return out
