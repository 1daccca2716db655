"""Values as plain JSON types, for what crosses the wire between ``rlvr serve`` and its clients (no heavy imports:
``rlvr_envs.remote`` uses it on the client side)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any


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
    if hasattr(value, "tolist") and callable(value.tolist):  # a numpy scalar or array (numpy not imported here)
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
