"""Data-parallel training (agents/distributed): 2 gloo ranks x 1 thread against 1 process, same recipe and seeds.

- The update split by groups over ranks gives the one-process losses, rewards and weights to fp32 tolerance, for
  GRPO and for methods whose components keep group-level state across steps (VIGOR, DUET, SAGC).
- ``rank_shares`` never splits a group and covers every row once.
- Through the real launcher (``rlvr train --nproc 2``, torchrun's agent): a rank killed mid-run stops the run with an
  error naming it; rerunning the command resumes from the last checkpoint and ends where an uninterrupted run ends.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from grpo_toys import ToyEngine, make_env, make_policy
from test_grpo_trainer import strip, trainer

from agents.distributed.data_parallel import rank_shares
from agents.grpo.batch import GroupBatch, Sample
from agents.grpo.config import from_dict

ROOT = Path(__file__).resolve().parents[1]
METHODS = {
    "grpo": ({}, {}),
    "vigor": ({"rollout_allocator": "vigor"},
              {"rollout_allocator": {"n0": 2, "budget_per_prompt": 4, "per_round": 2, "top_k_fraction": 0.5}}),
    "duet": ({"prompt_selector": "duet", "rollout_allocator": "duet", "generation_controller": "duet_abort",
              "group_transform": "duet_reweight"},
             {"rollout_allocator": {"n_ref": 4}, "generation_controller": {"markers": ["t1", "t2"]}}),
    "sagc": ({"rollout_allocator": "sagc"}, {"rollout_allocator": {"g_min": 2, "g_max": 8}}),
}


def settings(name: str, out: Path) -> dict:
    stages, params = METHODS[name]
    return dict(model="toy", steps=3, prompts_per_step=4, max_new_tokens=4 if name == "duet" else 2, lr=1e-2,
                train_layers=-1, eval_size=4, eval_every=0, out_dir=str(out), progress=False, plot=False,
                micro_batch=3, train_pool=6, threads=1, precision="fp32", stages=stages,
                params=params or {"rollout_allocator": {"n": 4}})


def _rank_main(rank: int, world: int, port: int, names: list[str], out: str, steps: int = 3) -> None:
    """One rank: train each of ``names`` (toy policy and task) in ``out/<name>``, one process group for all."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    import torch.distributed as dist

    from agents.distributed.data_parallel import DataParallelTrainer

    for name in names:
        run_dir = Path(out) / name
        policy = make_policy()
        t = DataParallelTrainer(from_dict({**settings(name, run_dir), "steps": steps}), policy=policy,
                                engine=ToyEngine(policy), env=make_env(8), eval_env=make_env(8))
        t.run(resume=False)
        torch.save({k: v.detach().clone() for k, v in t.model.named_parameters()}, run_dir / f"weights-rank{rank}.pt")
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(names: list[str], out: Path, world: int = 2, steps: int = 3) -> None:
    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, world, port, names, str(out), steps)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
    codes = [p.exitcode for p in procs]
    for p in procs:
        if p.is_alive():
            p.kill()
    assert codes == [0] * world, f"ranks exited with {codes}"


@pytest.fixture(scope="module")
def two_rank_runs(tmp_path_factory) -> Path:
    """Every method of METHODS trained by 2 ranks, one after the other in one process group (ranks start once)."""
    out = tmp_path_factory.mktemp("two-ranks")
    run_ranks(list(METHODS), out)
    return out


@pytest.mark.parametrize("name", list(METHODS))
def test_two_ranks_train_what_one_process_trains(name, two_rank_runs, tmp_path):
    threads = torch.get_num_threads()
    try:  # the one-process run pins torch to 1 thread, as each rank does
        one = trainer(tmp_path / "one", env=make_env(8), eval_env=make_env(8), **settings(name, tmp_path / "one"))
        one_records = one.run(resume=False)
    finally:
        torch.set_num_threads(threads)
    two_records = _read(two_rank_runs / name / "metrics.jsonl")
    one_train = [r for r in one_records if r["kind"] == "train"]
    two_train = [r for r in two_records if r["kind"] == "train"]
    assert len(one_train) == len(two_train) == 3
    assert all(r["ranks"] == 2.0 for r in two_train)
    for a, b in zip(one_train, two_train):
        assert a["rollouts"] == b["rollouts"] and a["samples"] == b["samples"]  # same allocation and groups
        assert a["reward_mean"] == b["reward_mean"]
        for key in ("loss", "grad_norm", "policy_entropy", "flops_train"):
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), key
        # the components' own metrics (group-level state: VIGOR's variances, DUET's surrogate, SAGC's dual variable)
        for key in a:
            if key.split(".")[0] in ("prompt_selector", "rollout_allocator", "generation_controller",
                                     "group_transform"):
                assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), key
    rank0 = torch.load(two_rank_runs / name / "weights-rank0.pt")
    rank1 = torch.load(two_rank_runs / name / "weights-rank1.pt")
    for k, v in one.model.named_parameters():
        assert torch.equal(rank0[k], rank1[k]), k  # the ranks hold one model
        # Adam divides each coordinate by its running RMS, so a near-zero gradient coordinate turns float rounding
        # into a step difference: the tolerance is 1e-3 of one step (lr = 1e-2)
        torch.testing.assert_close(rank0[k], v.detach(), rtol=1e-5, atol=1e-5)
    moved = sum(float((rank0[k] - v.detach()).abs().sum()) for k, v in make_policy().model.named_parameters())
    assert moved > 0  # the runs learned something: the equality is not two untouched models


