"""rlvr/Modes-v0 (rlvr_envs/modes.py): marker parsing, per-mode caps, weights, info, instruction, check_env,
determinism, the harness and the results report."""

from __future__ import annotations

import json
import warnings

import gymnasium as gym
import pytest
from grpo_toys import make_env as toy_env
from grpo_toys import make_tokenizer
from gymnasium.utils.env_checker import check_env
from harness_toy import TOY_ID
from hypothesis import given, settings
from hypothesis import strategies as st

import rlvr_envs  # noqa: F401
from rlvr_envs.harness import evaluate, validate
from rlvr_envs.modes import (
    DEFAULT_INSTRUCTION,
    MODES_ID,
    ModesWrapper,
    ModeTable,
    cut_tokens,
    cut_words,
    main,
    mode_report,
)

# The toy task answers with one word (question "p<k>", answer "t<k>"); modes are toy words too, caps in words.
TOY = {"nothink": {"marker": "a", "cap": 2}, "short": {"marker": "b", "cap": 3}, "long": {"marker": "c", "cap": 4}}


def wrapped(**kw) -> ModesWrapper:
    return ModesWrapper(toy_env(4), **{"modes": TOY, "instruction": None, **kw})


def play(env: gym.Env, response: str, index: int = 1) -> tuple[float, dict]:
    env.reset(options={"index": index})
    _, reward, terminated, truncated, info = env.step(response)
    assert terminated and not truncated
    return reward, info


# -- parsing -----------------------------------------------------------------------------------------------------
def test_marker_is_the_exact_first_word():
    table = ModeTable.build()
    assert [m.marker for m in table.modes] == ["/nothink", "/short", "/long"]
    cases = {"/nothink 5": ("nothink", 8), "  \n\t/short x": ("short", 10), "/long": ("long", 5),
             "/short\n/long": ("short", 6), "/short:": (None, 0), "/shortcut 3": (None, 0), "/LONG 3": (None, 0),
             "x /long": (None, 0), "": (None, 0), "   \n": (None, 0), "🙂 /nothink": (None, 0), "\x00/long": (None, 0)}
    for text, (name, end) in cases.items():
        mode, at = table.parse(text)
        assert (None if mode is None else mode.name, at) == (name, end), text


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_parse_never_raises_and_agrees_with_split(text):
    table = ModeTable.build(TOY)
    mode, end = table.parse(text)
    words = text.split()
    if mode is None:
        assert end == 0 and (not words or words[0] not in ("a", "b", "c"))
    else:
        assert words[0] == mode.marker and text[:end].strip() == mode.marker


def test_resolve_and_weights_follow_no_marker():
    table = ModeTable.build(TOY)
    assert [table.weight(t) for t in ("a t0", "b t0", "c t0", "t0", "")] == [1.0, 0.9, 0.75, 0.75, 0.75]
    strict = ModeTable.build(TOY, no_marker="error")
    assert strict.resolve("t0") == (None, False) and strict.weight("t0") == 0.0
    assert ModeTable.build(TOY, no_marker="nothink").weight("t0") == 1.0


@pytest.mark.parametrize("modes, no_marker, key", [
    ({"nothink": {"marker": "two words"}}, "long", "modes.nothink.marker"),
    ({"short": {"marker": "a"}, "nothink": {"marker": "a"}}, "long", "is used by another mode"),
    ({"short": {"cap": 0}}, "long", "modes.short.cap"),
    ({"short": {"cap": 1.5}}, "long", "modes.short.cap"),
    ({"long": {"weight": -0.1}}, "long", "modes.long.weight"),
    ({"long": {"weight": float("nan")}}, "long", "modes.long.weight"),
    ({"long": {"size": 3}}, "long", "unknown field"),
    ({"medium": {"marker": "/medium"}}, "long", "needs"),
    ({"Medium": {"marker": "/m", "cap": 8, "weight": 0.8}}, "long", "mode name"),
    ({"long": 3}, "long", "modes.long"),
    (None, "medium", "no_marker"),
])
def test_bad_mode_tables_raise_naming_the_key(modes, no_marker, key):
    with pytest.raises(ValueError, match=key):
        ModeTable.build(modes, no_marker)


