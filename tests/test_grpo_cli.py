"""Recipes and ``rlvr train``: overrides, every recipe on the tiny model, ``--list``, and SIGKILL + resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agents.grpo.config import apply_override, list_recipes, load_recipe
from agents.grpo.metrics import without_timing
from rlvr_envs.cli import main

ROOT = Path(__file__).resolve().parent.parent
SMALL = ["model=tiny", "steps=2", "max_new_tokens=8", "prompts_per_step=2", "eval_size=2", "progress=false",
         "plot=false"]


def sets(items):
    return [x for item in items for x in ("--set", item)]


def test_overrides_parse_as_toml_and_reach_tables():
    cfg = load_recipe("grpo", ["model=tiny", "steps=3", "lr=1e-3", "stages.advantage=lampo",
                               "params.advantage.kappa=0.5", "env_kwargs={max_operand = 9}"])
    assert (cfg.model, cfg.steps, cfg.lr) == ("tiny", 3, 1e-3)
    assert cfg.stages["advantage"] == "lampo" and cfg.params["advantage"]["kappa"] == 0.5
    assert cfg.env_kwargs == {"max_operand": 9}
    data: dict = {}
    apply_override(data, "description=two words")
    assert data["description"] == "two words"  # not TOML: kept as text


def test_bad_recipes_are_clear_errors(tmp_path, capsys):
    with pytest.raises(ValueError, match="unknown recipe key"):
        load_recipe("grpo", ["stepz=3"])
    with pytest.raises(ValueError, match="unknown stage"):
        load_recipe("grpo", ["stages.critic=x"])
    with pytest.raises(FileNotFoundError, match="built-in recipes: .*vigor"):
        load_recipe("nope")
    with pytest.raises(ValueError, match="key=value"):
        apply_override({}, "steps")
    assert main(["train", "grpo", "--set", "steps=-1"]) == 2
    assert "steps must be" in capsys.readouterr().err


def test_list_shows_every_registry(capsys):
    assert main(["train", "--list"]) == 0
    out = capsys.readouterr().out
    for role in ("PromptSelector", "RolloutAllocator", "GenerationController", "GroupTransform", "RewardShaper",
                 "AdvantageEstimator", "Loss", "ReplayBuffer", "Aggregator", "Orchestrator", "vigor", "lampo",
                 "err_plus", "dapo"):
        assert role in out


def test_the_recipe_set():
    assert {"grpo", "dr_grpo", "dapo", "vigor", "err_plus", "lampo", "saturated", "signal_budget", "budget_schedule",
            "duet", "sagc", "hd_replay", "replay_uniform", "data_policy", "hint"} <= set(list_recipes())


@pytest.mark.parametrize("recipe", list_recipes())
def test_every_recipe_runs_on_tiny(recipe, tmp_path):
    assert main(["train", recipe, *sets([*SMALL, f"out_dir={tmp_path}"])]) == 0
    records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "train"] == [1, 2]
    assert [r["step"] for r in records if r["kind"] == "eval"] == [0, 2]
    assert (tmp_path / "checkpoints" / "latest").is_file()


def strip(path: Path):
    return [without_timing(json.loads(x)) for x in path.read_text().splitlines()]


# stateful components: a pass-rate history, token budgets, a replay buffer with stored groups, a dual variable
@pytest.mark.parametrize(("recipe", "extra"), [("grpo", ["params.rollout_allocator.n=4"]), ("duet", []),
                                               ("hd_replay", ["params.replay_buffer.max_drift=5.0"]), ("sagc", [])])
def test_sigkill_mid_run_then_resume_continues_exactly(recipe, extra, tmp_path):
    args = [sys.executable, "-m", "rlvr_envs.cli", "train", recipe,
            *sets([*SMALL, "steps=4", "checkpoint_every=2", "eval_every=3", "train_pool=3", *extra])]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    ref, cut = tmp_path / "ref", tmp_path / "cut"
    subprocess.run([*args, "--set", f"out_dir={ref}"], check=True, env=env, cwd=ROOT, capture_output=True,
                   timeout=300)
    proc = subprocess.Popen([*args, "--set", f"out_dir={cut}"], env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    metrics = cut / "metrics.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:  # kill once step 3 is logged past the step-2 checkpoint
        if metrics.is_file() and any(r.get("kind") == "train" and r["step"] >= 3 for r in strip(metrics)):
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL
    assert max(r["step"] for r in strip(metrics)) < 4  # it really died mid-run
    subprocess.run([*args, "--set", f"out_dir={cut}"], check=True, env=env, cwd=ROOT, capture_output=True,
                   timeout=300)
    assert strip(metrics) == strip(ref / "metrics.jsonl")
