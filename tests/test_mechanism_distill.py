"""The distillation methods' mechanism (issue 45, build item 5) and the precondition probe's pieces
(benchmarks/mechanism_distill.py), on tiny models built from a config:

- a teacher whose context holds the answer, in a model that learned to read it, puts more probability on the gold
  answer's tokens than the student does (the gap the probe measures), and an untrained model shows no such gap;
- the gap restricted to the answer reads exactly the answer's tokens;
- the probe's gap is the trainer's ``teacher_lp_gap`` (``context_stats``), and in the trainer a frozen ("initial")
  teacher's log-probs stay put across an update while a live teacher's move with the student.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from test_grpo_trainer import trainer

from agents.grpo.distill import context_stats
from agents.grpo.registry import build
from agents.policy.models import tiny_model, tiny_tokenizer

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("mechanism_distill", ROOT / "benchmarks" / "mechanism_distill.py")
md = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(md)

ANSWERS = ["317", "582", "946", "123", "775", "208", "664", "439"]


def _ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def _copy_task(tok) -> tuple[list[list[int]], list[list[int]], list[list[int]], torch.Tensor]:
    """Student prompt "Q:" (the answer unknowable), teacher prompt "Q:<a>|" (the answer in context), response
    "=<answer>a</answer>": prompts, responses and the answer-token mask from the probe's own functions."""
    student, teacher, responses, masks = [], [], [], []
    for a in ANSWERS:
        text = f"=<answer>{a}</answer>"
        ids, mask = md.span_token_mask(tok, text, md.answer_span(text, a))
        student.append(_ids(tok, "Q:"))
        teacher.append(_ids(tok, f"Q:{a}|"))
        responses.append(ids)
        masks.append(mask)
    return student, teacher, responses, torch.tensor(masks)


def _train_to_read_the_context(model, tok, steps: int = 80) -> None:
    """Teacher-forced cross-entropy on both contexts: the teacher's prompt determines the answer, the student's does
    not (so the best student spreads its mass over the 8 answers)."""
    student, teacher, responses, _ = _copy_task(tok)
    seqs = [p + r for p, r in zip(student + teacher, responses + responses)]
    n_prompt = [len(p) for p in student + teacher]
    width = max(map(len, seqs))
    ids = torch.tensor([s + [tok.pad_token_id] * (width - len(s)) for s in seqs])
    labels = ids.clone()
    for i, (k, s) in enumerate(zip(n_prompt, seqs)):
        labels[i, :k] = -100
        labels[i, len(s):] = -100
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    torch.manual_seed(0)
    for _ in range(steps):
        opt.zero_grad()
        model(input_ids=ids, labels=labels).loss.backward()
        opt.step()
    model.eval()


def test_answer_span_and_mask_cover_exactly_the_answer():
    tok = tiny_tokenizer()
    text = "2+7=9 [9]\n<answer>2+7</answer>"
    span = md.answer_span(text, "9")
    assert text[slice(*span)] == "2+7"  # the <answer> content wins over the bare gold answer
    ids, mask = md.span_token_mask(tok, text, span)
    assert tok.decode([t for t, m in zip(ids, mask) if m]) == "2+7" and sum(mask) == 3
    plain = "24 - 26 = -2. The answer is -2."
    assert plain[slice(*md.answer_span(plain, "-2"))] == "-2" and md.answer_span(plain, "-2")[0] == len(plain) - 3
    with pytest.raises(ValueError, match="no gold answer"):
        md.answer_span("nothing here", "5")


def test_a_teacher_that_reads_the_answer_in_its_context_has_a_positive_gold_answer_gap():
    tok = tiny_tokenizer()
    model = tiny_model(tok, seed=0)
    student, teacher, responses, mask = _copy_task(tok)

    def answer_gap() -> dict[str, float]:
        return md.gap_summary(md.token_gaps(model, student, teacher, responses, pad_id=tok.pad_token_id), mask)

    before = answer_gap()
    _train_to_read_the_context(model, tok)
    after = answer_gap()
    assert abs(before["gap_mean"]) < 0.3, before  # an untrained model does not read its context: no systematic gap
    # the student can at best spread over the 8 answers (log 8 = 2.08 nats on the first digit, then the digits follow
    # from the first); the teacher reads the answer off its context
    assert after["gap_first_token"] > 1.5 and after["gap_mean"] > 0.5, (before, after)


