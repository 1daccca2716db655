"""DRE, Dynamic Rollout Editing (seed 004). Stage: GroupTransform.

A correct rollout that keeps thinking after its answer has emerged gets an edited twin: the verified prefix up to the
answer's emergence, then a short close. The twin joins the original's group with a reward that ranks it above the
original, so the group advantage prefers stopping where the answer emerged over the unnecessary continuation, while
the prefix that reached the answer keeps its credit (both rows share it). For an original of reward r and L_orig
response tokens whose edit has L_edit < L_orig tokens:

    reward(edit)      = r + bonus + length_bonus * (1 - L_edit / L_orig)      (> r: ranked above the original)
    base_reward(edit) = base_reward(original)                                  (the env's reward: the edit is correct)

Our reading (the abstract gives the idea, not its details; every choice below is a hyper-parameter or documented):
- Countdown search traces (rows whose ``info["metadata"]`` has ``numbers`` and ``target``; the micro lane's format,
  ``agents.policy.countdown_traces``): the answer *emerged* at the first line that validly reaches the target (a ``!``
  leaf that ``check_trace`` finds valid: right arithmetic on the numbers its branch has left, every number used). The
  edit keeps the trace through that line and closes with ``<answer>EXPR</answer>``, EXPR built from that branch's moves
  (``countdown_traces.moves``, so it is written as the trace writer writes expressions) and checked with the task's
  verifier before it is added. ``unmarked_hits`` (off by default) also counts a valid leaf that reaches the
  target but is marked ``x`` (a hit the search walked past): the edit claims it (``!``) and answers.
- Other rows: the first answer pattern (``<answer>..</answer>`` or ``\\boxed{..}``) whose content equals the gold
  answer ``info["answer"]`` (after stripping ``$``, spaces, thousands commas, a trailing period; numbers compared as
  fractions) is where the answer emerged; the edit keeps the text through it. If a ``<think>`` block is still open
  there, the close is ``think_close`` followed by the answer pattern restated (the final answer then sits after the
  thinking, where parsers look); otherwise the answer itself ends the edit.
- An edit is added only when the original spent tokens after the emergence: the edit is strictly shorter in tokens,
  and (``only_continued``) the original's text after the cut is more than its own final answer (a Countdown
  original that went straight from the ``!`` line to an answer tag, however written, is not overthinking).
- Tokens: the edit keeps the original's token ids up to the last token boundary at or before the cut (so the prefix
  tokens, and their sampler log-probs and entropies, are exactly the original's), then the tokenized close, then the
  original's final special token if it ended with one (EOS: the edit ends; ``finish_reason`` "stop"). An edit whose
  decoded text is not prefix + close (an odd tokenizer) is not added.
- Log-probs (``logprobs``): "policy" (default) stores the current policy's log-probs of the whole edited row (the
  trainer's ``services.logprobs``, counted in its FLOPs) as its behaviour log-probs: at this stage the current
  policy is the one that sampled the original, so the prefix values equal the sampler's up to numerics and the close
  tokens get real values. The row stays on-policy (not ``off_policy``): the loss takes its ratio against the current
  policy (ratio 1 at the first PPO epoch; with ppo_epochs > 1 the trainer's old log-probs cover it like any row), and
  readers of behaviour log-probs (LamPO's sequence log-prob, replay drift) see one policy's numbers. "copy" keeps the
  prefix's sampler values and puts 0 ("unknown", the batch's convention) on the close tokens; "policy" without a bound
  service (unit tests) falls back to "copy". Entropies: the prefix's are copied, the close's are 0 (the service
  gives no entropies).
- The edit's info is a copy of the original's with ``"dre_edit": True`` and ``parsed_answer`` set to the edit's own
  answer; group id, prompt, weight and replay flag are the original's. At most ``max_edits`` edits per group, those
  saving the most tokens first (then row order). An edit is never edited again.
- Edits sit in the batch the loss and the train record see (``samples``, ``response_len_mean`` and ``accuracy``
  include them); they are not generated, so the rollout and token totals that compare methods' budgets do not count
  them. A reward shaper later in the step that rebuilds rewards from ``base_rewards`` would drop the bonus; shapers
  that add to ``rewards`` keep it.
- Malformed output (garbage, empty responses, unparseable traces, metadata that is not numbers) gets no edit, never
  an exception.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import torch

from agents.grpo.batch import GroupBatch
from agents.grpo.comparisons import Comparison, declare
from agents.grpo.registry import Component, register
from agents.policy.countdown_traces import Step, check_trace, moves
from rlvr_envs.extract import boxed_spans
from rlvr_envs.verifiers.countdown import verify as verify_countdown

LOGPROB_MODES = ("policy", "copy")
PATTERNS = ("answer_tag", "boxed")
_ATOM_PREC = 3  # an atom binds tighter than any operator (countdown_traces' convention for a task number)
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_NUMBER = re.compile(r"[-+]?\d{1,30}(?:\.\d{1,30})?(?:/\d{1,30})?")
_CLOSE_TAG = re.compile(r"</answer>", re.IGNORECASE)
_LONE_ANSWER = re.compile(r"<answer>[^<]*</answer>", re.IGNORECASE)
_TOKEN_FIELDS = ("behaviour_logprobs", "entropies", "old_logprobs", "ref_logprobs")


@dataclass(frozen=True)
class Emergence:
    """Where a response's answer emerged: keep ``text[:cut]``, then ``close``; ``answer`` is what the edit answers."""

    cut: int
    close: str
    answer: str


