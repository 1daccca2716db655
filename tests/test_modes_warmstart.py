"""The ``smollm2-modes`` warm start (agents/policy/modes_warmstart.py), built on the tiny model."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.grpo.sft import demonstrations, masked_nll
from agents.policy import load_policy
from agents.policy.modes_warmstart import (
    ModesWarmStart,
    ModeTraceTeacher,
    check_caps,
    ensure_modes_warmstart,
    long_steps,
    parse_name,
    warm_start,
)
from rlvr_envs.modes import make_env
from rlvr_envs.tasks.arithmetic import evaluate_chain

# Caps in tiny-tokenizer tokens (it spells most text a character at a time).
TINY = "smollm2-modes@base=tiny,tasks=32,epochs=15,lr=3e-3,nothink_cap=40,short_cap=80,long_cap=160"


def test_long_steps_golden():
    assert long_steps([48, 29], ["-"]) == "48 - 20 = 28, 28 - 9 = 19"
    assert long_steps([23, 17], ["+"]) == "20 + 10 = 30, 3 + 7 = 10, 30 + 10 = 40"
    assert long_steps([5, 40, 9], ["-", "+"]) == "5 - 40 = -35, -35 + 9 = -26"
    assert long_steps([3, -4], ["+"]) == "3 + (-4) = -1"
    with pytest.raises(ValueError, match=r"\+ and - only"):
        long_steps([3, 4], ["*"])
    with pytest.raises(ValueError, match="2 operands for 2 operators"):
        long_steps([3, 4], ["+", "-"])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-60, 99), min_size=2, max_size=5), st.data())
def test_long_steps_end_at_the_value(operands, data):
    ops = data.draw(st.lists(st.sampled_from("+-"), min_size=len(operands) - 1, max_size=len(operands) - 1))
    steps = long_steps(operands, ops)
    assert int(steps.rsplit("= ", 1)[1]) == evaluate_chain(operands, ops)
    for step in steps.split(", "):  # every written equation is true (text compared, never evaluated)
        left, right = step.split(" = ")
        a, op, b = left.split(" ")
        b = int(b.strip("()"))
        assert int(right) == (int(a) + b if op == "+" else int(a) - b)


def test_teacher_writes_a_correct_response_in_the_drawn_mode():
    cfg = ModesWarmStart()
    env = make_env(**cfg.env_kwargs(), seed_base=3)
    teacher = ModeTraceTeacher(env, seed=0)
    seen = set()
    for seed in range(24):
        _, info = env.reset(seed=seed)
        index = teacher.source.index_of(info["task_id"])
        (text,) = teacher.act(["ignored"], [info])
        mode = teacher.mode_of(index)
        _, reward, terminated, _, out = env.step(text)
        assert terminated and out["marker_found"] and out["mode"] == mode and out["base_correct"] and reward == 1.0
        assert text.startswith(teacher.table.mode(mode).marker + " ")
        seen.add(mode)
    assert seen == {"nothink", "short", "long"}
    # every block of three tasks holds each mode once; a task's mode depends on (seed, index) only
    modes = [teacher.mode_of(i) for i in range(30)]
    assert all(sorted(modes[i:i + 3]) == ["long", "nothink", "short"] for i in range(0, 30, 3))
    assert [teacher.mode_of(i) for i in range(10)] == [ModeTraceTeacher(env, seed=0).mode_of(i) for i in range(10)]
    assert [teacher.mode_of(i) for i in range(30)] != [ModeTraceTeacher(env, seed=1).mode_of(i) for i in range(30)]
    with pytest.raises(ValueError, match="Modes-v0"):
        import gymnasium as gym

        import rlvr_envs  # noqa: F401

        ModeTraceTeacher(gym.make("rlvr/Arithmetic-v0"))


def test_a_trace_over_its_cap_is_an_error():
    cfg = parse_name("smollm2-modes@base=tiny,nothink_cap=40,short_cap=80,long_cap=30")
    policy = load_policy("tiny")
    env = make_env(**cfg.env_kwargs(), seed_base=cfg.data_seed_base)
    teacher = ModeTraceTeacher(env)
    episodes, _ = demonstrations(policy, env, 12, teacher=teacher)
    with pytest.raises(ValueError, match="raise long_cap"):
        check_caps(policy, episodes, teacher.table)
    with pytest.raises(ValueError, match="tasks must be >= 1"):
        warm_start(parse_name("smollm2-modes@base=tiny,tasks=0"))


def test_parse_name():
    assert parse_name("smollm2-modes") == ModesWarmStart()
    assert parse_name("smollm2-modes@tasks=5,lr=0.01,base=tiny") == ModesWarmStart(tasks=5, lr=0.01, base="tiny")
    assert parse_name("smollm2") is None and parse_name("micro-countdown") is None
    with pytest.raises(ValueError, match="keys from"):
        parse_name("smollm2-modes@steps=1")
    with pytest.raises(ValueError, match="not a int"):
        parse_name("smollm2-modes@tasks=many")
    assert ModesWarmStart(tasks=4).key() != ModesWarmStart(tasks=5).key()


def test_warm_start_teaches_the_markers_and_is_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("RLVR_CACHE_DIR", str(tmp_path / "a"))
    torch.set_num_threads(1)
    cfg = parse_name(TINY)
    path = ensure_modes_warmstart(cfg)
    report = json.loads((path / "warmstart.json").read_text())
    assert report["key"] == cfg.key() and report["demonstrations"]["episodes"] == 32
    assert sum(report["mode_counts"].values()) == 32 and min(report["mode_counts"].values()) >= 10
    stamp = (path / "warmstart.json").stat().st_mtime_ns
    tuned = load_policy(TINY)  # reuses the cache
    assert (path / "warmstart.json").stat().st_mtime_ns == stamp
    assert tuned.info["warmstart_key"] == cfg.key()
    base = load_policy("tiny")
    assert tuned.weights_hash != base.weights_hash
    # held-out prompts (another task stream): the marked responses are far likelier after the warm start
    env = make_env(**cfg.env_kwargs(), seed_base=1)
    held, _ = demonstrations(base, env, 16, teacher=ModeTraceTeacher(env, seed=5))
    with torch.no_grad():
        before = float(masked_nll(base.model, held, pad_id=base.tokenizer.pad_token_id or 0))
        after = float(masked_nll(tuned.model, held, pad_id=tuned.tokenizer.pad_token_id or 0))
    assert after < 0.5 * before, (before, after)
