"""RREDCoT and Monte-Carlo step credit (per-token advantages) and the credit-quality measures: golden values with fake
log-prob / generation services, GRPO equivalence at beta = 0, garbage text, the toy trainer and exact resume."""

from __future__ import annotations

import json
import math
import re
from types import SimpleNamespace

import pytest
import torch
from grpo_toys import ToyEngine, make_env
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_grpo_trainer import strip, trainer

from agents.grpo.batch import GroupBatch, Sample
from agents.grpo.credit_quality import (
    agreement,
    compare,
    reference_credit,
    segment_credit,
    sign_agreement,
    spearman,
)
from agents.grpo.registry import build
from agents.grpo.segments import evenly
from agents.methods.mc_credit import row_verifier
from agents.methods.rredcot import gold_continuation
from agents.policy.models import tiny_tokenizer

TOK = tiny_tokenizer()  # character level: token k of a text is its character k
PROMPT = 7  # the one prompt token of every test row
R2 = math.sqrt(2)
A = 1 / R2  # GRPO advantage of rewards (1, 0): +-0.5 / std 0.7071 (unbiased)
COUNTDOWN = {"metadata": {"numbers": [1, 2], "target": 3, "solution": "1+2"}, "answer": "3"}


def ids(text: str) -> list[int]:
    return TOK(text, add_special_tokens=False)["input_ids"]


def make_batch(rows: list[tuple[str, str, float, dict]], step: int = 1) -> GroupBatch:
    """(group, response text, reward, info) per row."""
    samples = [Sample(group_id=f"{step}:0:{g}:{g}", prompt="p", prompt_ids=[PROMPT], response_ids=ids(text),
                      text=text, reward=r, correct=r > 0, info=info) for g, text, r, info in rows]
    return GroupBatch.from_samples(samples, step=step, tokenizer=TOK)


def prefix_of(prompt_ids: list[int]) -> str:
    assert prompt_ids[0] == PROMPT
    return TOK.decode(prompt_ids[1:])


class FakeScorer:
    """The log-prob service: V(prefix) from a table keyed by the prefix text, put on the first answer token."""

    def __init__(self, table: dict[str, float], default: float | None = None):
        self.table, self.default, self.calls, self.seen = table, default, 0, []

    def logprobs(self, part: GroupBatch, rows=None) -> torch.Tensor:
        self.calls += 1
        out = torch.zeros_like(part.behaviour_logprobs)
        for r in range(len(part)):
            prefix = prefix_of(part.prompt_ids[r])
            self.seen.append((prefix, TOK.decode(part.response_ids[r])))
            v = self.table.get(prefix, self.default if self.default is not None else -(len(prefix) % 5) - 0.5)
            out[r, 0] = v
        return out


class FakeGenerator:
    """The generation service: continuations per prefix text from a table (a default list for other prefixes)."""

    def __init__(self, table: dict[str, list[str]], default: list[str] | None = None):
        self.table, self.default, self.calls = table, default, []

    def generate(self, prompts, n, *, max_new_tokens=None, temperature=None, seed=0):
        self.calls.append({"prefixes": [prefix_of(p) for p in prompts], "n": n, "max_new_tokens": max_new_tokens,
                           "temperature": temperature, "seed": seed})
        out = []
        for p in prompts:
            conts = self.table.get(prefix_of(p), self.default)
            assert len(conts) == n
            out += [SimpleNamespace(prompt_ids=list(p), response_ids=ids(c), text=c) for c in conts]
        return out


def grpo(batch: GroupBatch) -> torch.Tensor:
    return build("advantage", "grpo")(batch)


# -- RREDCoT -------------------------------------------------------------------------------------------------------
def rredcot_golden_batch() -> GroupBatch:
    return make_batch([("a", "ab\ncd\n<answer>x</answer>", 1.0, COUNTDOWN), ("a", "e\n<answer>y</answer>", 0.0, COUNTDOWN)])


