"""``rlvr/BFCL-v0``: single-turn function calling on the Berkeley Function Calling Leaderboard (v4, Python AST categories).

Data: ``<data_dir>/bfcl/BFCL_v4_<category>.json`` (JSON lines: id, question, function) and
``bfcl/possible_answer/BFCL_v4_<category>.json`` (ground_truth); irrelevance has no answer file (the right answer is
no call). Task ids are BFCL's ids (``simple_python_0``). The function docs are shown as tools in the chat-template tool
prompt (and given as ``info["tools"]``); the response's calls (``<tool_call>`` JSON or Python-style) are checked by
``rlvr_envs.verifiers.calls.match_bfcl``, a re-implementation of BFCL's AST checker.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from rlvr_envs.core import Message, Task, TextEnv, Verdict
from rlvr_envs.data import load_rows
from rlvr_envs.rubric import Rubric
from rlvr_envs.splits import seeded_source
from rlvr_envs.tools.base import tools_system_prompt
from rlvr_envs.verifiers.calls import ToolCall, UnverifiableGold, match_bfcl, parse_tool_calls

CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance", "live_simple", "live_multiple")
PREAMBLE = ("You are an expert in composing functions. You are given a question and a set of possible functions. "
            "Based on the question, make one or more function calls to achieve the purpose. If none of the functions "
            "can be used, point it out and do not call any function. If the question lacks parameters required by "
            "the function, also point it out.")
NO_CALL_RESPONSE = "None of the available functions can be used for this request, so I will not call any."

_TYPES = {"dict": "object", "float": "number", "tuple": "array"}


def to_json_schema(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A BFCL parameter spec as standard JSON schema (dict->object, float->number, tuple->array, any->no type)."""
    out: dict[str, Any] = {}
    for key, value in spec.items():
        if key == "type":
            if value != "any":
                out["type"] = _TYPES.get(value, value)
        elif key == "properties" and isinstance(value, Mapping):
            out["properties"] = {k: to_json_schema(v) for k, v in value.items()}
        elif key == "items" and isinstance(value, Mapping):
            out["items"] = to_json_schema(value)
        elif key != "optional":
            out[key] = value
    return out


def tool_schema(function: Mapping[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": function["name"], "description": function.get("description", ""),
                                             "parameters": to_json_schema(function.get("parameters", {}))}}


def load_tasks(categories: Sequence[str], data_dir: str | os.PathLike | None = None) -> tuple[list[Task], str]:
    tasks: list[Task] = []
    h = hashlib.sha256()
    for category in categories:
        if category not in CATEGORIES:
            raise ValueError(f"unknown BFCL category {category!r}; choose from {list(CATEGORIES)} or 'all'")
        rows, digest, _ = load_rows(f"bfcl/BFCL_v4_{category}.json", data_dir=data_dir)
        h.update(digest.encode())
        answers: dict[str, Any] = {}
        if category != "irrelevance":
            answer_rows, answer_digest, _ = load_rows(f"bfcl/possible_answer/BFCL_v4_{category}.json", data_dir=data_dir)
            h.update(answer_digest.encode())
            answers = {r["id"]: r["ground_truth"] for r in answer_rows}
        for row in rows:
            if category != "irrelevance" and row["id"] not in answers:
                raise ValueError(f"BFCL {category}: no possible answer for {row['id']}")
            turn = row["question"][0]  # single-turn categories: one turn of messages
            question = next((m["content"] for m in reversed(turn) if m["role"] == "user"), "")
            tasks.append(Task(id=row["id"], question=question, answer=json.dumps(answers.get(row["id"], [])),
                              messages=tuple({"role": m["role"], "content": m["content"]} for m in turn),
                              metadata={"category": category, "functions": row["function"],
                                        "ground_truth": answers.get(row["id"], [])}))
    return tasks, h.hexdigest()


def score_bfcl(task: Task, response: str) -> Verdict:
    parsed = parse_tool_calls(response)
    shown = json.dumps([{c.name: c.arguments} for c in parsed.calls], ensure_ascii=False)
    category = task.metadata["category"]
    if parsed.errors and "irrelevance" not in category:
        return Verdict.failed(f"unparseable tool call: {parsed.errors[0]}", parsed=shown)
    format_ok = not parsed.errors
    try:
        error = match_bfcl(parsed.calls, task.metadata["ground_truth"], task.metadata["functions"], category)
    except UnverifiableGold as exc:
        return Verdict.could_not_verify(str(exc), parsed=shown, format_ok=format_ok)
    if error:
        return Verdict.failed(error, parsed=shown, format_ok=format_ok)
    return Verdict(correct=True, reward=1.0, parsed=shown, format_ok=format_ok)


