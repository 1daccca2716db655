"""OPSD / DASH-OPSD (agents/methods/opsd.py): golden token weights, the privileged context, loss algebra, and one
gradient step moving the student toward its privileged view."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.grpo.batch import GroupBatch, Sample
from agents.grpo.distill import ContextStats, context_stats
from agents.grpo.registry import build
from agents.methods.opsd import dash_weights, privileged_messages, reference_solution
from agents.policy.countdown_traces import check_trace
from agents.policy.models import load_policy
from rlvr_envs.verifiers.countdown import verify


def test_dash_weights_golden():
    d, mask = torch.tensor([[1.0, 3.0, 0.0, 2.0, 0.0]]), torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])
    # kappa = 0: every gate is 1/2. gamma = 1: W4 = 2, W3 = 0 + 0.5 * 2 = 1, W2 = 3 + 0.5 * 1 = 3.5, W1 = 1 + 1.75
    raw = dash_weights(d, mask, gamma=1.0, kappa=0.0, normalize=False)
    torch.testing.assert_close(raw, torch.tensor([[2.75, 3.5, 1.0, 2.0, 0.0]]))
    norm = dash_weights(d, mask, gamma=1.0, kappa=0.0)
    torch.testing.assert_close(norm, raw / 2.3125)
    # gamma = 0: no horizon, the weights are the divergences themselves (normalized)
    torch.testing.assert_close(dash_weights(d, mask, gamma=0.0, kappa=5.0, normalize=False), d * mask)
    # a sharp gate carries only through tokens above the mean (1.5): token 2 (D = 3) passes W3 on, token 4 (D = 2)
    # would pass W5 = 0; token 1 (D = 1) and token 3 (D = 0) stop the carry
    sharp = dash_weights(d, mask, gamma=1.0, kappa=200.0, normalize=False)
    torch.testing.assert_close(sharp, torch.tensor([[1.0, 3.0, 0.0, 2.0, 0.0]]), atol=1e-6, rtol=0)
    d2 = torch.tensor([[3.0, 2.0, 0.0]])  # mean 5/3: tokens 1 and 2 above it carry
    torch.testing.assert_close(dash_weights(d2, torch.ones(1, 3), gamma=0.5, kappa=200.0, normalize=False),
                               torch.tensor([[3.0 + 0.5 * 2.0, 2.0, 0.0]]), atol=1e-6, rtol=0)
    # an all-zero row keeps weight 1 on its tokens after normalizing (no 0 / 0)
    torch.testing.assert_close(dash_weights(torch.zeros(1, 3), torch.ones(1, 3), gamma=0.9, kappa=5.0),
                               torch.ones(1, 3))


def _batch(n_rows: int, width: int, seed: int = 0) -> tuple[GroupBatch, ContextStats]:
    rng = np.random.default_rng(seed)
    samples = []
    for i in range(n_rows):
        k = int(rng.integers(1, width + 1))
        samples.append(Sample(group_id=f"g{i // 2}", prompt="p", prompt_ids=[1], response_ids=[2] * k, text="x",
                              reward=float(i % 2), logprobs=[-1.0] * k))
    batch = GroupBatch.from_samples(samples)
    batch.advantages = torch.tensor(rng.normal(size=n_rows), dtype=torch.float32)
    w = batch.response_mask.shape[1]
    div = torch.tensor(rng.uniform(0, 2, size=(n_rows, w)), dtype=torch.float32) * batch.response_mask
    lp = torch.tensor(rng.uniform(-3, 0, size=(n_rows, w)), dtype=torch.float32) * batch.response_mask
    return batch, ContextStats(logprobs=lp, entropies=torch.zeros_like(lp), teacher_logprobs=lp - 0.5,
                               divergence=div)


def _rows(stats: ContextStats, rows: list[int]) -> ContextStats:
    return ContextStats(*(getattr(stats, f)[rows] for f in ("logprobs", "entropies", "teacher_logprobs", "divergence")))


@settings(max_examples=25, deadline=None)
@given(st.integers(2, 9), st.integers(1, 6), st.integers(0, 10_000), st.sampled_from(["opsd", "dash_opsd"]),
       st.sampled_from(["seq-mean-token-mean", "token-mean"]), st.sampled_from([0.0, 0.5]))
def test_losses_of_a_partition_of_rows_add_up_to_the_batch_loss(n, width, seed, name, aggregation, rl_coef):
    batch, stats = _batch(n, width, seed)
    loss_fn = build("loss", name, {"aggregation": aggregation, "rl_coef": rl_coef})
    full, _ = loss_fn(batch, stats.logprobs, None, context=stats)
    cut = int(np.random.default_rng(seed).integers(1, n))
    parts = [list(range(cut)), list(range(cut, n))]
    total = sum(float(loss_fn(batch, stats.logprobs[p], p, context=_rows(stats, p))[0]) for p in parts)
    assert total == pytest.approx(float(full), rel=1e-5, abs=1e-6)


def test_opsd_loss_is_the_aggregated_divergence_and_dash_reweights_it():
    batch, stats = _batch(4, 5, seed=3)
    mask = batch.response_mask.float()
    opsd = build("loss", "opsd", {})
    loss, metrics = opsd(batch, stats.logprobs, None, context=stats)
    per_row = (stats.divergence * mask).sum(1) / mask.sum(1)
    assert float(loss) == pytest.approx(float(per_row.mean()), rel=1e-6)
    assert metrics["tokens"] == float(mask.sum())
    assert opsd.metrics()["teacher_lp_gap"] == pytest.approx(-0.5, abs=1e-6)
    dash = build("loss", "dash_opsd", {"gamma": 0.0, "normalize": False})
    loss_d, _ = dash(batch, stats.logprobs, None, context=stats)
    want = ((stats.divergence ** 2 * mask).sum(1) / mask.sum(1)).mean()  # weights = D_t (detached) at gamma 0
    assert float(loss_d) == pytest.approx(float(want), rel=1e-6)


def test_bad_settings_and_missing_context_are_clear_errors():
    with pytest.raises(ValueError, match="beta"):
        build("loss", "opsd", {"beta": 2.0})
    with pytest.raises(ValueError, match="solution"):
        build("loss", "opsd", {"template": "no placeholder"})
    with pytest.raises(ValueError, match="gamma"):
        build("loss", "dash_opsd", {"gamma": 1.5})
    batch, stats = _batch(2, 3)
    with pytest.raises(ValueError, match="teacher context"):
        build("loss", "opsd", {})(batch, stats.logprobs, None)


def test_privileged_context():
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "Q?"}]
    out = privileged_messages(messages, "42", "\nSolution: {solution}")
    assert out[-1]["content"] == "Q?\nSolution: 42" and messages[-1]["content"] == "Q?"
    with pytest.raises(ValueError, match="no user message"):
        privileged_messages([{"role": "system", "content": "s"}], "42")
    numbers, target = [8, 2, 5], 2
    text = reference_solution({"task_id": "cd-1", "metadata": {"numbers": numbers, "target": target}})
    assert verify(numbers, target, text).correct and check_trace(numbers, target, text).reached
    assert text == reference_solution({"task_id": "cd-1", "metadata": {"numbers": numbers, "target": target}})
    assert reference_solution({"metadata": {"solution": " step\nanswer "}}) == "step\nanswer"
    assert reference_solution({"answer": "17", "metadata": {}}) == "The answer is 17."
    with pytest.raises(ValueError, match="no reference solution"):
        reference_solution({"task_id": "t", "metadata": {}})


def test_one_step_on_the_opsd_loss_moves_the_student_toward_its_privileged_view():
    policy = load_policy("tiny", seed=0)
    model = policy.model
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    student = [torch.randint(vocab, (4,), generator=gen).tolist() for _ in range(6)]
    teacher = [torch.randint(vocab, (5,), generator=gen).tolist() + p for p in student]
    responses = [torch.randint(vocab, (8,), generator=gen).tolist() for _ in range(6)]
    opt = torch.optim.SGD(model.parameters(), lr=0.5)

    def mean_div() -> torch.Tensor:
        return context_stats(model, student, teacher, responses, beta=0.5).divergence.mean()

    loss = mean_div()
    loss.backward()
    before = float(loss.detach())
    opt.step()
    with torch.no_grad():
        after = float(mean_div())
    assert after < before * 0.99, (before, after)


# -- RLCSD and DistIL ------------------------------------------------------------------------------------------------
class _Tok:
    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text]}


def _hinted_batch(groups: int = 3, per_group: int = 2) -> GroupBatch:
    samples = []
    for g in range(groups):
        for k in range(per_group):
            samples.append(Sample(group_id=f"g{g}", prompt="q", prompt_ids=[1], response_ids=[5, 6, 7][: 2 + k % 2],
                                  text="x", reward=float(k % 2), correct=bool(k % 2),
                                  info={"task_id": f"t{g}", "answer": str(10 + g), "parsed_answer": "3",
                                        "messages": [{"role": "user", "content": f"Q{g}"}], "metadata": {}}))
    return GroupBatch.from_samples(samples)


def test_rlcsd_adds_the_clipped_contrast_of_the_right_and_wrong_hint_to_grpo():
    from types import SimpleNamespace

    seen = []

    def context_logprobs(batch, prompt_ids, rows):
        texts = ["".join(map(chr, p)) for p in prompt_ids]
        seen.append(texts)
        # log-prob of every token = the hinted answer's number / 10 (so right - wrong is known per row)
        vals = torch.tensor([float(t.rsplit("The answer is ", 1)[1].rstrip(".")) / 10 for t in texts])
        return vals[:, None].expand(len(rows), batch.response_mask.shape[1]).clone()

    services = SimpleNamespace(prompt_text=lambda m: m[-1]["content"], tokenizer=_Tok(),
                               context_logprobs=context_logprobs)
    batch = _hinted_batch()
    adv = build("advantage", "rlcsd", {"lam": 0.5, "clip": 0.15})
    adv.bind(services)
    out = adv(batch)
    grpo = build("advantage", "grpo", {})(batch)
    # row of group g: right hint answer 10 + g, wrong hint the next group's (cyclic): s = -0.1, -0.1, +0.2 -> clip 0.15
    s = torch.tensor([-0.1, -0.1, -0.1, -0.1, 0.15, 0.15])
    want = (grpo[:, None] + 0.5 * s[:, None]) * batch.response_mask
    torch.testing.assert_close(out, want.float(), atol=1e-6, rtol=0)
    assert seen[0][0] == "Q0\n\nA verified solution:\nThe answer is 10." and seen[1][0].endswith("is 11.")
    metrics = adv.metrics()
    assert metrics["clipped"] == pytest.approx(5 / 15)  # group 2: its rows have 2 + 3 of the 15 tokens
    one = _hinted_batch(groups=1)
    torch.testing.assert_close(adv(one), (build("advantage", "grpo", {})(one)[:, None] * one.response_mask).float())
    with pytest.raises(ValueError, match="lam"):
        build("advantage", "rlcsd", {"lam": -1})


def test_distil_expert_reads_feedback_on_the_rows_own_attempt_and_trains_forward_ce():
    from types import SimpleNamespace

    loss_fn = build("loss", "distil", {})
    assert loss_fn.divergence == "forward_ce"
    loss_fn.bind(SimpleNamespace(prompt_text=lambda m: m[-1]["content"], tokenizer=_Tok()))
    batch = _hinted_batch(groups=1)
    texts = ["".join(map(chr, p)) for p in loss_fn.teacher_prompt_ids(batch, [0, 1])]
    assert "answer 3 is incorrect" in texts[0] and "answer 3 is correct" in texts[1]
    assert texts[0].startswith("Q0\n\nFeedback") and texts[0].endswith("The answer is 10.")
    with pytest.raises(ValueError, match="verdict"):
        build("loss", "distil", {"feedback": "{solution}"})