def test_rredcot_golden_group_zscore():
    b = rredcot_golden_batch()
    scorer = FakeScorer({"": -3.0, "ab\n": -1.0, "ab\ncd\n": -2.0, "e\n": -4.0})
    est = build("advantage", "rredcot", {"beta": 0.5})
    est.bind(SimpleNamespace(logprobs=scorer.logprobs, tokenizer=TOK))
    adv = est(b)
    # one scoring call; row 0 bounds [0, 3, 6] (lines "ab\n", "cd\n", reasoning ends at "<answer>"), row 1 [0, 2];
    # every scored continuation is the Countdown gold "<answer>1+2</answer>"
    assert scorer.calls == 1
    assert sorted(scorer.seen) == sorted([(p, "<answer>1+2</answer>") for p in ["", "ab\n", "ab\ncd\n", "", "e\n"]])
    assert est.last_bounds == [[0, 3, 6], [0, 2]]
    # dV: row 0 [-1 - -3, -2 - -1] = [2, -1]; row 1 [-4 - -3] = [-1]. Group z-score over [2, -1, -1]: mean 0,
    # population std sqrt(6/3) = sqrt 2 -> [sqrt 2, -1/sqrt 2, -1/sqrt 2]. GRPO A = +-1/sqrt 2.
    assert est.last_delta == [[2.0, -1.0], [-1.0]]
    # tied to the outcome: row 0 is correct, so its second segment's -1/sqrt 2 is cut to 0 (row 1 is wrong: kept)
    want0 = [A + 0.5 * R2] * 3 + [A] * 3 + [A] * (len(b.response_ids[0]) - 6)  # 1.414, .707, .707
    want1 = [-A - 0.5 / R2] * 2 + [-A] * (len(b.response_ids[1]) - 2)  # -1.061, then -.707 on the answer
    assert adv[0].tolist() == pytest.approx(want0, abs=1e-5)
    assert adv[1, : len(want1)].tolist() == pytest.approx(want1, abs=1e-5)
    assert adv[1, len(want1):].abs().sum() == 0  # padding
    m = est.metrics()
    assert m["scoring_sequences"] == 5 and m["segments"] == 3 and m["scored_rows"] == 2 and m["fallback_rows"] == 0
    assert m["dv_mean"] == pytest.approx(0.0) and m["dv_abs_mean"] == pytest.approx(4 / 3)
    assert m["gated_segments"] == 1 and m["answers_mean"] == 1  # "x" is no valid expression: the gold alone
    ungated = build("advantage", "rredcot", {"beta": 0.5, "outcome_gate": False})  # the earlier reading
    ungated.bind(SimpleNamespace(logprobs=scorer.logprobs, tokenizer=TOK))
    assert ungated(b)[0, 3] == pytest.approx(A - 0.5 / R2, abs=1e-5)  # .354


@pytest.mark.parametrize(("normalize", "seg"), [
    ("none", [2.0, -1.0, -1.0]),  # dV as is
    ("group_scale", [R2, -1 / R2, -1 / R2]),  # / std sqrt 2, no centering
    ("batch", [R2, -1 / R2, -1 / R2]),  # one group: as the group z-score
])
def test_rredcot_normalizations(normalize, seg):
    b = rredcot_golden_batch()
    est = build("advantage", "rredcot", {"beta": 1.0, "normalize": normalize, "outcome_gate": False})
    est.bind(SimpleNamespace(logprobs=FakeScorer({"": -3.0, "ab\n": -1.0, "ab\ncd\n": -2.0, "e\n": -4.0}).logprobs))
    adv = est(b)
    assert [float(adv[0, 0]), float(adv[0, 3]), float(adv[1, 0])] == pytest.approx(
        [A + seg[0], A + seg[1], -A + seg[2]], abs=1e-5)


