"""Tool-call parsing and the BFCL AST match.

Parsing accepts the two formats models emit:

- the chat-template format (Hermes / Qwen / transformers ``tools=``): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
  blocks (``"parameters"`` is accepted for ``"arguments"``; a JSON list of call objects inside one block is fine too);
- Python-style calls, the format of BFCL's prompting mode: ``[f(a=1), pkg.g(b="x")]`` or ``f(a=1)``, parsed with ``ast`` and a
  whitelist of literal nodes (strings, numbers, booleans, None, lists, tuples, dicts, unary minus). Nothing is ever evaluated.

Malformed calls never raise: each becomes one entry in ``ParsedCalls.errors``. Sizes are bounded (response length,
number of calls, argument size, nesting depth), so hostile text costs bounded time.

``match_bfcl`` re-implements the Berkeley Function Calling Leaderboard AST checker (bfcl_eval/eval_checker/ast_eval) for
Python categories: exact function name, required parameters present, no unknown parameters, type check (int accepted
for float), strings compared after BFCL's standardisation (case, spaces and ``,./-_*^`` ignored), optional parameters
omitted only where the possible answer allows ``""``, parallel calls matched order-free, irrelevance = no call.
"""

from __future__ import annotations

import ast
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

MAX_TEXT_CHARS = 32_768  # longer responses are parsed only up to here
MAX_CALLS = 32
MAX_ARG_CHARS = 16_384  # JSON size of one call's arguments
MAX_DEPTH = 16

_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
_FENCE = re.compile(r"^```[a-zA-Z]*\s*\n?(.*?)\n?```$", re.DOTALL)
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]{0,127}$")


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)

    def to_json(self, *, sort_keys: bool = False) -> str:
        """The call as JSON; ``sort_keys=True`` gives a canonical form (equal calls, equal strings)."""
        return json.dumps({"name": self.name, "arguments": self.arguments}, ensure_ascii=False, sort_keys=sort_keys)


@dataclass(frozen=True)
class ParsedCalls:
    """The calls a response makes. ``errors`` holds one message per call that could not be parsed; ``text`` is the
    response with the tool-call blocks removed (the final answer, when there are no calls)."""

    calls: tuple[ToolCall, ...] = ()
    errors: tuple[str, ...] = ()
    text: str = ""
    style: str = "none"  # "json", "python" or "none"

    @property
    def attempted(self) -> int:
        return len(self.calls) + len(self.errors)


class CallSyntaxError(ValueError):
    pass


class UnverifiableGold(ValueError):
    """The possible answer cannot be checked against (it names a function the item does not document, or a parameter
    type the checker does not know): the item's fault, not the response's, so the verdict is unverifiable."""


# -- JSON format -----------------------------------------------------------------------------------------------------
def _reject_constant(name: str) -> Any:
    raise CallSyntaxError(f"non-finite number {name} is not JSON")


def _loads(text: str) -> Any:
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except CallSyntaxError:
        raise
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, over-long ints, absurd nesting
        raise CallSyntaxError(f"malformed JSON: {str(exc)[:120]}") from None


def _check_value(value: Any, depth: int = 0) -> None:
    if depth > MAX_DEPTH:
        raise CallSyntaxError(f"arguments nested deeper than {MAX_DEPTH}")
    if isinstance(value, dict):
        for k, v in value.items():
            _check_value(k, depth + 1)
            _check_value(v, depth + 1)
    elif isinstance(value, list):
        for v in value:
            _check_value(v, depth + 1)


