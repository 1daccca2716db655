"""``PolicyAgent``: a policy + rollout engine behind the harness's agent interface ``act(observations, infos)``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agents.policy.engine import Rollout, RolloutEngine, SamplingParams, make_engine


class PolicyAgent:
    """Answers each observation with one sampled response.

    The prompt is ``infos[i]["messages"]`` through the tokenizer's chat template (with the assistant generation
    prompt); without messages, the observation text is used as a single user turn. When every info carries ``seed``
    (the harness's per-sample seed) rollout i is drawn with it, so results do not depend on batching. After each call
    ``last_rollouts`` holds the rollouts and ``last_token_counts`` their response lengths (tokens).
    """

    def __init__(self, policy: Any, engine: RolloutEngine | None = None, sampling: SamplingParams | None = None) -> None:
        self.policy = policy
        self.engine = engine if engine is not None else make_engine(policy)
        self.sampling = sampling if sampling is not None else SamplingParams()
        self.last_rollouts: list[Rollout] = []
        self.last_token_counts: list[int] = []

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
        # A response prefix (an env's prefill, e.g. Countdown's entrance_as="prefill") is written for the model: the
        # prompt ends with it, and the response the env grades is prefix + what the model continued with.
        prefixes = [str((i or {}).get("response_prefix") or "") for i in infos]
        prompts = [self.prompt_for(o, i) + p for o, i, p in zip(observations, infos, prefixes)]
        seeds = [(i or {}).get("seed") for i in infos]
        if all(s is None for s in seeds):
            seeds = None
        elif any(s is None for s in seeds):
            raise ValueError("either every info carries 'seed' or none does")
        rollouts = self.engine.generate(prompts, 1, self.sampling, seeds=seeds)
        self.last_rollouts = rollouts
        self.last_token_counts = [r.n_tokens for r in rollouts]  # generated tokens only, not the prefix
        return [p + r.text for p, r in zip(prefixes, rollouts)]

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
