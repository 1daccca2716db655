"""The micro lane: search traces and their checker, the micro tokenizer, the cached warm start, and lanes."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.grpo.config import load_lane, load_recipe
from agents.policy.countdown_traces import TRACE_MODES, check_trace, solution_branch, write_mode_trace, write_trace
from agents.policy.micro import MicroConfig, ensure_micro, env_kwargs, micro_tokenizer, parse_name, warmstart_examples
from rlvr_envs.tasks.countdown import CountdownSource
from rlvr_envs.verifiers.countdown import verify

SMALL = "micro-countdown@steps=3,batch_size=4,hidden_size=32,intermediate_size=64,num_layers=1,num_heads=2"


def _tasks(n: int, seed_base: int = 7):
    src = CountdownSource(min_numbers=3, max_numbers=4, min_number=1, max_number=9, min_target=2, max_target=40,
                          seed_base=seed_base)
    return [src.task(i) for i in range(n)]


def test_traces_are_valid_searches_that_reach_the_target():
    lengths = []
    for i, task in enumerate(_tasks(150)):
        nums, target = task.metadata["numbers"], int(task.answer)
        trace = write_trace(nums, target, np.random.default_rng(i))
        check = check_trace(nums, target, trace)
        assert check.all_valid and check.reached, trace
        assert verify(nums, target, trace).correct, trace
        assert trace == write_trace(nums, target, np.random.default_rng(i))  # deterministic for the seed
        lengths.append(len(trace))
    p10, p90 = np.percentile(lengths, [10, 90])
    assert p90 / p10 >= 2  # the length spread the length methods need


def test_trace_noise_gives_different_searches_for_one_task():
    nums, target = [2, 7, 9], 23
    traces = {write_trace(nums, target, np.random.default_rng(s)) for s in range(20)}
    assert len(traces) > 3


def test_unreachable_target_is_an_error():
    with pytest.raises(ValueError, match="cannot reach"):
        write_trace([1, 1, 1], 40, np.random.default_rng(0))


def test_mode_traces_are_scored_by_the_modes_env_as_their_mode():
    """Each mode's trace parses as that mode in rlvr/Modes-v0, its answer is correct, Short keeps only the solution
    branch (valid, no dead end) and NoThink has no search line; lengths order NoThink < Short <= Long."""
    from rlvr_envs.modes import ModeTable

    table, tok = ModeTable.build(), micro_tokenizer()
    for i, task in enumerate(_tasks(60)):
        nums, target = task.metadata["numbers"], int(task.answer)
        full = write_trace(nums, target, np.random.default_rng(i))
        texts = {m: write_mode_trace(nums, target, np.random.default_rng(i), m) for m in TRACE_MODES}
        lengths = {m: len(tok(t, add_special_tokens=False)["input_ids"]) for m, t in texts.items()}
        for mode, text in texts.items():
            parsed, _ = table.parse(text)
            assert parsed is not None and parsed.name == mode, text
            assert verify(nums, target, text).correct, text
        assert texts["long"] == "/long\n" + full
        short = check_trace(nums, target, texts["short"].split("\n", 1)[1])
        assert short.all_valid and short.reached and all(s.mark != "x" for s in short.steps)
        assert texts["short"].split("\n")[1:-1] == solution_branch(full)
        assert "=" not in texts["nothink"]
        assert lengths["nothink"] < lengths["short"] <= lengths["long"]
    with pytest.raises(ValueError, match="mode must be one of"):
        write_mode_trace([2, 3, 4], 10, np.random.default_rng(0), "medium")


def test_mode_trace_warm_start_mixes_the_modes():
    tok = micro_tokenizer()
    examples = warmstart_examples(MicroConfig(mode_traces=1), tok, 300)
    firsts = [tok.decode(r[:2]) for _, r in examples]
    shares = {m: firsts.count(f"/{m}") / len(firsts) for m in TRACE_MODES}
    assert sum(shares.values()) == 1 and min(shares.values()) > 0.25, shares
    plain = warmstart_examples(MicroConfig(), tok, 20)
    assert all(not tok.decode(r[:1]).startswith("/") for _, r in plain)
    assert MicroConfig(mode_traces=1).key() != MicroConfig().key()
    with pytest.raises(ValueError, match="mode_traces"):
        warmstart_examples(MicroConfig(mode_traces=2), tok, 1)


def test_check_trace_flags_bad_steps():
    nums, target = [2, 7, 9], 23
    good = "9+7=16 [2 16]\n 16+2=18 x\n7*2=14 [9 14]\n 14+9=23 !\n<answer>7*2+9</answer>"
    assert check_trace(nums, target, good).reached
    assert check_trace(nums, target, good).first_move == (9, "+", 7)
    wrong_sum = good.replace("9+7=16 [2 16]\n 16+2=18", "9+7=15 [2 15]\n 15+2=17")
    c = check_trace(nums, target, wrong_sum)
    assert not c.steps[0].valid and not c.steps[1].valid and c.reached  # the second branch is still right
    unavailable = "8*3=24 [24]\n<answer>8*3</answer>"
    assert not check_trace(nums, target, unavailable).steps[0].valid
    bad_left = "9+7=16 [3 16]\n 16+2=18 x"
    assert not check_trace(nums, target, bad_left).steps[0].valid
    false_claim = "7*2=14 [9 14]\n 14+9=23 !"
    assert check_trace(nums, 24, false_claim).reached is False
    prose = "let me think\n9+7=16 [2 16]"
    assert check_trace(nums, target, prose).malformed_lines == 1


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126) | st.sampled_from("\n\t"), max_size=80))
def test_tokenizer_is_lossless_on_printable_ascii(text: str):
    tok = _TOK
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.unk_token_id not in ids
    assert tok.decode(ids) == text


_TOK = micro_tokenizer()


def test_tokenizer_is_compact_on_traces():
    trace = "9+7=16 [2 16]\n 16+2=18 x\n<answer>(7+6)*1</answer>"
    ids = _TOK(trace, add_special_tokens=False)["input_ids"]
    assert _TOK.convert_ids_to_tokens(ids)[:4] == ["9", "+", "7", "="]
    assert len(ids) <= 30 and " 16" in _TOK.convert_ids_to_tokens(ids)


def test_parse_name():
    assert parse_name("micro-countdown") == MicroConfig()
    assert parse_name("micro-countdown@steps=5,lr=0.01").steps == 5
    assert parse_name("smollm2") is None
    with pytest.raises(ValueError, match="keys from"):
        parse_name("micro-countdown@nope=1")
    with pytest.raises(ValueError, match="not a int"):
        parse_name("micro-countdown@steps=x")


def test_warm_start_is_cached_and_deterministic(tmp_path, monkeypatch):
    from agents.policy import load_policy

    monkeypatch.setenv("RLVR_CACHE_DIR", str(tmp_path / "a"))
    cfg = parse_name(SMALL)
    path = ensure_micro(cfg, progress=False)
    report = json.loads((path / "warmstart.json").read_text())
    assert report["key"] == cfg.key() and len(report["loss_every_10"]) == 1
    stamp = (path / "warmstart.json").stat().st_mtime_ns
    policy = load_policy(SMALL)  # reuses the cache
    assert (path / "warmstart.json").stat().st_mtime_ns == stamp
    monkeypatch.setenv("RLVR_CACHE_DIR", str(tmp_path / "b"))
    again = load_policy(SMALL)  # built again from scratch elsewhere: the same weights
    assert again.weights_hash == policy.weights_hash
    prompt = policy.prompt_text([{"role": "user", "content": "Using the numbers [1, 2, 3], create"}])
    assert prompt.endswith("create\n")
    assert MicroConfig(steps=4).key() != MicroConfig(steps=5).key()


def test_lane_fixes_the_setup_and_keeps_the_method():
    cfg = load_recipe("vigor", ["seed=3"], lane="micro")
    lane = load_lane("micro")
    assert cfg.lane == "micro" and cfg.model == "micro-countdown" and cfg.env == "rlvr/Countdown-v0"
    assert cfg.env_kwargs == lane["env_kwargs"] and cfg.temperature == lane["temperature"]
    assert cfg.stages["rollout_allocator"] == "vigor" and cfg.seed == 3 and cfg.out_dir == "runs/micro/vigor"
    assert {k: v for k, v in cfg.env_kwargs.items()} == env_kwargs(MicroConfig())
    with_set = load_recipe("grpo", ["steps=3"], lane="smollm2")
    assert with_set.steps == 3 and with_set.model == "smollm2" and with_set.eval_size >= 200
    with pytest.raises(FileNotFoundError, match="lanes: micro, smollm2"):
        load_recipe("grpo", lane="nope")


def test_lane_may_not_set_the_method(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('model = "tiny"\n[stages]\nadvantage = "lampo"\n')
    with pytest.raises(ValueError, match="may not set"):
        load_recipe("grpo", lane=str(bad))
