"""``smollm2-modes``: SmolLM2 taught to begin every response with a ``rlvr/Modes-v0`` marker (a supervised warm start).

SmolLM2-135M-Instruct never writes a mode marker (0 of 64 sampled responses, measured before the smollm2 modes
comparison was declared), so on the plain model every response is scored as Long and a modes comparison tests only
the generation cap. This warm start makes mode choice something RL can act on, as the micro lane's ``mode_traces=1``
does for the micro policy:

1. Tasks come from the lane's base env (``rlvr/Arithmetic-v0``) on a ``data_seed_base`` stream of their own (the
   smollm2 lane trains on stream 0 and evaluates on stream 1), wrapped in the modes env with the lane's caps, so each
   prompt is exactly what RL shows (the instruction listing the modes, through the policy's chat template).
2. Each task gets one response in a mode assigned independently of the task, every mode once in each block of three
   tasks (``ModeTraceTeacher``), so the demonstrations show no preference among modes: NoThink is the marker and the boxed answer; Short adds the equation
   (the env's gold solution); Long works each operation out by tens and units. Every response, EOS included, must fit
   its mode's cap: one that does not is an error naming the cap, never a silently cut demonstration.
3. Supervised fine-tuning of every weight on the response tokens (``agents.grpo.sft``), then saved under
   ``$RLVR_CACHE_DIR/models/smollm2-modes-<key>/``, where ``key`` hashes the config and the source of the code that
   turns it into weights: change either and the next load rebuilds.

Our reading: the paper (seed 004) starts its modes from a model that already writes them; the traces, the uniform
mode mix and the SFT budget here are our choices, and all of them are fields of ``ModesWarmStart``
(``smollm2-modes@tasks=96,lr=2e-5`` overrides them; ``base=tiny`` builds a test-sized one).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

NAME = "smollm2-modes"


@dataclass(frozen=True)
class ModesWarmStart:
    base: str = "smollm2"  # the model fine-tuned ("tiny" for tests)
    # the modes env: the smollm2 modes comparison's settings must match (agents/methods/modes.py, SMOLLM2_MODES)
    env_base: str = "rlvr/Arithmetic-v0"
    nothink_cap: int = 16
    short_cap: int = 32
    long_cap: int = 48
    data_seed_base: int = 7
    # supervised fine-tuning
    tasks: int = 192
    epochs: int = 2
    lr: float = 5e-5
    batch_size: int = 8
    seed: int = 0

    def env_kwargs(self) -> dict[str, Any]:
        """``rlvr/Modes-v0`` kwargs (the base env's training distribution, the caps) without the task stream."""
        return {"base": self.env_base, "pay_weights": False,
                "modes": {"nothink": {"cap": self.nothink_cap}, "short": {"cap": self.short_cap},
                          "long": {"cap": self.long_cap}}}

    def key(self) -> str:
        """Hash of the config and of the code that turns it into weights."""
        from agents.grpo import sft
        from rlvr_envs import modes
        from rlvr_envs.tasks import arithmetic

        h = hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode())
        for module in (sft, modes, arithmetic, inspect.getmodule(ModesWarmStart)):
            h.update(inspect.getsource(module).encode())
        h.update(f"torch={torch.__version__.split('+')[0]}".encode())
        return h.hexdigest()[:16]


def long_steps(operands: Sequence[int], operators: Sequence[str]) -> str:
    """An operation chain worked out left to right, each step by tens then units: ``48 - 29`` ->
    ``48 - 20 = 28, 28 - 9 = 19``; ``23 + 17`` -> ``20 + 10 = 30, 3 + 7 = 10, 30 + 10 = 40``."""
    if len(operands) != len(operators) + 1:
        raise ValueError(f"{len(operands)} operands for {len(operators)} operators")
    acc, parts = int(operands[0]), []
    for op, x in zip(operators, operands[1:]):
        x = int(x)
        if op not in "+-":
            raise ValueError(f"long traces are written for + and - only, got {op!r}")
        if x < 0 or acc < 0 or (op == "-" and (x < 10 or x % 10 == 0)):
            # one step: the tens/units split is written for non-negative numbers, and a subtraction of a one-digit
            # number or of whole tens has nothing to split
            result = acc + x if op == "+" else acc - x
            parts.append(f"{acc} {op} {x if x >= 0 else f'({x})'} = {result}")
        elif op == "+":
            tens, units = acc // 10 * 10 + x // 10 * 10, acc % 10 + x % 10
            parts.append(f"{acc // 10 * 10} + {x // 10 * 10} = {tens}, {acc % 10} + {x % 10} = {units}, "
                         f"{tens} + {units} = {tens + units}")
            result = tens + units
        else:
            mid = acc - x // 10 * 10
            result = mid - x % 10
            parts.append(f"{acc} - {x // 10 * 10} = {mid}, {mid} - {x % 10} = {result}")
        acc = result
    return ", ".join(parts)


