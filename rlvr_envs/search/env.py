"""The multi-turn search environment.

``reset`` shows the question; each ``step(turn)`` takes one model turn: a search returns an ``<information>`` block
(the observation, also appended to ``info["messages"]``), an answer ends the episode with its EM / F1 reward.
``info["trajectory"]`` is the whole response sequence so far (model turns and inserted blocks joined by blank lines,
Search-R1 style) and ``info["retrieved_spans"]`` the ``[start, end)`` character spans of env-inserted text in it, so
a trainer can mask retrieved text out of the loss. ``info["verdict"]`` is the outcome ("correct", "wrong",
"unverifiable") once the episode ends and None while it is open.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym

from rlvr_envs.core import Message, Task, TaskSource, Verdict, WallTime, render_messages, select_task_index
from rlvr_envs.rubric import Rubric, build_rubric
from rlvr_envs.search.corpus import Corpus
from rlvr_envs.search.protocol import SEARCH_TOOL, format_information, format_notice, parse_action
from rlvr_envs.search.retrievers import Retriever, make_retriever
from rlvr_envs.spaces import DEFAULT_MAX_CHARS, TextSpace
from rlvr_envs.verifiers import qa

DEFAULT_TEMPLATE = (
    "Answer the question using the search engine. To search, write <search>your query</search> (or the tool call "
    '<tool_call>{{"name": "search", "arguments": {{"query": "your query"}}}}</tool_call>); the top results come back '
    "between <information> and </information>. You may search up to {max_searches} times. When you know the answer, "
    "write it as a short phrase between <answer> and </answer>.\n\nQuestion: {question}"
)
SEP = "\n\n"


class SearchEnv(gym.Env[str, str]):
    """Multi-turn retrieval QA over a pinned corpus; reward = EM or token F1 of the final answer vs. the gold only."""

    metadata = {"render_modes": ["ansi"]}

    def __init__(self, source: TaskSource, corpus: Corpus, *, retriever: str | Retriever = "bm25", top_k: int = 3,
                 max_turns: int = 4, max_searches: int | None = None, reward: str = "em",
                 prompt_template: str | None = None, system_prompt: str | None = None, info_role: str = "user",
                 max_passage_chars: int = 600, cache_dir: str | os.PathLike | None = None,
                 max_response_chars: int = 1 << 16, render_mode: str | None = None,
                 rubric: Rubric | Mapping[str, Any] | None = None):
        if reward not in qa.METRICS:
            raise ValueError(f"reward must be one of {qa.METRICS}, got {reward!r}")
        if prompt_template is not None and "{question}" not in prompt_template:
            raise ValueError("prompt_template must contain '{question}'")
        if max_turns < 1 or top_k < 1:
            raise ValueError("max_turns and top_k must be >= 1")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']}, got {render_mode!r}")
        self.source = source
        self.corpus = corpus
        self._retriever_spec = retriever
        self._retriever: Retriever | None = retriever if isinstance(retriever, Retriever) else None
        self.cache_dir = cache_dir
        self.top_k = int(top_k)
        self.max_turns = int(max_turns)
        self.max_searches = int(max_searches) if max_searches is not None else max(self.max_turns - 1, 0)
        self.reward_metric = reward
        self.prompt_template = prompt_template or DEFAULT_TEMPLATE
        self.system_prompt = system_prompt
        self.info_role = info_role
        self.max_passage_chars = int(max_passage_chars)
        self.max_response_chars = int(max_response_chars)
        self.render_mode = render_mode
        self.verifier_name = f"qa-{reward}"
        self.rubric = build_rubric(rubric)  # scores the episode's end (rlvr_envs.rubric); default: the EM / F1 reward
        self.observation_space = TextSpace(DEFAULT_MAX_CHARS)
        self.action_space = TextSpace(DEFAULT_MAX_CHARS)
        self._task: Task | None = None
        self._done = True

    # -- retrieval ------------------------------------------------------------------------------------------------
    @property
    def retriever(self) -> Retriever:
        """Built (or loaded from the on-disk cache) on first use, so constructing the env stays cheap."""
        if self._retriever is None:
            self._retriever = make_retriever(str(self._retriever_spec), self.corpus, cache_dir=self.cache_dir)
        return self._retriever

    @property
    def fingerprint(self) -> str:
        return self.source.fingerprint

    # -- prompts --------------------------------------------------------------------------------------------------
    def messages_for(self, task: Task) -> list[Message]:
        content = self.prompt_template.format(question=task.question, max_searches=self.max_searches)
        messages = [{"role": "user", "content": content}]
        if self.system_prompt:
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return messages

    # -- gymnasium API --------------------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        index = select_task_index(self.source, options, self.np_random)
        self._task = self.source.task(index)
        self._messages = self.messages_for(self._task)
        self._segments: list[tuple[str, bool]] = []  # (text, inserted by the env)
        self._turn = 0
        self._searches = 0
        self._seen_titles: list[str] = []
        self._cut = False
        self._done = False
        self._last_render = ""
        info = {"messages": [dict(m) for m in self._messages], "task_id": self._task.id, "index": index,
                "tools": [SEARCH_TOOL], "turn": 0, "searches": 0, "trajectory": "", "retrieved_spans": []}
        return render_messages(self._messages), info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._done or self._task is None:
            raise gym.error.ResetNeeded("call reset() before step(): the episode has ended")
        if not isinstance(action, str):
            raise TypeError(f"action must be the model's turn (str), got {type(action).__name__}")
        task = self._task
        turn = action[: self.max_response_chars]
        self._cut = len(action) > self.max_response_chars
        parsed = parse_action(turn)
        self._turn += 1
        if parsed.end:  # text after the acting tag was never acted on; it stays out of the record
            turn = turn[: parsed.end] + parsed.closing
        self._messages.append({"role": "assistant", "content": turn})
        self._segments.append((turn, False))

        if parsed.kind == "answer":
            return self._finish(task, turn, parsed.kind, truncated=False)
        if self._turn >= self.max_turns:
            return self._finish(task, turn, parsed.kind, truncated=True)

        retrieved: list[dict[str, Any]] = []
        if parsed.kind == "invalid":
            obs = format_notice(f"Invalid action: {parsed.error}. Search with <search>query</search> or answer with "
                                "<answer>...</answer>.")
        elif self._searches >= self.max_searches:
            obs = format_notice(f"Search limit reached ({self.max_searches} searches). Answer now with "
                                "<answer>...</answer>.")
        else:
            self._searches += 1
            hits = self.retriever.search(parsed.text, self.top_k)
            docs = [self.corpus[h.index] for h in hits]
            retrieved = [{"index": h.index, "title": d.title, "score": h.score} for h, d in zip(hits, docs)]
            self._seen_titles.extend(d.title for d in docs)
            obs = format_information([(d.title, d.text) for d in docs], self.max_passage_chars)
        self._messages.append({"role": self.info_role, "content": obs})
        self._segments.append((obs, True))
        info = self._info(task)
        info.update(action=parsed.kind, query=parsed.text if parsed.kind == "search" else None, retrieved=retrieved,
                    error=parsed.error, correct=False, verdict=None, parsed_answer=None,
                    format_ok=parsed.kind == "search")
        self._last_render = obs
        return obs, 0.0, False, False, info

    def _finish(self, task: Task, turn: str, kind: str, *, truncated: bool) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self._done = True
        start = time.perf_counter()
        verdict = Verdict.failed(f"turn limit ({self.max_turns}) reached without an answer") if truncated \
            else self.score(task, turn)
        info = self._info(task)
        info.update(correct=bool(verdict.correct), verdict=verdict.status, parsed_answer=verdict.parsed,
                    format_ok=bool(verdict.format_ok),
                    verify_ms=WallTime((time.perf_counter() - start) * 1000.0), error=verdict.error,
                    answer=task.answer, action=kind, gold_recall=self._gold_recall(task))
        model_text = "\n".join(text for text, inserted in self._segments if not inserted)
        reward, info["rubric"] = self.rubric.score(verdict, model_text, info)
        self._last_render = f"[{task.id}] correct={verdict.correct} parsed={verdict.parsed!r}"
        return "", reward, not truncated, truncated, info

    def _info(self, task: Task) -> dict[str, Any]:
        trajectory, spans, pos = [], [], 0
        for i, (text, inserted) in enumerate(self._segments):
            if i:
                pos += len(SEP)
            if inserted:
                spans.append([pos, pos + len(text)])
            trajectory.append(text)
            pos += len(text)
        return {"messages": [dict(m) for m in self._messages], "task_id": task.id, "turn": self._turn,
                "searches": self._searches, "trajectory": SEP.join(trajectory), "retrieved_spans": spans,
                "truncated_response": self._cut}

    def _gold_recall(self, task: Task) -> float | None:
        gold = list(task.metadata.get("gold_titles", ()))
        if not gold:
            return None
        seen = set(self._seen_titles)
        return sum(t in seen for t in gold) / len(gold)

    def render(self) -> str | None:
        return self._last_render if self.render_mode == "ansi" else None

    # -- helpers for agents, the harness and tests ----------------------------------------------------------------
    def score(self, task: Task, response: str) -> Verdict:
        """Score a final model turn: its first action must be an ``<answer>``; only that answer and the gold count."""
        parsed = parse_action(response[: self.max_response_chars])
        if parsed.kind != "answer":
            return Verdict.failed("the final turn has no <answer>...</answer> as its action")
        golds = [task.answer, *task.metadata.get("aliases", ())]
        return qa.verify(golds, f"<answer>{parsed.text}</answer>", metric=self.reward_metric)

    def same_answer(self, a: str, b: str) -> bool:
        """Whether two parsed answers are one answer (maj@k votes with this): exact match after SQuAD normalization,
        the verifier's notion of a correct answer."""
        return qa.normalize_answer(a) == qa.normalize_answer(b)

    def gold_response(self, task: Task) -> str:
        return f"<answer>{task.answer}</answer>"

    def oracle_actions(self, task: Task) -> list[str]:
        """Search each gold supporting title (within the caps), then answer the gold answer."""
        budget = min(self.max_searches, self.max_turns - 1)
        titles = list(task.metadata.get("gold_titles", ()))[:budget]
        return [f"<search>{t}</search>" for t in titles] + [self.gold_response(task)]


