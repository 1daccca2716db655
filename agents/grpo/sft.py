"""Supervised warm start on a multi-turn env's oracle trajectories, env tokens masked as in RL.

SmolLM2 never emits a tool call, so RL on the tool and search envs has no signal to start from. The envs' oracle
agents (``rlvr_envs.tools.env.OracleAgent``, ``rlvr_envs.search.env.OracleAgent``) solve their tasks; their turns
are played through the same episode loop and token streams as RL rollouts (agents/grpo/multiturn.py): a
``TeacherAgent`` writes each oracle turn as the model's tokens (the turn's text, then the end-of-turn token), and the
env's turns are appended as ids with mask 0. Supervised fine-tuning then minimizes the mean negative log-likelihood
of the model tokens only, the same masked positions the RL loss reads.

    python -m agents.grpo.sft --env rlvr/ToolUse-v0 --model smollm2 --tasks 256 --epochs 2 --out runs/sft-tooluse

writes the fine-tuned model and tokenizer to ``--out`` (``model=<out>`` in a recipe loads it) and ``sft.json``
(episodes, tokens, the loss per step, the command). Demonstrations come from the env's training split (the env's
default kwargs), never from its held-out seed.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from agents.grpo.logprobs import response_logprobs
from agents.grpo.multiturn import play, remake
from agents.policy.agent import PolicyAgent
from agents.policy.engine import Rollout
from agents.policy.episodes import TokenEpisode
from rlvr_envs.harness.evaluate import EnvPool


class TeacherAgent(PolicyAgent):
    """A scripted agent's turns as token-exact episodes of ``policy``: each turn is the teacher's text tokenized,
    closed with the tokenizer's end-of-turn token (as the model would close it), log-probs 0."""

    def __init__(self, policy: Any, teacher: Any, *, max_episode_tokens: int | None = None):
        from agents.policy.engine import SamplingParams

        super().__init__(policy, _NoEngine(policy), SamplingParams(max_new_tokens=1), max_episode_tokens=max_episode_tokens)
        self.teacher = teacher
        eos = getattr(policy.tokenizer, "eos_token_id", None)
        self.end_id = int(eos) if eos is not None else None

    def sample(self, observations: list[str], infos: list[Mapping[str, Any]], prompts: list[Any],
               seeds: list[int] | None) -> list[Rollout]:
        texts = self.teacher.act(list(observations), [dict(i) for i in infos])
        out = []
        for prompt, text in zip(prompts, texts):
            prompt_ids = list(prompt) if not isinstance(prompt, str) else self._tokenize(prompt)
            ids = self._tokenize(str(text)) + ([self.end_id] if self.end_id is not None else [])
            out.append(Rollout(prompt_ids, ids, str(text), [0.0] * len(ids), None, "stop"))
        return out


class _NoEngine:
    """Stands in for an engine: a teacher never samples."""

    backend = "teacher"

    def __init__(self, policy: Any):
        self.max_positions = getattr(getattr(policy.model, "config", None), "max_position_embeddings", None)

    def generate(self, *args: Any, **kwargs: Any) -> list[Rollout]:
        raise RuntimeError("a TeacherAgent writes its teacher's turns; it never generates")

    def sync_weights(self, model: Any) -> None:
        return None


def default_teacher(env: Any) -> Any:
    """The env's own oracle agent (tool use, search)."""
    base = env.unwrapped
    module = sys.modules[type(base).__module__]
    oracle = getattr(module, "OracleAgent", None)
    if oracle is None:
        raise ValueError(f"{type(base).__name__} has no OracleAgent in {module.__name__}; pass a teacher")
    return oracle(base)


def demonstrations(policy: Any, env: Any, n_tasks: int, *, seed: int = 0, teacher: Any = None,
                   correct_only: bool = True) -> tuple[list[TokenEpisode], dict[str, float]]:
    """Token-exact episodes of ``teacher`` (default: the env's oracle) on the first ``n_tasks`` tasks of ``env``;
    only the ones it solved unless ``correct_only=False``. Returns ``(episodes, stats)``."""
    agent = TeacherAgent(policy, teacher if teacher is not None else default_teacher(env))
    items = [(i, 0, i) for i in range(n_tasks)]
    episodes = play(agent, EnvPool(env, lambda: remake(env)), items, run_seed=seed)
    kept = []
    for (u, s, _), ep in zip(items, episodes):
        stream = agent.episodes[(u, s)]
        correct = ep.final is not None and bool(ep.final[1].get("correct", ep.final[0] > 0))
        if (correct or not correct_only) and not stream.drifted and stream.model_tokens:
            kept.append(stream)
    stats = {"episodes": len(kept), "tasks": n_tasks,
             "model_tokens": float(sum(e.model_tokens for e in kept)),
             "env_tokens": float(sum(len(e.ids) - e.model_tokens for e in kept)),
             "turns_mean": float(sum(e.turns for e in kept) / max(1, len(kept)))}
    return kept, stats