@dataclass(frozen=True)
class Edit:
    row: int
    response_ids: list[int]
    text: str
    keep: int  # original tokens kept (the prefix)
    answer: str
    saved: int  # L_orig - L_edit


# -- where the answer emerged --------------------------------------------------------------------------------------
def _expression(numbers: list[int], branch: list[Step]) -> str | None:
    """The expression a branch of trace steps builds, written as ``countdown_traces`` writes it; None if a step is
    not a move of the state its predecessors left."""
    state = [(n, str(n), _ATOM_PREC) for n in numbers]
    expr = None
    for step in branch:
        pair = sorted((step.a, step.b))
        for move, nxt in moves(state):
            if move.op == step.op and move.result == step.result and sorted((move.a, move.b)) == pair:
                state, expr = nxt, move.expr
                break
        else:
            return None
    return expr


def countdown_emergence(numbers: list[int], target: int, text: str, *, max_lines: int = 512,
                        unmarked_hits: bool = False) -> Emergence | None:
    """The first line of a search trace that validly reaches ``target`` and the close that answers with its branch.
    With ``unmarked_hits`` a valid leaf that reaches the target but is marked ``x`` (a hit the search walked past)
    counts too; the edit then rewrites that line's mark to ``!`` before answering."""
    check = check_trace(numbers, target, text, max_lines=max_lines)
    if not check.reached and not unmarked_hits:
        return None
    body = text.split("<answer>", 1)[0]
    pos, k = 0, 0
    branch: list[Step] = []  # branch[d]: the latest step at depth d (the path the next deeper line extends)
    for raw in body.splitlines(keepends=True)[:max_lines]:
        start, pos = pos, pos + len(raw)
        line = raw.splitlines()[0] if raw.splitlines() else ""  # the line as check_trace reads it
        if not line.strip() or not check_trace((), 0, line).steps:  # blank or malformed: check_trace skips it too
            continue
        if k >= len(check.steps):  # the two readings of the lines disagree: no emergence we can vouch for
            return None
        step = check.steps[k]
        k += 1
        branch = branch[: step.depth] + [step]
        hit = step.valid and step.result == target and (step.mark == "!" or (unmarked_hits and step.mark == "x"))
        if hit:
            expr = _expression(numbers, branch)
            if expr is None:
                return None
            answer = f"<answer>{expr}</answer>"
            if step.mark == "!":
                return Emergence(pos, ("" if raw.endswith(("\n", "\r")) else "\n") + answer, expr)
            marked = re.sub(r"x(\s*)$", r"!\1", line)  # the walked-past hit, claimed
            return Emergence(start, f"{marked}\n{answer}", expr)
    return None


