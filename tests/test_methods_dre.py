"""DRE (Dynamic Rollout Editing): where the answer emerged, the edited twin, its reward, log-probs, and the trainer."""

from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_grpo_trainer import trainer

from agents.grpo.batch import GroupBatch, Sample
from agents.grpo.config import from_dict
from agents.grpo.registry import build
from agents.grpo.trainer import Trainer
from agents.methods.dre import countdown_emergence, same_answer, text_emergence
from agents.policy.countdown_traces import write_trace
from agents.policy.micro import micro_tokenizer
from rlvr_envs.tasks.countdown import make_env as countdown_env
from rlvr_envs.verifiers.countdown import verify

NUMS, TARGET = [3, 8, 7], 17
# The first line that reaches 17 is " 24-7=17 !"; the search goes on for two more lines before answering.
OVER = "8*3=24 [7 24]\n 24-7=17 !\n8+7=15 [3 15]\n 15+3=18 x\n<answer>8*3-7</answer>"
PLAIN = "8*3=24 [7 24]\n 24-7=17 !\n<answer>8*3-7</answer>"
META = {"numbers": NUMS, "target": TARGET}


@pytest.fixture(scope="module")
def tok():
    return micro_tokenizer()


def ids_of(tok, text: str, eos: bool = True) -> list[int]:
    return list(tok(text, add_special_tokens=False)["input_ids"]) + ([tok.eos_token_id] if eos else [])


def sample(tok, text: str, *, group: str = "g", reward: float = 1.0, correct: bool = True, meta=META, answer="17",
           eos: bool = True, lp: float = -0.25, extra_info=None) -> Sample:
    ids = ids_of(tok, text, eos)
    return Sample(group, "prompt", [5, 6], ids, text, reward=reward, correct=correct, logprobs=[lp] * len(ids),
                  entropies=[0.5] * len(ids), finish_reason="stop" if eos else "length",
                  info={"answer": answer, "metadata": dict(meta or {}), "parsed_answer": "orig", **(extra_info or {})})


def make_batch(tok, samples: list[Sample]) -> GroupBatch:
    return GroupBatch.from_samples(samples, tokenizer=tok)


def overthink(numbers, target, seed: int, extra: int = 2) -> tuple[str, str]:
    """(plain trace, the same trace with ``extra`` more search lines between its ``!`` line and its answer)."""
    trace = write_trace(numbers, target, np.random.default_rng(seed))
    lines = trace.split("\n")
    more = [ln for ln in write_trace(numbers, target, np.random.default_rng(seed + 1)).split("\n")[:-1]][:extra]
    more = more or ["wait, check again"]
    return trace, "\n".join([*lines[:-1], *more, lines[-1]])


# -- where the answer emerged --------------------------------------------------------------------------------------
def test_countdown_emergence_first_valid_hit():
    em = countdown_emergence(NUMS, TARGET, OVER)
    assert em is not None
    assert OVER[: em.cut] == "8*3=24 [7 24]\n 24-7=17 !\n"
    assert em.close == "<answer>8*3-7</answer>" and em.answer == "8*3-7"  # 8*3 (x=8 >= y=3), then 24-7


def test_countdown_emergence_skips_invalid_claims_and_uses_the_branch():
    # a "!" with wrong arithmetic (24-7=18) and a "!" that does not reach 17 come first: neither is the emergence
    text = ("8*3=24 [7 24]\n 24-7=18 !\n8+7=15 [3 15]\n 15+3=18 !\n7+3=10 [8 10]\n 10+8=18 x\n"
            "8*3=24 [7 24]\n 24-7=17 !\n8-7=1 [1 3]\n 3*1=3 x\n<answer>8*3-7</answer>")
    em = countdown_emergence(NUMS, TARGET, text)
    assert text[: em.cut].endswith("10+8=18 x\n8*3=24 [7 24]\n 24-7=17 !\n") and em.answer == "8*3-7"
    # the branch of the first hit, not the final answer: 1+2=3 then 3+3=6 -> "3+2+1" (x is the larger operand)
    text = "1+2=3 [3 3]\n 3+3=6 !\n3*2=6 [1 6]\n 6*1=6 !\n<answer>3*2*1</answer>"
    em = countdown_emergence([1, 2, 3], 6, text)
    assert em.answer == "3+2+1" and text[: em.cut] == "1+2=3 [3 3]\n 3+3=6 !\n"
    assert verify([1, 2, 3], 6, f"<answer>{em.answer}</answer>").correct
    # the "!" line is the last of the body, with no newline: the close starts one
    em = countdown_emergence(NUMS, TARGET, "8*3=24 [7 24]\n 24-7=17 !<answer>8*3-7</answer>")
    assert em.close == "\n<answer>8*3-7</answer>"


