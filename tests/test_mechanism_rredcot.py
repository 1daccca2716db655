"""RREDCoT's mechanism on constructed groups (a fake value model, no training): (a) credit stays tied to the outcome,
so no segment of an all-wrong group is paid and no segment of an all-right group is charged; (b) the value scores any
answer the Countdown verifier accepts, so a trace that found a different valid expression than the task's gold one is
valued as correct (its reasoning raises V), where the gold-only value made its last line look like a step away."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from agents.grpo.batch import GroupBatch, Sample
from agents.grpo.registry import build
from agents.methods.rredcot import verified_solutions
from agents.policy.models import tiny_tokenizer
from rlvr_envs.verifiers.countdown import verify

TOK = tiny_tokenizer()  # character level
PROMPT = 7
TASK = {"metadata": {"numbers": [1, 2, 3], "target": 6, "solution": "1+2+3"}, "answer": "6"}
GOLD, ALT, WRONG = "<answer>1+2+3</answer>", "<answer>2*3*1</answer>", "<answer>2*3+1</answer>"
LINE1 = "2*3=6 [1 6]\n"
ROW_ALT = LINE1 + " 6*1=6 !\n" + ALT  # correct, by another expression than the gold one
ROW_WRONG = LINE1 + " 6+1=7 x\n" + WRONG


def ids(text: str) -> list[int]:
    return TOK(text, add_special_tokens=False)["input_ids"]


def make_batch(rows: list[tuple[str, str, float]]) -> GroupBatch:
    samples = [Sample(group_id=f"1:0:{g}:{g}", prompt="p", prompt_ids=[PROMPT], response_ids=ids(text), text=text,
                      reward=r, correct=r > 0, info=TASK) for g, text, r in rows]
    return GroupBatch.from_samples(samples, step=1, tokenizer=TOK)


class FakeModel:
    """The log-prob service: log p(continuation | prefix) from a table, else a fixed function of the two lengths."""

    def __init__(self, table: dict[tuple[str, str], float]):
        self.table, self.seen = table, set()

    def logprobs(self, part: GroupBatch, rows=None) -> torch.Tensor:
        out = torch.zeros_like(part.behaviour_logprobs)
        for r in range(len(part)):
            assert part.prompt_ids[r][0] == PROMPT
            prefix, cont = TOK.decode(part.prompt_ids[r][1:]), TOK.decode(part.response_ids[r])
            self.seen.add(cont)
            out[r, 0] = self.table.get((prefix, cont), -float((len(prefix) * 7 + len(cont)) % 5) - 0.5)
        return out


def estimator(model: FakeModel, **params) -> object:
    est = build("advantage", "rredcot", {"beta": 1.0, **params})
    est.bind(SimpleNamespace(logprobs=model.logprobs, tokenizer=TOK))
    return est


# The model after each prefix: before the search it expects neither answer; after the first line it leans to the
# product; at the end of the solved trace it is sure to write its own expression "2*3*1", not the gold "1+2+3".
TABLE = {("", GOLD): -4.0, ("", ALT): -4.0, (LINE1, GOLD): -5.0, (LINE1, ALT): -2.0,
         (LINE1 + " 6*1=6 !\n", GOLD): -8.0, (LINE1 + " 6*1=6 !\n", ALT): -0.05,
         (LINE1 + " 6+1=7 x\n", GOLD): -6.0, (LINE1 + " 6+1=7 x\n", ALT): -6.0}


def test_a_different_valid_expression_is_valued_as_correct():
    b = make_batch([("g", ROW_ALT, 1.0), ("g", ROW_WRONG, 0.0)])
    assert verify([1, 2, 3], 6, ROW_ALT).correct and not verify([1, 2, 3], 6, ROW_WRONG).correct
    assert verified_solutions([TASK, TASK], [ROW_ALT, ROW_WRONG]) == ["2*3*1"]  # the wrong "2*3+1" is not an answer
    model = FakeModel(TABLE)
    est = estimator(model)
    bounds, answers = est.plan(b)
    values = est.values(b, bounds, answers)
    assert model.seen == {TOK.decode(ids(GOLD)), TOK.decode(ids(ALT))}  # A* = gold + the verified alternative
    # V = log(p(gold) + p(alt)): -3.31 at the start, -1.95 after line 1, -0.05 at the end: valued as correct
    assert values[0] == pytest.approx([math.log(2 * math.exp(-4)), math.log(math.exp(-5) + math.exp(-2)),
                                       math.log(math.exp(-8) + math.exp(-0.05))], abs=1e-6)
    assert math.exp(values[0][-1]) > 0.9
    est(b)
    assert all(d > 0 for d in est.last_delta[0])  # both lines of the solved trace raised the value
    assert est.last_delta[1][-1] < 0  # the dead end of the wrong row lowered it (-1.95 -> log 2e^-6 = -5.31)
    gold_only = estimator(FakeModel(TABLE), max_answers=1)  # the earlier reading: log p(gold expression) alone
    gold_only(b)
    assert gold_only.last_delta[0] == pytest.approx([-1.0, -3.0])  # the solved trace looked like a walk away


ALL_WRONG = [("w", "1+2=3 [3 3]\n 3*3=9 x\n<answer>(1+2)*3</answer>", 0.0),
             ("w", "3-2=1 [1 1]\n 1*1=1 x\n<answer>(3-2)*1</answer>", 0.0),
             ("w", "3+1=4 [2 4]\n 4*2=8 x\n<answer>(3+1)*2</answer>", 0.0)]
ALL_RIGHT = [("r", "1+2=3 [3 3]\n 3+3=6 !\n<answer>1+2+3</answer>", 1.0),
             ("r", "3*2=6 [1 6]\n 6*1=6 !\n<answer>3*2*1</answer>", 1.0),
             ("r", "3+2=5 [1 5]\n 5+1=6 !\n<answer>3+2+1</answer>", 1.0)]


@pytest.mark.parametrize("normalize", ["group", "group_scale", "batch", "none"])
def test_credit_is_tied_to_the_outcome(normalize):
    b = make_batch(ALL_WRONG + ALL_RIGHT)
    wrong, right = slice(0, 3), slice(3, 6)
    est = estimator(FakeModel({}), normalize=normalize)
    adv = est(b)
    mask = b.response_mask
    # the GRPO advantage of a one-outcome group is 0: whatever remains is segment credit
    assert float(adv[wrong][mask[wrong]].max()) <= 0 and float(adv[wrong][mask[wrong]].min()) < 0
    assert float(adv[right][mask[right]].min()) >= 0 and float(adv[right][mask[right]].max()) > 0
    ungated = estimator(FakeModel({}), normalize=normalize, outcome_gate=False)(b)
    # without the tie, the same values pay segments of the all-wrong group (centred z-scores: about half of them)
    assert float(ungated[wrong][mask[wrong]].max()) > 0 and float(ungated[right][mask[right]].min()) < 0
    if normalize == "group":
        segments = [x for d in est.last_delta[:3] for x in d]
        paid = sum(1 for x in segments if x > sum(segments) / len(segments))
        assert 0 < paid < len(segments)  # the ungated credit paid these; the tie paid none of them