def test_rredcot_values_and_templates():
    b = make_batch([("a", "ab\ncd", 1.0, {"answer": "42"}), ("a", "zz\n", 0.0, {}),
                    ("b", "q\nr", 1.0, {"answer": "7"})])
    # generic template; no "<answer>" marker: the whole response is reasoning; "ab\ncd" -> bounds [0, 3, 5]
    for value, f in [("logprob", lambda v: v), ("mean_logprob", lambda v: v / len(ids("\nThe answer is 42"))),
                     ("prob", math.exp)]:
        scorer = FakeScorer({"": -2.0, "ab\n": -1.0, "ab\ncd": -0.5, "q\n": -1.0, "q\nr": -1.0})
        est = build("advantage", "rredcot", {"beta": 1.0, "normalize": "none", "value": value})
        est.bind(SimpleNamespace(logprobs=scorer.logprobs))
        est(b)
        assert ("", "\nThe answer is 42") in scorer.seen and ("", "\nThe answer is 7") in scorer.seen
        assert est.last_bounds == [[0, 3, 5], [], [0, 2, 3]]  # row 1 has no gold answer: group advantage
        assert est.last_delta[0] == pytest.approx([f(-1.0) - f(-2.0), f(-0.5) - f(-1.0)])
        assert est.metrics()["fallback_rows"] == 1
    assert gold_continuation(COUNTDOWN, "auto") == "<answer>1+2</answer>"
    assert gold_continuation({"answer": 5}, "auto") == "\nThe answer is 5"
    assert gold_continuation({"metadata": {"solution": "x"}}, "Sol: {solution}, {answer}") is None  # no answer
    assert gold_continuation({"answer": "5"}, "{answer!q}") is None  # a bad format spec is no gold, not a crash


@pytest.mark.parametrize(("key", "value"), [("value", "max"), ("normalize", "zscore"), ("base", "lampo"),
                                            ("max_segments", 0), ("split", "words"), ("split", "tokens=0"),
                                            ("split", "regex=("), ("beta", float("nan")), ("template", "")])
def test_rredcot_bad_hyper_parameters_name_the_key(key, value):
    with pytest.raises(ValueError, match=key):
        build("advantage", "rredcot", {key: value})


def test_rredcot_splits_and_merges():
    b = make_batch([("a", "a. b. c. d. e. f\n<answer>1+2</answer>", 1.0, COUNTDOWN)])
    scorer = FakeScorer({}, default=-1.0)
    est = build("advantage", "rredcot", {"split": r"regex=\.\s", "max_segments": 3})
    est.bind(SimpleNamespace(logprobs=scorer.logprobs))
    est(b)
    # cuts after ". " at chars 3, 6, 9, 12, 15; reasoning ends at 17 ("<answer>"); 6 segments merged to 3:
    # interior bounds [3, 6, 9, 12, 15], 2 kept at positions floor((j+1) 6/3 + .5) - 1 = 1, 3 -> 6, 12
    assert est.last_bounds == [[0, 6, 12, 17]]
    est = build("advantage", "rredcot", {"split": "tokens=4", "answer_marker": ""})
    est.bind(SimpleNamespace(logprobs=scorer.logprobs))
    est(make_batch([("a", "abcdefghij", 1.0, {"answer": "1"})]))
    assert est.last_bounds == [[0, 4, 8, 10]]


def test_evenly_golden():
    assert evenly(list(range(10)), 3) == [2, 5, 7]  # floor(2.75+.5)-1, floor(5.5+.5)-1, floor(8.25+.5)-1
    assert evenly([4, 9], 3) == [4, 9] and evenly([1, 2, 3], 0) == []
    assert evenly(list(range(5)), 1) == [2]  # floor(3 + .5) - 1


# -- Monte-Carlo step credit ---------------------------------------------------------------------------------------
def mc_services(gen: FakeGenerator, cap: int = 40) -> SimpleNamespace:
    return SimpleNamespace(generate=gen.generate, tokenizer=TOK, cfg=SimpleNamespace(max_new_tokens=cap))