def test_countdown_emergence_unmarked_hits(tok):
    # " 24-7=17 x" reaches 17 but is marked a dead end; the search goes on and claims the same move later
    text = "8*3=24 [7 24]\n 24-7=17 x\n8+7=15 [3 15]\n 15+3=18 x\n8*3=24 [7 24]\n 24-7=17 !\n<answer>8*3-7</answer>"
    em = countdown_emergence(NUMS, TARGET, text)
    assert text[: em.cut].endswith("15+3=18 x\n8*3=24 [7 24]\n 24-7=17 !\n")  # off: the first "!" line
    em = countdown_emergence(NUMS, TARGET, text, unmarked_hits=True)
    assert text[: em.cut] == "8*3=24 [7 24]\n" and em.close == " 24-7=17 !\n<answer>8*3-7</answer>"
    out = build("group_transform", "dre", {"unmarked_hits": True})(make_batch(tok, [sample(tok, text)]))
    assert out.texts[1] == PLAIN
    # a walked-past hit never found again: the original is wrong, no edit (only correct rows are edited)
    assert countdown_emergence(NUMS, TARGET, "8*3=24 [7 24]\n 24-7=17 x\n<answer>8*7</answer>") is None


@pytest.mark.parametrize("text", ["", "garbage", "<answer>8*3-7</answer>", "8*3=24 [7 24]\n 24-7=17 x\n",
                                  "8*3=24 [7 9]\n 24-7=17 !", "\n\n!!\n 24-7=17 !", "x" * 5000])
def test_countdown_emergence_none_on_malformed(text):
    assert countdown_emergence(NUMS, TARGET, text) is None


PIECES = st.sampled_from(["8", "3", "7", "24", "17", "15", "*", "-", "+", "/", "=", " ", "  ", "[", "]", "!", "x",
                          "\n", "\r", "<answer>", "</answer>", "<think>", "</think>", "\\boxed{", "}", "$", ",", "."])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pieces=st.lists(st.one_of(PIECES, st.text(max_size=3)), max_size=60), countdown=st.booleans(),
       correct=st.booleans())
def test_dre_never_raises_on_any_text(tok, pieces, countdown, correct):
    text = "".join(pieces)
    out = build("group_transform", "dre", {"unmarked_hits": True, "only_continued": False})(
        make_batch(tok, [sample(tok, text, correct=correct, meta=META if countdown else {}, answer="17")]))
    assert len(out) in (1, 2)
    if len(out) == 2:  # an edit: correct on its own, shorter, its text the decode of its ids
        assert len(out.response_ids[1]) < len(out.response_ids[0]) and bool(out.correct[1])
        assert out.texts[1] == tok.decode(out.response_ids[1], skip_special_tokens=True)
        if countdown:
            assert verify(NUMS, TARGET, out.texts[1]).correct


def test_text_emergence_and_same_answer():
    assert same_answer("0.5", "1/2") and same_answer(" $1,000$ ", "1000") and same_answer("X.", "x")
    assert not same_answer("1e999999999", "1") and not same_answer("", "") and not same_answer("4", "5")
    em = text_emergence("So \\boxed{4}. Hmm, let me check: 2+2 = 4. Yes \\boxed{4}", "4")
    assert em.cut == len("So \\boxed{4}") and em.close == "" and em.answer == "4"
    em = text_emergence("<think>so <answer>4</answer> wait</think><answer>4</answer>", "4")
    assert em.cut == len("<think>so <answer>4</answer>") and em.close == "\n</think>\n<answer>4</answer>"
    assert text_emergence("\\boxed{5} then \\boxed{4}", "4").cut == len("\\boxed{5} then \\boxed{4}")
    assert text_emergence("no answer here", "4") is None
    assert text_emergence("<answer>4</answer>", "4", patterns=("boxed",)) is None


