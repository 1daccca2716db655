"""Final-answer extraction from model responses.

Styles, tried in the order given: the last ``\\boxed{...}`` (nested braces, ``\\fbox`` too), the last
``<answer>...</answer>``, the text after the last ``####``, and the last "The (final) answer is ...".
Only the *final* candidate is ever graded; ``boxed_candidates`` lets verifiers apply the answer-spam policy.
"""

from __future__ import annotations

import re

BOXED_COMMANDS = ("\\boxed", "\\fbox")
DEFAULT_STYLES = ("boxed", "answer_tag", "hashes", "answer_is")

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_TOKEN = re.compile(r"[^\s$]+")
_ANSWER_IS = re.compile(r"the (?:final )?answer is[:\s]*(.+?)(?:\.\s|\.$|\n|$)", re.IGNORECASE)


def _braced(text: str, start: int) -> tuple[str, int] | None:
    """The contents of the brace group opening at ``text[start] == '{'`` and the index after it, or None if unbalanced."""
    depth = 0
    i = start
    n = len(text)
    while i < n:
        c = text[i]
        if c == "\\":  # an escaped character (\{, \}) never changes the depth
            i += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i], i + 1
        i += 1
    return None


BOXED_MARKER = re.compile(r"\\(?:boxed|fbox)")


def boxed_spans(text: str) -> list[tuple[int, int, str]]:
    """``(start, end, content)`` of every ``\\boxed{...}`` / ``\\fbox{...}`` / ``\\boxed N``, in order of appearance."""
    out: list[tuple[int, int, str]] = []
    pos = 0
    while (m := BOXED_MARKER.search(text, pos)) is not None:
        j = m.end()
        while j < len(text) and text[j] == " ":
            j += 1
        if j < len(text) and text[j] == "{":
            got = _braced(text, j)
            if got is None:
                return out  # unbalanced: nothing after this can be trusted
            out.append((m.start(), got[1], got[0].strip()))
            pos = got[1]
        elif j > m.end():  # "\boxed 5" form: the next token
            tok = _TOKEN.match(text, j)  # match in place: slicing text[j:] here made hostile inputs quadratic
            if tok:
                out.append((m.start(), tok.end(), tok.group(0).strip()))
            pos = tok.end() if tok else j
        else:
            pos = m.end()
    return out


def boxed_candidates(text: str) -> list[str]:
    """Every boxed answer's content, in order of appearance."""
    return [content for _, _, content in boxed_spans(text)]


def last_boxed(text: str) -> str | None:
    cands = boxed_candidates(text)
    return cands[-1] if cands else None


def after_hashes(text: str) -> str | None:
    idx = text.rfind("####")
    if idx < 0:
        return None
    tail = text[idx + 4 :].strip().splitlines()
    return tail[0].strip() if tail and tail[0].strip() else None


def answer_tag(text: str) -> str | None:
    # Cut at the last closing tag: unclosed opening tags after it make the lazy regex quadratic (5000 tags: 10 s).
    close = text.lower().rfind("</answer>")
    if close < 0:
        return None
    found = _ANSWER_TAG.findall(text[: close + len("</answer>")])
    return found[-1].strip() if found else None


def answer_is(text: str) -> str | None:
    found = _ANSWER_IS.findall(text)
    return found[-1].strip().strip("$ ").rstrip(".") if found else None


_EXTRACTORS = {"boxed": last_boxed, "answer_tag": answer_tag, "hashes": after_hashes, "answer_is": answer_is}


def extract_answer(text: str, styles: tuple[str, ...] = DEFAULT_STYLES) -> tuple[str | None, str | None]:
    """``(answer, style)`` for the first style that finds an answer, else ``(None, None)``."""
    for style in styles:
        try:
            fn = _EXTRACTORS[style]
        except KeyError:
            raise ValueError(f"unknown answer style {style!r}; known: {sorted(_EXTRACTORS)}") from None
        ans = fn(text)
        if ans:
            return ans, style
    return None, None