def test_mc_step_golden():
    b = make_batch([("a", "ab\ncd\nef", 1.0, COUNTDOWN), ("a", "gh", 0.0, COUNTDOWN)])
    gen = FakeGenerator({"ab\n": ["<answer>1+2</answer>", "<answer>1*2</answer>"],  # 1 of 2 right: V = .5
                         "ab\ncd\n": ["<answer>2+1</answer>", "<answer>(1+2)</answer>"]})  # both right: V = 1
    est = build("advantage", "mc_step", {"rollouts_per_boundary": 2, "seed": 3})
    est.bind(mc_services(gen))
    adv = est(b)
    # row 0: boundaries after "ab\n" (k=3) and "cd\n" (k=6); budgets 40-3 = 37 and 34, one band ((37-1)//32 =
    # (34-1)//32 = 1): one call of n = 2 with the larger budget
    assert len(gen.calls) == 1
    call = gen.calls[0]
    assert call["prefixes"] == ["ab\n", "ab\ncd\n"] and call["n"] == 2 and call["max_new_tokens"] == 37
    assert call["seed"] == est.call_seed(1, 1) and call["temperature"] is None
    # V: start = group mean .5, V(3) = .5, V(6) = 1, end = r = 1 -> d = [0, .5, 0]; row 1 has no interior boundary:
    # one segment d = 0 - .5. Tokens: A + beta d, beta = 1, A = +-1/sqrt 2.
    assert est.last_bounds == [[0, 3, 6, 8], [0, 2]]
    assert est.last_values == [[0.5, 0.5, 1.0, 1.0], [0.5, 0.0]]
    assert adv[0].tolist() == pytest.approx([A] * 3 + [A + 0.5] * 3 + [A] * 2, abs=1e-5)
    assert adv[1].tolist() == pytest.approx([-A - 0.5] * 2 + [0.0] * 6, abs=1e-5)
    m = est.metrics()
    assert m["continuations"] == 4 and m["calls"] == 1 and m["boundaries"] == 2 and m["fallback_rows"] == 0
    assert m["extra_tokens"] == 3 * 20 + 22  # three 20-character continuations and one of 22 ("(1+2)")
    assert m["value_mean"] == pytest.approx(0.75) and m["credit_abs_mean"] == pytest.approx((0.5 + 0.5) / 4)


def test_mc_step_cuts_continuations_at_the_rollout_cap_and_bands_calls():
    b = make_batch([("a", "ab\ncd\nef", 1.0, COUNTDOWN), ("a", "gh", 0.0, COUNTDOWN)])
    right = ["<answer>1+2</answer>"] * 2
    gen = FakeGenerator({"ab\n": right, "ab\ncd\n": right})
    est = build("advantage", "mc_step", {"rollouts_per_boundary": 2, "max_new_tokens": 24, "budget_step": 2})
    est.bind(mc_services(gen))
    est(b)
    # budgets 24-3 = 21 (band (21-1)//2 = 10) and 24-6 = 18 (band 8): two calls, the smaller band first; the
    # 20-character answer fits in 21 but is cut to 18 ("<answer>1+2</answe"): V(3) = 1, V(6) = 0
    assert [c["max_new_tokens"] for c in gen.calls] == [18, 21]
    assert [c["seed"] for c in gen.calls] == [est.call_seed(1, 8), est.call_seed(1, 10)]
    assert est.last_values[0] == [0.5, 1.0, 0.0, 1.0]
    assert est.call_seed(1, 7) != est.call_seed(2, 7) != est.call_seed(1, 9)


def test_mc_step_match_verifier_fallback_and_boundaries():
    b = make_batch([("a", "x\ny\nz\nw\nv", 1.0, {"answer": "t1"}), ("a", "x\ny", 0.0, {}),
                    ("b", "q\nr", 1.0, {"answer": "t1"})])
    gen = FakeGenerator({}, default=["a t1", "t1 a"])  # last word t1: 1, then 0 -> V = .5 everywhere
    est = build("advantage", "mc_step", {"boundaries": 2, "rollouts_per_boundary": 2, "verifier": "match",
                                         "answer_pattern": r"(\S+)\s*$"})
    est.bind(mc_services(gen))
    adv = est(b)
    # cap 40 leaves every continuation whole. Row 0: 4 interior line ends (k = 2, 4, 6, 8), 2 kept at
    # floor((j+1) 5/3 + .5) - 1 = 1, 2 -> k = 4, 6
    assert est.last_bounds[0] == [0, 4, 6, 9] and est.last_values[0] == [0.5, 0.5, 0.5, 1.0]
    assert est.last_bounds[1] == [] and est.metrics()["fallback_rows"] == 1  # no gold: the group advantage
    base = grpo(b)
    assert adv[1, :3].tolist() == pytest.approx([float(base[1])] * 3)
    # a one-row group: GRPO advantage 0, V_0 = r = 1; V(2) = .5 -> d = [-.5, .5]
    assert est.last_values[2] == [1.0, 0.5, 1.0] and adv[2, :3].tolist() == pytest.approx([-0.5, -0.5, 0.5])
    v = row_verifier({"answer": " 12 "}, "auto", re.compile(r"<answer>(.*?)</answer>"))
    assert v("<answer>1</answer> <answer> 12</answer>") == 1.0 and v("<answer>1</answer>") == 0.0 and v("") == 0.0
    assert row_verifier({}, "auto", re.compile("(x)")) is None
    assert row_verifier({"answer": "3"}, "countdown", re.compile("(x)")) is None