def test_a_new_mode_and_field_merges():
    table = ModeTable.build({"medium": {"marker": "/medium", "cap": 32, "weight": 0.8}, "short": {"cap": 40}})
    assert table.names == ["nothink", "short", "long", "medium"]
    assert table.mode("short").cap == 40 and table.mode("short").weight == 0.9 and table.mode("short").marker == "/short"
    assert ModeTable.build(**table.to_kwargs()) == table


# -- caps ----------------------------------------------------------------------------------------------------------
def test_cut_words_and_tokens_golden():
    assert cut_words("a b  c\nd", 2) == ("a b", 4)
    assert cut_words("  a b", 5) == ("  a b", 2)
    assert cut_words("", 3) == ("", 0)
    assert cut_words("a b c", 3) == ("a b c", 3)
    tok = make_tokenizer()  # whitespace word-level: tokens are words
    assert cut_tokens("a b  c\nd", 2, tok) == ("a b", 4)
    from agents.policy.micro import micro_tokenizer

    micro = micro_tokenizer()  # "N <answer>7*2+9</answer>" = N | <answer> | 7 | * | 2 | + | 9 | </answer>
    assert cut_tokens("N <answer>7*2+9</answer>", 5, micro) == ("N <answer>7*2", 8)
    assert cut_tokens("N <answer>7*2+9</answer>", 8, micro) == ("N <answer>7*2+9</answer>", 8)


# -- the wrapper ---------------------------------------------------------------------------------------------------
def test_step_golden_values():
    env = wrapped()
    # task 1: the right answer is "t1" as the first word after the marker
    cases = [
        # response          reward  correct mode       found  cap capped len
        ("a t1",            1.0,    True,  "nothink", True,  2,  False, 2),
        ("b t1 d",          0.9,    True,  "short",   True,  3,  False, 3),
        ("c t1 e f g h",    0.75,   True,  "long",    True,  4,  True,  6),  # cut to "c t1 e f": still right
        ("a x t1",          0.0,    False, "nothink", True,  2,  True,  3),  # the answer lies past the cap
        ("t1",              0.75,   True,  "long",    False, 4,  False, 1),  # unmarked: scored as Long
        ("b t2",            0.0,    False, "short",   True,  3,  False, 2),
        ("",                0.0,    False, "long",    False, 4,  False, 0),
        ("  \n a   t1 ",    1.0,    True,  "nothink", True,  2,  False, 2),
    ]
    for response, reward, correct, mode, found, cap, capped, length in cases:
        r, info = play(env, response)
        assert (r, info["correct"], info["mode"], info["marker_found"], info["cap"], info["capped"],
                info["response_len"]) == (reward, correct, mode, found, cap, capped, length), response
        assert info["base_reward"] == float(correct) and info["base_correct"] == correct
        assert info["weight"] == {"nothink": 1.0, "short": 0.9, "long": 0.75}[mode]
        assert info["len_unit"] == "words" and info["task_id"] == "toy-1" and info["answer"] == "t1"


def test_no_marker_as_format_error_and_flat_pay():
    r, info = play(wrapped(no_marker="error"), "t1")
    assert (r, info["correct"], info["format_ok"], info["mode"], info["cap"], info["weight"]) == \
        (0.0, False, False, None, None, 0.0)
    assert info["base_correct"] is True and info["base_reward"] == 1.0 and "marker" in info["error"]
    r, info = play(wrapped(no_marker="error"), "c t1")
    assert r == 0.75 and info["correct"]
    r, info = play(wrapped(pay_weights=False), "c t1")  # the weight is recorded, not paid (a shaper pays it)
    assert (r, info["weight"], info["base_reward"]) == (1.0, 0.75, 1.0)
    r, _ = play(wrapped(modes={**TOY, "short": {**TOY["short"], "weight": 0.5}}), "b t1")
    assert r == 0.5


