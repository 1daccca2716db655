"""Token-exact multi-turn episodes: the model's tokens exactly as sampled, the env's turns appended as token ids.

Re-rendering a growing chat through the chat template and tokenizing it again each turn does not give back the
tokens the model sampled (a response re-tokenizes differently, a template strips whitespace or drops the end-of-turn
token), so training log-probs drift from the sampled ones. A ``TokenEpisode`` keeps one token stream instead:

    prompt_ids | model turn 1 | env tokens 1 | model turn 2 | ... | model turn T

with ``mask`` 1 on model tokens (the only ones a loss may touch) and the sampled log-probs and entropies on them
(0 on env tokens). The env tokens of a turn are the text the chat template adds after what the stream already
holds: the new chat (``info["messages"]``, rendered with the assistant generation prompt) minus its longest common
prefix with the stream's text; when the model closed its turn itself (its last token is an end token whose text
starts that remainder) the end token is not repeated. What the stream holds, and what the model sees next turn, is
therefore its own tokens plus the template's text for everything the env said.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class TokenEpisode:
    prompt_ids: list[int]
    text: str  # the stream's text so far (prompt text + decoded model turns + env text), for the next turn's delta
    ids: list[int] = field(default_factory=list)  # everything after the prompt: model and env tokens
    mask: list[bool] = field(default_factory=list)  # True on model tokens
    logprobs: list[float] = field(default_factory=list)  # sampled log-probs on model tokens, 0 on env tokens
    entropies: list[float] = field(default_factory=list)
    turns: int = 0  # model turns so far
    finish_reasons: list[str] = field(default_factory=list)
    overflow: bool = False  # the stream reached its token limit: the last turn was not generated
    drifted: str = ""  # why the stream stopped being token-exact (the chat template rewrote earlier turns), or ""
    _closed_by_model: str = ""  # the end token's text when the model's last turn ended with one
    _turn_start: int = 0  # len(text) before the last model turn

    @property
    def stream(self) -> list[int]:
        """Prompt and everything after it: what the model reads before its next turn."""
        return self.prompt_ids + self.ids

    @property
    def model_tokens(self) -> int:
        return sum(self.mask)

    def add_model_turn(self, response_ids: Sequence[int], logprobs: Sequence[float],
                       entropies: Sequence[float] | None, text: str, finish_reason: str, end_text: str = "") -> None:
        """Append one sampled turn. ``text``: its decoded text without special tokens; ``end_text``: the text of its
        last token when that token is an end-of-turn token the template also writes (else "")."""
        if len(logprobs) != len(response_ids):
            raise ValueError(f"{len(logprobs)} log-probs for {len(response_ids)} response tokens")
        self._turn_start = len(self.text)
        self.ids += [int(t) for t in response_ids]
        self.mask += [True] * len(response_ids)
        self.logprobs += [float(x) for x in logprobs]
        self.entropies += [float(x) for x in entropies] if entropies else [0.0] * len(response_ids)
        self.text += text
        self.turns += 1
        self.finish_reasons.append(finish_reason)
        self._closed_by_model = end_text

    def add_env_turn(self, rendered: str, tokenize: Callable[[str], list[int]]) -> str:
        """Append the env's part of the chat: ``rendered`` (the whole new chat through the template, with the
        generation prompt) past what the stream already holds. Returns the appended text."""
        common = len(os.path.commonprefix([rendered, self.text]))
        if common < self._turn_start:
            raise ValueError(f"the env's chat no longer starts with the turns already played (they differ at character "
                             f"{common}): a token-exact episode needs an env that only appends to info['messages']")
        delta = rendered[common:]
        if self._closed_by_model and delta.startswith(self._closed_by_model):
            delta = delta[len(self._closed_by_model):]  # the model wrote the end token itself: it is in the stream
            self.text += self._closed_by_model
        self._closed_by_model = ""
        ids = tokenize(delta) if delta else []
        self.ids += ids
        self.mask += [False] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.entropies += [0.0] * len(ids)
        # the next turn's delta is taken against the chat as rendered, not against the model's own spelling of it
        self.text = rendered
        return delta


def turn_spans(mask: Sequence[bool]) -> list[tuple[int, int]]:
    """``[start, end)`` of each run of model tokens (each model turn) in a stream's mask."""
    spans, start = [], None
    for k, m in enumerate(mask):
        if m and start is None:
            start = k
        elif not m and start is not None:
            spans.append((start, k))
            start = None
    if start is not None:
        spans.append((start, len(mask)))
    return spans


def end_token_text(tokenizer: Any, token_id: int, end_ids: set[int]) -> str:
    """The text of ``token_id`` when it ends a turn (an EOS / end-of-turn id), else ""."""
    if int(token_id) not in end_ids:
        return ""
    return tokenizer.decode([int(token_id)], skip_special_tokens=False)


def episode_key(info: Mapping[str, Any] | None) -> tuple[int, int] | None:
    """``(task_index, sample_index)`` of a harness info, or None where it does not carry both."""
    if not info or info.get("task_index") is None or info.get("sample_index") is None:
        return None
    return int(info["task_index"]), int(info["sample_index"])