def test_mc_step_group_normalization_and_no_services():
    b = make_batch([("a", "ab\ncd\nef", 1.0, COUNTDOWN), ("a", "gh", 0.0, COUNTDOWN)])
    gen = FakeGenerator({"ab\n": ["<answer>1+2</answer>"], "ab\ncd\n": ["<answer>1+2</answer>"]})
    est = build("advantage", "mc_step", {"rollouts_per_boundary": 1, "normalize": "group", "beta": 1.0})
    est.bind(mc_services(gen))
    adv = est(b)
    # d: row 0 [V(3) - .5, V(6) - V(3), 1 - V(6)] = [.5, 0, 0], row 1 [-.5]; mean 0, population std sqrt(.5/4)
    s = math.sqrt(0.125)
    assert [float(adv[0, 0]), float(adv[0, 3]), float(adv[1, 0])] == pytest.approx([A + 0.5 / s, A, -A - 0.5 / s],
                                                                                   abs=1e-4)
    unbound = build("advantage", "mc_step", {})  # no services: one segment per row, d = r - mean
    assert unbound(b)[0, 0] == pytest.approx(A + 0.5)


@pytest.mark.parametrize(("key", "value"), [("boundaries", -1), ("rollouts_per_boundary", 0), ("verifier", "llm"),
                                            ("answer_pattern", "no group"), ("answer_pattern", "("),
                                            ("budget_step", 0), ("normalize", "batch"), ("split", "x"),
                                            ("max_new_tokens", 0), ("temperature", -1.0), ("base", "x")])
def test_mc_step_bad_hyper_parameters_name_the_key(key, value):
    with pytest.raises(ValueError, match=key):
        build("advantage", "mc_step", {key: value})


# -- properties: beta = 0 is GRPO, garbage never raises ------------------------------------------------------------
ALPHABET = ["a", "1", "+", "\n", " ", "<answer>", "</answer>", "=", "!", "x", "<|im_end|>", "\x00", "é"]
rows_strategy = st.lists(st.tuples(st.sampled_from("abc"), st.lists(st.sampled_from(ALPHABET), max_size=12),
                                   st.sampled_from([0.0, 1.0, 0.5]), st.sampled_from([0, 1, 2])),
                         min_size=1, max_size=7)
INFOS = [COUNTDOWN, {"answer": "a"}, {"metadata": "garbage", "answer": None}]


def garbage_batch(rows) -> GroupBatch:
    samples = []
    for g, pieces, r, kind in rows:
        text = "".join(pieces)
        samples.append(Sample(group_id=f"1:0:{g}:{g}", prompt="p", prompt_ids=[PROMPT],
                              response_ids=TOK(text, add_special_tokens=False)["input_ids"], text=text, reward=r,
                              info=INFOS[kind]))
    return GroupBatch.from_samples(samples, step=1, tokenizer=TOK)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows_strategy, st.sampled_from([0.0, 0.7]), st.sampled_from(["lines", "tokens=2"]))
