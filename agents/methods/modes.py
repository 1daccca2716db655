"""NoThink / Short / Long modes (seed 004). Stages: GenerationController (``mode_caps``) and RewardShaper
(``mode_reward``); the env side is ``rlvr/Modes-v0`` (``rlvr_envs/modes.py``: marker parsing, caps, instruction).

The policy picks a mode with the first word of its response; each mode m has a hard cap C_m (tokens, marker and EOS
included, as ``max_new_tokens`` counts them) and a weight w_m. With base reward r_b of the capped response:

    y = y_{1..min(|y|, C_m(y))},     r = w_m(y) * r_b(y),     w = 1.0 / 0.9 / 0.75 (NoThink / Short / Long)

GRPO then normalizes r within the group as usual: inside a group, a correct NoThink answer beats a correct Long one
by 0.25 of reward, so the policy learns to pick the briefest mode that still solves the problem, without a router.

``mode_caps`` (GenerationController) generates in phases at the distinct caps C_(1) < C_(2) < ...: every rollout
first decodes up to C_(1) tokens; one still running continues, in one engine call per phase, to the next cap while
its mode (read from its text so far) allows it; finally every rollout is cut at its mode's cap. A continuation is an
engine call on the rollout's own token ids with a seed derived from the rollout's (as ``generate_with_abort``), so the
joined rollout is a sample of the same policy and its log-probs and entropies are those of the tokens as sampled;
cutting truncates ids, log-probs and entropies together. The trained tokens are then exactly the scored ones. A
token is generated past a rollout's cap only when its mode changes between phases (a marker still incomplete at the
first cap); the trainer counts FLOPs on the returned rollouts, so those tokens and the continuations' re-reading of
their prefix are not counted (as with DUET's abort). A rollout that ran into its cap has ``finish_reason="length"``.
Metrics per step, over every generated rollout: ``share_<mode>`` (mode mix), ``no_marker_rate``, ``acc_<mode>`` and
``len_<mode>`` (accuracy and mean tokens, ``<mode>`` also ``unmarked``; left out for a mode no rollout chose),
``capped_rate``.

``mode_reward`` (RewardShaper) multiplies each row's reward by its mode's weight (0 for a format error under
``no_marker="error"``).

Our reading (every choice a hyper-parameter, most of them the env's):
- the weights are paid in one place per run. The env pays them by default (``pay_weights=true``: what the harness
  evaluates). A comparison's env settings apply to both of its runs, so its GRPO baseline would be trained on the
  mode-weighted reward too; there the env is set to ``pay_weights=false`` and the method pays the weights with
  ``mode_reward``, which refuses to run on a modes env that pays them already (no double pay).
- the mode table (markers, caps, weights, ``no_marker``) is read from the run's env settings (``env_kwargs.modes``,
  ``env_kwargs.no_marker``) when the run's env is ``rlvr/Modes-v0``: one source for what the env scores and what the
  controller cuts. ``modes`` / ``no_marker`` hyper-parameters layer over it and must agree with it on a modes env
  (else ValueError); on any other env they (or the defaults) are the table.
- a rollout without a marker: under ``no_marker="error"`` its reward is 0 whatever follows, so it stops at the first
  phase; otherwise it runs under the ``no_marker`` mode's cap.
- a marker must fit its mode's cap with room to spare (``len(marker tokens) < C_m``), checked against the policy's
  tokenizer at bind: a cap inside the marker would change the parsed mode.
- caps count the policy's tokens in the controller and the env's unit (words unless it has a tokenizer) in the env;
  a response has at most as many words as tokens, so the env never cuts a response the controller capped.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from agents.grpo.batch import GroupBatch
from agents.grpo.comparisons import Comparison, declare
from agents.grpo.registry import Component, register
from agents.policy.engine import Rollout
from rlvr_envs.modes import UNMARKED, ModeTable, is_modes_env, merge_modes, mode_stats


def run_table(cfg: Any, modes: Mapping[str, Mapping[str, Any]] | None, no_marker: str | None, who: str) -> ModeTable:
    """The run's mode table: its env's (when the env is ``rlvr/Modes-v0``) with the component's hyper-parameters
    layered on top; on a modes env the two must agree, so the controller cuts what the env scores."""
    env_kwargs = dict(getattr(cfg, "env_kwargs", None) or {}) if is_modes_env(getattr(cfg, "env", "")) else None
    env_modes = (env_kwargs or {}).get("modes")
    env_no_marker = (env_kwargs or {}).get("no_marker", "long")
    table = ModeTable.build(merge_modes(env_modes, modes), no_marker if no_marker is not None else env_no_marker)
    if env_kwargs is not None and table != ModeTable.build(env_modes, env_no_marker):
        raise ValueError(f"{who}: modes / no_marker {table.to_kwargs()} differ from the env's "
                         f"(env_kwargs.modes / env_kwargs.no_marker); set them in one place")
    return table


class _ModeTableUser(Component):
    def __init__(self, modes: Mapping[str, Mapping[str, Any]] | None = None, no_marker: str | None = None):
        self._modes, self._no_marker = modes, no_marker
        self.table = ModeTable.build(modes, no_marker if no_marker is not None else "long")  # bad values raise now

    def bind(self, services: Any) -> None:
        cfg = getattr(services, "cfg", None)
        if cfg is not None:
            self.table = run_table(cfg, self._modes, self._no_marker, f"{self.stage}/{self.name}")


@register("mode_caps", stage="generation_controller")
class ModeCaps(_ModeTableUser):
    def __init__(self, modes: Mapping[str, Mapping[str, Any]] | None = None, no_marker: str | None = None):
        super().__init__(modes, no_marker)
        self.tokenizer: Any = None
        self._reset_counts()

    def _reset_counts(self) -> None:
        self.rollouts = self.capped = 0
        self.texts: list[str] = []
        self.correct: list[bool] = []
        self.lengths: list[int] = []

    def bind(self, services: Any) -> None:
        super().bind(services)
        self.tokenizer = getattr(services, "tokenizer", None)
        if self.tokenizer is None:
            return
        for m in self.table.modes:
            n = len(self.tokenizer(m.marker, add_special_tokens=False)["input_ids"])
            if n >= m.cap:
                raise ValueError(f"mode_caps: modes.{m.name}.cap = {m.cap} leaves no room after its marker "
                                 f"{m.marker!r} ({n} tokens of the policy's tokenizer)")

    def sampling(self, sampling: Any, step: int) -> Any:
        return sampling

    # -- generation ------------------------------------------------------------------------------------------------
    def target(self, text: str, limit: int) -> int:
        """How many tokens a rollout whose text so far is ``text`` may have (0: stop now, a format error)."""
        mode, _ = self.table.resolve(text)
        return 0 if mode is None else min(mode.cap, limit)

    def generate(self, engine: Any, prompts: Sequence[Any], n: int, sampling: Any) -> list[Any]:
        limit = int(sampling.max_new_tokens)
        levels = sorted({min(m.cap, limit) for m in self.table.modes})
        tokenizer = getattr(engine, "tokenizer", None) or self.tokenizer
        if tokenizer is None:
            raise ValueError("mode_caps: needs the policy's tokenizer to cut rollouts (bind it, or an engine with "
                             ".tokenizer)")
        out = list(engine.generate(prompts, n, dataclasses.replace(sampling, max_new_tokens=levels[0])))
        done = levels[0]
        for phase, level in enumerate(levels[1:], 1):
            keep = [k for k, ro in enumerate(out) if ro.finish_reason == "length" and self.target(ro.text, limit) >= level]
            if not keep:  # no rollout may run past this level, so none may past the higher ones
                break
            seeds = [_continuation_seed(out[k], k, phase, sampling) for k in keep]
            tails = engine.generate([list(out[k].prompt_ids) + list(out[k].response_ids) for k in keep], 1,
                                    dataclasses.replace(sampling, max_new_tokens=level - done), seeds=seeds)
            for k, tail in zip(keep, tails):
                out[k] = _join(out[k], tail, tokenizer, phase)
            done = level
        out = [self.cut(ro, tokenizer, limit) for ro in out]
        self.rollouts += len(out)
        self.capped += sum(bool(ro.meta.get("mode_capped")) for ro in out)
        return out

    def generate_eval(self, engine: Any, prompts: Sequence[Any], n: int, sampling: Any) -> list[Any]:
        """The trainer's held-out eval decodes with the caps too (the deployed policy answers within its mode's cap);
        its rollouts are not counted in the training metrics."""
        counts = (self.rollouts, self.capped)
        try:
            return self.generate(engine, prompts, n, sampling)
        finally:
            self.rollouts, self.capped = counts

    def cut(self, ro: Any, tokenizer: Any, limit: int) -> Rollout:
        """``ro`` cut at its mode's cap (ids, log-probs and entropies together; text decoded from the kept ids),
        repeated until the text's mode is stable, so the env parses the mode the cut was made for. ``mode_capped``:
        the rollout ran into its cap (cut, or stopped there by the length limit without an EOS); it keeps
        ``finish_reason="length"``. A format error stopped before the limit is marked ``"abort"``."""
        ids, text, cut = list(ro.response_ids), ro.text, False
        for _ in range(len(self.table.modes) + 1):
            mode, _ = self.table.resolve(text)
            if mode is None or len(ids) <= min(mode.cap, limit):
                break
            ids, cut = ids[: min(mode.cap, limit)], True
            text = tokenizer.decode(ids, skip_special_tokens=True)
        mode, found = self.table.resolve(text)
        finish = "length" if cut else ro.finish_reason
        capped = mode is not None and finish == "length" and len(ids) >= min(mode.cap, limit)
        if mode is None and finish == "length" and len(ids) < limit:
            finish = "abort"  # no_marker="error": its reward is 0 whatever would follow
        k = len(ids)
        entropies = None if ro.entropies is None else list(ro.entropies)[:k]
        return Rollout(list(ro.prompt_ids), ids, text, list(ro.logprobs)[:k], entropies, finish,
                       seed=getattr(ro, "seed", None),
                       meta={**(getattr(ro, "meta", None) or {}), "mode": None if mode is None else mode.name,
                             "marker_found": found, "mode_capped": capped})

    # -- metrics ---------------------------------------------------------------------------------------------------
    def observe_rollouts(self, batch: GroupBatch, wall_s: float) -> None:
        self.texts += list(batch.texts)
        self.correct += [bool(c) for c in batch.correct.tolist()]
        self.lengths += [int(x) for x in batch.response_lengths.tolist()]

    def metrics(self) -> dict[str, float]:
        stats = mode_stats(self.texts, self.correct, self.lengths, self.table)
        out = {f"share_{m}": float(stats["share"][m]) for m in self.table.names}
        out["no_marker_rate"] = float(stats["no_marker_rate"])
        for name in (*self.table.names, UNMARKED):
            if name in stats["accuracy"]:
                out[f"acc_{name}"] = float(stats["accuracy"][name])
                out[f"len_{name}"] = float(stats["len_mean"][name])
        out["capped_rate"] = self.capped / self.rollouts if self.rollouts else 0.0
        self._reset_counts()
        return out


def _continuation_seed(ro: Any, k: int, phase: int, sampling: Any) -> int:
    """A continuation's seed: from the rollout's own seed and the phase, else (engines that do not report one) from
    the call's seed, the phase and the rollout's index."""
    own = getattr(ro, "seed", None)
    root, key = (int(own), (2, phase)) if own is not None else (int(sampling.seed or 0), (2, phase, k))
    return int(np.random.SeedSequence(root, spawn_key=key).generate_state(1, np.uint64)[0] >> 1)


def _join(ro: Any, tail: Any, tokenizer: Any, phase: int) -> Rollout:
    ids = list(ro.response_ids) + list(tail.response_ids)
    ents = None if ro.entropies is None or tail.entropies is None else list(ro.entropies) + list(tail.entropies)
    return Rollout(list(ro.prompt_ids), ids, tokenizer.decode(ids, skip_special_tokens=True),
                   list(ro.logprobs) + list(tail.logprobs), ents, tail.finish_reason, seed=getattr(ro, "seed", None),
                   meta={**(getattr(ro, "meta", None) or {}), "phases": phase + 1})


@register("mode_reward", stage="reward_shaper")
class ModeReward(_ModeTableUser):
    def __init__(self, modes: Mapping[str, Mapping[str, Any]] | None = None, no_marker: str | None = None):
        super().__init__(modes, no_marker)
        self.weight_mean = 0.0

    def bind(self, services: Any) -> None:
        super().bind(services)
        cfg = getattr(services, "cfg", None)
        if cfg is not None and is_modes_env(cfg.env) and (cfg.env_kwargs or {}).get("pay_weights", True):
            raise ValueError("mode_reward: the run's env pays the mode weights already (env_kwargs.pay_weights is "
                             "true); set env_kwargs.pay_weights=false or drop this shaper")

    def __call__(self, batch: GroupBatch) -> torch.Tensor:
        w = torch.tensor([self.table.weight(t) for t in batch.texts], dtype=torch.float64)
        self.weight_mean = float(w.mean()) if len(w) else 0.0
        return (batch.rewards.double() * w).float()

    def metrics(self) -> dict[str, float]:
        return {"weight_mean": self.weight_mean}


# Measured before declaring (inference only, 16 held-out tasks x 4 samples at T = 0.7, through mode_caps and the hf
# engine): SmolLM2-135M-Instruct started 0 of 64 responses with a marker, with the default instruction and with one
# that shows an example reply, so on the plain model every response is scored as Long. Both runs therefore start from
# ``smollm2-modes`` (agents/policy/modes_warmstart.py): SmolLM2 fine-tuned on 192 tasks of another task stream, the
# three modes' answers in equal numbers, prompted exactly as here. Measured (32 held-out tasks x 4 at T = 0.7): every
# response starts with a marker (plain SmolLM2: none), mixed 77% /nothink, 18% /short, 5% /long, mean@4 0.125.
# The smollm2 lane with its env switched to the modes wrapper, for both runs: the same prompts (the instruction
# listing the modes), the same caps in scoring, flat pay in the env. The method adds the mode weights (mode_reward)
# and generation-time caps (mode_caps); the baseline is GRPO on the same env. Caps in SmolLM2 tokens: "/nothink"
# alone is 4 of them and "\boxed{12}" 7, a one-line "a + b = c. The answer is \boxed{c}." about 24; the warm start's
# caps are these (its defaults) and it refuses a demonstration that would not fit.
SMOLLM2_MODES = ("model=smollm2-modes", "env=rlvr/Modes-v0", "env_kwargs.base=rlvr/Arithmetic-v0",
                 "env_kwargs.pay_weights=false", "env_kwargs.modes.nothink.cap=16", "env_kwargs.modes.short.cap=32",
                 "env_kwargs.modes.long.cap=48")

declare(Comparison(
    method="modes", baseline="grpo", metric="final_eval_tokens", direction="lower", accuracy_tolerance=0.05,
    lane="smollm2", overrides=SMOLLM2_MODES,
    known_result=(
        "smollm2 lane from the smollm2-modes warm start, seeds 0-1 (2026-12-05): final greedy held-out length 24.6 "
        "vs GRPO 24.4 tokens, +0.13 [95% -0.89, +1.14] at accuracy 0.445 vs 0.430: not reproduced. Every response "
        "carried a marker, and both runs left /nothink (70-73% of rollouts at step 1, accuracy about 0.1) for /short "
        "(91-95% by step 5, 97-100% from step 10): a mode's accuracy (/short about 0.4-0.6) outweighed its pay "
        "(0.9 vs 1.0), so the weights changed nothing and held-out length rose 11.9 -> 24.6 on both sides. Before "
        "the warm start (plain SmolLM2, seed 0) no marker was ever written: 11.1 vs 12.5 tokens, not a test of modes"),
    claim="modes chosen by the first token, learned in GRPO through mode-weighted reward (1.0 / 0.9 / 0.75) and hard "
          "per-mode caps, cut mean response length 41% (4796 -> 2811 tokens) at about equal accuracy (MATH500 0.782 "
          "vs 0.796; read: mean final accuracy within 0.05). Here the baseline is GRPO on the same modes env (same "
          "prompt and caps in scoring, flat pay)"))

# Measured (commit c009196 runs, seeds 0-2, `python -m agents.grpo.regression -k modes_vs_grpo`): final held-out
# length 13.99 vs 15.58 tokens, -1.59 [95% -3.03, -0.15] (-10%, the paper -41%) at mean@4 0.365 vs 0.360: reproduced.
# At the end 82-89% of the method's rollouts chose /nothink (from ~56% at the warm start); GRPO on flat pay also
# shortened (19.8 -> 15.5), so the difference is the weights' and caps' share of it.
# The micro lane with the mode-trace warm start (agents/policy/micro.py, mode_traces=1: every warm-start response
# begins with /nothink, /short or /long, drawn uniformly and independently of the task, so RL starts with no
# preference among modes). Prompt = the bare question (no instruction: the policy already writes markers). Caps in
# micro tokens, measured on 300 warm-start tasks: NoThink traces 11 tokens (max 12), Short 28 (max 29), Long 50
# (max 182); caps 16 / 40 / 192 (the lane's max_new_tokens) leave each mode's traces uncut.
MICRO_MODES = ("model=micro-countdown@mode_traces=1", "env=rlvr/Modes-v0", "env_kwargs.base=rlvr/Countdown-v0",
               'env_kwargs.instruction=""', "env_kwargs.pay_weights=false", "env_kwargs.modes.nothink.cap=16",
               "env_kwargs.modes.short.cap=40", "env_kwargs.modes.long.cap=192")

declare(Comparison(
    method="modes", baseline="grpo", metric="final_eval_tokens", direction="lower", accuracy_tolerance=0.05,
    overrides=MICRO_MODES,
    claim="modes chosen by the first token, learned in GRPO through mode-weighted reward (1.0 / 0.9 / 0.75) and hard "
          "per-mode caps, cut mean response length 41% at about equal accuracy (MATH500 0.782 vs 0.796; read: mean "
          "final accuracy within 0.05). Micro lane, mode-trace warm start; the baseline is GRPO on the same modes env "
          "and warm start (flat pay, caps in scoring only)"))
