"""Tasks, verdicts, task sources and the single-turn text environment.

A ``TextEnv`` is one prompt and one response: ``reset`` picks a task (by seed, ``options={"task_id": ...}`` or
``options={"index": i}``, so every rollout of a GRPO group can see the same task), ``step(response)`` scores it with
the task family's scorer and terminates.
"""

from __future__ import annotations

import abc
import hashlib
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

from rlvr_envs.rubric import Rubric, build_rubric
from rlvr_envs.spaces import DEFAULT_MAX_CHARS, TextSpace

Message = dict[str, str]


class WallTime(float):
    """A duration in ms. Two ``WallTime`` values compare equal: timing is measurement, not environment state, so
    Gymnasium's determinism checks (same seed + action -> same info) must not see it. Against plain numbers it is
    an ordinary float."""

    def __eq__(self, other: object) -> bool:
        return True if isinstance(other, WallTime) else float.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    __hash__ = float.__hash__


@dataclass(frozen=True)
class Task:
    """One problem: ``question`` is the bare problem text; ``messages`` the chat the model sees (no system turn)."""

    id: str
    question: str
    answer: str
    messages: tuple[Message, ...] = ()
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.messages:
            object.__setattr__(self, "messages", ({"role": "user", "content": self.question},))


# The three outcomes of scoring: right, wrong, or the verifier could not decide.
CORRECT, WRONG, UNVERIFIABLE = "correct", "wrong", "unverifiable"
VERDICT_STATUSES = (CORRECT, WRONG, UNVERIFIABLE)


def verdict_status(correct: bool, reported: Any = None) -> str:
    """The status of an outcome from its ``correct`` flag and a reported status (``info["verdict"]``, a record's
    ``status``; None for files and envs from before statuses existed). Only "unverifiable" is taken from the report,
    and only for an answer that is not correct: "correct" vs "wrong" always follows ``correct``, so a stale or
    wrapped status can never contradict the flag that accuracy is computed from."""
    if correct:
        return CORRECT
    return UNVERIFIABLE if reported == UNVERIFIABLE else WRONG


@dataclass(frozen=True)
class Verdict:
    """The outcome of scoring one response. ``reward`` excludes the env's optional format bonus.

    ``unverifiable=True`` says the verifier could not decide (a timeout, a crashed worker, a gold answer it cannot
    read): such a response is not correct and earns 0, but it is reported apart from a wrong answer, whose verdict
    is settled. A model output that does not parse is *wrong*, not unverifiable. ``status`` names the three cases."""

    correct: bool
    reward: float
    parsed: str | None = None
    error: str | None = None
    format_ok: bool = False
    unverifiable: bool = False

    def __post_init__(self) -> None:
        if self.unverifiable and self.correct:
            raise ValueError("a Verdict cannot be both correct and unverifiable")
        if self.unverifiable and self.reward != 0:
            raise ValueError(f"an unverifiable Verdict must have reward 0, got {self.reward!r}")

    @property
    def status(self) -> str:
        """``"correct"``, ``"wrong"`` or ``"unverifiable"``."""
        return UNVERIFIABLE if self.unverifiable else CORRECT if self.correct else WRONG

    @classmethod
    def failed(cls, error: str, parsed: str | None = None, format_ok: bool = False) -> Verdict:
        """A wrong answer with the reason (no final answer, a malformed one, a wrong value)."""
        return cls(correct=False, reward=0.0, parsed=parsed, error=error, format_ok=format_ok)

    @classmethod
    def could_not_verify(cls, error: str, parsed: str | None = None, format_ok: bool = False) -> Verdict:
        """An unverifiable outcome: the verifier, not the response, failed (``error`` says how)."""
        return cls(correct=False, reward=0.0, parsed=parsed, error=error, format_ok=format_ok, unverifiable=True)


Scorer = Callable[[Task, str], Verdict]


class TaskSource(abc.ABC):
    """An indexable, finite-or-huge collection of tasks. Procedural sources generate ``task(i)`` from ``i`` alone."""

    name: str = "tasks"

    @abc.abstractmethod
    def __len__(self) -> int: ...

    @abc.abstractmethod
    def task(self, index: int) -> Task: ...

    def index_of(self, task_id: str) -> int:
        raise KeyError(f"{self.name}: unknown task id {task_id!r}")

    @property
    def fingerprint(self) -> str:
        """A content hash identifying exactly which tasks this source yields (goes into results provenance)."""
        return hashlib.sha256(self.name.encode()).hexdigest()