def test_rredcot_beta_zero_is_grpo_and_garbage_never_raises(rows, beta, split):
    b = garbage_batch(rows)
    est = build("advantage", "rredcot", {"beta": beta, "split": split})
    est.bind(SimpleNamespace(logprobs=FakeScorer({}).logprobs))
    adv = est(b)
    assert adv.shape == b.response_mask.shape and torch.isfinite(adv).all()
    assert adv[~b.response_mask].abs().sum() == 0
    if beta == 0:
        want = grpo(b)[:, None].expand_as(adv) * b.response_mask
        torch.testing.assert_close(adv, want)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows_strategy, st.sampled_from([0.0, 1.0]), st.lists(st.sampled_from(ALPHABET), max_size=8))
def test_mc_step_beta_zero_is_grpo_and_garbage_never_raises(rows, beta, cont):
    b = garbage_batch(rows)
    gen = FakeGenerator({}, default=["".join(cont)] * 2)
    est = build("advantage", "mc_step", {"beta": beta, "rollouts_per_boundary": 2, "boundaries": 2})
    est.bind(mc_services(gen, cap=16))
    adv = est(b)
    assert adv.shape == b.response_mask.shape and torch.isfinite(adv).all()
    assert adv[~b.response_mask].abs().sum() == 0
    if beta == 0:
        torch.testing.assert_close(adv, grpo(b)[:, None].expand_as(adv) * b.response_mask)
    for i, v in enumerate(est.last_values):  # the chain runs from the group mean to the row's own reward
        assert not v or v[-1] == float(b.base_rewards[i])


# -- credit quality --------------------------------------------------------------------------------------------------
def test_credit_quality_golden():
    assert spearman([1, 2, 3], [1, 3, 2]) == pytest.approx(0.5)  # 1 - 6 (0 + 1 + 1) / (3 (9 - 1))
    assert spearman([1, 2, 3, 4], [10, 20, 20, 30]) == pytest.approx(0.9486833, abs=1e-5)  # ranks 1 2.5 2.5 4
    assert math.isnan(spearman([1, 1], [1, 2])) and math.isnan(spearman([1], [2]))
    assert sign_agreement([1, -1, 0, 2], [0.5, 0.3, 9, -1]) == (pytest.approx(1 / 3), 3)  # hit, miss, -, miss
    assert sign_agreement([1, 1], [0.0, 1.0]) == (0.5, 2)  # an estimate of 0 has no sign: a miss
    assert math.isnan(sign_agreement([0.0], [1.0])[0])
    assert reference_credit([[0.5, 0.5, 1.0, 1.0], [], [0.5, 0.0]]) == [0.0, 0.5, 0.0, -0.5]
    adv = torch.tensor([[1.0, 2.0, 3.0, 4.0], [0.0, -1.0, 0.0, 0.0]])
    # row 0 base 1: segments [0, 1), [1, 4) -> 0, mean(1, 2, 3) = 2; row 1 base 0: [0, 2) -> -0.5
    assert segment_credit(adv, torch.tensor([1.0, 0.0]), [[0, 1, 4], [0, 2]]) == [0.0, 2.0, -0.5]
    assert segment_credit(torch.tensor([3.0, 1.0]), torch.tensor([3.0, 1.0]), [[0, 2], [0, 1]]) == [0.0, 0.0]
    a = agreement([0.0, 0.5, -0.5], [0.0, 2.0, -1.0])
    assert a["spearman"] == pytest.approx(1.0) and a["sign_agreement"] == 1.0 and a["segments"] == 3
    out = compare([[0, 1, 4], [0, 2]], [[0.5, 0.0, 1.0], [0.5, 0.0]], {"x": adv}, torch.tensor([1.0, 0.0]))
    # reference [-.5, 1, -.5] vs estimate [0, 2, -.5]: ranks (1.5, 3, 1.5) vs (2, 3, 1)
    assert out["x"]["spearman"] == pytest.approx(0.8660254, abs=1e-5) and out["x"]["sign_agreement"] == pytest.approx(2 / 3)


