"""Systematic wrong answers for BFCL items, built from the ground truth by construction (not by asking the checker).

Used by the tests (each must score 0) and by the benchmark that compares our verdicts with bfcl-eval's checker.
A perturbation that does not apply to an item (no required parameter to drop, no value that can be made wrong) is None.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rlvr_envs.core import Task
from rlvr_envs.tools.bfcl import gold_calls
from rlvr_envs.verifiers.calls import ToolCall, standardize

KINDS = ("wrong_value", "missing_required", "extra_call", "swapped_function")


def _unacceptable(value: Any, options: Sequence[Any]) -> Any | None:
    """A value of the same type as ``value`` that is none of ``options`` (None when we cannot make one)."""
    std_options = [standardize(o) if isinstance(o, str) else o for o in options]
    if isinstance(value, bool):
        candidates: list[Any] = [not value]
    elif isinstance(value, int):
        candidates = [value + k for k in (1, 2, 3, 7, 1000)]
    elif isinstance(value, float):
        candidates = [value + k for k in (1.5, 2.5, 1000.5)]
    elif isinstance(value, str):
        candidates = [value + " zzq", "qqz unrelated"]
    elif isinstance(value, list):
        candidates = [[*value, value[-1]] if value else ["zzq"], [*value, "zzq", 12345]]
    else:
        return None
    for c in candidates:
        std = standardize(c) if isinstance(c, str) else [standardize(x) if isinstance(x, str) else x for x in c] \
            if isinstance(c, list) else c
        if std not in std_options and not any(type(o) is type(c) and o == c for o in options):
            return c
    return None


def perturbations(task: Task) -> dict[str, list[ToolCall] | None]:
    functions: list[Mapping[str, Any]] = task.metadata["functions"]
    gold = gold_calls(task)
    out: dict[str, list[ToolCall] | None] = dict.fromkeys(KINDS)
    if not gold:  # irrelevance: any call at all is wrong
        f = functions[0]
        out["extra_call"] = [ToolCall(f["name"], {})]
        return out
    first = gold[0]
    (_, expected), = task.metadata["ground_truth"][0].items()
    spec = next(f for f in functions if f["name"] == first.name)["parameters"]
    required = [p for p in spec.get("required", []) if p in first.arguments]
    order = required + [p for p in first.arguments if p not in required]
    for param in order:
        bad = _unacceptable(first.arguments[param], expected.get(param, []))
        if bad is not None:
            out["wrong_value"] = [ToolCall(first.name, {**first.arguments, param: bad}), *gold[1:]]
            break
    if required:
        args = {k: v for k, v in first.arguments.items() if k != required[0]}
        out["missing_required"] = [ToolCall(first.name, args), *gold[1:]]
    out["extra_call"] = [*gold, first]
    others = [f["name"] for f in functions if f["name"] != first.name]
    out["swapped_function"] = [ToolCall(others[0] if others else first.name + "_v2", first.arguments), *gold[1:]]
    return out


# Rewrites a correct checker must accept (BFCL's rules: order-free parallel calls, case/spacing-insensitive strings,
# ints for floats, optional parameters omitted where "" is acceptable) and one type trap it must reject.
EQUIVALENT_KINDS = ("reordered", "string_case", "int_for_float", "omit_optional")
TRAP_KINDS = ("float_for_int",)


def _params(task: Task, call: ToolCall) -> Mapping[str, Any]:
    return next(f for f in task.metadata["functions"] if f["name"] == call.name)["parameters"].get("properties", {})


def rewrites(task: Task) -> dict[str, list[ToolCall] | None]:
    """Equivalent rewrites of the ground truth (should score 1) and type traps (should score 0); None = not applicable."""
    gold = gold_calls(task)
    out: dict[str, list[ToolCall] | None] = dict.fromkeys(EQUIVALENT_KINDS + TRAP_KINDS)
    if not gold:
        return out
    if len(gold) > 1 and "parallel" in task.metadata["category"] and gold != gold[::-1]:
        out["reordered"] = gold[::-1]
    changed = [ToolCall(c.name, {k: (v.upper().replace(" ", "  ") if isinstance(v, str) else v)
                                 for k, v in c.arguments.items()}) for c in gold]
    if changed != gold:
        out["string_case"] = changed
    props = [_params(task, c) for c in gold]
    as_int = [ToolCall(c.name, {k: (int(v) if p.get(k, {}).get("type") == "float" and isinstance(v, float)
                                    and v.is_integer() else v) for k, v in c.arguments.items()})
              for c, p in zip(gold, props)]
    if as_int != gold or any(type(a) is not type(b) for c1, c2 in zip(as_int, gold)
                             for a, b in zip(c1.arguments.values(), c2.arguments.values())):
        out["int_for_float"] = as_int
    (_, expected), = task.metadata["ground_truth"][0].items()
    optional = [k for k in gold[0].arguments if "" in expected.get(k, [])]
    if optional:
        out["omit_optional"] = [ToolCall(gold[0].name, {k: v for k, v in gold[0].arguments.items() if k not in optional}),
                                *gold[1:]]
    as_float = [ToolCall(c.name, {k: (float(v) if p.get(k, {}).get("type") == "integer" and type(v) is int else v)
                                  for k, v in c.arguments.items()}) for c, p in zip(gold, props)]
    if any(type(a) is float and type(b) is int for c1, c2 in zip(as_float, gold)
           for a, b in zip(c1.arguments.values(), c2.arguments.values())):
        out["float_for_int"] = as_float
    return out
