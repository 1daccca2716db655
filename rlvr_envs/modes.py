"""``rlvr/Modes-v0``: NoThink / Short / Long response modes around any single-turn text env (seed 004).

The paper lets a reasoning model choose, as the first token of its response, how much to think: NoThink (answer at
once), Short (brief reasoning) or Long (extended reasoning). The choice is learned inside GRPO with no router, through
a reward that makes each mode worthwhile at a different length and hard per-mode token caps that keep the modes
distinct (MATH500 0.782 vs 0.796 for the base model at 41% fewer tokens; the modes do not collapse, and the brief
modes end up more accurate than Long: the policy routes easy problems to them).

``ModesWrapper`` scores a response in four steps:

1. **marker**: the response's first whitespace-separated word (leading whitespace allowed) must equal one mode's
   marker exactly (``ModeTable.parse``; ``/nothink``, ``/short``, ``/long`` by default; ``"/short:"`` is not a marker).
   A response without one is scored as the mode named by ``no_marker`` (default ``"long"``), or, with
   ``no_marker="error"``, gets reward 0, ``correct=False`` and ``format_ok=False`` (a format error).
2. **cap**: the response, marker included, is cut after ``cap`` units of its mode: tokens of ``tokenizer`` when one is
   given (a Hugging Face tokenizer object, or a name/path ``AutoTokenizer`` loads), else whitespace-separated words.
   Text past the cap is never scored.
3. **score**: the base env scores the cut response less its marker (and the whitespace after it): base reward
   ``r_b``, base verdict ``c_b``. ``info["correct"]`` is ``c_b`` (accuracy is the capped response's).
4. **pay**: ``r = w_mode * r_b`` (``pay_weights=True``); ``pay_weights=False`` returns ``r_b`` and leaves the weight
   to a GRPO RewardShaper (``agents/methods/modes.py``: ``mode_reward``), so that a comparison whose env settings
   apply to both runs pays the weights to the method only.

``info`` adds ``mode`` (the mode scored, ``None`` for a format error), ``marker_found``, ``cap``, ``capped`` (text was
cut), ``response_len`` (the response's length before the cut, in ``len_unit``: "tokens" or "words"), ``weight``,
``base_reward`` and ``base_correct``. ``reset`` appends an instruction listing the modes to the last user message
(``instruction``, a template with ``{prompt}`` and ``{modes}``; ``None`` or ``""`` leaves the prompt unchanged, for
a policy warm-started to emit markers).

Our reading (the abstract gives neither weights nor caps; every choice is a keyword argument):
- weights 1.0 / 0.9 / 0.75 go to NoThink / Short / Long: a correct answer pays more the briefer its mode, so Long is
  worth choosing only where it is the mode that solves the problem (p_long * 0.75 > p_short * 0.9 and > p_nothink);
  the reverse order would make Long dominant wherever it is at least as accurate (collapse to Long).
- the weight scales the base env's reward (its correctness on exact-match envs; a format bonus or partial credit of
  the base env is scaled with it).
- default caps 16 / 64 / 256 (a 1 : 4 : 16 ladder); a lane sets its own (``modes={"nothink": {"cap": 12}}`` merges
  into the defaults field by field).
- word caps are the default because an env has no policy tokenizer; for whitespace-splitting tokenizers (BPE, the
  micro lane's) a response has at most as many words as tokens, so a response the GRPO controller ``mode_caps``
  already cut at ``cap`` tokens is never cut again here: the trained tokens are exactly the scored ones.

``mode_report(results)`` reads a harness results file of this env and reports the mode mix, per-mode accuracy and
mean length (``python -m rlvr_envs.modes results.json``).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym

from rlvr_envs.core import WRONG, TextEnv, render_messages

MODES_ID = "rlvr/Modes-v0"
ERROR = "error"  # no_marker value: an unmarked response is a format error (reward 0)
UNMARKED = "unmarked"  # the report's bucket for responses without a marker
DEFAULT_INSTRUCTION = "{prompt}\n\nBegin your response with one mode token: {modes}."
_FIELDS = ("marker", "cap", "weight", "description")
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_FIRST_WORD = re.compile(r"\s*(\S+)")
_WORD = re.compile(r"\S+")


@dataclass(frozen=True)
class Mode:
    name: str
    marker: str  # the response's first word selects the mode
    cap: int  # the most units (tokens or words) of a response in this mode, marker included
    weight: float  # a correct answer's pay in this mode
    description: str = ""  # what the instruction says the mode is for


DEFAULT_MODES: dict[str, Mode] = {
    "nothink": Mode("nothink", "/nothink", 16, 1.0, "answer at once, no reasoning"),
    "short": Mode("short", "/short", 64, 0.9, "brief reasoning"),
    "long": Mode("long", "/long", 256, 0.75, "extended reasoning"),
}


def merge_modes(*layers: Mapping[str, Mapping[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """Mode overrides layered field by field (later layers win): ``{"short": {"cap": 32}}`` on ``{"short":
    {"weight": 0.8}}`` gives ``{"short": {"weight": 0.8, "cap": 32}}``."""
    out: dict[str, dict[str, Any]] = {}
    for layer in layers:
        if layer is None:
            continue
        if not isinstance(layer, Mapping):
            raise ValueError(f"modes must be a table of mode name -> fields, got {type(layer).__name__}")
        for name, fields in layer.items():
            if not isinstance(fields, Mapping):
                raise ValueError(f"modes.{name} must be a table of {_FIELDS}, got {fields!r}")
            out[str(name)] = {**out.get(str(name), {}), **dict(fields)}
    return out


@dataclass(frozen=True)
class ModeTable:
    """The modes (in order), how an unmarked response is scored, and the marker parser every consumer shares (the
    env, the GRPO controller and reward shaper, the results report), so all of them read a response alike."""

    modes: tuple[Mode, ...]
    no_marker: str = "long"

    @classmethod
    def build(cls, modes: Mapping[str, Mapping[str, Any]] | None = None, no_marker: str = "long") -> ModeTable:
        """The default modes with ``modes`` merged in field by field; a new name adds a mode (all fields needed)."""
        table: dict[str, Mode] = dict(DEFAULT_MODES)
        for name, fields in merge_modes(modes).items():
            unknown = set(fields) - set(_FIELDS)
            if unknown:
                raise ValueError(f"modes.{name}: unknown field(s) {sorted(unknown)}; fields: {', '.join(_FIELDS)}")
            if name in table:
                base = table[name]
                table[name] = Mode(name, **{f: fields.get(f, getattr(base, f)) for f in _FIELDS})
            else:
                missing = [f for f in ("marker", "cap", "weight") if f not in fields]
                if missing:
                    raise ValueError(f"modes.{name}: a new mode needs {missing}")
                table[name] = Mode(name, **{"description": "", **fields})
        out = cls(tuple(table.values()), str(no_marker))
        out.validate()
        return out

    def validate(self) -> None:
        markers: set[str] = set()
        for m in self.modes:
            where = f"modes.{m.name}"
            if not _NAME.match(m.name) or m.name in (ERROR, UNMARKED):
                raise ValueError(f"{where}: a mode name must match [a-z][a-z0-9_]* and not be {ERROR!r} or "
                                 f"{UNMARKED!r} (it names metrics)")
            if not isinstance(m.marker, str) or not m.marker or _WORD.fullmatch(m.marker) is None:
                raise ValueError(f"{where}.marker must be one non-empty word without whitespace, got {m.marker!r}")
            if m.marker in markers:
                raise ValueError(f"{where}.marker {m.marker!r} is used by another mode")
            markers.add(m.marker)
            if isinstance(m.cap, bool) or not isinstance(m.cap, int) or m.cap < 1:
                raise ValueError(f"{where}.cap must be an integer >= 1, got {m.cap!r}")
            if isinstance(m.weight, bool) or not isinstance(m.weight, (int, float)) or not math.isfinite(m.weight) \
                    or m.weight < 0:
                raise ValueError(f"{where}.weight must be a finite number >= 0, got {m.weight!r}")
            if not isinstance(m.description, str):
                raise ValueError(f"{where}.description must be a string, got {m.description!r}")
        if self.no_marker != ERROR and self.no_marker not in self.names:
            raise ValueError(f"no_marker must be a mode name ({', '.join(self.names)}) or {ERROR!r}, "
                             f"got {self.no_marker!r}")

    @property
    def names(self) -> list[str]:
        return [m.name for m in self.modes]

    def mode(self, name: str) -> Mode:
        for m in self.modes:
            if m.name == name:
                return m
        raise KeyError(f"no mode {name!r}; modes: {', '.join(self.names)}")

    def parse(self, text: str) -> tuple[Mode | None, int]:
        """The mode whose marker is ``text``'s first word, and the index just past the marker (``(None, 0)``: no
        marker). Reads only the first word, so it is linear in the leading whitespace and that word."""
        m = _FIRST_WORD.match(text) if isinstance(text, str) else None
        if m is None:
            return None, 0
        word = m.group(1)
        for mode in self.modes:
            if word == mode.marker:
                return mode, m.end(1)
        return None, 0

    def resolve(self, text: str) -> tuple[Mode | None, bool]:
        """The mode a response is scored in (``None``: a format error under ``no_marker="error"``) and whether it
        carried a marker."""
        mode, _ = self.parse(text)
        if mode is not None:
            return mode, True
        return (None if self.no_marker == ERROR else self.mode(self.no_marker)), False

    def weight(self, text: str) -> float:
        """What a correct response's reward is multiplied by: its mode's weight (0 for a format error)."""
        mode, _ = self.resolve(text)
        return 0.0 if mode is None else float(mode.weight)

    def to_kwargs(self) -> dict[str, Any]:
        """The env keyword arguments that rebuild this table."""
        return {"modes": {m.name: {f: getattr(m, f) for f in _FIELDS} for m in self.modes},
                "no_marker": self.no_marker}


def cut_words(text: str, cap: int) -> tuple[str, int]:
    """``text`` up to the end of its ``cap``-th whitespace-separated word, and its total word count."""
    end, n = len(text), 0
    for n, m in enumerate(_WORD.finditer(text), 1):
        if n == cap:
            end = m.end()
    return (text[:end] if n > cap else text), n


def cut_tokens(text: str, cap: int, tokenizer: Any) -> tuple[str, int]:
    """``text`` up to the end of its ``cap``-th token of ``tokenizer`` (no special tokens), and its token count.
    Character offsets where the tokenizer reports them (fast tokenizers), else the decoded first ``cap`` tokens."""
    try:
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        offsets = enc["offset_mapping"]
    except (NotImplementedError, TypeError, KeyError, ValueError):
        offsets = None
    if offsets is not None:
        if len(offsets) <= cap:
            return text, len(offsets)
        return text[: offsets[cap - 1][1]], len(offsets)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) <= cap:
        return text, len(ids)
    return tokenizer.decode(ids[:cap], skip_special_tokens=True), len(ids)


def _load_tokenizer(spec: Any) -> Any:
    if spec is None or not isinstance(spec, str):
        return spec
    from rlvr_envs.extras import require

    # heavy: imported only when token caps name a tokenizer
    transformers = require("transformers", "agents", f"rlvr/Modes-v0 with tokenizer={spec!r}")
    return transformers.AutoTokenizer.from_pretrained(spec)


class ModesWrapper(gym.Wrapper):
    """Mode markers, per-mode caps and mode-weighted pay around a single-turn text env (see the module docstring)."""

    def __init__(self, env: gym.Env, *, modes: Mapping[str, Mapping[str, Any]] | None = None,
                 no_marker: str = "long", instruction: str | None = DEFAULT_INSTRUCTION, pay_weights: bool = True,
                 tokenizer: Any = None):
        if not isinstance(env.unwrapped, TextEnv):
            raise ValueError(f"the modes wrapper needs a single-turn text env (a TextEnv), got "
                             f"{type(env.unwrapped).__name__}")
        super().__init__(env)
        self.table = ModeTable.build(modes, no_marker)
        if instruction == "":  # what `--set env_kwargs.instruction=""` can say (TOML has no null)
            instruction = None
        if instruction is not None:
            if not isinstance(instruction, str) or "{prompt}" not in instruction:
                raise ValueError(f"instruction must be a template containing '{{prompt}}' (or None), "
                                 f"got {instruction!r}")
            try:
                instruction.format(prompt="", modes="")
            except (KeyError, IndexError, ValueError) as exc:
                raise ValueError(f"instruction: only {{prompt}} and {{modes}} may be used ({exc!r})") from None
        if not isinstance(pay_weights, bool):
            raise ValueError(f"pay_weights must be true or false, got {pay_weights!r}")
        self.instruction, self.pay_weights = instruction, pay_weights
        self.tokenizer = _load_tokenizer(tokenizer)
        self.len_unit = "tokens" if self.tokenizer is not None else "words"

    def modes_text(self) -> str:
        parts = [f"{m.marker} ({m.description})" if m.description else m.marker for m in self.table.modes]
        return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " or " + parts[-1]

    def with_instruction(self, messages: Sequence[Mapping[str, str]]) -> list[dict[str, str]]:
        out = [dict(m) for m in messages]
        if self.instruction is None:
            return out
        users = [i for i, m in enumerate(out) if m.get("role") == "user"]
        if not users:
            out.append({"role": "user", "content": ""})
            users = [len(out) - 1]
        i = users[-1]
        out[i]["content"] = self.instruction.format(prompt=out[i]["content"], modes=self.modes_text())
        return out

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, options=options)
        if self.instruction is None:
            return obs, info
        messages = self.with_instruction(info["messages"])
        return render_messages(messages), {**info, "messages": messages}

    def cut(self, text: str, cap: int) -> tuple[str, int]:
        return cut_tokens(text, cap, self.tokenizer) if self.tokenizer is not None else cut_words(text, cap)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if not isinstance(action, str):
            raise TypeError(f"action must be the response text (str), got {type(action).__name__}")
        mode, found = self.table.resolve(action)
        if mode is None:  # no marker under no_marker="error": the base env still closes the episode and reports
            obs, base_reward, terminated, truncated, info = self.env.step(action)
            _, length = self.cut(action, 1)
            extra = {"correct": False, "verdict": WRONG, "format_ok": False, "cap": None, "capped": False,
                     "weight": 0.0, "error": "no mode marker at the start of the response"}
            reward = 0.0
        else:
            cut, length = self.cut(action, mode.cap)
            _, end = self.table.parse(action)  # a cap inside the marker leaves nothing to score
            body = cut[end:].lstrip() if found else cut
            obs, base_reward, terminated, truncated, info = self.env.step(body)
            reward = mode.weight * float(base_reward) if self.pay_weights else float(base_reward)
            extra = {"cap": mode.cap, "capped": length > mode.cap, "weight": float(mode.weight)}
        if not (terminated or truncated):
            raise NotImplementedError("the modes wrapper scores one response per episode; the base env left the "
                                      "episode open (a multi-turn env)")
        info = {**info, "base_reward": float(base_reward), "base_correct": bool(info.get("correct", False)),
                "mode": None if mode is None else mode.name, "marker_found": found, "response_len": length,
                "len_unit": self.len_unit, **extra}
        return obs, float(reward), terminated, truncated, info


def make_env(*, base: str = "rlvr/Arithmetic-v0", base_kwargs: Mapping[str, Any] | None = None,
             modes: Mapping[str, Mapping[str, Any]] | None = None, no_marker: str = "long",
             instruction: str | None = DEFAULT_INSTRUCTION, pay_weights: bool = True, tokenizer: Any = None,
             **extra: Any) -> ModesWrapper:
    """``gym.make(base, **base_kwargs, **extra)`` wrapped in ``ModesWrapper``. Keyword arguments the wrapper does not
    know go to the base env (so a trainer's held-out ``seed_base=1`` reaches the task source)."""
    if not isinstance(base, str) or base.split(":")[-1] == MODES_ID:
        raise ValueError(f"base must be another env id, got {base!r}")
    import rlvr_envs  # noqa: F401  (registers the base ids)

    env = gym.make(base, **{**dict(base_kwargs or {}), **extra})
    return ModesWrapper(env, modes=modes, no_marker=no_marker, instruction=instruction, pay_weights=pay_weights,
                        tokenizer=tokenizer)


def is_modes_env(env_id: str) -> bool:
    return isinstance(env_id, str) and env_id.split(":")[-1] == MODES_ID


# -- reading results ---------------------------------------------------------------------------------------------
def mode_stats(texts: Sequence[str], correct: Sequence[bool], lengths: Sequence[float | None],
               table: ModeTable) -> dict[str, Any]:
    """Mode mix (share of each marker, and of unmarked responses), per-mode accuracy and mean length. A mode no
    response chose has share 0 and no accuracy or length entry (an empty mean is not 0)."""
    buckets: dict[str, list[int]] = {name: [] for name in (*table.names, UNMARKED)}
    for i, text in enumerate(texts):
        mode, _ = table.parse(text)
        buckets[UNMARKED if mode is None else mode.name].append(i)
    n = len(texts)
    out: dict[str, Any] = {"n": n, "share": {}, "accuracy": {}, "len_mean": {}, "count": {}}
    for name, rows in buckets.items():
        out["count"][name] = len(rows)
        out["share"][name] = len(rows) / n if n else 0.0
        if rows:
            out["accuracy"][name] = sum(bool(correct[i]) for i in rows) / len(rows)
            known = [float(lengths[i]) for i in rows if lengths[i] is not None]
            if known:
                out["len_mean"][name] = sum(known) / len(known)
    out["no_marker_rate"] = out["share"][UNMARKED]
    return out


def mode_report(results: str | Path | Mapping[str, Any], **table_kwargs: Any) -> dict[str, Any]:
    """Mode mix, per-mode accuracy and mean length of a harness results file (or its loaded document) of
    ``rlvr/Modes-v0``: the mode table comes from the run's ``env_kwargs`` (``table_kwargs``, ``modes=`` /
    ``no_marker=``, for results of another env whose responses carry markers). Lengths are the records' token counts
    where the agent reported them, else whitespace words (``length_unit`` says which)."""
    doc = json.loads(Path(results).read_text()) if isinstance(results, (str, Path)) else dict(results)
    cfg = doc.get("config") or {}
    env_kwargs = cfg.get("env_kwargs") or {}
    if not table_kwargs and not is_modes_env(str(cfg.get("env_id", ""))):
        raise ValueError(f"{cfg.get('env_id')!r} is not {MODES_ID}; pass modes= / no_marker= to read its markers")
    kw = {"modes": env_kwargs.get("modes"), "no_marker": env_kwargs.get("no_marker", "long"), **table_kwargs}
    table = ModeTable.build(**kw)
    records = list(doc.get("records") or [])
    tokens = [r.get("tokens") for r in records]
    unit = "tokens" if records and all(t is not None for t in tokens) else "words"
    lengths = tokens if unit == "tokens" else [len(r["response"].split()) for r in records]
    out = mode_stats([r["response"] for r in records], [bool(r["correct"]) for r in records], lengths, table)
    return {"env_id": cfg.get("env_id"), "length_unit": unit, **out}


def main(argv: list[str] | None = None) -> int:
    """``python -m rlvr_envs.modes RESULTS.json``: print the mode report of a harness results file."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(main.__doc__)
        return 2
    print(json.dumps(mode_report(args[0]), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
