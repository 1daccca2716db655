"""Segment spans in tokens: character offsets of a response's steps mapped onto its tokens."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from agents.grpo.segments import line_spans, token_at, token_ends, token_segments
from agents.policy.micro import micro_tokenizer

TRACE = "9+7=16 [2 16]\n 16+2=18 x\n7*2=14 [9 14]\n 14+9=23 !\n<answer>7*2+9</answer>"


def test_token_ends_tile_the_decoded_text():
    tok = micro_tokenizer()
    ids = tok(TRACE, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    ends = token_ends(tok, ids)
    assert len(ends) == len(ids) and ends[-1] == ends[-2] == len(TRACE)  # EOS adds no characters
    starts = [0, *ends[:-1]]
    assert "".join(TRACE[a:b] for a, b in zip(starts, ends)) == TRACE
    assert TRACE[starts[token_at(ends, TRACE.index("16+2"))]:].startswith(" 16+2")  # " 16" is one token


def test_lines_become_token_segments():
    tok = micro_tokenizer()
    ids = tok(TRACE, add_special_tokens=False)["input_ids"]
    ends = token_ends(tok, ids)
    spans = line_spans(TRACE)
    assert [TRACE[a:b].strip() for a, b in spans] == [line.strip() for line in TRACE.splitlines()]
    segs = token_segments(ends, [b for _, b in spans[:-1]])
    assert len(segs) == len(spans) and segs[0][0] == 0 and segs[-1][1] == len(ids)
    texts = [tok.decode(ids[a:b]) for a, b in segs]
    assert "".join(texts) == TRACE and texts[1] == " 16+2=18 x\n" and texts[-1].startswith("<answer>")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["1", "23", "+", "=", " ", "\n", "x", "[", "]", "!"]), min_size=1, max_size=30),
       st.lists(st.integers(0, 60), max_size=5))
def test_segments_partition_the_tokens(pieces, cuts):
    tok = micro_tokenizer()
    text = "".join(pieces)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    ends = token_ends(tok, ids)
    segs = token_segments(ends, sorted(cuts))
    assert segs[0][0] == 0 and segs[-1][1] == len(ids)
    assert all(a <= b for a, b in segs) and all(segs[j][1] == segs[j + 1][0] for j in range(len(segs) - 1))
