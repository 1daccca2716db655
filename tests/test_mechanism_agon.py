"""Agon's mechanism on constructed outcomes (fake learners, no model): in a real ``orchestrated_step`` each role is
rewarded as the spec reads the paper, r_X = c_X + beta (c_X - c_Y) with c_Y the rival's verdict *on the same draft*;
the solver reads that draft; the roles alternate by step; the cascade eval drafts with this run's policy and answers
with the partner."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import torch

from agents.grpo.batch import GroupBatch, Sample
from agents.grpo.registry import build

BETA = 0.5
N = 4  # drafts per prompt
# per prompt: the draft k's verdict, and the verdict of the answer written after reading draft k
DRAFT_OK = {0: [1, 1, 0, 0], 1: [0, 1, 0, 1]}
SOLVE_OK = {0: [1, 0, 1, 0], 1: [0, 0, 1, 1]}
DRAFT = re.compile(r"DRAFT\((\w+) q(\d) k(\d)\)")


class Learner:
    """What ``AgonOrchestrator.orchestrated_step`` touches of a trainer. Drafts are ``DRAFT(name qI kK)``, right or
    wrong by ``DRAFT_OK``; an answer is right by ``SOLVE_OK`` of the draft its prompt shows (none shown: an error)."""

    def __init__(self, name: str):
        self.name, self.step, self.updates = name, 1, []
        self.cfg = SimpleNamespace(prompts_per_step=2, train_pool=0, seed=0)
        self.env = SimpleNamespace(unwrapped=SimpleNamespace(source=list(range(10))))
        self.components = {"advantage": build("advantage", "grpo"),
                           "rollout_allocator": build("rollout_allocator", "fixed", {"n": N}),
                           "prompt_selector": SimpleNamespace(select=lambda k, n_tasks, step: list(range(k)))}
        self.policy = SimpleNamespace(prompt_text=lambda messages: "\n".join(m["content"] for m in messages))
        self.engine = SimpleNamespace(sync_weights=lambda model: None, generate=self.engine_generate)
        self.model, self.rollouts_total, self.tokens_total = None, 0, 0
        self.flops = {"generation": 0.0, "training": 0.0}

    def _open_groups(self, indices, step, round_):
        return {f"{step}:0:{j}:q{i}": {"task_id": f"q{i}", "index": i, "metadata": {}, "prompt": "",
                                       "messages": [{"role": "user", "content": f"Q{i}"}]} for j, i in enumerate(indices)}

    def respond(self, prompt: str, k: int) -> tuple[str, bool]:
        shown = DRAFT.findall(prompt)
        if not shown:  # drafting
            q = int(prompt.strip()[1])
            return f"DRAFT({self.name} q{q} k{k})", bool(DRAFT_OK[q][k])
        _, q, d = shown[-1]
        return f"ANSWER({self.name} to q{q} k{d})", bool(SOLVE_OK[int(q)][int(d)])

    def _generate(self, requests, groups, seed):
        samples = []
        for gid, n in requests.items():
            for k in range(n):
                text, ok = self.respond(groups[gid]["prompt"], k)
                samples.append(Sample(group_id=gid, prompt=groups[gid]["prompt"], prompt_ids=[1], response_ids=[2, 3],
                                      text=text, reward=float(ok), correct=ok))
        return GroupBatch.from_samples(samples, step=self.step)

    def engine_generate(self, prompts, n, sampling):
        return [SimpleNamespace(text=self.respond(p, k)[0]) for p in prompts for k in range(n)]

    def update(self, batch):
        self.updates.append(batch)
        return {"loss": 0.0}

    def flop_record(self):
        return {}


def role_reward(own: float, rival: float) -> float:
    return own + BETA * (own - rival)


def run_step(step: int):
    main, partner = Learner("main"), Learner("partner")
    main.step = partner.step = step
    orch = build("orchestrator", "agon", {"beta": BETA})
    orch.partner = partner
    orch.orchestrated_step(main)
    return main, partner, orch


@pytest.mark.parametrize("step", [1, 2])
def test_each_role_is_rewarded_for_its_verdict_and_its_margin_on_the_same_draft(step):
    main, partner, orch = run_step(step)
    drafter, solver = (main, partner) if step % 2 else (partner, main)  # odd steps: this run's policy drafts
    assert orch.metrics()["drafter_is_main"] == float(step % 2)
    (drafts,), (answers,) = drafter.updates, solver.updates
    d = [float(x) for q in (0, 1) for x in DRAFT_OK[q]]
    s = [float(x) for q in (0, 1) for x in SOLVE_OK[q]]
    # the solver read draft k of prompt q and answered it: its rows pair one to one with the drafter's
    assert [t.split(" ", 1)[1] for t in answers.texts] == [f"to q{q} k{k})" for q in (0, 1) for k in range(N)]
    assert all(p.endswith(f"DRAFT({drafter.name} q{q} k{k})\n") for p, (q, k) in
               zip(answers.prompts, [(q, k) for q in (0, 1) for k in range(N)]))
    torch.testing.assert_close(drafts.rewards, torch.tensor([role_reward(a, b) for a, b in zip(d, s)]))
    torch.testing.assert_close(answers.rewards, torch.tensor([role_reward(b, a) for a, b in zip(d, s)]))
    # golden, prompt 0 (d = 1 1 0 0, s = 1 0 1 0): the drafter 1, 1.5, -0.5, 0; the solver 1, -0.5, 1.5, 0
    assert drafts.rewards[:4].tolist() == [1.0, 1.5, -0.5, 0.0] and answers.rewards[:4].tolist() == [1.0, -0.5, 1.5, 0.0]
    # out-solving the rival pays most, being out-solved least, and a right answer always beats a wrong one
    assert role_reward(1, 0) > role_reward(1, 1) > role_reward(0, 0) > role_reward(0, 1)
    # the env's verdicts stay the base rewards; each role's GRPO group is one prompt's n drafts / n answers
    assert drafts.base_rewards.tolist() == d and answers.base_rewards.tolist() == s
    assert answers.num_groups == drafts.num_groups == 2 and answers.group_ids == drafts.group_ids
    torch.testing.assert_close(answers.advantages, build("advantage", "grpo")(answers))
    assert orch.metrics() == {}  # read once
    assert main.rollouts_total == 2 * 2 * N


def test_answers_out_of_order_are_refused():
    main, partner = Learner("main"), Learner("partner")
    real = partner._generate
    partner._generate = lambda requests, groups, seed: real(dict(reversed(list(requests.items()))), groups, seed)
    orch = build("orchestrator", "agon", {"beta": BETA})
    orch.partner = partner
    with pytest.raises(RuntimeError, match="order"):
        orch.orchestrated_step(main)


def test_the_cascade_eval_drafts_with_this_policy_and_answers_with_the_partner():
    main, partner = Learner("main"), Learner("partner")
    orch = build("orchestrator", "agon", {"beta": BETA})
    orch.partner = partner
    out = orch.generate_eval(main, ["Q0", "Q1"], [[{"role": "user", "content": "Q0"}],
                                                  [{"role": "user", "content": "Q1"}]], 2, None)
    assert [o.text for o in out] == ["ANSWER(partner to q0 k0)", "ANSWER(partner to q0 k1)",
                                     "ANSWER(partner to q1 k0)", "ANSWER(partner to q1 k1)"]
