"""Where the steps of a response are, in tokens: what step- and segment-level credit (DASH, GraphPO, RREDCoT, DRE,
Monte-Carlo step values) needs to put an advantage on the tokens of one step.

A response's text is split into segments by character offsets (lines of a search trace, sentences, answer
commitments); ``token_ends`` maps those offsets onto the response's tokens by decoding growing prefixes, so it is
right for any tokenizer whose decode of a prefix is a prefix of the decode of the whole (byte-level BPE included,
where a token may end inside a multi-byte character: that token then counts as ending where its text does).
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Sequence
from typing import Any


def token_ends(tokenizer: Any, response_ids: Sequence[int], *, skip_special_tokens: bool = True) -> list[int]:
    """``ends[k]`` = the length of the decoded text of tokens ``0..k``: token ``k`` covers characters
    ``ends[k-1]:ends[k]`` (``ends[-1]`` = 0). Non-decreasing; special tokens (EOS) add no characters."""
    ids = list(response_ids)
    ends: list[int] = []
    for k in range(len(ids)):
        ends.append(len(tokenizer.decode(ids[: k + 1], skip_special_tokens=skip_special_tokens)))
    for k in range(1, len(ends)):  # a decode that shrinks (replacement characters settling) must not go back
        ends[k] = max(ends[k], ends[k - 1])
    return ends


def token_at(ends: Sequence[int], char: int) -> int:
    """The index of the token that contains character ``char`` (the first token whose text ends after it);
    ``len(ends)`` when ``char`` lies past the decoded text."""
    return bisect.bisect_right(list(ends), char)


def line_spans(text: str) -> list[tuple[int, int]]:
    """``(start, end)`` character spans of the non-blank lines of ``text``, newline included in the span of the line
    it ends (so consecutive spans tile the text up to the last line)."""
    spans, start = [], 0
    for line in text.splitlines(keepends=True):
        end = start + len(line)
        if line.strip():
            spans.append((start, end))
        start = end
    return spans


def token_segments(ends: Sequence[int], cuts: Sequence[int]) -> list[tuple[int, int]]:
    """Split tokens ``0..len(ends)`` into segments at character offsets ``cuts`` (ascending): segment ``j`` is the
    token range ``[a, b)`` whose text lies before ``cuts[j]`` and after the previous cut; the last segment runs to the
    end. A cut inside a token puts that token in the segment the cut closes."""
    bounds = [0]
    for c in cuts:
        k = min(len(ends), max(bounds[-1], token_at(ends, c - 1) + 1 if c > 0 else 0))
        bounds.append(k)
    bounds.append(len(ends))
    return [(bounds[j], bounds[j + 1]) for j in range(len(bounds) - 1)]


def parse_split(split: str) -> tuple[str, Any]:
    """``"lines"`` | ``"tokens=K"`` | ``"regex=PATTERN"`` -> (kind, argument); a bad value raises naming ``split``."""
    if split == "lines":
        return "lines", None
    kind, _, arg = str(split).partition("=")
    if kind == "tokens":
        try:
            k = int(arg)
        except ValueError:
            k = 0
        if k < 1:
            raise ValueError(f"split: 'tokens=K' needs an integer K >= 1, got {split!r}")
        return "tokens", k
    if kind == "regex" and arg:
        try:
            return "regex", re.compile(arg)
        except re.error as exc:
            raise ValueError(f"split: bad regex {arg!r}: {exc}") from None
    raise ValueError(f"split must be 'lines', 'tokens=K' or 'regex=PATTERN', got {split!r}")


def evenly(items: list[int], k: int) -> list[int]:
    """``k`` of ``items`` at evenly spaced positions strictly inside the list (all of them when there are at most k):
    position ``floor((j + 1)(n + 1) / (k + 1) + 1/2) - 1`` for ``j < k``."""
    n = len(items)
    if n <= k:
        return list(items)
    picked = [int(math.floor((j + 1) * (n + 1) / (k + 1) + 0.5)) - 1 for j in range(k)]
    return [items[p] for p in sorted(set(min(n - 1, max(0, p)) for p in picked))]
