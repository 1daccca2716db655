"""Multi-turn rollouts for the trainer: tool-call and search envs played through the harness's episode loop.

The trainer's rollout stage for any env that is not a single-turn ``TextEnv`` (``rlvr/ToolUse-v0``,
``rlvr/MultiHopSynth-v0``, ``rlvr/HotpotQA-v0``): the episodes are played by ``rlvr_envs.harness.evaluate.run_episodes``
(the harness's own lockstep loop, so a run's rollouts are what ``rlvr eval`` would record for the same agent and seeds)
with a ``PolicyAgent`` whose episodes are token-exact (agents/policy/episodes.py). Each episode becomes one Sample:

    prompt_ids   = the opening chat's tokens
    response_ids = every later token, the model's as sampled and the env's appended as ids
    token_mask   = 1 on model tokens only (the loss, KL and entropy never see an env token)
    logprobs     = the sampled log-probs on model tokens (0 on env tokens)

Collapse guards (verl and GEM users report tool use collapsing to one or two calls): ``episode_stats`` gives calls
per episode, the invalid-call rate and the tool-use rate (episodes with at least one call or search) for the train
record, and ``ToolUseMonitor`` warns when the tool-use rate falls below a threshold.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from agents.grpo.batch import Sample
from agents.policy.episodes import turn_spans
from rlvr_envs.core import TextEnv
from rlvr_envs.harness.evaluate import MAX_TURNS, EnvPool, Episode, run_episodes
from rlvr_envs.rubric import plan_precision, plan_recall


def is_multiturn(env: Any) -> bool:
    # a served env (rlvr_envs.remote.RemoteEnv) says what it serves; a local one is multi-turn unless a TextEnv
    flag = getattr(env.unwrapped, "multi_turn", None)
    return bool(flag) if flag is not None else not isinstance(env.unwrapped, TextEnv)


def remake(env: Any) -> Any:
    """Another instance of ``env``: from its registration (id and kwargs) when it has one, else a deep copy."""
    spec = getattr(env, "spec", None)
    if spec is not None and getattr(spec, "id", None):
        import gymnasium as gym

        return gym.make(spec.id, **(spec.kwargs or {}))
    import copy

    return copy.deepcopy(env)


def model_turn_lengths(samples: Sequence[Sample]) -> tuple[list[int], list[int]]:
    """``(prefix, turn)`` token counts of every model turn of every episode: the stream before the turn (what the
    engine prefilled for it) and the turn's own tokens, for the generation FLOPs."""
    prefix, turn = [], []
    for s in samples:
        mask = list(s.token_mask) if s.token_mask is not None else [True] * len(s.response_ids)
        for start, end in turn_spans(mask):
            prefix.append(len(s.prompt_ids) + start)
            turn.append(end - start)
    return prefix, turn


def calls_of(info: dict[str, Any]) -> int:
    """Tool calls (ToolUse: ``calls_made``) or searches (search envs) of an episode, from its last info."""
    return int(info.get("calls_made", info.get("searches", 0)) or 0)


def play(agent: Any, pool: EnvPool, items: Sequence[tuple[int, int, int]], *, run_seed: int,
         max_turns: int = MAX_TURNS) -> list[Episode]:
    """Episodes for ``items`` = ``(unit, sample, dataset index)``: ``unit`` keys the seeds (unique per prompt of the
    call), the dataset index picks the task."""
    units = [(u, s) for u, s, _ in items]
    n_samples = 1 + max((s for _, s, _ in items), default=0)
    return run_episodes(agent, pool, units, run_seed=run_seed, n_samples=n_samples,
                        reset_options=[{"index": int(index)} for _, _, index in items], max_turns=max_turns)


