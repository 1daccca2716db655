"""The reproduced leaderboard tier: with a policy loadable here (the tiny model, built from a config), a board decodes
a seeded sample again and recounts tokens, so rewritten responses, a false model name and fake token counts are
rejected; every other entry is marked self-reported, field by field, in ``show`` and on the page."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import gymnasium as gym
import pytest
from harness_toy import SeededAgent

import rlvr_envs  # noqa: F401
from rlvr_envs.cli import main as rlvr_main
from rlvr_envs.harness import evaluate
from rlvr_envs.harness import leaderboard as lb
from rlvr_envs.harness.metrics import answer_equivalence, compute_metrics
from rlvr_envs.harness.reproduce import REPRODUCED, SELF_REPORTED, evidence_text, token_slack

pytest.importorskip("torch")
ENV_ID = "rlvr/Arithmetic-v0"
N_SAMPLES, LIMIT = 2, 3


@pytest.fixture(scope="module")
def policy_results(tmp_path_factory) -> dict:
    """A real evaluation of the tiny model (seed 0), sampled at T = 1 with per-sample seeds."""
    from agents.policy import PolicyAgent, load_policy
    from agents.policy.engine import SamplingParams, make_engine

    policy = load_policy("tiny", seed=0)
    agent = PolicyAgent(policy, make_engine(policy, precision="fp32"),
                        SamplingParams(temperature=1.0, max_new_tokens=12, seed=0))
    out = tmp_path_factory.mktemp("reproduce") / "tiny.json"
    evaluate(agent, ENV_ID, n_samples=N_SAMPLES, limit=LIMIT, seed=3, out=out, progress=False, batch_size=4)
    doc = json.loads(out.read_text())
    assert doc["provenance"]["agent"]["model"] == "tiny-seed0"
    assert all(isinstance(r["tokens"], int) for r in doc["records"])
    return doc


def remeasure(doc: dict) -> dict:
    """Recompute the claimed metrics after an edit, as a careful forger would (so re-verification alone passes)."""
    env = gym.make(doc["config"]["env_id"], **doc["config"]["env_kwargs"])
    doc["metrics"] = compute_metrics(doc["records"], doc["config"]["n_samples"],
                                     n_params=doc["provenance"]["agent"].get("n_params"),
                                     same_answer=answer_equivalence(env))
    env.close()
    lb.verify_results(doc)  # the forgery passes every check a board made before tiers
    return doc


def submit(doc: dict, boards: Path, **kw) -> dict:
    return lb.submit(doc, "arith", boards_dir=boards, reproduce=LIMIT * N_SAMPLES, **kw)


def test_an_honest_run_of_a_loadable_policy_is_reproduced(policy_results, tmp_path, capsys):
    results = tmp_path / "results.json"
    results.write_text(json.dumps(policy_results))
    boards = str(tmp_path / "boards")
    assert rlvr_main(["leaderboard", "--boards-dir", boards, "submit", str(results), "--board", "arith",
                      "--reproduce", str(LIMIT * N_SAMPLES)]) == 0
    assert "responses: reproduced (6 of 6)" in capsys.readouterr().out
    (entry,) = lb.load_board(tmp_path / "boards" / "arith.json")["entries"]
    ev = entry["evidence"]
    assert ev["tier"] == REPRODUCED and all(ev[f] == REPRODUCED for f in ("model", "responses", "tokens"))
    assert ev["sample"]["records"] == ev["sample"]["of"] == LIMIT * N_SAMPLES
    assert rlvr_main(["leaderboard", "--boards-dir", boards, "show", "arith", "--per-seed"]) == 0
    assert "model: reproduced; responses: reproduced (6 of 6); tokens: reproduced" in capsys.readouterr().out


def test_rewritten_responses_are_rejected(policy_results, tmp_path):
    doc = copy.deepcopy(policy_results)
    env = gym.make(ENV_ID).unwrapped
    for rec in doc["records"]:  # every wrong answer rewritten into a right one, verdict fields to match
        gold = env.source.task(rec["task_index"]).answer
        rec.update(response=f"\\boxed{{{gold}}}", parsed_answer=str(gold), correct=True, reward=1.0, format_ok=True,
                   status="correct", tokens=len(f"\\boxed{{{gold}}}") + 1)
    remeasure(doc)
    assert doc["metrics"]["accuracy"] == 1.0
    with pytest.raises(lb.SubmissionRejected, match="not what tiny-seed0 decodes"):
        submit(doc, tmp_path)
    assert not (tmp_path / "arith.json").exists()


def test_a_false_model_name_is_rejected(policy_results, tmp_path):
    doc = copy.deepcopy(policy_results)
    doc["provenance"]["agent"]["model"] = "tiny-seed1"  # a loadable model, but not the one that wrote these
    with pytest.raises(lb.SubmissionRejected, match="weights hash here is"):
        submit(doc, tmp_path)


def test_fake_token_counts_are_rejected(policy_results, tmp_path):
    doc = copy.deepcopy(policy_results)
    for rec in doc["records"]:
        rec["tokens"] = 1
    remeasure(doc)
    with pytest.raises(lb.SubmissionRejected, match="the tokenizer counts"):
        submit(doc, tmp_path)
    # one count below the recount's slack, or above what the sampling cap allows, is caught on any record
    from agents.policy import load_policy

    tokenizer = load_policy("tiny", seed=0).tokenizer
    for fake in ("low", "high"):
        doc = copy.deepcopy(policy_results)
        rec = max(doc["records"], key=lambda r: r["tokens"])
        recount = len(tokenizer(rec["response"], add_special_tokens=False)["input_ids"])
        rec["tokens"] = recount - token_slack(recount) - 1 if fake == "low" else 12 + 1  # max_new_tokens=12
        remeasure(doc)
        with pytest.raises(lb.SubmissionRejected, match="the tokenizer counts"):
            lb.submit(doc, "arith", boards_dir=tmp_path, reproduce=1)


def test_unloadable_agents_are_self_reported_field_by_field(tmp_path, capsys):
    out = tmp_path / "toy-results.json"
    boards = tmp_path / "boards"
    evaluate(SeededAgent(), ENV_ID, n_samples=1, limit=2, seed=0, out=out, progress=False)
    entry = lb.submit(out, "toy", boards_dir=boards)
    assert entry["evidence"]["tier"] == SELF_REPORTED
    assert evidence_text(entry) == "model: self-reported; responses: self-reported; tokens: self-reported"
    assert "not requested" in entry["evidence"]["reason"]
    with pytest.raises(lb.SubmissionRejected, match="needs the evaluated policy loadable here"):
        lb.submit(out, "toy-reproduced", boards_dir=boards, reproduce=2)  # asked for, so refused, not downgraded
    assert rlvr_main(["leaderboard", "--boards-dir", str(boards), "show", "toy", "--per-seed"]) == 0
    assert "model: self-reported; responses: self-reported; tokens: self-reported" in capsys.readouterr().out
    # entries from before tiers carry no evidence: nothing was reproduced, so they show as self-reported
    assert evidence_text({"model": "old"}).count(SELF_REPORTED) == 3
    pytest.importorskip("matplotlib")
    from rlvr_envs.harness.render import render_site

    page = render_site(boards, tmp_path / "site").read_text()
    assert "model: self-reported; responses: self-reported; tokens: self-reported" in page