def test_a_checkpoint_written_by_two_ranks_resumes_in_one_process(tmp_path):
    """The checkpoint holds the whole state (weights, optimizer, components, RNG), not a rank's: a run can go on with
    another rank count."""
    threads = torch.get_num_threads()
    try:
        run_ranks(["vigor"], tmp_path / "switch", steps=2)
        resumed = trainer(tmp_path / "switch" / "vigor", env=make_env(8), eval_env=make_env(8),
                          **settings("vigor", tmp_path / "switch" / "vigor")).run(resume=True)
        full = trainer(tmp_path / "one", env=make_env(8), eval_env=make_env(8),
                       **settings("vigor", tmp_path / "one")).run(resume=False)
    finally:
        torch.set_num_threads(threads)
    a, b = ([r for r in records if r["kind"] == "train"] for records in (full, resumed))
    assert [r["step"] for r in b] == [1, 2, 3] and "ranks" in b[1] and "ranks" not in b[2]
    assert [r["reward_mean"] for r in a] == [r["reward_mean"] for r in b]
    assert b[2]["loss"] == pytest.approx(a[2]["loss"], rel=1e-5, abs=1e-7)
    assert b[2]["grad_norm"] == pytest.approx(a[2]["grad_norm"], rel=1e-5)
    assert [(r["rollouts"], r["samples"]) for r in a] == [(r["rollouts"], r["samples"]) for r in b]


def _read(path: Path) -> list[dict]:
    import json

    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _batch(group_sizes: list[int], lengths: list[int]) -> GroupBatch:
    samples, k = [], 0
    for g, size in enumerate(group_sizes):
        for _ in range(size):
            samples.append(Sample(group_id=f"g{g}", prompt="p", prompt_ids=[1, 2], response_ids=[3] * lengths[k],
                                  text="x", reward=0.0))
            k += 1
    return GroupBatch.from_samples(samples)


@pytest.mark.parametrize("world", [1, 2, 3, 5])
def test_rank_shares_keep_groups_whole_and_cover_every_row_once(world):
    batch = _batch([4, 2, 6, 1, 3], [1, 5, 2, 9, 3, 3, 7, 1, 1, 1, 2, 8, 4, 4, 6, 2])
    shares = rank_shares(batch, world)
    assert len(shares) == world
    assert sorted(i for s in shares for i in s) == list(range(len(batch)))
    owner = {i: r for r, s in enumerate(shares) for i in s}
    for rows in batch.groups().values():
        assert len({owner[i] for i in rows}) == 1
    if world == 2:  # balanced by tokens: neither share is empty
        assert all(shares)


# -- through the launcher: a rank dies, the rerun resumes --------------------------------------------------------------
CLI = ["grpo", "--lane", "micro", "--set", "model=tiny", "--set", "prompts_per_step=4", "--set", "max_new_tokens=16",
       "--set", "eval_size=0", "--set", "final_eval_size=0", "--set", "checkpoint_every=1", "--set", "threads=1",
       "--set", "micro_batch=8", "--set", "stages.reward_shaper=err_plus", "--set", "steps=30"]