def _make_call(name: Any, arguments: Any) -> ToolCall:
    if not isinstance(name, str) or not _NAME.match(name):
        raise CallSyntaxError(f"invalid function name {str(name)[:80]!r}")
    if arguments is None:
        arguments = {}
    if isinstance(arguments, str):  # OpenAI style: arguments as a JSON string
        arguments = _loads(arguments) if arguments.strip() else {}
    if not isinstance(arguments, dict):
        raise CallSyntaxError(f"arguments of {name!r} must be an object, got {type(arguments).__name__}")
    if not all(isinstance(k, str) for k in arguments):
        raise CallSyntaxError(f"argument names of {name!r} must be strings")
    _check_value(arguments)
    size = len(json.dumps(arguments, ensure_ascii=False))
    if size > MAX_ARG_CHARS:
        raise CallSyntaxError(f"arguments of {name!r} too large ({size} > {MAX_ARG_CHARS} characters)")
    return ToolCall(name, arguments)


def _calls_from_json(obj: Any) -> list[ToolCall]:
    items = obj if isinstance(obj, list) else [obj]
    calls = []
    for item in items:
        if not isinstance(item, dict) or "name" not in item:
            raise CallSyntaxError('a tool call must be an object {"name": ..., "arguments": {...}}')
        extra = set(item) - {"name", "arguments", "parameters", "id", "type"}
        if extra:
            raise CallSyntaxError(f"unexpected keys in tool call: {sorted(extra)}")
        calls.append(_make_call(item["name"], item.get("arguments", item.get("parameters"))))
    return calls


# -- Python format ---------------------------------------------------------------------------------------------------
_NAMED_CONSTANTS = {"True": True, "False": False, "None": None, "true": True, "false": False, "null": None}


