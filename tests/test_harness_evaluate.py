"""evaluate(): records, metrics, provenance, per-sample seeds, Ctrl-C and kill-and-resume on a toy env."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness_toy import TOY_ID, GoldAgent, SeededAgent

from rlvr_envs.harness import Results, SchemaError, evaluate, sample_seed, validate
from rlvr_envs.harness.evaluate import sidecar_path, turn_seed

TESTS = Path(__file__).resolve().parent


def run_toy(tmp_path=None, name="r.json", **kw):
    args = dict(n_samples=3, seed=5, limit=10, progress=False, batch_size=4)
    args.update(kw)
    agent = args.pop("agent", None) or SeededAgent()
    out = tmp_path / name if tmp_path is not None else None
    return evaluate(agent, TOY_ID, out=out, **args)


def expected_correct(ti, si, seed):
    return ti % 2 == 0 and sample_seed(seed, ti, si) % 4 != 0


def test_records_metrics_and_provenance(tmp_path):
    res = run_toy(tmp_path)
    assert res.complete and len(res.records) == 30
    assert [(r["task_index"], r["sample_index"]) for r in res.records] == [(t, s) for t in range(10) for s in range(3)]
    for r in res.records:
        assert r["seed"] == sample_seed(5, r["task_index"], r["sample_index"])
        assert r["correct"] is expected_correct(r["task_index"], r["sample_index"], 5)
        assert r["task_id"] == f"toy-{r['task_index']}"
        assert r["parsed_answer"] == r["response"].split("{")[1].rstrip("}")
        assert r["tokens"] == len(r["response"].split()) + 3
    acc = sum(expected_correct(t, s, 5) for t in range(10) for s in range(3)) / 30
    m = res.metrics
    assert m["accuracy"] == pytest.approx(acc) and m["pass@1"] == pytest.approx(acc)
    assert 0 < m["pass@1"] <= m["pass@2"] <= m["pass@3"] <= 0.5  # odd tasks are never right
    assert m["length_unit"] == "tokens" and m["tokens_generated"] == sum(r["tokens"] for r in res.records)
    assert m["flops_estimate"] == 2 * 1000 * m["tokens_generated"]
    assert set(m["accuracy_by_subject"]) == {"algebra", "geometry", "counting"}
    assert m["format_error_rate"] == 0.0
    prov = res.provenance
    assert prov["env"]["id"] == TOY_ID and prov["env"]["version"] == 0
    assert prov["agent"]["model"] == "seeded-fake" and prov["agent"]["class"].endswith("SeededAgent")
    assert len(prov["data"]["fingerprint"]) == 64 and prov["data"]["size"] == 12
    assert prov["package"]["version"] and "commit" in prov["package"]
    assert prov["machine"]["cpu_count"] >= 1
    assert res.data["timing"]["wall_time_s"] > 0 and len(res.data["timing"]["batches"]) == 8
    # The file on disk is the same document and passes the schema check; the sidecar is gone.
    loaded = Results.load(tmp_path / "r.json")
    assert loaded.data == json.loads(json.dumps(res.data))
    assert not sidecar_path(tmp_path / "r.json").exists()


def test_seeds_depend_on_task_and_sample_not_on_batching(tmp_path):
    a = run_toy(batch_size=1)
    b = run_toy(batch_size=7)
    assert a.records == b.records and a.metrics == b.metrics
    c = run_toy(seed=6)
    assert [r["seed"] for r in c.records] != [r["seed"] for r in a.records]
    assert len({r["seed"] for r in a.records}) == len(a.records)


def test_agent_gets_batches_with_seeds_and_messages():
    seen = []

    class Spy(SeededAgent):
        def act(self, observations, infos):
            seen.append((list(observations), [dict(i) for i in infos]))
            return super().act(observations, infos)

    run_toy(agent=Spy(), batch_size=4, limit=3, n_samples=2)
    assert [len(o) for o, _ in seen] == [4, 2]
    first = seen[0][1][0]
    assert first["messages"][0]["content"] == seen[0][0][0] and first["n_samples"] == 2
    assert [(i["task_index"], i["sample_index"]) for _, b in seen for i in b] == [(t, s) for t in range(3) for s in (0, 1)]


def test_without_token_reports_lengths_are_labelled_words():
    res = run_toy(agent=SeededAgent(report_tokens=False))
    assert res.metrics["length_unit"] == "whitespace_words"
    assert res.metrics["tokens_generated"] is None and res.metrics["flops_estimate"] is None


def test_gold_agent_scores_one_and_bad_agents_fail_clearly():
    assert run_toy(agent=GoldAgent(), limit=None).metrics["accuracy"] == 1.0

    class Short:
        def act(self, observations, infos):
            return observations[:-1]

    with pytest.raises(ValueError, match="returned 3 responses for 4"):
        run_toy(agent=Short())


def test_ctrl_c_keeps_finished_batches_and_resume_matches(tmp_path):
    full = run_toy()
    with pytest.raises(KeyboardInterrupt):
        run_toy(tmp_path, agent=SeededAgent(interrupt_after=3))
    partial = Results.load(tmp_path / "r.json")
    assert not partial.complete and len(partial.records) == 12 and not partial.metrics
    # Resume from the partial results file alone (sidecar deleted) and from the sidecar: same final records.
    os.unlink(sidecar_path(tmp_path / "r.json"))
    agent = SeededAgent()
    resumed = run_toy(tmp_path, agent=agent, resume=True)
    assert agent.calls == 5  # only the 18 missing samples were generated
    assert resumed.records == full.records and resumed.metrics == full.metrics
    assert "resumed_at" in resumed.provenance


def test_existing_file_needs_resume_and_the_same_run(tmp_path):
    run_toy(tmp_path)
    with pytest.raises(FileExistsError, match="resume"):
        run_toy(tmp_path)
    again = run_toy(tmp_path, resume=True, agent=SeededAgent(interrupt_after=0))  # complete: nothing is generated
    assert again.complete
    with pytest.raises(ValueError, match="different run.*n_samples"):
        run_toy(tmp_path, resume=True, n_samples=2)
    with pytest.raises(ValueError, match="resume=True needs out"):
        run_toy(resume=True)


def test_torn_sidecar_line_is_dropped(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        run_toy(tmp_path, agent=SeededAgent(interrupt_after=2))
    side = sidecar_path(tmp_path / "r.json")
    os.unlink(tmp_path / "r.json")
    text = side.read_text()
    side.write_text(text + text.splitlines()[-1][:50])  # a batch line cut short by a kill
    resumed = run_toy(tmp_path, resume=True)
    assert resumed.records == run_toy().records


def rlvr_eval_cmd(out: Path, sleep: float, *extra: str) -> list[str]:
    return [sys.executable, "-m", "rlvr_envs.cli", "eval", "--env", TOY_ID, "--agent", "harness_toy:SeededAgent",
            "--agent-kwargs", json.dumps({"sleep": sleep}), "--samples", "3", "--seed", "11", "--limit", "12",
            "--batch-size", "2", "--out", str(out), "--no-progress", *extra]


def test_sigkill_rlvr_eval_mid_run_then_resume_equals_uninterrupted_run(tmp_path):
    out = tmp_path / "killed.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(rlvr_eval_cmd(out, 0.15), env=env)
    side = sidecar_path(out)
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            if side.exists() and side.read_text().count('"kind": "batch"') >= 3:
                break
            assert proc.poll() is None, "the run finished before it could be killed"
            time.sleep(0.02)
        else:
            pytest.fail("no batches were flushed within 60 s")
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert not out.exists()  # killed: only the sidecar survives
    done = side.read_text().count('"kind": "batch"')
    assert 3 <= done < 18
    # Without --resume the partial run is protected; with it, only the missing batches run.
    refused = subprocess.run(rlvr_eval_cmd(out, 0), env=env, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "--resume" in refused.stderr
    subprocess.run(rlvr_eval_cmd(out, 0, "--resume"), env=env, check=True, timeout=120, capture_output=True)
    resumed = Results.load(out)
    full = evaluate(SeededAgent(), TOY_ID, n_samples=3, seed=11, limit=12, batch_size=2, progress=False)
    assert resumed.records == full.records
    assert resumed.metrics == full.metrics
    assert resumed.config == full.config
    assert resumed.provenance["created_at"] <= resumed.provenance["resumed_at"]


def test_validate_rejects_malformed_documents():
    doc = json.loads(json.dumps(run_toy().data))
    validate(doc)
    bad = json.loads(json.dumps(doc))
    bad["records"][3]["correct"] = "yes"
    with pytest.raises(SchemaError, match=r"records\[3\]\.correct"):
        validate(bad)
    bad = json.loads(json.dumps(doc))
    bad["records"].append(dict(bad["records"][0]))
    with pytest.raises(SchemaError, match="holds 31 records|duplicate"):
        validate(bad)
    bad = json.loads(json.dumps(doc))
    bad["schema_version"] = 99
    with pytest.raises(SchemaError, match="schema_version"):
        validate(bad)
    bad = json.loads(json.dumps(doc))
    del bad["records"][0]["task_id"]
    with pytest.raises(SchemaError, match="missing field 'task_id'"):
        validate(bad)


def test_multi_turn_env_runs_in_lockstep_and_resumes(tmp_path):
    from harness_toy import MULTI_ID, HintAgent

    calls = []

    class Spy(HintAgent):
        def act(self, observations, infos):
            calls.append([(i["task_index"], i["turn_index"]) for i in infos])
            return super().act(observations, infos)

    full = evaluate(Spy(), MULTI_ID, n_samples=2, seed=3, batch_size=4, progress=False)
    # Batch 0 = tasks 0 and 1 (2 samples each): turn 0 all four, turn 1 all four, turn 2 only task 0's hints...
    assert calls[:3] == [[(0, 0), (0, 0), (1, 0), (1, 0)], [(0, 1), (0, 1), (1, 1), (1, 1)], [(0, 2), (0, 2)]]
    by_task = {}
    for r in full.records:
        by_task.setdefault(r["task_index"], []).append(r)
        assert r["turns"][-1] == r["response"]
        if r["task_index"] % 3 == 0:  # hints until the turn cap: truncated before answering
            assert len(r["turns"]) == 3 and not r["correct"]
        else:
            assert len(r["turns"]) == 2 and r["turns"][0].startswith("HINT")
            # Later turns see fresh seeds; the answer is decided by the turn-1 seed here.
            assert r["correct"] is (r["task_index"] % 2 == 0 and
                                    turn_seed(3, r["task_index"], r["sample_index"], 1) % 4 != 0)
    assert r["tokens"] is not None
    with pytest.raises(KeyboardInterrupt):
        evaluate(HintAgent(interrupt_after=4), MULTI_ID, n_samples=2, seed=3, batch_size=4, progress=False,
                 out=tmp_path / "m.json")
    resumed = evaluate(HintAgent(), MULTI_ID, n_samples=2, seed=3, batch_size=4, progress=False,
                       out=tmp_path / "m.json", resume=True)
    assert resumed.records == full.records