class ListSource(TaskSource):
    """Tasks held in memory (loaded from a data file)."""

    def __init__(self, tasks: Sequence[Task], name: str, fingerprint: str | None = None):
        if not tasks:
            raise ValueError(f"{name}: no tasks (check the filters and the data file)")
        self._tasks = list(tasks)
        self.name = name
        self._ids: dict[str, int] | None = None
        self._fingerprint = fingerprint

    def __len__(self) -> int:
        return len(self._tasks)

    def task(self, index: int) -> Task:
        if not 0 <= index < len(self._tasks):
            raise IndexError(f"{self.name}: index {index} out of range [0, {len(self._tasks)})")
        return self._tasks[index]

    def index_of(self, task_id: str) -> int:
        if self._ids is None:
            self._ids = {t.id: i for i, t in enumerate(self._tasks)}
        try:
            return self._ids[task_id]
        except KeyError:
            raise KeyError(f"{self.name}: unknown task id {task_id!r}") from None

    @property
    def fingerprint(self) -> str:
        if self._fingerprint is None:
            h = hashlib.sha256()
            for t in self._tasks:
                h.update(json.dumps([t.id, t.question, t.answer], ensure_ascii=False).encode())
            self._fingerprint = h.hexdigest()
        return self._fingerprint


def select_task_index(source: TaskSource, options: Mapping[str, Any] | None, rng: Any) -> int:
    """The task an episode gets: ``options["task_id"]``, ``options["index"]``, or a draw from the env's ``np_random``.

    Shared by every env (single- and multi-turn) so all of them accept the same reset options."""
    options = options or {}
    if "task_id" in options and "index" in options:
        raise ValueError("pass either options['task_id'] or options['index'], not both")
    if "task_id" in options:
        return source.index_of(str(options["task_id"]))
    if "index" in options:
        index = int(options["index"])
        if not 0 <= index < len(source):
            raise IndexError(f"index {index} out of range [0, {len(source)})")
        return index
    return int(rng.integers(len(source)))


def step_single_turn(env: gym.Env, action: str) -> tuple[float, dict[str, Any]]:
    """``env.step(action)`` for callers that score one response per episode (the GRPO trainer, the TRL reward function):
    ``(reward, info)``. A multi-turn env (search, tool use) answers a tool call with reward 0 and an open episode;
    taking that 0 as the response's reward would silently train on zeros, so an episode left open is an error."""
    _, reward, terminated, truncated, info = env.step(action)
    if not (terminated or truncated):
        name = getattr(getattr(env, "spec", None), "id", None) or type(env.unwrapped).__name__
        raise NotImplementedError(
            f"{name}: the episode is still open after one response (a multi-turn env took it as a tool or search "
            f"call); multi-turn training is not supported by one-response scoring: play whole episodes "
            f"(rlvr_envs.harness.evaluate.run_episodes; the GRPO trainer does for multi-turn envs)")
    return float(reward), info


def render_messages(messages: Sequence[Message]) -> str:
    """A plain rendering of a chat for the observation; policies apply their own chat template to ``info['messages']``."""
    if len(messages) == 1 and messages[0]["role"] == "user":
        return messages[0]["content"]
    return "\n\n".join(f"{m['role']}: {m['content']}" for m in messages)


