"""``seed_base``, the one split option: every env family accepts it, 0 is the env as before, another value is another
stream of tasks; and ``rlvr train grpo`` (whose held-out default is ``seed_base=1``) trains 2 steps on each family."""

from __future__ import annotations

import json
import os
from pathlib import Path

import gymnasium as gym
import pytest

import rlvr_envs  # noqa: F401  (registers the rlvr/ ids)
from rlvr_envs.core import Task
from rlvr_envs.splits import check_seed_base, seeded_order

DATA = os.environ.get("RLVR_DATA_DIR")
TOOLS_KW = {"services": ["files"], "distractor_tools": 0}
SYNTH_KW = {"corpus_size": 40, "num_tasks": 8, "hops": 1}


def _needs(subdir: str):
    return pytest.mark.skipif(not DATA or not Path(DATA, subdir).is_dir(), reason=f"RLVR_DATA_DIR lacks {subdir}/")


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("RLVR_CACHE_DIR", str(tmp_path / "cache"))  # search indexes built here, not in the user's


TEXT_FAMILIES = [
    pytest.param("rlvr/ToolUse-v0", TOOLS_KW, id="tools-ToolUse"),
    pytest.param("rlvr/BFCL-v0", {}, id="tools-BFCL", marks=_needs("bfcl")),
    pytest.param("rlvr/MultiHopSynth-v0", SYNTH_KW, id="search-MultiHopSynth"),
    pytest.param("rlvr/HotpotQA-v0", {}, id="search-HotpotQA", marks=_needs("multihop")),
    pytest.param("rlvr/Arithmetic-v0", {}, id="single-turn-Arithmetic"),
]


def _first_tasks(env_id: str, kwargs: dict, n: int = 4) -> tuple[list[tuple[str, str]], str]:
    """(id, question) of tasks 0..n-1 and the source fingerprint."""
    env = gym.make(env_id, **kwargs)
    source = env.unwrapped.source
    tasks = [source.task(i) for i in range(n)]
    for task in tasks:  # every task the source lists is reachable by its id (what the trainer and adapters reset by)
        assert source.index_of(task.id) == tasks.index(task)
    fingerprint = source.fingerprint
    env.close()
    return [(t.id, t.question) for t in tasks], fingerprint


@pytest.mark.parametrize(("env_id", "kwargs"), TEXT_FAMILIES)
def test_every_text_family_takes_seed_base_and_another_value_is_other_tasks(env_id, kwargs):
    default, default_fp = _first_tasks(env_id, kwargs)
    zero, zero_fp = _first_tasks(env_id, {**kwargs, "seed_base": 0})
    held_out, held_out_fp = _first_tasks(env_id, {**kwargs, "seed_base": 1})
    again, _ = _first_tasks(env_id, {**kwargs, "seed_base": 1})
    assert zero == default and zero_fp == default_fp          # seed_base=0 is the env as it always was
    assert again == held_out                                   # a split is deterministic
    assert [q for _, q in held_out] != [q for _, q in default]  # and another value gives other tasks
    assert held_out_fp != default_fp                            # which results files can tell apart


@pytest.mark.parametrize("env_id", ["rlvr/Grouped64-v0", "rlvr/Taxi-v0", "rlvr/Grid50-v0"])
def test_tabular_mdps_take_seed_base_as_another_episode_stream(env_id):
    def starts(**kwargs) -> list[int]:
        env = gym.make(env_id, **kwargs)
        out = [int(env.reset(seed=s)[0]) for s in range(12)]
        env.close()
        return out

    assert starts(seed_base=0) == starts()
    assert starts(seed_base=1) == starts(seed_base=1)
    assert starts(seed_base=1) != starts()


@pytest.mark.parametrize("bad", [-1, 1.5, True, "1"])
def test_seed_base_must_be_a_non_negative_integer(bad):
    with pytest.raises(ValueError, match="seed_base"):
        check_seed_base(bad)
    with pytest.raises(ValueError, match="seed_base"):
        gym.make("rlvr/ToolUse-v0", seed_base=bad)


def test_seeded_order_is_a_permutation_that_ignores_load_order():
    tasks = [Task(id=f"t{i}", question=str(i), answer=str(i)) for i in range(20)]
    assert seeded_order(tasks, 0) == tasks
    shuffled = seeded_order(tasks, 1)
    assert sorted(t.id for t in shuffled) == sorted(t.id for t in tasks) and shuffled != tasks
    assert seeded_order(list(reversed(tasks)), 1) == shuffled
    assert seeded_order(tasks, 2) != shuffled


CLI_FAMILIES = [
    # the tiny model has 2048 positions: ToolUse's tool schemas in the prompt alone take ~2.7k, so they are left out
    pytest.param("rlvr/ToolUse-v0", '{services = ["files"], distractor_tools = 0, tools_in_prompt = false}',
                 id="ToolUse"),
    pytest.param("rlvr/BFCL-v0", "{}", id="BFCL", marks=_needs("bfcl")),
    pytest.param("rlvr/MultiHopSynth-v0", "{corpus_size = 40, num_tasks = 8, hops = 1}", id="MultiHopSynth"),
]


@pytest.mark.parametrize(("env_id", "env_kwargs"), CLI_FAMILIES)
def test_rlvr_train_grpo_trains_two_steps_on_each_family(env_id, env_kwargs, tmp_path):
    from rlvr_envs.cli import main

    settings = [f"env={env_id}", f"env_kwargs={env_kwargs}", "model=tiny", "steps=2", "max_new_tokens=8",
                "prompts_per_step=2", "eval_size=2", "progress=false", "plot=false", f"out_dir={tmp_path}"]
    assert main(["train", "grpo", *[x for s in settings for x in ("--set", s)]]) == 0
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "train"] == [1, 2]
    assert [r["step"] for r in records if r["kind"] == "eval"] == [0, 2]  # the held-out (seed_base=1) env ran
