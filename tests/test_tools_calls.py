"""Tool-call parsing (JSON blocks and Python-style calls) and the BFCL AST match on hand-made cases."""

import pytest

from rlvr_envs.verifiers.calls import MAX_ARG_CHARS, ToolCall, match_bfcl, parse_tool_calls, standardize


def test_json_blocks_are_parsed_in_order_and_the_rest_is_text():
    text = ('Let me check.\n<tool_call>\n{"name": "get_order", "arguments": {"order_id": 7}}\n</tool_call>\n'
            '<tool_call>{"name": "list_files", "parameters": {"folder": "/docs"}}</tool_call>')
    parsed = parse_tool_calls(text)
    assert parsed.calls == (ToolCall("get_order", {"order_id": 7}), ToolCall("list_files", {"folder": "/docs"}))
    assert parsed.errors == () and parsed.text == "Let me check." and parsed.style == "json"


def test_arguments_as_json_string_list_in_block_and_unclosed_final_block():
    parsed = parse_tool_calls('<tool_call>[{"name": "a", "arguments": "{\\"x\\": 1}"}, {"name": "b"}]</tool_call>'
                              '<tool_call>{"name": "c", "arguments": {}}')
    assert [c.name for c in parsed.calls] == ["a", "b", "c"] and parsed.calls[0].arguments == {"x": 1}


@pytest.mark.parametrize("body, message", [
    ('{"name": "f", "arguments": {"a": 1}', "malformed JSON"),
    ('{"arguments": {}}', "must be an object"),
    ('{"name": "f; DROP TABLE x", "arguments": {}}', "invalid function name"),
    ('{"name": "f", "arguments": [1, 2]}', "must be an object"),
    ('{"name": "f", "arguments": {"a": NaN}}', "non-finite"),
    ('{"name": "f", "arguments": {}, "evil": 1}', "unexpected keys"),
    ('{"name": "f", "arguments": {"a": ' + "[" * 40 + "]" * 40 + "}}", "nested deeper"),
])
def test_malformed_json_calls_become_errors_not_exceptions(body, message):
    parsed = parse_tool_calls(f"<tool_call>{body}</tool_call>")
    assert parsed.calls == () and len(parsed.errors) == 1 and message in parsed.errors[0]


def test_oversized_arguments_and_too_many_calls_are_bounded():
    big = '<tool_call>{"name": "f", "arguments": {"a": "' + "x" * (MAX_ARG_CHARS + 10) + '"}}</tool_call>'
    assert "too large" in parse_tool_calls(big).errors[0]
    many = "".join('<tool_call>{"name": "f", "arguments": {}}</tool_call>' for _ in range(40))
    parsed = parse_tool_calls(many, max_calls=5)
    assert len(parsed.calls) == 5 and "too many calls" in parsed.errors[-1]


def test_python_style_calls_use_a_literal_whitelist():
    parsed = parse_tool_calls('[math.hypot(x=4, y=-5.5, z=None), spotify.play(artist="Maroon 5", tags=("a", "b"), '
                              'opts={"loud": True})]')
    assert parsed.style == "python" and parsed.errors == ()
    assert parsed.calls == (ToolCall("math.hypot", {"x": 4, "y": -5.5, "z": None}),
                            ToolCall("spotify.play", {"artist": "Maroon 5", "tags": ["a", "b"], "opts": {"loud": True}}))
    fenced = parse_tool_calls('```python\nf(a=[1, 2])\n```')
    assert fenced.calls == (ToolCall("f", {"a": [1, 2]}),)


@pytest.mark.parametrize("text", [
    "f(a=__import__('os').system('echo hi'))", "f(a=1+1)", "f(a=x)", "f(1)", "f(**{'a': 1})",
    "f(a=[i for i in range(3)])", "f(a=lambda: 0)", "f()(a=1)", "f(a=1e999)",
])
def test_python_style_rejects_everything_but_literals(text):
    parsed = parse_tool_calls(text)
    assert parsed.calls == () and len(parsed.errors) == 1


def test_prose_is_not_a_call():
    for text in ("The answer is 42.", "I cannot help with that (sorry).", "", "{not json}", '{"answer": 3}'):
        parsed = parse_tool_calls(text)
        assert parsed.attempted == 0 and parsed.text == text.strip()


def test_bfcl_standardize_and_match_rules():
    assert standardize("April 1, 2024") == standardize("april 1 2024")
    fn = {"name": "f", "parameters": {"type": "dict", "required": ["a"], "properties": {
        "a": {"type": "integer"}, "b": {"type": "float"}, "c": {"type": "string"},
        "d": {"type": "array", "items": {"type": "string"}}, "e": {"type": "dict", "properties": {}}}}}
    gt = [{"f": {"a": [3], "b": [2.0, ""], "c": ["New York", ""], "d": [["x", "y"], ""], "e": [{"k": ["v"]}, ""]}}]
    ok = lambda **kw: match_bfcl([ToolCall("f", kw)], gt, [fn], "simple_python") is None  # noqa: E731
    assert ok(a=3) and ok(a=3, b=2) and ok(a=3, c="new york") and ok(a=3, d=["X", "y"]) and ok(a=3, e={"k": "V"})
    assert not ok(a=3.0)            # float for an integer
    assert not ok(a=True)           # bool is not an integer
    assert not ok(b=2.0)            # missing required
    assert not ok(a=3, z=1)         # unknown parameter
    assert not ok(a=3, c="Boston")  # wrong value
    assert not ok(a=3, d=["y", "x"])  # list order matters
    assert not ok(a=3, e={"k": "v", "extra": 1})
    assert match_bfcl([], gt, [fn], "simple_python") is not None
    assert match_bfcl([], [], [fn], "irrelevance") is None
    assert match_bfcl([ToolCall("f", {"a": 3})], [], [fn], "irrelevance") is not None


def test_bfcl_parallel_is_order_free_and_counts_calls():
    fn = {"name": "g", "parameters": {"type": "dict", "required": ["n"], "properties": {"n": {"type": "integer"}}}}
    gt = [{"g": {"n": [1]}}, {"g": {"n": [2]}}]
    assert match_bfcl([ToolCall("g", {"n": 2}), ToolCall("g", {"n": 1})], gt, [fn], "parallel") is None
    assert match_bfcl([ToolCall("g", {"n": 2}), ToolCall("g", {"n": 2})], gt, [fn], "parallel") is not None
    assert match_bfcl([ToolCall("g", {"n": 1})] * 3, gt, [fn], "parallel") is not None
