"""A toy text env and deterministic fake agents for the harness and leaderboard tests (no data, no model).

Imported by the tests and by their subprocesses (``PYTHONPATH=tests``); registers ``rlvrtest/Toy-v0``.
"""

from __future__ import annotations

import re
import time

import gymnasium as gym

from rlvr_envs.core import ListSource, Task, TextEnv, Verdict
from rlvr_envs.extract import extract_answer

TOY_ID = "rlvrtest/Toy-v0"
SUBJECTS = ("algebra", "geometry", "counting")


def exact_scorer(task: Task, response: str) -> Verdict:
    answer, _ = extract_answer(response)
    ok = answer is not None and answer.strip() == task.answer
    return Verdict(correct=ok, reward=float(ok), parsed=answer, format_ok=answer is not None)


def make_toy_env(n_tasks: int = 12) -> TextEnv:
    tasks = [Task(id=f"toy-{i}", question=f"What is {i} + {2 * i + 1}?", answer=str(3 * i + 1),
                  metadata={"subject": SUBJECTS[i % 3], "level": 1 + i % 2}) for i in range(n_tasks)]
    return TextEnv(ListSource(tasks, "toy-add"), exact_scorer, verifier_name="exact")


if TOY_ID not in gym.registry:
    gym.register(TOY_ID, entry_point=make_toy_env)


def toy_answer(question: str) -> int:
    a, b = map(int, re.findall(r"-?\d+", question)[:2])
    return a + b


class SeededAgent:
    """Deterministic given each sample's seed: right on even tasks unless seed % 4 == 0, wrong on odd tasks.

    The response length depends on the seed too, so lengths, maj@k and pass@k all see per-sample variation.
    ``sleep`` slows act() down (kill tests); ``interrupt_after`` raises KeyboardInterrupt on that call (Ctrl-C tests).
    """

    def __init__(self, report_tokens: bool = True, sleep: float = 0.0, interrupt_after: int | None = None):
        self.report_tokens = report_tokens
        self.sleep = sleep
        self.interrupt_after = interrupt_after
        self.calls = 0
        self.last_token_counts: list[int] | None = None

    def act(self, observations: list[str], infos: list[dict]) -> list[str]:
        self.calls += 1
        if self.interrupt_after is not None and self.calls > self.interrupt_after:
            raise KeyboardInterrupt
        if self.sleep:
            time.sleep(self.sleep)
        out = []
        for obs, info in zip(observations, infos):
            seed = info["seed"]
            answer = toy_answer(obs)
            if info["task_index"] % 2 == 1 or seed % 4 == 0:
                answer += 1 + seed % 2  # two different wrong answers, so majority votes vary
            filler = " ".join(["step"] * (seed % 7))
            out.append(f"{filler} The final answer is \\boxed{{{answer}}}")
        self.last_token_counts = [len(r.split()) + 3 for r in out] if self.report_tokens else None
        return out

    def describe(self) -> dict:
        return {"model": "seeded-fake", "weights_hash": "0" * 16, "n_params": 1000, "sampling": {"temperature": 1.0}}


class GoldAgent:
    """Answers every task with the env's own gold response (accuracy must be 1)."""

    def __init__(self, env_id: str = TOY_ID, **env_kwargs):
        self.env = gym.make(env_id, **env_kwargs).unwrapped

    def act(self, observations: list[str], infos: list[dict]) -> list[str]:
        return [self.env.gold_response(self.env.source.task(info["task_index"])) for info in infos]

    def describe(self) -> dict:
        return {"model": "gold"}


MULTI_ID = "rlvrtest/ToyHint-v0"


class HintEnv(gym.Env):
    """Multi-turn toy: a turn containing ``HINT`` gets a hint back; any other turn is the final answer. Three turns
    without an answer truncate the episode. No ``score`` method: the leaderboard re-verifies by replaying turns."""

    metadata = {"render_modes": []}

    def __init__(self, n_tasks: int = 8, max_turns: int = 3):
        from rlvr_envs.spaces import TextSpace

        self.source = make_toy_env(n_tasks).source
        self.max_turns = max_turns
        self.observation_space = TextSpace(1000)
        self.action_space = TextSpace(1000)
        self._task = None

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        index = int((options or {}).get("index", self.np_random.integers(len(self.source))))
        self._task, self._turn = self.source.task(index), 0
        return self._task.question, {"task_id": self._task.id, "index": index, "turn": 0,
                                     "messages": [{"role": "user", "content": self._task.question}]}

    def step(self, action):
        self._turn += 1
        info = {"task_id": self._task.id, "turn": self._turn}
        if "HINT" in action:
            truncated = self._turn >= self.max_turns
            info.update(correct=False, parsed_answer=None, format_ok=False)
            return f"{self._task.question} (hint: it ends in {self._task.answer[-1]})", 0.0, False, truncated, info
        verdict = exact_scorer(self._task, action)
        info.update(correct=verdict.correct, parsed_answer=verdict.parsed, format_ok=verdict.format_ok,
                    answer=self._task.answer)
        return "", verdict.reward, True, False, info


if MULTI_ID not in gym.registry:
    gym.register(MULTI_ID, entry_point=HintEnv)


class HintAgent(SeededAgent):
    """Asks for a hint first (on tasks divisible by 3 it keeps asking and runs out of turns), then answers."""

    def act(self, observations: list[str], infos: list[dict]) -> list[str]:
        answers = super().act(observations, infos)
        out = []
        for a, info in zip(answers, infos):
            hints = 3 if info["task_index"] % 3 == 0 else 1
            out.append(f"HINT please (seed {info['seed']})" if info["turn_index"] < hints else a)
        return out