def _normalize(answer: str) -> str:
    s = answer.strip().strip("$").strip()
    s = re.sub(r"(?<=\d),(?=\d{3}\b)", "", s)  # 1,000 -> 1000
    return "".join(s.split()).rstrip(".").lower()


def same_answer(answer: str, gold: str) -> bool:
    """Normalized string equality, or equal numbers (``0.5`` and ``1/2``)."""
    a, b = _normalize(answer), _normalize(gold)
    if not a or not b:
        return False
    if a == b:
        return True
    if not (_NUMBER.fullmatch(a) and _NUMBER.fullmatch(b)):  # plain numbers only (never "1e999999999")
        return False
    try:
        return Fraction(a) == Fraction(b)
    except (ValueError, ZeroDivisionError):
        return False


def answer_spans(text: str, patterns: tuple[str, ...] = PATTERNS) -> list[tuple[int, int, str]]:
    """``(start, end, content)`` of every answer pattern in ``text``, in order of appearance."""
    spans: list[tuple[int, int, str]] = []
    if "answer_tag" in patterns:
        # up to the last closing tag: unclosed opening tags after it would make the lazy scan quadratic
        ends = [m.end() for m in _CLOSE_TAG.finditer(text)]
        head = text[: ends[-1]] if ends else ""
        spans += [(m.start(), m.end(), m.group(1).strip()) for m in _ANSWER_TAG.finditer(head)]
    if "boxed" in patterns:
        spans += boxed_spans(text)
    return sorted(spans)


def text_emergence(text: str, gold: str, *, patterns: tuple[str, ...] = PATTERNS,
                   think_close: str = "\n</think>\n") -> Emergence | None:
    """The first answer pattern holding the gold answer; the close restates it after ``think_close`` when a
    ``<think>`` block is still open there."""
    for start, end, content in answer_spans(text, patterns):
        if same_answer(content, gold):
            head = text[:end]
            open_think = head.count("<think>") > head.count("</think>")
            return Emergence(end, think_close + text[start:end] if open_think else "", content)
    return None


def _squash(s: str) -> str:
    return "".join(s.split())


def continued(text: str, em: Emergence, countdown: bool) -> bool:
    """Whether the original wrote more after the emergence than its own final answer."""
    rest = _squash(text[em.cut:])
    if not rest or rest == _squash(em.close):
        return False
    return not (countdown and _LONE_ANSWER.fullmatch(rest))


# -- tokens --------------------------------------------------------------------------------------------------------
def _ends_special(tokenizer: Any, ids: list[int]) -> bool:
    specials = set(getattr(tokenizer, "all_special_ids", None) or ())
    specials.discard(getattr(tokenizer, "unk_token_id", None))
    return bool(ids) and ids[-1] in specials


def edited_ids(tokenizer: Any, ids: list[int], text: str, cut: int, close: str) -> tuple[list[int], str, int] | None:
    """``(edited ids, edited text, kept tokens)``: the original's tokens up to the last boundary at or before
    character ``cut``, the tokenized close, and the original's final special token (EOS) if it had one."""
    eos = [ids[-1]] if _ends_special(tokenizer, ids) else []
    n = len(ids) - len(eos)
    lo, hi = 0, n  # the largest k with len(decode(ids[:k])) <= cut (decoded prefixes grow with k)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(tokenizer.decode(ids[:mid], skip_special_tokens=True)) <= cut:
            lo = mid
        else:
            hi = mid - 1
    kept = tokenizer.decode(ids[:lo], skip_special_tokens=True)
    want = text[:cut] + close
    if not text[:cut].startswith(kept):
        return None
    tail = want[len(kept):]
    tail_ids = list(tokenizer(tail, add_special_tokens=False)["input_ids"]) if tail else []
    new = list(ids[:lo]) + tail_ids + eos
    new_text = tokenizer.decode(new, skip_special_tokens=True)
    return (new, new_text, lo) if new_text == want else None