def _gold_value(options: Sequence[Any], spec: Mapping[str, Any]) -> tuple[bool, Any]:
    """(present, value): the first acceptable value of a parameter; absent when only "" (omit) is offered.
    BFCL's dict check is one level deep: a dict answer maps each key to its acceptable literal values."""
    for option in options:
        if option == "":
            continue
        if spec.get("type") == "dict" and isinstance(option, Mapping):
            return True, _first_values(option)
        if spec.get("type") == "array" and spec.get("items", {}).get("type") == "dict" and isinstance(option, list):
            return True, [_first_values(d) if isinstance(d, Mapping) else d for d in option]
        return True, option
    return False, None


def _first_values(expected: Mapping[str, Sequence[Any]]) -> dict[str, Any]:
    return {k: next(o for o in v if o != "") for k, v in expected.items() if any(o != "" for o in v)}


def _gold_arguments(expected: Mapping[str, Sequence[Any]], props: Mapping[str, Any]) -> dict[str, Any]:
    out = {}
    for name, options in expected.items():
        if name not in props:  # a few answers list parameters of another function (always with "": omit them)
            continue
        present, value = _gold_value(options, props[name])
        if present:
            out[name] = value
    return out


def answer_defect(task: Task) -> str | None:
    """Why no response can match this item's possible answer (a data defect BFCL's checker shares), or None."""
    functions = {f["name"]: f for f in task.metadata["functions"]}
    for gt in task.metadata["ground_truth"]:
        (name, expected), = gt.items()
        params = functions.get(name, {}).get("parameters", {})
        for p in params.get("required", []):
            if not any(o != "" for o in expected.get(p, [])):
                return f"{name}: required parameter {p!r} has no acceptable value"
        for p, options in expected.items():
            if p not in params.get("properties", {}) and "" not in options:
                return f"{name}: answer requires undocumented parameter {p!r}"
    return None


def gold_calls(task: Task) -> list[ToolCall]:
    functions = {f["name"]: f for f in task.metadata["functions"]}
    calls = []
    for gt in task.metadata["ground_truth"]:
        (name, expected), = gt.items()
        props = functions.get(name, {}).get("parameters", {}).get("properties", {})
        calls.append(ToolCall(name, _gold_arguments(expected, props)))
    return calls


def render_calls(calls: Sequence[ToolCall]) -> str:
    return "\n".join(f"<tool_call>\n{c.to_json()}\n</tool_call>" for c in calls)


def gold_response(task: Task) -> str:
    calls = gold_calls(task)
    return render_calls(calls) if calls else NO_CALL_RESPONSE


class BFCLEnv(TextEnv):
    """Single-turn; ``info`` adds ``tools``, ``calls_made``, ``invalid_calls`` and ``plan_length`` (expected calls)."""

    def __init__(self, category: str | Sequence[str] = "simple_python", *, data_dir: str | os.PathLike | None = None,
                 tools_in_prompt: bool = True, render_mode: str | None = None,
                 rubric: Rubric | Mapping[str, Any] | None = None, seed_base: int = 0):
        categories = list(CATEGORIES) if category == "all" else [category] if isinstance(category, str) else list(category)
        tasks, digest = load_tasks(categories, data_dir)
        # seed_base: a fixed data set has no other stream, so another value is the same tasks in a seeded order
        # (the trainer's held-out "first n tasks" become a seeded sample; rlvr_envs.splits)
        source = seeded_source(tasks, f"bfcl:{'+'.join(categories)}", digest, seed_base)
        super().__init__(source, score_bfcl,
                         max_response_chars=32_768, verifier_name="BFCL AST match", gold_formatter=gold_response,
                         render_mode=render_mode, rubric=rubric)
        self.categories = tuple(categories)
        self.tools_in_prompt = bool(tools_in_prompt)

    def messages_for(self, task: Task) -> list[Message]:
        system = [m["content"] for m in task.messages if m["role"] == "system"]
        rest = [dict(m) for m in task.messages if m["role"] != "system"]
        tools = [tool_schema(f) for f in task.metadata["functions"]]
        prompt = tools_system_prompt(tools, "\n\n".join([PREAMBLE, *system])) if self.tools_in_prompt else \
            "\n\n".join([PREAMBLE, *system])
        return [{"role": "system", "content": prompt}, *rest]

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        obs, info = super().reset(seed=seed, options=options)
        assert self._task is not None
        info["tools"] = [tool_schema(f) for f in self._task.metadata["functions"]]
        info["category"] = self._task.metadata["category"]
        return obs, info

    def extra_info(self, task: Task, response: str) -> dict[str, Any]:
        """Call counts for the step's info (a rubric's ``tool_precision`` reads them)."""
        parsed = parse_tool_calls(response)
        return {"calls_made": parsed.attempted, "invalid_calls": len(parsed.errors),
                "plan_length": len(task.metadata["ground_truth"]), "category": task.metadata["category"]}


def make_env(**kwargs: Any) -> BFCLEnv:
    return BFCLEnv(**kwargs)