def _rlvr(*args: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "rlvr_envs.cli", "train", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _rank_pid(parent: int, rank: int) -> int | None:
    """The pid of the process under ``parent`` (any depth) whose environment has ``RANK=rank``."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if f"RANK={rank}".encode() in env and b"GROUP_RANK=0" in env and ppid != 1:
            pid = int(entry.name)
            chain = ppid
            while chain > 1:
                if chain == parent:
                    return pid
                try:
                    chain = int((Path("/proc") / str(chain) / "stat").read_text().rsplit(")", 1)[1].split()[1])
                except (OSError, ValueError, IndexError):
                    break
    return None


def _latest_step(out: Path) -> int:
    pointer = out / "checkpoints" / "latest"
    try:
        return int(pointer.read_text().strip().split("-")[1].split(".")[0])
    except (OSError, ValueError, IndexError):
        return 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the rank's pid through /proc")
def test_a_killed_rank_stops_the_run_clearly_and_the_rerun_resumes_to_the_same_end(tmp_path):
    full = _rlvr(*CLI, "--nproc", "2", "--set", f"out_dir={tmp_path / 'full'}")
    cut_out = tmp_path / "cut"
    cut = _rlvr(*CLI, "--nproc", "2", "--set", f"out_dir={cut_out}")
    deadline = time.monotonic() + 240
    while _latest_step(cut_out) < 2 and cut.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    victim = _rank_pid(cut.pid, 1)
    assert victim is not None, "rank 1 not found"
    os.kill(victim, signal.SIGKILL)
    output = cut.communicate(timeout=120)[0]
    assert cut.returncode == 1, output
    assert "rank 1" in output and "SIGKILL" in output and "resumes from step-" in output, output
    stopped_at = _latest_step(cut_out)
    assert 2 <= stopped_at < 30  # it died mid-run
    resumed = _rlvr(*CLI, "--nproc", "2", "--set", f"out_dir={cut_out}")
    assert resumed.communicate(timeout=240)[0] and resumed.returncode == 0
    assert full.communicate(timeout=240)[0] and full.returncode == 0
    full_records = [r for r in _read(tmp_path / "full" / "metrics.jsonl") if r["kind"] == "train"]
    resumed_records = [r for r in _read(cut_out / "metrics.jsonl") if r["kind"] == "train"]
    assert strip(resumed_records) == strip(full_records)
    a = torch.load(tmp_path / "full" / "checkpoints" / "step-30.pt", weights_only=False)["model"]
    b = torch.load(cut_out / "checkpoints" / "step-30.pt", weights_only=False)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("recipe", ["grpo", "vigor", "duet", "sagc"])
def test_the_micro_lane_with_the_tiny_model_trains_the_same_on_two_ranks(recipe, tmp_path):
    """The issue's setup through the real CLI: `rlvr train RECIPE --lane micro` with the tiny model, 1 process vs
    `--nproc 2` (ERR+'s entropy shaping gives the tiny model's zero-reward groups a signal, so weights move)."""
    cli = [recipe, *[a if a != "steps=30" else "steps=3" for a in CLI[1:]]]
    one = _rlvr(*cli, "--set", f"out_dir={tmp_path / 'one'}")
    assert one.communicate(timeout=240)[0] is not None and one.returncode == 0
    two = _rlvr(*cli, "--nproc", "2", "--set", f"out_dir={tmp_path / 'two'}")
    assert two.communicate(timeout=240)[0] is not None and two.returncode == 0
    a = [r for r in _read(tmp_path / "one" / "metrics.jsonl") if r["kind"] == "train"]
    b = [r for r in _read(tmp_path / "two" / "metrics.jsonl") if r["kind"] == "train"]
    assert len(a) == len(b) == 3 and all(r["ranks"] == 2.0 for r in b)
    for x, y in zip(a, b):
        assert x["rollouts"] == y["rollouts"] and x["reward_mean"] == y["reward_mean"]
        assert y["shaped_reward_mean"] == pytest.approx(x["shaped_reward_mean"], rel=1e-5)
        assert y["loss"] == pytest.approx(x["loss"], rel=1e-4, abs=1e-7)
        assert y["grad_norm"] == pytest.approx(x["grad_norm"], rel=1e-4)
    wa = torch.load(tmp_path / "one" / "checkpoints" / "step-3.pt", weights_only=False)["model"]
    wb = torch.load(tmp_path / "two" / "checkpoints" / "step-3.pt", weights_only=False)["model"]
    init = torch.load(tmp_path / "one" / "checkpoints" / "step-3.pt", weights_only=False)["config"]
    assert init["model"] == "tiny"
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], rtol=1e-5, atol=1e-6)
    assert any(float(x["grad_norm"]) > 0 for x in a)


def test_components_that_run_the_step_themselves_are_refused_before_any_rank_starts(capsys):
    from agents.distributed.data_parallel import check_data_parallel
    from agents.grpo.config import load_recipe
    from rlvr_envs.cli import main as rlvr_main

    for recipe in ("grpo", "vigor", "duet", "sagc"):
        check_data_parallel(load_recipe(recipe, [], lane="micro"))
    for recipe, needle in (("fgrpo", "aggregator 'fgrpo'"), ("agon", "orchestrator 'agon'")):
        with pytest.raises(ValueError, match=needle):
            check_data_parallel(load_recipe(recipe, [], lane="micro"))
        assert rlvr_main(["train", recipe, "--lane", "micro", "--nproc", "2"]) == 2
        assert "is not data-parallel" in capsys.readouterr().err
