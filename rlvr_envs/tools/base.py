"""``ToolEnv``: the multi-turn counterpart of ``TextEnv`` (core.py), for environments whose actions call tools.

Conventions shared with ``TextEnv``: ``reset(seed=, options={"task_id": ...} | {"index": i})`` returns the rendered
prompt and ``info`` with ``messages`` (the chat so far) and ``task_id``; actions are the model's response text.
Each step parses the response's tool calls (``rlvr_envs.verifiers.calls``): if it makes any, the env runs them and the
observation is the tool results (``info["messages"]`` grows by the assistant turn and one ``tool`` message per call);
a response without calls is the final answer and ends the episode with the task's reward. Turn and call caps end
runaway episodes (``truncated=True``, reward 0). ``info`` always reports ``turn``, ``calls_made``, ``invalid_calls``,
``failed_calls`` and ``plan_length``; ``verdict`` is the outcome ("correct", "wrong", "unverifiable") once the episode
ends (a capped episode is "wrong") and None while it is still open.

This base lives in ``rlvr_envs/tools`` rather than ``core.py`` because core.py belongs to the lead; it depends only on
core contracts and could move there unchanged.
"""

from __future__ import annotations

import abc
import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym

from rlvr_envs.core import WRONG, Message, Task, TaskSource, Verdict, WallTime, render_messages, select_task_index
from rlvr_envs.rubric import Rubric, build_rubric
from rlvr_envs.spaces import DEFAULT_MAX_CHARS, TextSpace
from rlvr_envs.tools.sandbox import CallResult, error_result
from rlvr_envs.verifiers.calls import ParsedCalls, ToolCall, parse_tool_calls

TOOLS_PROMPT = """# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{tools}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>"""


def tools_system_prompt(tools: Sequence[Mapping[str, Any]], preamble: str = "", epilogue: str = "") -> str:
    """The Hermes / Qwen2.5 tool prompt (what transformers' chat templates render for ``tools=``), as plain text so
    that any chat template, even one without tool support, shows the model its tools."""
    listing = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    parts = [preamble.strip(), TOOLS_PROMPT.format(tools=listing), epilogue.strip()]
    return "\n\n".join(p for p in parts if p)