# -- the component -------------------------------------------------------------------------------------------------
def test_dre_golden_countdown_edit(tok):
    b = make_batch(tok, [sample(tok, OVER), sample(tok, PLAIN), sample(tok, "oops", reward=0.0, correct=False)])
    t = build("group_transform", "dre", {"length_bonus": 0.5})
    out = t(b)
    assert len(out) == 4 and out.group_ids == ["g"] * 4
    # token counts by hand (micro tokenizer: an integer, an operator, " [", " 24", "]", "\n" are one token each):
    # "8*3=24 [7 24]\n" 10, " 24-7=17 !\n" 7, "8+7=15 [3 15]\n" 10, " 15+3=18 x\n" 7, "<answer>8*3-7</answer>" 7, EOS 1
    # original 10+7+10+7+7+1 = 42; edit 10+7+7+1 = 25; saved 17
    assert len(b.response_ids[0]) == 42 and len(out.response_ids[3]) == 25
    assert out.texts[3] == PLAIN and out.response_ids[3] == ids_of(tok, PLAIN)
    # reward = 1 + 0.5 * (1 - 25/42) = 1 + 0.5 * 17/42 = 1.2023810; base reward stays the env's 1
    assert float(out.rewards[3]) == pytest.approx(1.2023810, abs=1e-6)
    assert float(out.base_rewards[3]) == 1.0 and bool(out.correct[3])
    assert out.infos[3] == {"answer": "17", "metadata": META, "parsed_answer": "8*3-7", "dre_edit": True}
    assert out.finish_reasons[3] == "stop"
    mask = out.response_mask[3]
    assert int(mask.sum()) == 25 and not bool(mask[25:].any())
    # copy mode (no service bound): the 24 prefix tokens keep the sampler's -0.25, the close tokens 0
    lp = out.behaviour_logprobs[3]
    assert torch.all(lp[:17] == -0.25) and torch.all(lp[17:] == 0)
    assert torch.all(out.entropies[3, :17] == 0.5) and torch.all(out.entropies[3, 17:] == 0)
    assert t.metrics() == {"edits": 1.0, "tokens_saved": 17.0, "edit_rate": 0.5}  # 1 edit of 2 correct rows
    assert t.metrics()["edits"] == 0.0  # reset per step
    # the originals are untouched
    for f in ("rewards", "base_rewards", "response_mask", "behaviour_logprobs"):
        assert torch.equal(getattr(out, f)[:3], getattr(b, f))


def test_dre_constant_bonus_and_advantage_ranks_edit_first(tok):
    b = make_batch(tok, [sample(tok, OVER), sample(tok, "oops", reward=0.0, correct=False)])
    out = build("group_transform", "dre", {"bonus": 0.3, "length_bonus": 0.0})(b)
    assert out.rewards.tolist() == pytest.approx([1.0, 0.0, 1.3])  # 1 + 0.3
    adv = build("advantage", "grpo")(out)
    assert float(adv[2]) > float(adv[0]) > float(adv[1])


def test_dre_generic_text_edit(tok):
    text = "So \\boxed{4}. Hmm, let me check: 2+2 = 4. Yes \\boxed{4}"
    think = "<think>so <answer>4</answer> wait, 2+2 is 4 indeed</think><answer>4</answer>"
    b = make_batch(tok, [sample(tok, text, meta={}, answer="4"), sample(tok, think, meta={}, answer="4"),
                         sample(tok, "\\boxed{4}", meta={}, answer="4")])
    out = build("group_transform", "dre")(b)
    assert len(out) == 5
    assert out.texts[3] == "So \\boxed{4}" and out.infos[3]["parsed_answer"] == "4"
    assert out.texts[4] == "<think>so <answer>4</answer>\n</think>\n<answer>4</answer>"
    assert out.response_ids[3][-1] == tok.eos_token_id and len(out.response_ids[3]) < len(b.response_ids[0])


def test_dre_no_edit_cases(tok):
    rows = [sample(tok, PLAIN),  # answered right after the "!" line
            sample(tok, PLAIN.replace("<answer>8*3-7", "<answer>(8*3)-7"), group="h"),  # only the answer's writing
            sample(tok, OVER, reward=0.0, correct=False, group="i"),  # not correct
            sample(tok, OVER, meta={"numbers": ["a", None], "target": "x"}, group="j"),  # malformed metadata
            sample(tok, "", group="k"), sample(tok, "", eos=False, group="k"),  # empty responses
            sample(tok, "\x00\x01 }{ <answer> \\boxed{", meta={}, group="l"),  # garbage
            sample(tok, "<answer>4</answer> yes", meta={}, answer=None, group="m"),  # no gold answer
            sample(tok, OVER, group="n", extra_info={"dre_edit": True})]  # already an edit
    b = make_batch(tok, rows)
    t = build("group_transform", "dre")
    assert t(b) is b and t.metrics()["edits"] == 0
    # the answer written differently counts when only_continued is off (2 tokens shorter: "(" and ")")
    out = build("group_transform", "dre", {"only_continued": False})(b)
    assert len(out) == len(b) + 1 and out.group_ids[-1] == "h" and out.texts[-1] == PLAIN
    # no tokenizer anywhere: nothing to tokenize an edit with
    b.tokenizer = None
    assert build("group_transform", "dre")(b) is b


