"""Agon (agents/methods/agon.py): rewards, alternating roles, both policies trained, the cascade eval and agent,
exact resume with the partner's weights in the checkpoint."""

from __future__ import annotations

import json

import pytest
import torch
from test_grpo_trainer import strip, trainer

from agents.grpo.registry import build
from agents.methods.agon import CascadeAgent, agon_rewards, with_draft


def agon_trainer(out, steps: int = 4):
    return trainer(out, steps=steps, stages={"orchestrator": "agon"}, checkpoint_every=1, eval_size=4, eval_every=2,
                   params={"rollout_allocator": {"n": 4},
                           "orchestrator": {"beta": 0.5, "trainer_factory": "grpo_toys:federated_toy_trainer"}})


def weights(model) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()]).clone()


def test_rewards_golden():
    d, s = torch.tensor([True, True, False, False]), torch.tensor([True, False, True, False])
    r_d, r_s = agon_rewards(d, s, 0.5)
    torch.testing.assert_close(r_d, torch.tensor([1.0, 1.5, -0.5, 0.0]))
    torch.testing.assert_close(r_s, torch.tensor([1.0, -0.5, 1.5, 0.0]))
    with pytest.raises(ValueError, match="beta"):
        build("orchestrator", "agon", {"beta": 1.0})
    with pytest.raises(ValueError, match="draft"):
        build("orchestrator", "agon", {"draft_template": "no slot"})
    assert with_draft([{"role": "user", "content": "Q"}], "d", "|{draft}")[0]["content"] == "Q|d"


def test_roles_alternate_and_both_policies_learn(tmp_path):
    tr = agon_trainer(tmp_path / "a")
    main_before = weights(tr.model)
    records = tr.run(resume=False)
    train = [r for r in records if r["kind"] == "train"]
    assert [r["orchestrator.drafter_is_main"] for r in train] == [1.0, 0.0, 1.0, 0.0]
    assert all(r["rollouts"] == 2 * 4 * 4 for r in train)  # drafts + answers: 4 prompts x 4 each
    partner = tr.components["orchestrator"].partner
    assert not torch.equal(main_before, weights(tr.model))
    assert not torch.equal(weights(partner.model), weights(tr.model))
    assert [r["step"] for r in records if r["kind"] == "eval"] == [0, 2, 4]


def test_resumed_run_equals_the_uninterrupted_one(tmp_path):
    whole = strip(agon_trainer(tmp_path / "whole").run(resume=False))
    agon_trainer(tmp_path / "cut").run(resume=False, stop_after=3)
    resumed = strip(agon_trainer(tmp_path / "cut").run(resume=True))
    assert resumed == whole


class EchoAgent:
    def __init__(self, tag):
        self.tag, self.seen = tag, []

    def act(self, observations, infos):
        self.seen.append([i["messages"][-1]["content"] for i in infos])
        return [f"{self.tag}:{o}" for o in observations]

    def describe(self):
        return {"model": self.tag}


def test_cascade_agent_shows_the_draft_to_the_solver():
    drafter, solver = EchoAgent("A"), EchoAgent("B")
    agent = CascadeAgent(drafter, solver, template=" [draft: {draft}]")
    out = agent.act(["q1", "q2"], [{"messages": [{"role": "user", "content": "q1"}]},
                                   {"messages": [{"role": "user", "content": "q2"}]}])
    assert out == ["B:q1", "B:q2"] and agent.last_drafts == ["A:q1", "A:q2"]
    assert solver.seen == [["q1 [draft: A:q1]", "q2 [draft: A:q2]"]] and drafter.seen == [["q1", "q2"]]
    assert agent.describe()["model"] == "cascade: A drafts -> B answers"


def test_a_finished_agon_run_publishes_its_cascade_as_one_board_entry(tmp_path):
    from agents.grpo.config import load_recipe
    from agents.grpo.publish import publish_run
    from agents.grpo.regression import QUICK_OVERRIDES
    from agents.grpo.trainer import Trainer

    cfg = load_recipe("agon", [*QUICK_OVERRIDES, "progress=false", "plot=false", f"out_dir={tmp_path / 'run'}"],
                      lane="micro")
    Trainer(cfg).run(resume=False)
    entry = publish_run(tmp_path / "run", boards_dir=tmp_path / "boards", board="lane-agon-test",
                        results_dir=tmp_path / "results")
    assert entry["model"].startswith("cascade: tiny + agon (seed 0) drafts -> ") and "answers" in entry["model"]
    assert entry["n_tasks"] == cfg.eval_size and entry["training"]["weights_hash"] == entry["weights_hash"]
    from benchmarks.agon_alone import main as alone

    out = tmp_path / "alone.json"
    parts = alone([str(tmp_path / "run"), "--out", str(out)])
    assert [r["run_dir"] for r in parts["runs"]] == ["run"]
    for name in ("this_run_policy_alone", "partner_alone"):  # each policy without a draft, on the same tasks
        assert parts["runs"][0][name]["n_tasks"] == cfg.eval_size and 0.0 <= parts["runs"][0][name]["accuracy"] <= 1.0
    assert json.loads(out.read_text()) == parts
    plain = tmp_path / "plain"  # a run without the agon orchestrator is refused before anything is evaluated
    Trainer(load_recipe("grpo", [*QUICK_OVERRIDES, "steps=1", "progress=false", "plot=false", f"out_dir={plain}"],
                        lane="micro")).run(resume=False)
    refused = tmp_path / "refused.json"
    with pytest.raises(SystemExit):
        alone([str(tmp_path / "run"), str(plain), "--out", str(refused)])
    assert not refused.exists()  # the Agon run listed first was not evaluated and written either