class OracleAgent:
    """A scripted agent for tests and sanity sweeps: the env's ``oracle_actions`` played turn by turn
    (``act(observations, infos)`` as the harness expects; ``wrong=True`` answers a wrong answer instead)."""

    def __init__(self, env: SearchEnv, *, wrong: bool = False):
        self.env = env
        self.wrong = wrong

    def act(self, observations: list[str], infos: list[dict[str, Any]]) -> list[str]:
        out = []
        for info in infos:
            task = self.env.source.task(self.env.source.index_of(info["task_id"]))
            script = self.env.oracle_actions(task)
            if self.wrong:
                script[-1] = "<answer>certainly not the gold answer zzqx</answer>"
            out.append(script[min(int(info.get("turn", 0)), len(script) - 1)])
        return out

    def describe(self) -> dict[str, Any]:
        return {"agent": "oracle", "wrong": self.wrong}


def run_episode(env: gym.Env, agent: Any, *, options: dict[str, Any] | None = None,
                seed: int | None = None) -> tuple[float, dict[str, Any]]:
    """Play one episode with a single-env agent; returns (total reward, last info)."""
    obs, info = env.reset(seed=seed, options=options)
    total, done = 0.0, False
    while not done:
        (action,) = agent.act([obs], [info])
        obs, reward, terminated, truncated, info = env.step(action)
        total += reward
        done = terminated or truncated
    return total, info


def run_episodes(envs: Sequence[gym.Env], agent: Any, options: Sequence[dict[str, Any]], *,
                 seed: int | None = None) -> list[tuple[float, dict[str, Any]]]:
    """Play ``len(envs)`` episodes side by side (episode j in ``envs[j]`` with ``options[j]``), one batched
    ``agent.act`` call per turn over the episodes still running: the multi-turn loop a batched policy needs."""
    if len(envs) != len(options):
        raise ValueError(f"{len(envs)} envs for {len(options)} episodes")
    obs, infos = [], []
    for j, (env, opt) in enumerate(zip(envs, options)):
        o, i = env.reset(seed=None if seed is None else seed + j, options=opt)
        obs.append(o)
        infos.append(i)
    totals = [0.0] * len(envs)
    running = list(range(len(envs)))
    while running:
        actions = agent.act([obs[j] for j in running], [infos[j] for j in running])
        still = []
        for j, action in zip(running, actions):
            obs[j], reward, terminated, truncated, infos[j] = envs[j].step(action)
            totals[j] += reward
            if not (terminated or truncated):
                still.append(j)
        running = still
    return list(zip(totals, infos))