# -- inside the trainer --------------------------------------------------------------------------------------------
class RecordingEngine(ToyEngine):
    """Records every generate call's prompts, seed, budget and outputs, with the trainer's step."""

    def __init__(self, policy):
        super().__init__(policy)
        self.calls, self.trainer = [], None

    def generate(self, prompts, n, sampling, *, seeds=None):
        out = super().generate(prompts, n, sampling, seeds=seeds)
        self.calls.append((self.trainer.step if self.trainer else None, [list(p) if not isinstance(p, str) else p
                                                                         for p in prompts], n, sampling.seed,
                           sampling.max_new_tokens, [list(o.response_ids) for o in out]))
        return out


TOY = {
    "rredcot": ({"advantage": "rredcot"}, {"advantage": {"template": "{answer}", "split": "tokens=1"}},
                "advantage.scoring_sequences"),
    "mc_step": ({"advantage": "mc_step"}, {"advantage": {"split": "tokens=1", "verifier": "match",
                                                         "answer_pattern": r"^\s*(\S+)", "rollouts_per_boundary": 2}},
                "advantage.continuations"),
}


@pytest.mark.parametrize("name", list(TOY))
def test_component_runs_and_resumes_exactly_in_the_trainer(name, tmp_path):
    stages, params, metric = TOY[name]
    settings = dict(steps=5, checkpoint_every=2, eval_every=0, eval_size=2, train_pool=6, prompts_per_step=3,
                    stages=stages, params={"rollout_allocator": {"n": 4}, **params}, engine=RecordingEngine)

    def run(out, **kw):
        t = trainer(out, env=make_env(8), **settings)
        t.engine.trainer = t
        return t, t.run(**kw)

    t_full, full = run(tmp_path / "full", resume=False)
    run(tmp_path / "cut", resume=False, stop_after=3)  # dies after step 3; its last checkpoint is step 2
    t_res, resumed = run(tmp_path / "cut", resume=True)
    assert strip(resumed) == strip(full)
    train = [r for r in full if r["kind"] == "train"]
    assert len(train) == 5 and all(r[metric] > 0 for r in train)
    # every generation call after the checkpoint (rollouts, MC continuations, eval) repeats exactly
    after = [c for c in t_full.engine.calls if c[0] is not None and c[0] >= 3]
    assert [c for c in t_res.engine.calls if c[0] is not None and c[0] >= 3] == after
    if name == "mc_step":
        extra = [c for c in after if c[2] == 2]  # the continuations: n = rollouts_per_boundary = 2
        assert extra and all(len(c[1][0]) == 2 for c in extra)  # prompt + 1-token prefix
        assert train[-1]["extra_tokens"] > 0 and all(r["advantage.fallback_rows"] == 0 for r in train)


# -- benchmarks/credit_quality.py (toy and tiny models only) -----------------------------------------------------------
def _benchmark_script(name: str):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"{name}_script", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _script():
    return _benchmark_script("credit_quality")


def test_credit_quality_script_on_the_toy_trainer(tmp_path):
    t = trainer(tmp_path, env=make_env(8), prompts_per_step=3, params={"rollout_allocator": {"n": 4}})
    out = _script().measure(t, boundaries=2, rollouts_per_boundary=2,
                            mc={"split": "tokens=1", "verifier": "match", "answer_pattern": r"^\s*(\S+)"},
                            rredcot={"template": "{answer}", "split": "tokens=1"})
    assert out["rows"] == 12 and out["mc"]["extra_tokens_counted"] == out["mc"]["extra_tokens"] > 0
    agree = out["agreement"]
    assert {"grpo", "rredcot", "rredcot_raw", "dash"} <= set(agree)
    assert agree["grpo"]["segments"] == agree["rredcot"]["segments"] > 0
    assert math.isnan(agree["grpo"]["spearman"])  # no credit at all: a constant estimate has no rank correlation
    assert 0 <= agree["rredcot_raw"]["sign_agreement"] <= 1 or math.isnan(agree["rredcot_raw"]["sign_agreement"])