def test_token_caps_with_a_tokenizer():
    from agents.policy.micro import micro_tokenizer

    # micro tokens: "a t1" = a | " t" | 1: 3 tokens, 2 words. A 2-token cap cuts the answer, a 2-word cap does not.
    r, info = play(wrapped(tokenizer=micro_tokenizer()), "a t1")
    assert (r, info["capped"], info["response_len"], info["len_unit"]) == (0.0, True, 3, "tokens")
    r, info = play(wrapped(), "a t1")
    assert (r, info["capped"], info["response_len"]) == (1.0, False, 2)


def test_instruction_lists_the_modes_and_can_be_left_out():
    plain_obs, plain = toy_env(4).reset(options={"index": 2})
    obs, info = wrapped(instruction=DEFAULT_INSTRUCTION).reset(options={"index": 2})
    text = ("p2\n\nBegin your response with one mode token: a (answer at once, no reasoning), b (brief reasoning) "
            "or c (extended reasoning).")
    assert info["messages"] == [{"role": "user", "content": text}] and obs == text
    assert (info["task_id"], info["index"]) == (plain["task_id"], plain["index"])
    assert wrapped().reset(options={"index": 2}) == (plain_obs, plain)
    assert wrapped(instruction="").reset(options={"index": 2}) == (plain_obs, plain)  # TOML's way to say None
    assert wrapped(instruction="{prompt}").reset(options={"index": 2})[0] == plain_obs
    obs, _ = wrapped(instruction="{modes} | {prompt}").reset(options={"index": 2})
    assert obs.startswith("a (answer at once") and obs.endswith("| p2")
    for bad in ("no prompt", "{prompt} {other}", 3):
        with pytest.raises(ValueError, match="instruction"):
            wrapped(instruction=bad)
    with pytest.raises(ValueError, match="pay_weights"):
        wrapped(pay_weights="no")


def test_garbage_never_crashes_and_non_text_is_refused():
    env = wrapped()
    for text in ("\x00\x01", "a" * 10_000, " " * 5000, "🙂🙂 a t1", "c\n\n\n", "a\tt1"):
        r, info = play(env, text)
        assert r in (0.0, 0.75, 1.0) and isinstance(info["response_len"], int)
    env.reset(options={"index": 0})
    with pytest.raises(TypeError):
        env.step(5)


def test_check_env_passes():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # check_env warns that a wrapper is not the unwrapped env
        check_env(ModesWrapper(toy_env(4)), skip_render_check=True)
        check_env(ModesWrapper(toy_env(4), modes=TOY, no_marker="error", instruction=None), skip_render_check=True)
    env = gym.make(MODES_ID, size=20)
    check_env(env.unwrapped, skip_render_check=True)  # as tests/test_registry.py checks every id
    assert env.reset(seed=123)[0] == env.reset(seed=123)[0]


def test_deterministic_under_seeds():
    def episode(seed):
        env = gym.make(MODES_ID, size=50)
        env.action_space.seed(seed)
        out = []
        for k in range(6):
            obs, info = env.reset(seed=seed + k)
            answer = env.unwrapped.task.answer
            action = ["/nothink " + answer, "/short x " + answer, env.action_space.sample(), answer][k % 4]
            out.append((obs, info, *env.step(action)[1:]))
        return out

    first, second = episode(3), episode(3)
    assert first == second  # verify_ms is a WallTime: equal to any other
    assert [o[2] for o in first[:2]] == [1.0, 0.9] and first[3][2] == 0.75


def test_registered_id_passes_kwargs_to_the_base():
    env = gym.make(MODES_ID, base_kwargs={"max_operand": 5}, seed_base=1, size=10)
    _, info = env.reset(options={"index": 3})
    base = gym.make("rlvr/Arithmetic-v0", max_operand=5, seed_base=1, size=10)
    _, plain = base.reset(options={"index": 3})
    assert info["messages"][0]["content"].startswith(plain["messages"][0]["content"] + "\n\nBegin your response")
    assert len(env.unwrapped.source) == 10
    with pytest.raises(ValueError, match="base"):
        gym.make(MODES_ID, base=MODES_ID)
    with pytest.raises(ValueError, match="single-turn text env"):
        gym.make(MODES_ID, base="rlvr/Taxi-v0")