def test_dre_truncated_original_gets_no_eos(tok):
    b = make_batch(tok, [sample(tok, OVER, eos=False)])
    out = build("group_transform", "dre")(b)
    assert out.response_ids[1] == ids_of(tok, PLAIN, eos=False) and out.finish_reasons[1] == "length"


def test_dre_caps_edits_per_group_most_saved_first(tok):
    one = PLAIN.replace("<answer>", "8+7=15 [3 15]\n<answer>")  # one more line: saves 10 tokens
    three = PLAIN.replace("<answer>", "8+7=15 [3 15]\n 15+3=18 x\n7+3=10 [8 10]\n<answer>")  # saves 10+7+10 = 27
    rows = [sample(tok, one), sample(tok, OVER), sample(tok, three), sample(tok, one, group="h")]  # OVER saves 17
    out = build("group_transform", "dre", {"max_edits": 2})(make_batch(tok, rows))
    # group g keeps the two largest savings (rows 1 and 2), in row order; group h its only one
    assert len(out) == 7 and out.group_ids[4:] == ["g", "g", "h"] and out.texts[4:] == [PLAIN] * 3
    # rewards 1 + 0.5 * saved / L_orig: row 1 17/42, row 2 27/52, row 3 (h) 10/35
    assert out.rewards[4:].tolist() == pytest.approx([1 + 0.5 * 17 / 42, 1 + 0.5 * 27 / 52, 1 + 0.5 * 10 / 35])


def test_dre_policy_logprobs_from_the_service(tok):
    calls = []

    def logprobs(part, rows):
        calls.append((len(part), list(rows)))
        return torch.full((len(rows), part.response_mask.shape[1]), -0.7)

    t = build("group_transform", "dre")
    t.bind(SimpleNamespace(logprobs=logprobs, tokenizer=tok))
    out = t(make_batch(tok, [sample(tok, OVER), sample(tok, OVER)]))
    assert calls == [(2, [0, 1])]
    lp = out.behaviour_logprobs[2:]
    assert torch.all(lp[:, :25] == -0.7) and torch.all(lp[:, 25:] == 0)  # the whole edited row, nothing beyond
    assert out.off_policy is None  # on-policy rows: the loss's ratio is against the current policy
    # the batch's tokenizer may be missing: the service's is used
    b = make_batch(tok, [sample(tok, OVER)])
    b.tokenizer = None
    assert len(t(b)) == 2


def test_dre_keeps_optional_fields(tok):
    b = make_batch(tok, [sample(tok, OVER), sample(tok, PLAIN)])
    b.weights = torch.tensor([0.5, 1.0])
    b.off_policy = torch.tensor([False, False])
    b.old_logprobs = b.behaviour_logprobs.clone()
    out = build("group_transform", "dre")(b)
    assert out.weights.tolist() == [0.5, 1.0, 0.5] and out.off_policy.tolist() == [False] * 3
    assert torch.all(out.old_logprobs[2, :17] == -0.25) and torch.all(out.old_logprobs[2, 17:] == 0)


@pytest.mark.parametrize("params, key", [({"bonus": -1}, "bonus"), ({"length_bonus": -0.1}, "length_bonus"),
                                         ({"bonus": 0, "length_bonus": 0}, "bonus + length_bonus"),
                                         ({"max_edits": 0}, "max_edits"), ({"max_edits": 1.5}, "max_edits"),
                                         ({"logprobs": "sampler"}, "logprobs"), ({"patterns": ["hashes"]}, "patterns"),
                                         ({"max_lines": 0}, "max_lines")])
def test_dre_bad_hyper_parameters(params, key):
    with pytest.raises(ValueError, match=re.escape(key)):
        build("group_transform", "dre", params)