def _literal(node: ast.AST, depth: int = 0) -> Any:
    """The value of a literal expression node; anything else (names, operators, calls, comprehensions) is rejected."""
    if depth > MAX_DEPTH:
        raise CallSyntaxError(f"argument nested deeper than {MAX_DEPTH}")
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, int, float, bool, type(None))):
        if isinstance(node.value, float) and not math.isfinite(node.value):
            raise CallSyntaxError("non-finite number")
        return node.value
    if isinstance(node, ast.Name) and node.id in _NAMED_CONSTANTS:
        return _NAMED_CONSTANTS[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        inner = _literal(node.operand, depth + 1)
        if isinstance(inner, bool) or not isinstance(inner, (int, float)):
            raise CallSyntaxError("unary sign on a non-number")
        return -inner if isinstance(node.op, ast.USub) else inner
    if isinstance(node, (ast.List, ast.Tuple)):
        # Tuples become lists: tool arguments are JSON values (BFCL's checker also converts tuples to lists).
        return [_literal(e, depth + 1) for e in node.elts]
    if isinstance(node, ast.Dict):
        out = {}
        for k, v in zip(node.keys, node.values):
            if k is None:
                raise CallSyntaxError("** unpacking is not allowed in arguments")
            key = _literal(k, depth + 1)
            if not isinstance(key, (str, int, float, bool)):
                raise CallSyntaxError("dict keys must be literals")
            out[key if isinstance(key, str) else json.dumps(key)] = _literal(v, depth + 1)
        return out
    raise CallSyntaxError(f"only literal arguments are allowed, got {type(node).__name__}")


def _dotted_name(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        raise CallSyntaxError("a call must name a function (a.b.c)")
    parts.append(node.id)
    return ".".join(reversed(parts))


def _calls_from_python(text: str) -> list[ToolCall]:
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise CallSyntaxError(f"not a Python call expression: {type(exc).__name__}") from None
    body = tree.body
    nodes = body.elts if isinstance(body, (ast.List, ast.Tuple)) else [body]
    calls = []
    for node in nodes:
        if not isinstance(node, ast.Call):
            raise CallSyntaxError("expected function calls like f(a=1)")
        if node.args:
            raise CallSyntaxError(f"{_dotted_name(node.func)}: use keyword arguments only")
        kwargs = {}
        for kw in node.keywords:
            if kw.arg is None:
                raise CallSyntaxError("** unpacking is not allowed")
            kwargs[kw.arg] = _literal(kw.value)
        calls.append(_make_call(_dotted_name(node.func), kwargs))
    return calls


def _looks_like_python_calls(text: str) -> bool:
    # Cheap pre-filter so ordinary prose never reaches ast.parse: an identifier followed by "(" and a closing ")".
    return bool(re.match(r"^\[?\s*[A-Za-z_][\w.]*\s*\(", text)) and text.rstrip().endswith((")", "]"))


# -- entry point -----------------------------------------------------------------------------------------------------
def parse_tool_calls(text: str, *, allow_python: bool = True, max_calls: int = MAX_CALLS) -> ParsedCalls:
    """Every tool call in ``text``. Never raises on model text; see the module doc for the formats."""
    if not isinstance(text, str):
        return ParsedCalls(errors=(f"response must be text, got {type(text).__name__}",))
    text = text[:MAX_TEXT_CHARS]
    calls: list[ToolCall] = []
    errors: list[str] = []
    if "<tool_call>" in text:
        for m in _BLOCK.finditer(text):
            body = m.group(1).strip()
            try:
                calls.extend(_calls_from_json(_loads(body)))
            except CallSyntaxError as exc:
                errors.append(str(exc))
        rest = _BLOCK.sub("", text).strip()
        style = "json"
    else:
        rest = text.strip()
        style = "none"
        candidate = rest
        fence = _FENCE.match(candidate)
        if fence:
            candidate = fence.group(1).strip()
        if candidate.startswith(("{", "[{")) and candidate.endswith(("}", "]")):
            try:
                calls.extend(_calls_from_json(_loads(candidate)))
                style, rest = "json", ""
            except CallSyntaxError:
                pass  # not a call object: an ordinary (JSON-looking) answer
        elif allow_python and _looks_like_python_calls(candidate):
            try:
                calls.extend(_calls_from_python(candidate))
                style, rest = "python", ""
            except CallSyntaxError as exc:
                errors.append(str(exc))
                style = "python"
    if len(calls) + len(errors) > max_calls:
        errors.append(f"too many calls in one response (limit {max_calls}); the rest were dropped")
        calls = calls[:max_calls]
    return ParsedCalls(tuple(calls), tuple(errors), rest, style)


# -- BFCL AST match --------------------------------------------------------------------------------------------------
_PY_TYPES: dict[str, type] = {
    "string": str, "integer": int, "float": float, "number": float, "boolean": bool, "array": list,
    "tuple": list, "dict": dict, "object": dict, "any": str,
}
_STRIP = re.compile(r"[ ,./\-_*^]")


def standardize(s: str) -> str:
    """BFCL's string normalisation: 'April 1, 2024' == 'april 1 2024'."""
    return _STRIP.sub("", s).lower().replace("'", '"')


def _std(v: Any) -> Any:
    return standardize(v) if isinstance(v, str) else v


def _first_type(options: Sequence[Any]) -> type | None:
    for o in options:
        if o != "":
            return type(o)
    return None


def _type_ok(value: Any, options: Sequence[Any], expected: type, nested: type | None) -> tuple[bool, bool]:
    """(valid, is_variable) as BFCL's type_checker decides them (one level of nesting)."""
    answer_type = _first_type(options)
    is_variable = answer_type is not None and answer_type is not expected
    if type(value) is expected:
        if nested is None:
            return True, is_variable
        for option in options:
            if not isinstance(option, list) or all(_type_ok(v, option, nested, None)[0] for v in value):
                return True, is_variable
    if answer_type is not None and type(value) is answer_type:
        return True, True
    return False, False


def _dict_ok(value: dict, options: Sequence[Any]) -> bool:
    for option in options:
        if option == "" or not isinstance(option, dict):
            continue
        if all(k in option and _std(v) in [_std(o) for o in option[k]] for k, v in value.items()) and all(
            k in value or "" in opts for k, opts in option.items()
        ):
            return True
    return False


def _list_dict_ok(value: list, options: Sequence[Any]) -> bool:
    return any(
        isinstance(option, list) and len(option) == len(value)
        and all(isinstance(v, dict) and _dict_ok(v, [o]) for v, o in zip(value, option))
        for option in options
    )


def _param_error(name: str, value: Any, options: Sequence[Any], spec: Mapping[str, Any]) -> str | None:
    type_name = spec.get("type", "any")
    if type_name not in _PY_TYPES:
        raise UnverifiableGold(f"the function documents parameter {name!r} with type {type_name!r}, which the "
                               "checker does not support")
    expected = _PY_TYPES[type_name]
    nested = None
    if type_name in ("array", "tuple"):
        nested = _PY_TYPES.get(spec.get("items", {}).get("type", "any"), str)
    if type_name == "float" and type(value) is int:  # Python would convert int -> float
        value = float(value)
    valid, is_variable = _type_ok(value, options, expected, nested)
    if not valid:
        return f"wrong type for {name!r}: expected {type_name}, got {type(value).__name__}"
    if not is_variable:
        if expected is dict:
            return None if _dict_ok(value, options) else f"invalid value for {name!r}: {value!r}"
        if expected is list and nested is dict:
            return None if _list_dict_ok(value, options) else f"invalid value for {name!r}: {value!r}"
        if expected is str:
            ok = standardize(value) in [standardize(o) for o in options if isinstance(o, str)]
            return None if ok else f"invalid value for {name!r}: {value!r}"
        if expected is list:
            ok = [_std(v) for v in value] in [[_std(v) for v in o] for o in options if isinstance(o, list)]
            return None if ok else f"invalid value for {name!r}: {value!r}"
    if value not in options:
        return f"invalid value for {name!r}: {value!r}"
    return None


def call_error(call: ToolCall, function: Mapping[str, Any], expected: Mapping[str, Sequence[Any]]) -> str | None:
    """Why ``call`` does not match one ground-truth call (``expected``: parameter -> acceptable values), or None.
    Raises ``UnverifiableGold`` for a parameter type the checker does not support."""
    if call.name != function["name"]:
        return f"wrong function {call.name!r} (expected {function['name']!r})"
    params = function.get("parameters", {})
    props = params.get("properties", {})
    for required in params.get("required", []):
        if required not in call.arguments:
            return f"missing required parameter {required!r}"
    for name, value in call.arguments.items():
        if name not in props or name not in expected:
            return f"unexpected parameter {name!r}"
        err = _param_error(name, value, expected[name], props[name])
        if err:
            return err
    for name, options in expected.items():
        if name not in call.arguments and "" not in options:
            return f"parameter {name!r} omitted but required by the answer"
    return None


def match_bfcl(calls: Sequence[ToolCall], ground_truth: Sequence[Mapping[str, Any]],
               functions: Sequence[Mapping[str, Any]], category: str) -> str | None:
    """None when ``calls`` match the possible answer of a BFCL item, else the first reason they do not.

    Raises ``UnverifiableGold`` when the item's own answer cannot be checked against (see there)."""
    if "irrelevance" in category:
        return None if not calls else f"expected no call, got {len(calls)}"
    if len(calls) != len(ground_truth):
        return f"wrong number of calls: {len(calls)} (expected {len(ground_truth)})"
    by_name = {f["name"]: f for f in functions}
    if "parallel" in category:
        unmatched = list(range(len(calls)))
        for gt in ground_truth:
            (fname, expected), = gt.items()
            function = by_name.get(fname)
            if function is None:
                raise UnverifiableGold(f"possible answer names an undocumented function {fname!r}")
            errors = []
            for i in unmatched:
                err = call_error(calls[i], function, expected)
                if err is None:
                    unmatched.remove(i)
                    break
                errors.append(err)
            else:
                return f"no call matches {fname!r}: {errors[0] if errors else 'none left'}"
        return None
    (fname, expected), = ground_truth[0].items()
    function = by_name.get(fname)
    if function is None:
        raise UnverifiableGold(f"possible answer names an undocumented function {fname!r}")
    return call_error(calls[0], function, expected)
