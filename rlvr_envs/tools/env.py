"""``rlvr/ToolUse-v0``: multi-step tool use over a stateful SQLite sandbox with state-grounded queries.

Each task index ``i`` deterministically yields a sandbox (shop / calendar / file store, from a seed derived from ``i``)
and a query synthesized from that sandbox's rows, with its minimal ground-truth plan (1-4 calls) checked to execute.

Reward (outcome with a precision term, not recall): 0 unless the final database state equals the state the
ground-truth plan produces *and*, for questions, the final answer equals the ground-truth answer; otherwise
``min(1, plan_length / calls_made)``, so every call beyond the minimal plan (redundant, invalid or failing) lowers it.
Knobs: ``min_steps``/``max_steps`` (plan length), ``services`` (which services queries use), ``distractor_tools``
(extra tools from other services exposed in the prompt), ``seed_base`` (another stream of tasks, e.g. the trainer's
held-out ``seed_base=1``; 0 is the original stream, ``rlvr_envs.splits``).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rlvr_envs.core import UNVERIFIABLE, Message, Task, TaskSource, Verdict, verdict_status
from rlvr_envs.rubric import Rubric
from rlvr_envs.splits import check_seed_base
from rlvr_envs.tools.base import ToolEnv, tools_system_prompt
from rlvr_envs.tools.sandbox import CallResult, Sandbox
from rlvr_envs.tools.services import SERVICES, TOOLS
from rlvr_envs.tools.synthesis import eligible_templates, synthesize
from rlvr_envs.verifiers.calls import ToolCall

SYNTHESIS_VERSION = 1  # bump (with the env version) whenever templates or data generation change
DEFAULT_SIZE = 1_000_000

PREAMBLE = "You are an assistant that operates a small business's systems through tools."
EPILOGUE = """Tool results come back inside <tool_response></tool_response> tags. Use as few calls as you need.
When the request is done, reply without any tool call. If the user asked a question, give the final answer inside
<answer></answer> tags (just the value, e.g. <answer>42</answer>)."""

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)


class ToolUseSource(TaskSource):
    """Procedural tasks: ``task(i)`` is a function of (seed, knobs, i) alone."""

    def __init__(self, *, size: int = DEFAULT_SIZE, seed: int = 0, min_steps: int = 1, max_steps: int = 4,
                 services: Sequence[str] = SERVICES, distractor_tools: int = 2, seed_base: int = 0):
        unknown = set(services) - set(SERVICES)
        if unknown:
            raise ValueError(f"unknown services {sorted(unknown)}; choose from {list(SERVICES)}")
        if size < 1 or distractor_tools < 0:
            raise ValueError("size must be >= 1 and distractor_tools >= 0")
        self.size, self.seed, self.seed_base = int(size), int(seed), check_seed_base(seed_base)
        self.services = tuple(s for s in SERVICES if s in services)
        self.min_steps, self.max_steps, self.distractor_tools = int(min_steps), int(max_steps), int(distractor_tools)
        self.templates = eligible_templates(self.min_steps, self.max_steps, self.services)
        split = f",seed_base={self.seed_base}" if self.seed_base else ""  # seed_base=0 keeps the original name
        self.name = (f"tooluse(seed={self.seed}{split},steps={self.min_steps}-{self.max_steps},"
                     f"services={'+'.join(self.services)})")
        self._cache: OrderedDict[int, Task] = OrderedDict()

    def __len__(self) -> int:
        return self.size

    def task(self, index: int) -> Task:
        if not 0 <= index < self.size:
            raise IndexError(f"{self.name}: index {index} out of range [0, {self.size})")
        if index in self._cache:
            self._cache.move_to_end(index)
            return self._cache[index]
        # seed_base=0 keeps the original key, so existing tasks and results are unchanged
        key = [self.seed, index, SYNTHESIS_VERSION] + ([self.seed_base] if self.seed_base else [])
        rng = np.random.default_rng(key)
        db_seed = int(rng.integers(2**31))
        sandbox = Sandbox.generate(db_seed)
        try:
            ep = synthesize(sandbox, rng, self.templates)
        finally:
            sandbox.close()
        needed = [n for n, t in TOOLS.items() if t.service in ep.services]
        others = [n for n in TOOLS if n not in needed]
        k = min(self.distractor_tools, len(others))
        extra = {others[i] for i in rng.choice(len(others), size=k, replace=False)} if k else set()
        exposed = tuple(n for n in TOOLS if n in needed or n in extra)
        task = Task(id=f"tooluse-{index}", question=ep.query, answer=ep.answer or "",
                    metadata={"db_seed": db_seed, "template": ep.template, "services": ep.services,
                              "plan": tuple(c.to_json() for c in ep.plan), "plan_length": len(ep.plan),
                              "answer_kind": ep.answer_kind, "gold_digest": ep.gold_digest, "tools": exposed})
        self._cache[index] = task
        if len(self._cache) > 4096:
            self._cache.popitem(last=False)
        return task

    def index_of(self, task_id: str) -> int:
        m = re.fullmatch(r"tooluse-(\d+)", task_id)
        if not m or int(m.group(1)) >= self.size:
            raise KeyError(f"{self.name}: unknown task id {task_id!r}")
        return int(m.group(1))

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(f"{self.name}|size={self.size}|distractors={self.distractor_tools}|"
                              f"v{SYNTHESIS_VERSION}".encode()).hexdigest()


def plan_calls(task: Task) -> list[ToolCall]:
    return [ToolCall(d["name"], d["arguments"]) for d in map(json.loads, task.metadata["plan"])]


def answer_matches(expected: str, kind: str, text: str) -> tuple[bool, str | None, bool]:
    """(correct, parsed answer, format_ok). The answer is the last <answer>...</answer>, else the whole final text."""
    found = _ANSWER.findall(text)
    candidate = (found[-1] if found else text).strip()
    if kind == "number":
        cleaned = candidate.replace("$", "").replace(",", "").strip().rstrip(".")
        try:
            return abs(float(cleaned) - float(expected)) < 1e-6, candidate, bool(found)
        except ValueError:
            return False, candidate, bool(found)
    return candidate.rstrip(".").strip().lower() == expected.strip().lower(), candidate, bool(found)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except (TypeError, ValueError):
        return False
    return True


class ToolUseEnv(ToolEnv):
    def __init__(self, source: ToolUseSource | None = None, *, seed: int = 0, size: int = DEFAULT_SIZE,
                 min_steps: int = 1, max_steps: int = 4, services: Sequence[str] = SERVICES,
                 distractor_tools: int = 2, precision_penalty: bool = True, tools_in_prompt: bool = True,
                 max_turns: int = 10, max_calls: int = 16, max_calls_per_turn: int = 8, render_mode: str | None = None,
                 max_invalid_streak: int | None = None, rubric: Rubric | Mapping[str, Any] | None = None,
                 seed_base: int = 0):
        source = source or ToolUseSource(size=size, seed=seed, min_steps=min_steps, max_steps=max_steps,
                                         services=services, distractor_tools=distractor_tools, seed_base=seed_base)
        super().__init__(source, max_turns=max_turns, max_calls=max_calls, max_calls_per_turn=max_calls_per_turn,
                         verifier_name="sandbox final state + answer, precision-penalized", render_mode=render_mode,
                         max_invalid_streak=max_invalid_streak, rubric=rubric)
        self.precision_penalty = bool(precision_penalty)
        self.tools_in_prompt = bool(tools_in_prompt)
        self.sandbox: Sandbox | None = None
        self._allowed: tuple[str, ...] = ()
        self._plan_left: list[str] = []  # the gold plan's calls not yet made (canonical JSON), for plan recall

    # -- ToolEnv hooks -----------------------------------------------------------------------------------------------
    def open_episode(self, task: Task) -> list[Message]:
        if self.sandbox is not None:
            self.sandbox.close()
        self.sandbox = Sandbox.generate(task.metadata["db_seed"])
        self._allowed = tuple(task.metadata["tools"])
        self._plan_left = [c.to_json(sort_keys=True) for c in plan_calls(task)]
        messages: list[Message] = []
        if self.tools_in_prompt:
            messages.append({"role": "system", "content": tools_system_prompt(self.episode_tools(), PREAMBLE, EPILOGUE)})
        else:
            messages.append({"role": "system", "content": f"{PREAMBLE}\n\n{EPILOGUE}"})
        messages.append({"role": "user", "content": task.question})
        return messages

    def episode_tools(self) -> list[dict[str, Any]]:
        return [TOOLS[n].schema() for n in self._allowed]

    def run_call(self, call: ToolCall) -> CallResult:
        assert self.sandbox is not None
        result = self.sandbox.call(call, self._allowed)
        key = call.to_json(sort_keys=True)
        if result.status == "ok" and key in self._plan_left:  # each gold call counts once, however often repeated
            self._plan_left.remove(key)
        return result

    def _info(self, task: Task, truncated_response: bool, start: float) -> dict[str, Any]:
        info = super()._info(task, truncated_response, start)
        # plan recall: the share of the gold plan's calls the episode made successfully, extra calls not counted
        # against it (what the rubric's ``tool_recall`` term pays)
        info["plan_calls_hit"] = self.plan_length(task) - len(self._plan_left)
        return info

    def finish(self, task: Task, final_text: str, counts: Mapping[str, int]) -> tuple[Verdict, dict[str, Any]]:
        assert self.sandbox is not None
        state_ok = self.sandbox.digest() == task.metadata["gold_digest"]
        kind = task.metadata["answer_kind"]
        precision = min(1.0, task.metadata["plan_length"] / max(1, counts["calls_made"]))
        if kind == "none":
            answer_ok, parsed, format_ok = True, final_text.strip()[:200] or None, True
        else:
            answer_ok, parsed, format_ok = answer_matches(task.answer, kind, final_text)
        if state_ok and kind == "number" and not _is_number(task.answer):
            # the answer decides, and the task has no number to compare it with; a wrong state would settle it
            verdict = Verdict.could_not_verify(f"the task's expected answer {task.answer!r:.80} is not a number",
                                               parsed=parsed, format_ok=format_ok)
            return verdict, {"state_correct": state_ok, "answer_correct": None, "precision": precision,
                             "answer": task.answer or None}
        correct = state_ok and answer_ok
        reward = (precision if self.precision_penalty else 1.0) if correct else 0.0
        error = None if correct else ("final state differs from the ground truth" if not state_ok else "wrong answer")
        verdict = Verdict(correct=correct, reward=reward, parsed=parsed, error=error, format_ok=format_ok)
        return verdict, {"state_correct": state_ok, "answer_correct": answer_ok, "precision": precision,
                         "answer": task.answer or None}

    def close(self) -> None:
        if self.sandbox is not None:
            self.sandbox.close()
            self.sandbox = None

    # -- gold / oracle / re-verification ---------------------------------------------------------------------------
    def gold_turns(self, task: Task) -> list[str]:
        """The scripted oracle's assistant turns: one plan call per turn, then the final answer."""
        turns = [f"<tool_call>\n{call.to_json()}\n</tool_call>" for call in plan_calls(task)]
        turns.append(f"<answer>{task.answer}</answer>" if task.metadata["answer_kind"] != "none" else "Done.")
        return turns

    def gold_response(self, task: Task, messages: Sequence[Mapping[str, str]] | None = None) -> str:
        """The oracle's next turn given the chat so far (``info["messages"]``; default: the current episode's)."""
        if messages is None:
            messages = self._messages if self._task is not None and self._task.id == task.id else []
        done = sum(1 for m in messages if m.get("role") == "assistant")
        turns = self.gold_turns(task)
        return turns[min(done, len(turns) - 1)]

    def score(self, task: Task, response: str | Sequence[str]) -> Verdict:
        """Re-verify an episode from its assistant turns alone (the sandbox is rebuilt from the task's seed)."""
        turns = [response] if isinstance(response, str) else list(response)
        replay = ToolUseEnv(self.source, precision_penalty=self.precision_penalty, max_turns=self.max_turns,
                            max_calls=self.max_calls, max_calls_per_turn=self.max_calls_per_turn,
                            max_invalid_streak=self.max_invalid_streak)
        try:
            replay.reset(options={"task_id": task.id})
            reward, info = 0.0, {"correct": False, "parsed_answer": None, "format_ok": False, "error": "no final answer"}
            for turn in turns:
                _, reward, terminated, truncated, info = replay.step(turn)
                if terminated or truncated:
                    break
            else:
                reward, info = 0.0, {**info, "correct": False, "error": "episode did not end"}
            correct = bool(info["correct"])
            return Verdict(correct=correct, reward=float(reward), parsed=info.get("parsed_answer"),
                           error=info.get("error"), format_ok=bool(info.get("format_ok")),
                           unverifiable=verdict_status(correct, info.get("verdict")) == UNVERIFIABLE)
        finally:
            replay.close()


class OracleAgent:
    """A scripted policy that follows each task's ground-truth plan (``act(observations, infos)`` interface)."""

    def __init__(self, env: Any):
        self.env = env.unwrapped if hasattr(env, "unwrapped") else env

    def act(self, observations: list[str], infos: list[dict[str, Any]]) -> list[str]:
        out = []
        for info in infos:
            task = self.env.source.task(self.env.source.index_of(info["task_id"]))
            out.append(self.env.gold_response(task, info["messages"]))
        return out

    def describe(self) -> dict[str, Any]:
        return {"name": "tooluse-oracle", "kind": "scripted ground-truth plan"}


def make_env(**kwargs: Any) -> ToolUseEnv:
    return ToolUseEnv(**kwargs)
