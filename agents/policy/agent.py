"""``PolicyAgent``: a policy + rollout engine behind the harness's agent interface ``act(observations, infos)``."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from agents.policy.engine import Rollout, RolloutEngine, SamplingParams, eos_ids, make_engine
from agents.policy.episodes import TokenEpisode, end_token_text, episode_key


class PolicyAgent:
    """Answers each observation with one sampled response.

    The prompt is ``infos[i]["messages"]`` through the tokenizer's chat template (with the assistant generation
    prompt); without messages, the observation text is used as a single user turn. When every info carries ``seed``
    (the harness's per-sample seed) rollout i is drawn with it, so results do not depend on batching. After each call
    ``last_rollouts`` holds the rollouts and ``last_token_counts`` their response lengths (tokens).

    Multi-turn episodes are token-exact (agents/policy/episodes.py): an info with ``task_index``, ``sample_index`` and
    ``turn_index`` > 0 continues its episode's token stream (the model's sampled tokens, then the env's new turns
    appended as token ids) instead of re-rendering the chat; ``episodes[(task_index, sample_index)]`` holds each
    stream, its model-token mask and sampled log-probs (the trainer trains on exactly these). A call whose infos are
    all at turn 0 starts afresh (the harness's next batch). A stream that would pass ``max_episode_tokens`` (default:
    the model's positions) gets an empty turn instead of a generated one (``overflow``), which ends most episodes.
    """

    def __init__(self, policy: Any, engine: RolloutEngine | None = None, sampling: SamplingParams | None = None,
                 *, max_episode_tokens: int | None = None) -> None:
        self.policy = policy
        self.engine = engine if engine is not None else make_engine(policy)
        self.sampling = sampling if sampling is not None else SamplingParams()
        self.last_rollouts: list[Rollout] = []
        self.last_token_counts: list[int] = []
        self.episodes: dict[tuple[int, int], TokenEpisode] = {}
        self.max_episode_tokens = max_episode_tokens or getattr(self.engine, "max_positions", None)
        self._end_ids = set(getattr(self.engine, "eos", None) or (
            eos_ids(policy.model, policy.tokenizer) if getattr(policy, "model", None) is not None else ()))

    def prompt_for(self, observation: str, info: Mapping[str, Any] | None) -> str:
        messages = (info or {}).get("messages")
        if messages:
            return self.policy.prompt_text(messages)
        if not isinstance(observation, str):
            raise TypeError(f"observation must be a string when info has no 'messages', got {type(observation).__name__}")
        return self.policy.prompt_text([{"role": "user", "content": observation}])

    def act(self, observations: Sequence[str], infos: Sequence[Mapping[str, Any]] | None = None) -> list[str]:
        observations = list(observations)
        infos = list(infos) if infos is not None else [{} for _ in observations]
        if len(infos) != len(observations):
            raise ValueError(f"{len(observations)} observations but {len(infos)} infos")
        if not observations:
            self.last_rollouts, self.last_token_counts = [], []
            return []
        if all(int((i or {}).get("turn_index", 0)) == 0 for i in infos):
            self.episodes = {}
        # A response prefix (an env's prefill, e.g. Countdown's entrance_as="prefill") is written for the model: the
        # prompt ends with it, and the response the env grades is prefix + what the model continued with.
        prefixes = [str((i or {}).get("response_prefix") or "") for i in infos]
        seeds = [(i or {}).get("seed") for i in infos]
        if all(s is None for s in seeds):
            seeds = None
        elif any(s is None for s in seeds):
            raise ValueError("either every info carries 'seed' or none does")
        prompts: list[Any] = []
        for o, i, p in zip(observations, infos, prefixes):
            key, turn = episode_key(i), int((i or {}).get("turn_index", 0))
            episode = self.episodes.get(key) if key is not None and turn > 0 else None
            if episode is None:  # turn 0, or an info without the episode's key: the chat as the template renders it
                prompts.append(self.prompt_for(o, i) + p)
                continue
            if episode.turns != turn:
                raise ValueError(f"episode {key}: turn_index {turn} but {episode.turns} turns were played")
            messages = (i or {}).get("messages")
            if not messages:
                raise ValueError(f"episode {key}: a later turn's info must carry the chat ('messages')")
            rendered = self.policy.prompt_text(messages)
            if not episode.drifted:
                try:
                    episode.add_env_turn(rendered, self._tokenize)
                except ValueError as e:  # a template that rewrites earlier turns (drops past reasoning, say)
                    episode.drifted = str(e)
                    warnings.warn(f"episode {key}: {e}; it goes on from the re-rendered chat (fine for evaluation; "
                                  f"training refuses it)", RuntimeWarning, stacklevel=2)
            prompts.append(episode.stream if not episode.drifted else rendered + p)
        limit = self.max_episode_tokens
        # (a turn-0 prompt is the engine's to check: it raises on a prompt too long for the model)
        room = [limit is None or isinstance(q, str) or len(q) + self.sampling.max_new_tokens <= limit
                for q in prompts]
        go = [k for k, ok in enumerate(room) if ok]
        rollouts: list[Rollout | None] = [None] * len(prompts)
        if go:
            made = self.sample([observations[k] for k in go], [infos[k] for k in go], [prompts[k] for k in go],
                               None if seeds is None else [seeds[k] for k in go])
            for k, ro in zip(go, made):
                rollouts[k] = ro
        for k, (i, ro) in enumerate(zip(infos, rollouts)):
            key = episode_key(i)
            if key is None:
                continue
            if int((i or {}).get("turn_index", 0)) == 0:
                prompt_ids = list(ro.prompt_ids) if ro is not None else self._tokenize(prompts[k])
                self.episodes[key] = TokenEpisode(prompt_ids=prompt_ids, text=prompts[k])
            episode = self.episodes.get(key)
            if episode is None:  # a later turn of an episode this agent did not start: played from the rendered chat
                continue
            if episode.drifted:
                episode.turns += 1
                continue
            if ro is None:
                episode.overflow = True
                episode.add_model_turn([], [], [], "", "length")
            else:
                end = end_token_text(self.policy.tokenizer, ro.response_ids[-1], self._end_ids) if ro.response_ids else ""
                episode.add_model_turn(ro.response_ids, ro.logprobs, ro.entropies, ro.text, ro.finish_reason, end)
        self.last_rollouts = [ro for ro in rollouts if ro is not None]
        self.last_token_counts = [len(ro.response_ids) if ro is not None else 0 for ro in rollouts]  # generated tokens only
        return [p + (ro.text if ro is not None else "") for p, ro in zip(prefixes, rollouts)]

    def sample(self, observations: list[str], infos: list[Mapping[str, Any]], prompts: list[Any],
               seeds: list[int] | None) -> list[Rollout]:
        """One rollout per prompt (a string, or an episode's token stream): the engine's sample. A subclass may answer
        otherwise (agents/grpo/sft.py writes a scripted teacher's turns as tokens)."""
        return self.engine.generate(prompts, 1, self.sampling, seeds=seeds)

    def _tokenize(self, text: str) -> list[int]:
        return list(self.policy.tokenizer(text, add_special_tokens=False)["input_ids"])

    def describe(self) -> dict[str, Any]:
        """Provenance for results files: model id, weights hash, size, sampling and engine."""
        return {
            "class": f"{PolicyAgent.__module__}.{PolicyAgent.__qualname__}",
            "model": self.policy.name,
            "weights_hash": self.policy.weights_hash,
            "n_params": self.policy.n_params,
            "source": getattr(self.policy, "source", ""),
            "sampling": self.sampling.to_dict(),
            "engine": self.engine.describe(),
        }
