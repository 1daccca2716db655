"""Hypothesis fuzzing: random and hostile tool-call text never raises out of either env and never corrupts the sandbox."""

import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlvr_envs.tools.env import ToolUseEnv
from rlvr_envs.tools.services import TOOLS
from rlvr_envs.verifiers.calls import parse_tool_calls

INJECTIONS = ["'; DROP TABLE customers; --", "1 OR 1=1", "\" ; DELETE FROM orders WHERE 1; --", "Robert'); --",
              "%", "_", "/docs/../../etc/passwd", "\x00", "ATTACH DATABASE '/tmp/x' AS x; --", "😀" * 50]
PARAM_NAMES = sorted({p for t in TOOLS.values() for p in t.parameters["properties"]})

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.integers(-10**40, 10**40),
                    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=30),
                    st.sampled_from(INJECTIONS), st.just("x" * 20_000), st.integers(100, 1100))
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.one_of(st.sampled_from(PARAM_NAMES), st.text(max_size=8)), inner,
                                                 max_size=4)), max_leaves=12)
names = st.one_of(st.sampled_from(sorted(TOOLS)), st.text(max_size=20), st.sampled_from(INJECTIONS))
arguments = st.dictionaries(st.one_of(st.sampled_from(PARAM_NAMES), st.text(max_size=10)), json_values, max_size=5)


@st.composite
def json_call(draw):
    obj = {"name": draw(names), "arguments": draw(st.one_of(arguments, json_values))}
    body = json.dumps(obj) if draw(st.booleans()) else json.dumps(obj)[: draw(st.integers(0, 60))]  # maybe truncated
    return f"<tool_call>{body}{draw(st.sampled_from(['</tool_call>', '', '</tool_call></tool_call>']))}"


@st.composite
def python_call(draw):
    name = draw(st.sampled_from(sorted(TOOLS) + ["os.system", "__import__", "eval"]))
    kwargs = ", ".join(f"{k}={v!r}" for k, v in draw(arguments).items() if k.isidentifier())
    tail = draw(st.sampled_from(["", "", ", x=__import__('os').system('id')", ", **{'a': 1}"]))
    return f"[{name}({kwargs}{tail})]"


@st.composite
def schema_call(draw):
    """Well-typed calls of real tools with hostile strings: these reach the database and may change the state."""
    tool = TOOLS[draw(st.sampled_from(sorted(TOOLS)))]
    strings = st.one_of(st.sampled_from(INJECTIONS), st.text(max_size=12),
                        st.sampled_from(["2025-03-05", "10:00", "/docs/x.txt", "/notes/a.txt", "pending", "Sam"]))
    by_type = {"integer": st.integers(0, 1200), "number": st.floats(0, 100), "string": strings,
               "array": st.lists(strings, max_size=3)}
    props, required = tool.parameters["properties"], tool.parameters["required"]
    args = {p: draw(by_type[spec["type"]]) for p, spec in props.items() if p in required or draw(st.booleans())}
    return f'<tool_call>{json.dumps({"name": tool.name, "arguments": args})}</tool_call>'


actions = st.one_of(st.text(max_size=200), json_call(), python_call(), schema_call(),
                    st.lists(st.one_of(json_call(), python_call(), schema_call(), st.text(max_size=40)),
                             min_size=1, max_size=4).map("\n".join))


@pytest.fixture(scope="module")
def tool_env():
    env = ToolUseEnv(max_turns=4)
    yield env
    env.close()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), turns=st.lists(actions, min_size=1, max_size=4))
def test_tooluse_survives_hostile_text(tool_env, seed, turns):
    tool_env.reset(seed=seed)
    for text in turns:
        before = tool_env.sandbox.digest()
        obs, reward, terminated, truncated, info = tool_env.step(text)
        assert 0.0 <= reward <= 1.0 and isinstance(obs, str)
        assert tool_env.sandbox.integrity_problems() == []
        statuses = info.get("tool_results", [])  # one per tool message appended by this step
        tool_messages = info["messages"][len(info["messages"]) - len(statuses):] if statuses else []
        ok_writes = [m["name"] for m, status in zip(tool_messages, statuses) if status == "ok" and TOOLS[m["name"]].mutates]
        if not ok_writes:  # only a successful state-changing tool may change the state
            assert tool_env.sandbox.digest() == before
        assert info["calls_made"] >= info["invalid_calls"] + info["failed_calls"]
        if terminated or truncated:
            break


@settings(max_examples=150, deadline=None)
@given(text=actions)
def test_parser_never_raises(text):
    parsed = parse_tool_calls(text)
    assert parsed.attempted <= 33
    for call in parsed.calls:
        assert isinstance(call.arguments, dict) and json.dumps(call.arguments)


@pytest.fixture(scope="module")
def bfcl_env():
    root = os.environ.get("RLVR_DATA_DIR")
    if not root or not Path(root, "bfcl").is_dir():
        pytest.skip("RLVR_DATA_DIR does not hold the BFCL data (bfcl/)")
    from rlvr_envs.tools.bfcl import BFCLEnv

    return BFCLEnv(category="all", data_dir=root)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(index=st.integers(0, 2550), text=actions)
def test_bfcl_survives_hostile_text(bfcl_env, index, text):
    bfcl_env.reset(options={"index": index})
    _, reward, terminated, _, info = bfcl_env.step(text)
    assert terminated and reward in (0.0, 1.0)
    assert not str(info["error"] or "").startswith("scorer error")