# -- the component -------------------------------------------------------------------------------------------------
@register("dre", stage="group_transform")
class DynamicRolloutEditing(Component):
    def __init__(self, bonus: float = 0.0, length_bonus: float = 0.5, max_edits: int = 2, logprobs: str = "policy",
                 only_continued: bool = True, patterns: tuple[str, ...] | list[str] = PATTERNS,
                 think_close: str = "\n</think>\n", max_lines: int = 512, unmarked_hits: bool = False):
        if bonus < 0:
            raise ValueError(f"dre: bonus must be >= 0, got {bonus}")
        if length_bonus < 0:
            raise ValueError(f"dre: length_bonus must be >= 0, got {length_bonus}")
        if bonus + length_bonus <= 0:
            raise ValueError("dre: bonus + length_bonus must be > 0 (an edit must rank above its original), got "
                             f"bonus={bonus}, length_bonus={length_bonus}")
        if int(max_edits) != max_edits or max_edits < 1:
            raise ValueError(f"dre: max_edits must be an integer >= 1, got {max_edits}")
        if logprobs not in LOGPROB_MODES:
            raise ValueError(f"dre: logprobs must be one of {LOGPROB_MODES}, got {logprobs!r}")
        patterns = (patterns,) if isinstance(patterns, str) else tuple(patterns)
        if not patterns or any(p not in PATTERNS for p in patterns):
            raise ValueError(f"dre: patterns must be a non-empty subset of {PATTERNS}, got {list(patterns)}")
        if max_lines < 1:
            raise ValueError(f"dre: max_lines must be >= 1, got {max_lines}")
        self.bonus, self.length_bonus, self.max_edits = float(bonus), float(length_bonus), int(max_edits)
        self.logprobs, self.only_continued, self.patterns = logprobs, bool(only_continued), patterns
        self.think_close, self.max_lines = str(think_close), int(max_lines)
        self.unmarked_hits = bool(unmarked_hits)
        self.services: Any = None
        self.counts = {"edits": 0.0, "tokens_saved": 0.0, "correct_rows": 0.0}

    def bind(self, services: Any) -> None:
        self.services = services

    def reward_bonus(self, edit_len: int, orig_len: int) -> float:
        """bonus + length_bonus * (1 - L_edit / L_orig)."""
        return self.bonus + self.length_bonus * (1.0 - edit_len / max(1, orig_len))

    def emergence(self, text: str, info: dict[str, Any]) -> tuple[Emergence | None, bool]:
        """Where the answer emerged in a response (None: nowhere we can verify) and whether it is a Countdown trace."""
        meta = info.get("metadata") or {}
        if isinstance(meta, dict) and "numbers" in meta and "target" in meta:
            try:
                numbers, target = [int(n) for n in meta["numbers"]], int(meta["target"])
            except (TypeError, ValueError):
                return None, True
            em = countdown_emergence(numbers, target, text, max_lines=self.max_lines, unmarked_hits=self.unmarked_hits)
            if em is not None and not verify_countdown(numbers, target, text[:em.cut] + em.close).correct:
                em = None  # belt and braces: the close must answer correctly on its own
            return em, True
        gold = info.get("answer")
        if gold is None or not str(gold).strip():
            return None, False
        return text_emergence(text, str(gold), patterns=self.patterns, think_close=self.think_close), False

    def edit(self, batch: GroupBatch, row: int, tokenizer: Any) -> Edit | None:
        text, ids = batch.texts[row], list(batch.response_ids[row])
        info = batch.infos[row] if isinstance(batch.infos[row], dict) else {}
        if not ids or not isinstance(text, str) or info.get("dre_edit"):
            return None
        em, countdown = self.emergence(text, info)
        if em is None or (self.only_continued and not continued(text, em, countdown)):
            return None
        made = edited_ids(tokenizer, ids, text, em.cut, em.close)
        if made is None or len(made[0]) >= len(ids):
            return None
        new, new_text, keep = made
        return Edit(row, new, new_text, keep, em.answer, len(ids) - len(new))

    def __call__(self, batch: GroupBatch) -> GroupBatch:
        tokenizer = batch.tokenizer if batch.tokenizer is not None else getattr(self.services, "tokenizer", None)
        if tokenizer is None or not len(batch):
            return batch
        chosen: list[Edit] = []
        for rows in batch.groups().values():
            found = []
            for i in rows:
                if bool(batch.correct[i]):
                    self.counts["correct_rows"] += 1
                    e = self.edit(batch, i, tokenizer)
                    if e is not None:
                        found.append(e)
            found.sort(key=lambda e: (-e.saved, e.row))  # the most overthought first
            chosen += found[: self.max_edits]
        if not chosen:
            return batch
        chosen.sort(key=lambda e: e.row)
        part = batch.select([e.row for e in chosen])
        width = part.response_mask.shape[1]
        for j, e in enumerate(chosen):
            n = len(e.response_ids)
            orig_len = len(batch.response_ids[e.row])
            part.response_ids[j] = e.response_ids
            part.texts[j] = e.text
            part.infos[j] = {**batch.infos[e.row], "parsed_answer": e.answer, "dre_edit": True}
            if _ends_special(tokenizer, e.response_ids):
                part.finish_reasons[j] = "stop"
            part.response_mask[j] = torch.arange(width) < n
            for name in _TOKEN_FIELDS:  # prefix values are the original's; the close has none (0 = unknown)
                values = getattr(part, name)
                if values is not None:
                    values[j, e.keep:] = 0
            if part.advantages is not None and part.advantages.dim() == 2:
                part.advantages[j, e.keep:] = 0
            part.rewards[j] = part.rewards[j] + self.reward_bonus(n, orig_len)
            part.correct[j] = True
            self.counts["edits"] += 1
            self.counts["tokens_saved"] += e.saved
        service = getattr(self.services, "logprobs", None)
        if self.logprobs == "policy" and service is not None:
            lp = service(part, list(range(len(part))))
            part.behaviour_logprobs = torch.zeros_like(part.behaviour_logprobs)
            part.behaviour_logprobs[:, : lp.shape[1]] = lp.to(part.behaviour_logprobs.dtype)
            part.behaviour_logprobs = part.behaviour_logprobs * part.response_mask
        return GroupBatch.concat([batch, part])

    def metrics(self) -> dict[str, float]:
        out = {"edits": self.counts["edits"], "tokens_saved": self.counts["tokens_saved"],
               "edit_rate": self.counts["edits"] / max(1.0, self.counts["correct_rows"])}
        for k in self.counts:  # this step's counts (refill rounds included); then start the next step's
            self.counts[k] = 0.0
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"counts": dict(self.counts)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.counts = {k: float(v) for k, v in state["counts"].items()}


declare(Comparison(
    method="dre", baseline="grpo", metric="final_eval_tokens", direction="lower", accuracy_tolerance=0.05,
    known_result=(
        "micro lane, seeds 0-2 (commit 05cc971 runs): final eval length 28.19 vs GRPO 28.14 tokens, diff +0.05 [95% "
        "-0.17, +0.28] at mean@4 0.510 vs 0.510: not reproduced, because DRE's trigger almost never occurs here: the "
        "micro policy writes its answer right after the first valid '!' line, so in 180 steps x 256 rollouts it made "
        "1 edit (seed 0); seeds 1 and 2 trained exactly as GRPO did (identical evals)"),
    claim="DRE (edited twins of correct rollouts that kept thinking after the answer emerged, ranked above their "
          "originals) curbs overthinking: shorter responses at about equal accuracy (read: mean final accuracy "
          "within 0.05). The abstract gives no figure ('experiments across diverse tasks show the effectiveness of "
          "DRE')"))