def masked_nll(model: torch.nn.Module, episodes: Sequence[TokenEpisode], *, pad_id: int = 0) -> torch.Tensor:
    """Mean negative log-likelihood of the episodes' model tokens (env tokens and padding excluded)."""
    lp, _ = response_logprobs(model, [e.prompt_ids for e in episodes], [e.ids for e in episodes], pad_id=pad_id)
    mask = torch.zeros_like(lp)
    for r, e in enumerate(episodes):
        mask[r, : len(e.mask)] = torch.tensor(e.mask, dtype=lp.dtype)
    return -(lp * mask).sum() / mask.sum().clamp(min=1)


def sft(policy: Any, episodes: Sequence[TokenEpisode], *, epochs: int = 2, lr: float = 1e-5, batch_size: int = 8,
        seed: int = 0, log: Callable[[str], Any] | None = None) -> list[float]:
    """Fine-tune every parameter of ``policy.model`` on ``episodes`` (AdamW, shuffled each epoch); the loss per
    optimizer step."""
    if not episodes:
        raise ValueError("no demonstrations to fine-tune on")
    if epochs < 1 or batch_size < 1 or lr <= 0:
        raise ValueError(f"epochs and batch_size must be >= 1 and lr > 0, got {epochs}, {batch_size}, {lr}")
    model = policy.model
    pad_id = int(getattr(policy.tokenizer, "pad_token_id", None) or 0)
    params = [p for p in model.parameters()]
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    order, rng, losses = list(range(len(episodes))), random.Random(seed), []
    model.train()
    t0 = time.perf_counter()
    for epoch in range(epochs):
        rng.shuffle(order)
        for start in range(0, len(order), batch_size):
            part = [episodes[k] for k in order[start:start + batch_size]]
            loss = masked_nll(model, part, pad_id=pad_id)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            losses.append(float(loss.detach()))
            if log is not None:
                log(f"epoch {epoch + 1}/{epochs} step {len(losses)}: loss {losses[-1]:.4f} "
                    f"({time.perf_counter() - t0:.0f} s)")
    model.eval()
    return losses


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="SFT warm start on a multi-turn env's oracle trajectories")
    ap.add_argument("--env", required=True, help="a multi-turn env id (rlvr/ToolUse-v0, rlvr/MultiHopSynth-v0, ...)")
    ap.add_argument("--env-kwargs", default="{}", help="JSON kwargs for the env (its training split)")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--tasks", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True, help="directory for the fine-tuned model, tokenizer and sft.json")
    args = ap.parse_args(argv)
    import gymnasium as gym

    import rlvr_envs  # noqa: F401  (registers the ids)
    from agents.policy.models import load_policy

    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"{out} exists and is not empty; choose another --out")
    env_kwargs = json.loads(args.env_kwargs)
    policy = load_policy(args.model, seed=args.seed)
    env = gym.make(args.env, **env_kwargs)
    episodes, stats = demonstrations(policy, env, args.tasks, seed=args.seed)
    print(f"{stats['episodes']} demonstrations of {args.tasks} tasks: {stats['model_tokens']:.0f} model tokens, "
          f"{stats['env_tokens']:.0f} env tokens (masked)", flush=True)
    losses = sft(policy, episodes, epochs=args.epochs, lr=args.lr, batch_size=args.batch_size, seed=args.seed,
                 log=lambda m: print(m, flush=True))
    out.mkdir(parents=True, exist_ok=True)
    policy.model.save_pretrained(out)
    policy.tokenizer.save_pretrained(out)
    (out / "sft.json").write_text(json.dumps({"env": args.env, "env_kwargs": env_kwargs, "model": args.model,
                                              "stats": stats, "losses": losses, "args": vars(args),
                                              "command": "python -m agents.grpo.sft " + " ".join(argv or sys.argv[1:])},
                                             indent=1))
    print(f"wrote {out}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