class ToolEnv(gym.Env[str, str], abc.ABC):
    """Multi-turn tool-use environment; subclasses supply the per-episode world and the outcome check."""

    metadata = {"render_modes": ["ansi"]}

    def __init__(self, source: TaskSource, *, max_turns: int = 10, max_calls: int = 16, max_calls_per_turn: int = 8,
                 max_prompt_chars: int = DEFAULT_MAX_CHARS, max_response_chars: int = 16_384,
                 verifier_name: str = "", render_mode: str | None = None, max_invalid_streak: int | None = None,
                 rubric: Rubric | Mapping[str, Any] | None = None):
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']}, got {render_mode!r}")
        if min(max_turns, max_calls, max_calls_per_turn) < 1:
            raise ValueError("max_turns, max_calls and max_calls_per_turn must be >= 1")
        self.source = source
        self.max_turns, self.max_calls, self.max_calls_per_turn = int(max_turns), int(max_calls), int(max_calls_per_turn)
        # consecutive turns whose calls were all invalid before the episode is cut (None: never); a training guard
        # against a policy that loops on malformed calls
        if max_invalid_streak is not None and int(max_invalid_streak) < 1:
            raise ValueError(f"max_invalid_streak must be >= 1 or None, got {max_invalid_streak!r}")
        self.max_invalid_streak = None if max_invalid_streak is None else int(max_invalid_streak)
        self.max_response_chars = int(max_response_chars)
        self.verifier_name = verifier_name
        self.rubric = build_rubric(rubric)  # scores the episode's end (rlvr_envs.rubric); default: the verdict's reward
        self.render_mode = render_mode
        self.observation_space = TextSpace(max_prompt_chars)
        self.action_space = TextSpace(max_response_chars)
        self._task: Task | None = None
        self._messages: list[Message] = []
        self._counts: dict[str, int] = {}
        self._last_info: dict[str, Any] = {}

    # -- subclass hooks ----------------------------------------------------------------------------------------------
    @abc.abstractmethod
    def open_episode(self, task: Task) -> list[Message]:
        """Build the episode's world for ``task``; return the opening chat (system + user)."""

    @abc.abstractmethod
    def run_call(self, call: ToolCall) -> CallResult:
        """Execute one parsed call against the episode's world."""

    @abc.abstractmethod
    def finish(self, task: Task, final_text: str, counts: Mapping[str, int]) -> tuple[Verdict, dict[str, Any]]:
        """Score the episode once the model answers without a call; extra info keys go in the dict."""

    def plan_length(self, task: Task) -> int:
        return int(task.metadata.get("plan_length", 0))

    def episode_tools(self) -> list[dict[str, Any]]:
        """The current episode's tool schemas (OpenAI / transformers ``tools=`` form), reported as ``info["tools"]``."""
        return []

    @property
    def task(self) -> Task | None:
        """The current episode's task (None between episodes)."""
        return self._task

    def task_for(self, index: int) -> Task:
        return self.source.task(index)

    # -- gymnasium API -----------------------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        index = select_task_index(self.source, options, self.np_random)
        self._task = self.source.task(index)
        self._messages = self.open_episode(self._task)
        self._counts = {"turn": 0, "calls_made": 0, "invalid_calls": 0, "failed_calls": 0}
        self._invalid_streak = 0
        info = {"messages": [dict(m) for m in self._messages], "task_id": self._task.id, "index": index,
                **self._counts, "plan_length": self.plan_length(self._task), "tools": self.episode_tools()}
        self._last_info = info
        return render_messages(self._messages), info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._task is None:
            raise gym.error.ResetNeeded("call reset() before step() (the episode has ended)")
        if not isinstance(action, str):
            raise TypeError(f"action must be the response text (str), got {type(action).__name__}")
        task = self._task
        truncated_response = len(action) > self.max_response_chars
        response = action[: self.max_response_chars]
        self._counts["turn"] += 1
        self._messages.append({"role": "assistant", "content": response})
        parsed = parse_tool_calls(response)
        start = time.perf_counter()
        if parsed.attempted:
            results = self._run_calls(parsed)
            for r in results:
                self._messages.append({"role": "tool", "name": r.call.name if r.call else "error", "content": r.content})
            obs = "\n".join(f"<tool_response>\n{r.content}\n</tool_response>" for r in results)
            all_invalid = bool(results) and all(r.status == "invalid" for r in results)
            self._invalid_streak = self._invalid_streak + 1 if all_invalid else 0
            streak = self.max_invalid_streak is not None and self._invalid_streak >= self.max_invalid_streak
            capped = self._counts["turn"] >= self.max_turns or self._counts["calls_made"] >= self.max_calls
            error = (f"{self._invalid_streak} turns in a row of invalid calls" if streak
                     else "turn or call cap reached" if capped else None)
            capped = capped or streak
            info = self._info(task, truncated_response, start)
            info.update(tool_results=[r.status for r in results], final=False, correct=False, parsed_answer=None,
                        format_ok=True, error=error, invalid_streak=self._invalid_streak,
                        verdict=WRONG if capped else None)
            reward = 0.0
            if capped:  # the episode ends without an answer: the rubric scores it as a wrong one
                self._task = None
                reward, info["rubric"] = self.rubric.score(Verdict.failed(error or "capped"), self._model_text(), info)
            return obs, reward, False, capped, info
        verdict, extra = self.finish(task, parsed.text, self._counts)
        self._task = None
        info = self._info(task, truncated_response, start)
        info.update(final=True, correct=bool(verdict.correct), verdict=verdict.status, parsed_answer=verdict.parsed,
                    format_ok=bool(verdict.format_ok), error=verdict.error, **extra)
        reward, info["rubric"] = self.rubric.score(verdict, self._model_text(), info)
        return "", reward, True, False, info

    def _model_text(self) -> str:
        """All of the model's turns so far (what a rubric's length term measures)."""
        return "\n".join(m["content"] for m in self._messages if m["role"] == "assistant")

    def _run_calls(self, parsed: ParsedCalls) -> list[CallResult]:
        results = []
        for err in parsed.errors:
            self._counts["calls_made"] += 1
            self._counts["invalid_calls"] += 1
            results.append(error_result(None, "invalid", f"could not parse the tool call: {err}"))
        for i, call in enumerate(parsed.calls):
            if i >= self.max_calls_per_turn or self._counts["calls_made"] >= self.max_calls:
                self._counts["calls_made"] += 1
                self._counts["invalid_calls"] += 1
                results.append(error_result(call, "invalid", "call limit reached; this call was not run"))
                continue
            self._counts["calls_made"] += 1
            result = self.run_call(call)
            if result.status == "invalid":
                self._counts["invalid_calls"] += 1
            elif result.status == "failed":
                self._counts["failed_calls"] += 1
            results.append(result)
        return results

    def _info(self, task: Task, truncated_response: bool, start: float) -> dict[str, Any]:
        info = {"messages": [dict(m) for m in self._messages], "task_id": task.id, **self._counts,
                "plan_length": self.plan_length(task), "truncated_response": truncated_response,
                "verify_ms": WallTime((time.perf_counter() - start) * 1000.0)}
        self._last_info = info
        return info

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        return render_messages(self._last_info.get("messages", []))