def test_credit_quality_script_runs_on_the_tiny_model(tmp_path, capsys):
    out = _script().main(["--model", "tiny", "--prompts", "2", "--n", "2", "--max-new-tokens", "16",
                          "--boundaries", "2", "--rollouts-per-boundary", "2", "--json", str(tmp_path / "q.json")])
    assert out["rows"] == 4 and out["mc"]["fallback_rows"] == 0  # Countdown rows: the verifier reads the metadata
    assert "rredcot_raw" in capsys.readouterr().out and (tmp_path / "q.json").is_file()


def test_credit_quality_summary_over_batches_golden(tmp_path):
    script = _script()
    nan = float("nan")
    a = {"agreement": {"dash": {"spearman": 0.1, "sign_agreement": 0.5, "segments": 10},
                       "grpo": {"spearman": nan, "sign_agreement": 0.0, "segments": 10}}}
    b = {"agreement": {"dash": {"spearman": 0.3, "sign_agreement": 0.7, "segments": 12},
                       "grpo": {"spearman": nan, "sign_agreement": 0.0, "segments": 12}}}
    summary = script.summarize([a, b])
    assert summary["dash"]["spearman"]["mean"] == pytest.approx(0.2)
    # two batches: t(0.975, 1 df) = 12.706, sd 0.1414 -> half-width 12.706 * 0.1414 / sqrt(2) = 1.2706
    assert summary["dash"]["spearman"]["interval95"] == pytest.approx([0.2 - 1.2706, 0.2 + 1.2706], abs=1e-3)
    assert summary["dash"]["segments"] == 22
    assert summary["grpo"]["spearman"]["batches"] == 0 and math.isnan(summary["grpo"]["spearman"]["mean"])
    for name, out in (("a", a), ("b", b)):
        (tmp_path / f"{name}.json").write_text(json.dumps(out))
    combined = script.main(["--combine", str(tmp_path / "a.json"), str(tmp_path / "b.json")])
    assert combined["summary"]["dash"]["sign_agreement"]["mean"] == pytest.approx(0.6)
    assert len(combined["per_seed"]) == 2


# -- benchmarks/rredcot_probe.py (tiny model only) ---------------------------------------------------------------------
def _probe_script():
    return _benchmark_script("rredcot_probe")


def test_rredcot_probe_values_are_the_token_by_token_log_probability():
    from agents.policy import load_policy

    policy = load_policy("tiny")
    script = _probe_script()
    prefix, cont = "What is 3 + 4? 3 + 4 =", "\nThe answer is 7"
    p = policy.tokenizer(prefix, add_special_tokens=False)["input_ids"]
    a = policy.tokenizer(cont, add_special_tokens=False)["input_ids"]
    expected = 0.0
    with torch.no_grad():  # one forward per continuation token: an independent path to the same number
        for i, t in enumerate(a):
            logits = policy.model(torch.tensor([p + a[:i]])).logits[0, -1].float()
            expected += torch.log_softmax(logits, -1)[t].item()
    assert script.values(policy, [prefix], cont)[0] == pytest.approx(expected, abs=1e-4)
    # a batch of prefixes of different lengths (padded) scores each as it scores alone
    both = script.values(policy, [prefix, "What is 3 + 4?"], cont)
    assert both[0] == pytest.approx(expected, abs=1e-4)
    assert both[1] == pytest.approx(script.values(policy, ["What is 3 + 4?"], cont)[0], abs=1e-4)


def test_rredcot_probe_script_runs_on_the_tiny_model(tmp_path, capsys):
    script = _probe_script()
    assert script.main(["--model", "tiny", "--tasks", "3", "--json", str(tmp_path / "p.json")]) == 0
    out = json.loads((tmp_path / "p.json").read_text())
    v = out["mean_value"]
    assert out["tasks"] == 3 and set(v) == set(script.KINDS) and all(x < 0 for x in v.values())
    assert out["mean_dv"]["wrong"] == pytest.approx(v["wrong"] - v["start"])
    lo, hi = out["empty_box_minus_wrong"]["ci95"]
    assert lo <= out["empty_box_minus_wrong"]["mean"] <= hi
    with pytest.raises(SystemExit):
        script.main(["--model", "tiny", "--tasks", "1"])
    assert "--tasks must be at least 2" in capsys.readouterr().err