# -- harness and report --------------------------------------------------------------------------------------------
class ModeAgent:
    """Task i: /nothink right (i % 3 == 0), /short right on even i (i % 3 == 1), unmarked wrong (i % 3 == 2)."""

    def act(self, observations, infos):
        out = []
        for obs, info in zip(observations, infos):
            a, b = (int(x) for x in obs.split("What is ")[1].split("?")[0].split(" + "))
            i = info["task_index"]
            if i % 3 == 0:
                out.append(f"/nothink \\boxed{{{a + b}}}")
            elif i % 3 == 1:
                out.append(f"/short {a} + {b} = {a + b + i % 2} so \\boxed{{{a + b + i % 2}}}")
            else:
                out.append(f"I think \\boxed{{{a + b + 1}}}")
        self.last_token_counts = [len(r.split()) for r in out]
        return out


def test_harness_evaluates_the_wrapper_and_the_report_reads_it(tmp_path, capsys):
    path = tmp_path / "modes.json"
    res = evaluate(ModeAgent(), MODES_ID, env_kwargs={"base": TOY_ID}, limit=6, progress=False, out=path)
    validate(json.loads(path.read_text()))
    rewards = [r["reward"] for r in res.records]
    # tasks 0, 3: /nothink right (1.0); 1: /short wrong (a + b + 1); 4: /short right (0.9); 2, 5: unmarked wrong
    assert rewards == [1.0, 0.0, 0.0, 1.0, 0.9, 0.0]
    assert res.metrics["accuracy"] == pytest.approx(3 / 6)
    report = mode_report(path)
    assert report["share"] == {"nothink": 2 / 6, "short": 2 / 6, "long": 0.0, "unmarked": 2 / 6}
    assert report["accuracy"] == {"nothink": 1.0, "short": 0.5, "unmarked": 0.0}
    assert report["no_marker_rate"] == 2 / 6 and report["length_unit"] == "tokens"
    assert report["len_mean"]["nothink"] == 2.0 and report["len_mean"]["short"] == 8.0
    assert main([str(path)]) == 0 and json.loads(capsys.readouterr().out)["count"]["unmarked"] == 2
    with pytest.raises(ValueError, match="not"):
        mode_report({"config": {"env_id": TOY_ID, "env_kwargs": {}}, "records": []})


class CappedAgent:
    """A right answer written past the NoThink cap (2 words here): the wrapper scores it wrong, the bare env right."""

    def act(self, observations, infos):
        out = []
        for obs in observations:
            a, b = (int(x) for x in obs.split("What is ")[1].split("?")[0].split(" + "))
            out.append(f"/nothink so then \\boxed{{{a + b}}}")
        self.last_token_counts = [len(r.split()) for r in out]
        return out


def test_leaderboard_reverifies_through_the_wrapper(tmp_path):
    """A submission is re-scored as the harness scored it: through the wrapper's caps, not the bare env's verifier."""
    from rlvr_envs.harness.leaderboard import has_scoring_wrapper, verify_results

    path = tmp_path / "capped.json"
    kwargs = {"base": TOY_ID, "modes": {"nothink": {"cap": 2}}}
    res = evaluate(CappedAgent(), MODES_ID, env_kwargs=kwargs, limit=4, progress=False, out=path)
    assert [r["correct"] for r in res.records] == [False] * 4  # the answer lies past the cap
    doc = json.loads(path.read_text())
    assert verify_results(doc)["accuracy"] == 0.0
    doc["records"][0]["correct"] = True  # a false claim is still caught
    with pytest.raises(Exception, match="claimed correct=True"):
        verify_results(doc)
    assert has_scoring_wrapper(gym.make(MODES_ID, **kwargs)) and not has_scoring_wrapper(gym.make(TOY_ID))