def test_the_answer_gap_reads_only_the_answer_tokens():
    tok = tiny_tokenizer()
    model = tiny_model(tok, seed=1)
    student, teacher, responses, mask = _copy_task(tok)
    gap = md.token_gaps(model, student, teacher, responses, pad_id=tok.pad_token_id)
    summary = md.gap_summary(gap, mask)
    assert summary["tokens"] == 3 * len(ANSWERS) and summary["rows"] == len(ANSWERS)
    assert summary["gap_mean"] == pytest.approx(float(gap[mask].mean()), rel=1e-6)
    first = mask.float().argmax(1)
    assert summary["gap_first_token"] == pytest.approx(float(gap[torch.arange(len(gap)), first].mean()), rel=1e-6)
    # rewrite what follows the answer: the answer tokens' gap is unchanged (causal), the all-token gap is not
    suffix = _ids(tok, "</answer>")
    changed = [r[: len(r) - len(suffix)] + _ids(tok, "#########") for r in responses]
    gap2 = md.token_gaps(model, student, teacher, changed, pad_id=tok.pad_token_id)
    full = md.lengths_mask(responses, gap.shape[1])
    assert md.gap_summary(gap2, mask)["gap_mean"] == pytest.approx(summary["gap_mean"], abs=1e-6)
    assert md.gap_summary(gap2, full)["gap_mean"] != pytest.approx(md.gap_summary(gap, full)["gap_mean"], abs=1e-4)
    # rewrite what precedes it: now the answer's gap moves (the mask is not reading a constant)
    before_answer = [_ids(tok, "~") + r[1:] for r in responses]
    gap3 = md.token_gaps(model, student, teacher, before_answer, pad_id=tok.pad_token_id)
    assert md.gap_summary(gap3, mask)["gap_mean"] != pytest.approx(summary["gap_mean"], abs=1e-4)


def test_the_probe_gap_is_the_trainers_teacher_lp_gap():
    tok = tiny_tokenizer()
    model, frozen = tiny_model(tok, seed=2), tiny_model(tok, seed=3)
    student, teacher, responses, _ = _copy_task(tok)
    for other in (None, frozen):
        with torch.no_grad():
            stats = context_stats(model, student, teacher, responses, divergence="none", temperature=0.7,
                                  pad_id=tok.pad_token_id, teacher_model=other)
        gap = md.token_gaps(model, student, teacher, responses, temperature=0.7, pad_id=tok.pad_token_id,
                            teacher_model=other)
        torch.testing.assert_close(gap, (stats.teacher_logprobs - stats.logprobs).float(), atol=1e-5, rtol=0)


def _teacher_logprobs_around_one_update(tmp_path, loss: str, teacher: str) -> tuple[torch.Tensor, ...]:
    t = trainer(tmp_path, max_new_tokens=3, stages={"loss": loss}, params={"rollout_allocator": {"n": 4},
                                                                          "loss": {"teacher": teacher}})
    t.step = 1
    batch, _ = t.collect()
    batch.rewards = t.components["reward_shaper"](batch).float()
    batch.advantages = t.components["advantage"](batch)
    loss_fn = t.components["loss"]
    rows = list(range(len(batch)))
    prompts = loss_fn.teacher_prompt_ids(batch, rows)

    def stats():
        with torch.no_grad():
            return t._context_stats(batch, rows, prompts, loss_fn)

    s0 = stats()
    t.update(batch)
    s1 = stats()
    return s0.teacher_logprobs, s1.teacher_logprobs, s0.logprobs, s1.logprobs


@pytest.mark.parametrize("loss", ["opsd", "distil"])
def test_initial_teacher_stays_fixed_and_live_teacher_moves_in_the_trainer(tmp_path, loss):
    t0, t1, s0, s1 = _teacher_logprobs_around_one_update(tmp_path / "initial", loss, "initial")
    assert not torch.equal(s0, s1)  # the update moved the student
    torch.testing.assert_close(t0, t1, atol=0, rtol=0)  # ...and not the frozen start policy
    t0, t1, s0, s1 = _teacher_logprobs_around_one_update(tmp_path / "live", loss, "live")
    assert not torch.equal(s0, s1)
    assert float((t1 - t0).abs().max()) > 1e-4  # the live teacher is the student's weights


def test_teacher_defaults_follow_each_method():
    # OPSD's specification and public code fix the teacher at the start policy; DistIL's expert is the live model
    assert build("loss", "opsd", {}).teacher == "initial" and build("loss", "dash_opsd", {}).teacher == "initial"
    assert build("loss", "distil", {}).teacher == "live"
    with pytest.raises(ValueError, match="teacher"):
        build("loss", "distil", {"teacher": "ema"})
