"""QA verifier (EM / token F1, SQuAD normalization) and the search protocol's parser."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlvr_envs.search.protocol import format_information, parse_action
from rlvr_envs.verifiers import qa


@pytest.mark.parametrize("pred, gold, em", [
    ("The Eiffel Tower", "eiffel tower", 1.0),
    ("  an apple!! ", "Apple", 1.0),
    ("Gesellschaft mit beschränkter Haftung", "Gesellschaft mit beschränkter Haftung", 1.0),
    ("Paris, France", "Paris", 0.0),
    ("", "Paris", 0.0),
])
def test_exact_match_uses_squad_normalization(pred, gold, em):
    assert qa.exact_match(pred, gold) == em


def test_token_f1_matches_the_squad_definition():
    # pred tokens {paris, france}, gold {paris}: precision 1/2, recall 1 -> F1 2/3
    assert qa.f1_score("Paris, France", "Paris") == pytest.approx(2 / 3)
    assert qa.f1_score("the city of Paris", "Paris city") == pytest.approx(2 * (2 / 3) * 1 / (2 / 3 + 1))
    assert qa.f1_score("London", "Paris") == 0.0
    assert qa.f1_score("a the", "an") == 1.0  # both normalize to nothing


def test_verify_reads_only_the_last_answer_tag_and_best_alias():
    v = qa.verify(["Barack Obama", "Obama"], "I think <answer>wrong</answer> no: <answer>obama</answer>")
    assert v.correct and v.reward == 1.0 and v.parsed == "obama" and v.format_ok
    assert not qa.verify("Paris", "the answer is Paris").format_ok
    assert qa.verify("Paris", "Paris").reward == 0.0
    f1 = qa.verify("Paris", "<answer>Paris France</answer>", metric="f1")
    assert not f1.correct and f1.reward == pytest.approx(2 / 3)
    with pytest.raises(ValueError):
        qa.verify("x", "<answer>x</answer>", metric="bleu")


@given(st.text(max_size=40), st.text(max_size=40))
def test_scores_are_bounded_and_consistent(a, b):
    assert qa.normalize_answer(qa.normalize_answer(a)) == qa.normalize_answer(a)
    em, f1 = qa.exact_match(a, b), qa.f1_score(a, b)
    assert 0.0 <= f1 <= 1.0 and em in (0.0, 1.0)
    if em == 1.0:
        assert f1 == 1.0
    assert qa.f1_score(a, b) == pytest.approx(qa.f1_score(b, a))


def test_parse_action_takes_the_first_complete_tag():
    a = parse_action("let me look <search> who  founded\nX </search> then <answer>Y</answer>")
    assert a.kind == "search" and a.text == "who founded X" and not a.via_tool_call
    assert a.end == len("let me look <search> who  founded\nX </search>")
    b = parse_action("<answer> Kruta Shavodran </answer><search>more</search>")
    assert b.kind == "answer" and b.text == "Kruta Shavodran"
    assert parse_action("no tags at all").kind == "invalid"
    assert parse_action("<search>   </search>").kind == "invalid"
    assert parse_action("<search>unclosed <answer>x").kind == "answer"  # only the last open tag can be cut


def test_turn_cut_at_the_stop_string_counts_as_closed():
    a = parse_action("I should look it up. <search>Oneida Community")
    assert a.kind == "search" and a.text == "Oneida Community" and a.closing == "</search>"
    b = parse_action("<answer> Emberon ")
    assert b.kind == "answer" and b.text == "Emberon" and b.closing == "</answer>"
    c = parse_action('<tool_call>{"name": "search", "arguments": {"query": "q"}}')
    assert c.kind == "search" and c.via_tool_call and c.closing == "</tool_call>"
    assert parse_action("<search>a</search>").closing == ""


def test_parse_action_accepts_tool_calls():
    call = {"name": "search", "arguments": {"query": "Oneida Community"}}
    a = parse_action(f"<tool_call>{json.dumps(call)}</tool_call>")
    assert a.kind == "search" and a.text == "Oneida Community" and a.via_tool_call
    string_args = {"name": "search", "arguments": json.dumps({"query": "q"})}
    assert parse_action(f"<tool_call>\n{json.dumps(string_args)}\n</tool_call>").text == "q"
    bad = parse_action('<tool_call>{"name": "calculator", "arguments": {"x": 1}}</tool_call>')
    assert bad.kind == "invalid" and "unknown tool" in bad.error
    assert parse_action("<tool_call>{not json</tool_call>").kind == "invalid"
    assert parse_action('<tool_call>{"name": "search", "arguments": {"q": 1}}</tool_call>').kind == "invalid"


def test_information_block_lists_titles_and_truncates_long_passages():
    block = format_information([("A", "alpha text"), ("B", "b" * 50)], max_passage_chars=10)
    assert block.startswith("<information>\n") and block.endswith("\n</information>")
    assert 'Doc 1 (Title: "A") alpha text' in block and 'Doc 2 (Title: "B") bbbbbbbbbb ...' in block
    assert "No results." in format_information([])