class TextEnv(gym.Env[str, str]):
    """Single-turn environment: observation = rendered prompt, action = response text, reward from the scorer."""

    metadata = {"render_modes": ["ansi"]}

    def __init__(
        self,
        source: TaskSource,
        scorer: Scorer,
        *,
        system_prompt: str | None = None,
        prompt_template: str | None = None,
        format_reward: float = 0.0,
        rubric: Rubric | Mapping[str, Any] | None = None,
        max_prompt_chars: int = DEFAULT_MAX_CHARS,
        max_response_chars: int = DEFAULT_MAX_CHARS,
        verifier_name: str = "",
        gold_formatter: Callable[[Task], str] | None = None,
        answer_equivalence: Callable[[str, str], bool] | None = None,
        render_mode: str | None = None,
    ):
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']}, got {render_mode!r}")
        if prompt_template is not None and "{question}" not in prompt_template:
            raise ValueError("prompt_template must contain '{question}'")
        self.source = source
        self.scorer = scorer
        self.system_prompt = system_prompt
        self.prompt_template = prompt_template
        self.format_reward = float(format_reward)
        self.rubric = build_rubric(rubric, format_reward=format_reward)  # format_reward: the default rubric's format term
        self.max_response_chars = int(max_response_chars)
        self.verifier_name = verifier_name
        self._gold_formatter = gold_formatter
        self._answer_equivalence = answer_equivalence
        self.render_mode = render_mode
        self.observation_space = TextSpace(max_prompt_chars)
        self.action_space = TextSpace(max_response_chars)
        self._task: Task | None = None
        self._last: tuple[str, dict[str, Any]] | None = None

    def messages_for(self, task: Task) -> list[Message]:
        messages = [dict(m) for m in task.messages]
        if self.prompt_template is not None:
            messages = [{"role": "user", "content": self.prompt_template.format(question=task.question)}]
        if self.system_prompt:
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return messages

    @property
    def task(self) -> Task | None:
        return self._task

    # -- gymnasium API --------------------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        index = select_task_index(self.source, options, self.np_random)
        self._task = self.source.task(index)
        messages = self.messages_for(self._task)
        return render_messages(messages), {"messages": messages, "task_id": self._task.id, "index": index}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._task is None:
            raise gym.error.ResetNeeded("call reset() before step() (single-turn env: one step per episode)")
        if not isinstance(action, str):
            raise TypeError(f"action must be the response text (str), got {type(action).__name__}")
        task, self._task = self._task, None
        truncated_response = len(action) > self.max_response_chars
        response = action[: self.max_response_chars]
        start = time.perf_counter()
        try:
            verdict = self.scorer(task, response)
        except Exception as exc:  # a scorer bug must not kill a long run; the record keeps the error
            # the scorer, not the response, failed: nobody decided whether the answer is right
            verdict = Verdict.could_not_verify(f"scorer error: {type(exc).__name__}: {exc}")
        verify_ms = (time.perf_counter() - start) * 1000.0
        info = {
            "task_id": task.id,
            "correct": bool(verdict.correct),
            "verdict": verdict.status,
            "parsed_answer": verdict.parsed,
            "verify_ms": WallTime(verify_ms),
            "format_ok": bool(verdict.format_ok),
            "truncated_response": truncated_response,
            "error": verdict.error,
            "answer": task.answer,
            **self.extra_info(task, response),
        }
        reward, info["rubric"] = self.rubric.score(verdict, response, info)
        self._last = (response, info)
        return "", reward, True, False, info

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        if self._last is None:
            return ""
        response, info = self._last
        return f"[{info['task_id']}] correct={info['correct']} parsed={info['parsed_answer']!r}\n{response}"

    def extra_info(self, task: Task, response: str) -> dict[str, Any]:
        """Subclass hook: more ``info`` keys for a step, known before the rubric scores it (e.g. call counts)."""
        return {}

    # -- helpers for agents and tests -----------------------------------------------------------------------------
    def score(self, task: Task, response: str) -> Verdict:
        """Score a response against a task without an episode (used by the harness to re-verify records)."""
        return self.scorer(task, response[: self.max_response_chars])

    def same_answer(self, a: str, b: str) -> bool:
        """Whether two parsed answers are one answer under this env's verifier (maj@k votes with this): the
        ``answer_equivalence`` the env was built with, else equal strings once surrounding whitespace is stripped."""
        if self._answer_equivalence is not None:
            return bool(self._answer_equivalence(a, b))
        return a.strip() == b.strip()

    def gold_response(self, task: Task) -> str:
        """The reference answer written as a well-formatted response (for gold-agent sanity sweeps)."""
        if self._gold_formatter is not None:
            return self._gold_formatter(task)
        return f"The final answer is $\\boxed{{{task.answer}}}$."