def test_dre_state_round_trip(tok):
    t = build("group_transform", "dre")
    t(make_batch(tok, [sample(tok, OVER), sample(tok, PLAIN)]))
    u = build("group_transform", "dre")
    u.load_state_dict(t.state_dict())
    assert u.metrics() == t.metrics() == {"edits": 1.0, "tokens_saved": 17.0, "edit_rate": 0.5}
    b = make_batch(tok, [sample(tok, OVER)])
    assert torch.equal(t(b).rewards, u(b).rewards)


# -- inside the trainer ----------------------------------------------------------------------------------------------
def test_dre_runs_in_the_toy_trainer(tmp_path):
    records = trainer(tmp_path, stages={"group_transform": "dre"}, params={"rollout_allocator": {"n": 4},
                      "group_transform": {"max_edits": 1}}, steps=2).run(resume=False)
    train = [r for r in records if r["kind"] == "train"]
    assert len(train) == 2 and all("group_transform.edits" in r for r in train)


_QUESTION = re.compile(r"numbers \[([\d, ]+)\], create an equation that equals (\d+)")


class TraceEngine:
    """Scripted Countdown rollouts: per prompt, overthought traces (more search after the "!" line), plain ones and
    garbage, with made-up sampler log-probs."""

    def __init__(self, policy):
        self.policy = policy

    def sync_weights(self, model):
        pass

    def generate(self, prompts, n, sampling):
        tok, out = self.policy.tokenizer, []
        for p, prompt in enumerate(prompts):
            m = _QUESTION.search(prompt)
            numbers, target = [int(x) for x in m.group(1).split(",")], int(m.group(2))
            for k in range(n):
                plain, over = overthink(numbers, target, seed=1000 * p + k, extra=1 + k % 3)
                text = [over, plain, "3+4=7 x"][k % 3]
                ids = ids_of(tok, text)
                out.append(SimpleNamespace(prompt_ids=ids_of(tok, prompt, eos=False), response_ids=ids, text=text,
                                           logprobs=[-1.0] * len(ids), entropies=[0.1] * len(ids),
                                           finish_reason="stop"))
        return out


def test_dre_edits_in_the_trainer_with_policy_logprobs(tmp_path, tok):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                         max_position_embeddings=512, pad_token_id=0, eos_token_id=2)).eval()
    policy = SimpleNamespace(model=model, tokenizer=tok, name="toy-cd", prompt_text=lambda ms: ms[-1]["content"])
    kwargs = dict(min_numbers=3, max_numbers=3, min_number=1, max_number=9, min_target=2, max_target=40,
                  prompt_template="{question}")
    cfg = from_dict(dict(model="toy-cd", steps=2, prompts_per_step=2, max_new_tokens=192, lr=1e-3, train_layers=-1,
                         eval_size=0, eval_every=0, out_dir=str(tmp_path), progress=False, plot=False, micro_batch=8,
                         stages={"group_transform": "dre"},
                         params={"rollout_allocator": {"n": 6}, "group_transform": {"max_edits": 2}}))
    def make() -> Trainer:
        return Trainer(cfg, policy=policy, engine=TraceEngine(policy), env=countdown_env(**kwargs),
                       eval_env=countdown_env(**kwargs))

    t = make()
    t.step = 1
    batch, gen = t.collect()
    assert gen["rollouts"] == 12 and len(batch) == 12 + 4  # two overthought rollouts per prompt, both edited
    edits = [i for i, info in enumerate(batch.infos) if info.get("dre_edit")]
    assert edits == list(range(12, 16))
    for i in edits:
        g = [j for j in range(12) if batch.group_ids[j] == batch.group_ids[i]]
        assert g and bool(batch.correct[i]) and float(batch.base_rewards[i]) == 1.0 > 0
        nums, target = batch.infos[i]["metadata"]["numbers"], batch.infos[i]["metadata"]["target"]
        assert verify(nums, target, batch.texts[i]).correct
    # behaviour log-probs of the edits are the current policy's (the trainer's own no-grad pass), 0 beyond the row
    mine = t._no_grad_stats(t.model, batch, edits)[0][edits]
    torch.testing.assert_close(batch.behaviour_logprobs[edits], mine * batch.response_mask[edits], atol=1e-5, rtol=0)
    assert not torch.all(batch.behaviour_logprobs[edits][batch.response_mask[edits]] == -1.0)
    records = make().run(resume=False)
    train = [r for r in records if r["kind"] == "train"]
    assert [r["group_transform.edits"] for r in train] == [4.0, 4.0] and train[0]["samples"] == 16
