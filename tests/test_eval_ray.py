"""`rlvr eval --ray`: the tasks sharded over Ray actors give the same results file as one process for the same seeds,
a worker that dies has its shard re-run on a new one, and a run interrupted in one mode resumes in the other.

One local Ray (``ray.init(num_cpus=2)``, ~10 s to start) is shared by the module's tests.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from harness_toy import TOY_ID, SeededAgent

from rlvr_envs.cli import main as rlvr_main
from rlvr_envs.harness import Results, evaluate
from rlvr_envs.harness.ray_eval import evaluate_ray

ray = pytest.importorskip("ray")

ARITH = "rlvr/Arithmetic-v0"
# The only parts of a results file that may differ between a single-process and a Ray run (ray_eval's docstring).
RUN_SPECIFIC_PROVENANCE = ("created_at", "argv", "resumed_at", "machine", "ray")


@pytest.fixture(scope="module")
def local_ray():
    if ray.is_initialized():  # another module's session: start ours with known resources
        ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=100 * 2**20)
    yield ray
    ray.shutdown()


def comparable(path: Path) -> dict:
    """The results document without the fields a Ray run may legitimately change."""
    doc = json.loads(path.read_text())
    doc.pop("timing")
    for key in RUN_SPECIFIC_PROVENANCE:
        doc["provenance"].pop(key, None)
    # the checkout's commit and dirty flag at the moment each file is written (a commit landing between the two runs,
    # as a background regression run's does, moves them)
    doc["provenance"].get("package", {}).pop("commit", None)
    doc["provenance"].get("package", {}).pop("dirty", None)
    return doc


class DieOnceAgent(SeededAgent):
    """Exits its worker process on its ``die_on_call``-th act() call; the marker file makes it happen in one worker
    only (the first to get there), so the shard re-run on a new worker succeeds."""

    def __init__(self, marker: str, die_on_call: int = 2, sleep: float = 0.0):
        super().__init__(sleep=sleep)
        self.marker, self.die_on_call = marker, die_on_call

    def act(self, observations, infos):
        if self.calls + 1 == self.die_on_call:
            try:
                os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                pass
            else:
                os._exit(1)  # as a killed process would: no exception, no cleanup
        return super().act(observations, infos)


class AlwaysDieAgent(SeededAgent):
    def act(self, observations, infos):
        if any(i["task_index"] == 0 for i in infos):
            os._exit(1)
        return super().act(observations, infos)


class BuggyAgent(SeededAgent):
    def act(self, observations, infos):
        raise ValueError("agent bug on purpose")


def test_tiny_policy_ray_run_writes_the_single_process_file(local_ray, tmp_path, capsys):
    torch = pytest.importorskip("torch")
    pytest.importorskip("agents.policy")
    args = ["eval", "--env", ARITH, "--model", "tiny", "--samples", "2", "--temperature", "1.0", "--max-new-tokens",
            "12", "--limit", "6", "--batch-size", "3", "--seed", "3", "--no-progress"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each 1-CPU Ray actor decodes: the same float reductions, the same samples
    try:
        assert rlvr_main([*args, "--out", str(tmp_path / "single.json")]) == 0
    finally:
        torch.set_num_threads(threads)
    assert rlvr_main([*args, "--ray", "--out", str(tmp_path / "ray.json")]) == 0
    single, sharded = Results.load(tmp_path / "single.json"), Results.load(tmp_path / "ray.json")
    assert "wrote" in capsys.readouterr().out
    assert comparable(tmp_path / "ray.json") == comparable(tmp_path / "single.json")
    # The comparison has teeth: sampled responses differ between the two samples of a task, and token counts exist.
    assert any(a["response"] != b["response"] for a, b in zip(single.records[::2], single.records[1::2]))
    assert sharded.metrics["tokens_generated"] > 0
    ray_block = sharded.provenance["ray"]
    assert ray_block["workers"] == 2 and ray_block["worker_deaths"] == 0
    # Both actors played shards (4 shards of 3 samples), each from its own process.
    assert len(ray_block["shards_per_worker"]) == 2 and sum(ray_block["shards_per_worker"].values()) == 4
    assert sharded.provenance["agent"]["model"].startswith("tiny")


def test_a_worker_that_dies_mid_run_has_its_shard_rerun_and_the_file_is_identical(local_ray, tmp_path, capsys):
    common = ["eval", "--env", TOY_ID, "--samples", "3", "--limit", "12", "--batch-size", "4", "--seed", "7"]
    assert rlvr_main([*common, "--agent", "harness_toy:SeededAgent", "--out", str(tmp_path / "single.json"),
                      "--no-progress"]) == 0
    marker = tmp_path / "died"
    assert rlvr_main([*common, "--agent", "test_eval_ray:DieOnceAgent", "--agent-kwargs",
                      json.dumps({"marker": str(marker), "sleep": 0.05}), "--ray", "--no-progress", "--out",
                      str(tmp_path / "ray.json")]) == 0
    assert marker.exists()  # a worker really exited
    assert "Ray worker died on shard" in capsys.readouterr().err
    ray_block = Results.load(tmp_path / "ray.json").provenance["ray"]
    assert ray_block["workers"] == 2 and ray_block["worker_deaths"] == 1 and len(ray_block["rerun_batches"]) == 1
    # 9 shards: the dead worker's finished ones, the survivor's and the replacement's (three processes in all).
    assert len(ray_block["shards_per_worker"]) == 3 and sum(ray_block["shards_per_worker"].values()) == 9, ray_block
    single, sharded = comparable(tmp_path / "single.json"), comparable(tmp_path / "ray.json")
    # The agents' classes differ by name only (DieOnceAgent is a SeededAgent); everything else must be equal.
    assert sharded["provenance"]["agent"].pop("class").endswith("DieOnceAgent")
    single["provenance"]["agent"].pop("class")
    assert sharded == single


def test_a_shard_that_kills_every_worker_stops_the_run(local_ray, tmp_path):
    with pytest.raises(RuntimeError, match="shard 0 killed 2 Ray workers"):
        evaluate_ray(AlwaysDieAgent, TOY_ID, limit=4, batch_size=2, out=tmp_path / "r.json", progress=False,
                     max_attempts=2)
    assert not (tmp_path / "r.json").exists()


def test_an_agent_exception_propagates_instead_of_being_retried(local_ray, tmp_path):
    with pytest.raises(ValueError, match="agent bug on purpose"):
        evaluate_ray(BuggyAgent, TOY_ID, limit=4, batch_size=2, progress=False)


def test_a_single_process_run_interrupted_resumes_on_ray_to_the_same_file(local_ray, tmp_path):
    kw = dict(n_samples=2, seed=11, limit=10, batch_size=3, progress=False)
    full = evaluate(SeededAgent(), TOY_ID, **kw)
    out = tmp_path / "r.json"
    with pytest.raises(KeyboardInterrupt):
        evaluate(SeededAgent(interrupt_after=2), TOY_ID, out=out, **kw)
    assert len(Results.load(out).records) == 6
    resumed = evaluate_ray(SeededAgent, TOY_ID, out=out, resume=True, **kw)
    assert resumed.records == full.records and resumed.metrics == full.metrics
    assert sum(resumed.provenance["ray"]["shards_per_worker"].values()) == 5  # only the 5 unfinished of 7 shards


def test_ray_without_the_extra_names_it(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)
    code = rlvr_main(["eval", "--env", TOY_ID, "--agent", "harness_toy:SeededAgent", "--ray", "--out",
                      str(tmp_path / "r.json"), "--no-progress"])
    assert code != 0
    assert "needs the [ray] extra: pip install 'rlvr-envs[ray]'" in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()


def test_ray_workers_play_on_a_server_and_write_the_in_process_file(local_ray, tmp_path):
    """``rlvr eval --ray --remote URL``: every actor plays its shards on served sessions; the file equals the
    single-process in-process one except for where it ran (``ray``, ``remote``)."""
    pytest.importorskip("openenv")
    pytest.importorskip("websockets")
    from harness_toy import MULTI_ID

    from rlvr_envs.serve import create_app, running_server

    app = create_app([TOY_ID, MULTI_ID], max_sessions=16)
    with running_server(app) as url:
        server = app.state.rlvr
        for env_id, agent in ((TOY_ID, "harness_toy:SeededAgent"), (MULTI_ID, "harness_toy:HintAgent")):
            common = ["eval", "--env", env_id, "--samples", "2", "--limit", "6", "--batch-size", "4", "--seed", "5",
                      "--agent", agent, "--no-progress"]
            name = env_id.replace("/", "_")
            single, sharded = tmp_path / f"{name}-single.json", tmp_path / f"{name}-ray.json"
            assert rlvr_main([*common, "--out", str(single)]) == 0
            before = server.metrics.counters["steps_total"]
            assert rlvr_main([*common, "--ray", "--remote", url, "--out", str(sharded)]) == 0
            results = Results.load(sharded)
            assert results.provenance["remote"] == {"url": url} and results.provenance["ray"]["workers"] >= 1
            assert server.metrics.counters["steps_total"] - before >= len(results.records)  # served, not local
            a, b = comparable(single), comparable(sharded)
            b["provenance"].pop("remote")
            assert a == b