class ModeTraceTeacher:
    """Writes each modes-env prompt's response in one of the env's modes, chosen from ``(seed, task index)`` only (see
    ``mode_of``) so a demonstration does not depend on batching (``act(observations, infos)`` as a
    ``agents.grpo.sft.TeacherAgent`` expects)."""

    def __init__(self, env: Any, *, seed: int = 0):
        from rlvr_envs.modes import ModesWrapper

        wrapper = env
        while not isinstance(wrapper, ModesWrapper):
            if not hasattr(wrapper, "env"):
                raise ValueError(f"ModeTraceTeacher needs an rlvr/Modes-v0 env, got {type(env.unwrapped).__name__}")
            wrapper = wrapper.env
        self.table, self.source, self.seed = wrapper.table, wrapper.unwrapped.source, int(seed)

    def mode_of(self, index: int) -> str:
        """Each block of ``len(modes)`` consecutive tasks holds every mode once, in a seeded order: the mix is exactly
        uniform over whole blocks, not only in expectation."""
        names = self.table.names
        order = np.random.default_rng((self.seed, index // len(names))).permutation(len(names))
        return names[int(order[index % len(names)])]

    def write(self, index: int, mode: str) -> str:
        from rlvr_envs.tasks.arithmetic import gold_response

        task = self.source.task(index)
        answer = f"The answer is \\boxed{{{task.answer}}}."
        if mode == "nothink":
            body = f"\\boxed{{{task.answer}}}"
        elif mode == "short":
            body = gold_response(task)
        elif mode == "long":
            body = f"{long_steps(task.metadata['operands'], task.metadata['operators'])}. {answer}"
        else:
            raise ValueError(f"no trace is written for mode {mode!r} (nothink, short, long)")
        return f"{self.table.mode(mode).marker} {body}"

    def act(self, observations: list[str], infos: list[dict[str, Any]]) -> list[str]:
        out = []
        for info in infos:
            index = self.source.index_of(info["task_id"])
            out.append(self.write(index, self.mode_of(index)))
        return out


def check_caps(policy: Any, episodes: Sequence[Any], table: Any) -> dict[str, int]:
    """Every demonstration (its response tokens, EOS included) within its mode's cap; returns the mode counts."""
    counts = {name: 0 for name in table.names}
    for ep in episodes:
        text = policy.tokenizer.decode(ep.ids, skip_special_tokens=True)
        mode, found = table.resolve(text)
        if mode is None or not found:
            raise ValueError(f"a demonstration has no mode marker: {text[:80]!r}")
        if len(ep.ids) > mode.cap:
            raise ValueError(f"a {mode.name} demonstration takes {len(ep.ids)} tokens with EOS, over its cap of "
                             f"{mode.cap}: raise {mode.name}_cap or shorten the trace ({text!r})")
        counts[mode.name] += 1
    return counts


def warm_start(cfg: ModesWarmStart, *, log: Any = None) -> tuple[Any, dict[str, Any]]:
    """Fine-tune ``cfg.base`` on mode-marked demonstrations; returns (policy, report)."""
    from agents.grpo.sft import demonstrations, sft
    from agents.policy.models import load_policy
    from rlvr_envs.modes import make_env

    t0 = time.perf_counter()
    if cfg.tasks < 1:
        raise ValueError(f"tasks must be >= 1, got {cfg.tasks}")
    policy = load_policy(cfg.base, seed=cfg.seed)
    env = make_env(**cfg.env_kwargs(), seed_base=cfg.data_seed_base)
    teacher = ModeTraceTeacher(env, seed=cfg.seed)
    episodes, stats = demonstrations(policy, env, cfg.tasks, seed=cfg.seed, teacher=teacher)
    if len(episodes) != cfg.tasks:  # every trace is correct by construction: a loss here is a bug, not noise
        raise RuntimeError(f"{cfg.tasks - len(episodes)} of {cfg.tasks} demonstrations were scored wrong")
    counts = check_caps(policy, episodes, teacher.table)
    losses = sft(policy, episodes, epochs=cfg.epochs, lr=cfg.lr, batch_size=cfg.batch_size, seed=cfg.seed, log=log)
    report = {"config": asdict(cfg), "key": cfg.key(), "wall_s": round(time.perf_counter() - t0, 1),
              "demonstrations": stats, "mode_counts": counts, "loss_first": losses[0], "loss_last": losses[-1],
              "losses": [round(x, 4) for x in losses], "threads": torch.get_num_threads()}
    return policy, report


def warmstart_dir(cfg: ModesWarmStart) -> Path:
    from agents.policy.models import cache_dir

    return cache_dir() / "models" / f"{NAME}-{cfg.key()}"


def ensure_modes_warmstart(cfg: ModesWarmStart | None = None, *, log: Any = None) -> Path:
    """The cached warm-started model directory for ``cfg``, training it first if absent (file-locked, atomic)."""
    from agents.policy.models import cached_build

    cfg = cfg or ModesWarmStart()

    def build() -> tuple[Any, Any, dict[str, Any]]:
        policy, report = warm_start(cfg, log=log)
        return policy.model, policy.tokenizer, report

    return cached_build(warmstart_dir(cfg), build)


def parse_name(name: str) -> ModesWarmStart | None:
    """``smollm2-modes`` or ``smollm2-modes@key=value,...`` (config overrides) -> config; another name -> None."""
    from agents.policy.models import parse_spec

    return parse_spec(name, NAME, ModesWarmStart())