def episode_samples(agent: Any, items: Sequence[tuple[int, int, int]], episodes: Sequence[Episode],
                    group_of: Callable[[int], tuple[str, dict[str, Any]]]) -> list[Sample]:
    """One Sample per episode from the agent's token streams; ``group_of(unit)`` -> (group id, group dict)."""
    samples = []
    for (u, s, _), ep in zip(items, episodes):
        gid, group = group_of(u)
        stream = agent.episodes.get((u, s))
        if stream is None:
            raise RuntimeError(f"the agent kept no token stream for episode {(u, s)}: it must be a PolicyAgent")
        if stream.drifted:
            raise RuntimeError(f"episode {(u, s)} is not token-exact, so it cannot be trained on: {stream.drifted}")
        reward, info = ep.final or (0.0, {"correct": False, "error": f"no final answer within {len(ep.turns)} turns"})
        last = {**ep.last_info, **info}
        samples.append(Sample(
            group_id=gid, prompt=group["prompt"], prompt_ids=list(stream.prompt_ids), response_ids=list(stream.ids),
            text=ep.turns[-1] if ep.turns else "", reward=float(reward), correct=bool(info.get("correct", reward > 0)),
            logprobs=stream.logprobs, entropies=stream.entropies, token_mask=stream.mask,
            finish_reason=stream.finish_reasons[-1] if stream.finish_reasons else "length",
            info={"task_id": group["task_id"], "index": group["index"], "parsed_answer": info.get("parsed_answer"),
                  "verdict": info.get("verdict"),
                  "format_ok": info.get("format_ok"), "answer": info.get("answer"), "metadata": group["metadata"],
                  "messages": group["messages"], "turns": list(ep.turns), "calls": calls_of(last),
                  "invalid_calls": int(last.get("invalid_calls", 0) or 0), "overflow": stream.overflow,
                  "plan_length": last.get("plan_length"), "plan_calls_hit": last.get("plan_calls_hit"),
                  "ended": ep.final is not None}))
    return samples


def episode_stats(samples: Sequence[Sample]) -> dict[str, float]:
    """Collapse guards for the train record: turns and calls per episode, invalid-call and tool-use rates; for envs
    with a gold plan (ToolUse), ``plan_recall`` (share of the plan's calls made) and ``precision_solved`` (plan length
    over calls made, mean over solved episodes; absent when none was solved)."""
    if not samples:
        return {}
    calls = np.array([s.info.get("calls", 0) for s in samples], dtype=float)
    invalid = float(sum(s.info.get("invalid_calls", 0) for s in samples))
    # envs with a gold plan (ToolUse): is the calling complete (recall) and minimal (precision)? The rubric's own
    # formulas, read from the sample's call counts
    planned = [{"plan_length": s.info["plan_length"], "plan_calls_hit": s.info.get("plan_calls_hit"),
                "calls_made": max(1, s.info.get("calls", 0)), "correct": s.correct}
               for s in samples if s.info.get("plan_length")]
    plan: dict[str, float] = {}
    if planned:
        plan["plan_recall"] = float(np.mean([plan_recall(p) for p in planned]))
        solved = [p for p in planned if p["correct"]]
        if solved:  # precision of the solved episodes only: a failed one's calls say nothing about verbosity
            plan["precision_solved"] = float(np.mean([plan_precision(p) for p in solved]))
    return {**plan, "turns_per_episode": float(np.mean([len(s.info.get("turns", [])) for s in samples])),
            "calls_per_episode": float(calls.mean()),
            "tool_use_rate": float((calls > 0).mean()),
            "invalid_call_rate": invalid / calls.sum() if calls.sum() else 0.0,
            "env_token_frac": float(np.mean([1 - sum(s.token_mask) / max(1, len(s.token_mask)) for s in samples])),
            "unfinished_episodes": float(sum(not s.info.get("ended", True) for s in samples)),
            "overflow_episodes": float(sum(bool(s.info.get("overflow")) for s in samples))}


class ToolUseMonitor:
    """Warns (once per fall) when the tool-use rate of a training step drops below ``threshold`` after being at or
    above it (or from the first step, when it starts below): the collapse to answering without tools."""

    def __init__(self, threshold: float):
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"tool_use_warn_below must be in [0, 1], got {threshold!r}")
        self.threshold = float(threshold)
        self._below = False

    def update(self, step: int, rate: float) -> bool:
        """True (and a RuntimeWarning) when this step starts a stretch below the threshold."""
        below = self.threshold > 0 and rate < self.threshold
        fired = below and not self._below
        if fired:
            warnings.warn(f"step {step}: tool-use rate {rate:.3f} fell below {self.threshold:.3f} (episodes answering "
                          f"without any call or search); check the reward and the invalid-call rate",
                          RuntimeWarning, stacklevel=2)
        self._below = below
        return fired
