"""The ``rlvr`` subcommands (one module each, listed in ``rlvr_envs.cli.COMMANDS``) and what several of them share."""

from __future__ import annotations

import json
from typing import Any


def json_object(text: str, flag: str) -> dict[str, Any]:
    """A command-line flag's JSON object (``--env-kwargs '{"a": 1}'``), or exit with what is wrong with it."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SystemExit(f"{flag}: not valid JSON ({exc.msg})") from None
    if not isinstance(value, dict):
        raise SystemExit(f"{flag}: expected a JSON object, got {type(value).__name__}")
    return value
