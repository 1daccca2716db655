"""Hand-written Countdown search-trace batches for the step-credit tests (DASH, GraphPO): each response is a list of
pieces whose tokens are known, so a golden per-token advantage can be written piece by piece."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from agents.grpo.batch import GroupBatch, Sample
from agents.policy.micro import micro_tokenizer

TOK = micro_tokenizer()
META = {"numbers": [2, 7, 9], "target": 23}


def encode(pieces: list[str]) -> list[list[int]]:
    """Token ids of the pieces, each encoded alone (so each piece's tokens are known), checked to be the tokens of
    the whole text."""
    ids = [TOK(p, add_special_tokens=False)["input_ids"] for p in pieces]
    assert sum(ids, []) == TOK("".join(pieces), add_special_tokens=False)["input_ids"]
    return ids


def batch_of(rows, *, meta=META, answer=None, group: str = "g") -> GroupBatch:
    """rows: (pieces, reward) -> a batch with the micro tokenizer, one EOS after each response."""
    samples = []
    for pieces, r in rows:
        ids = sum(encode(pieces), []) + [TOK.eos_token_id]
        samples.append(Sample(group, "p", [1], ids, "".join(pieces), reward=r, correct=bool(r),
                              info={"metadata": meta, "answer": answer}))
    return GroupBatch.from_samples(samples, tokenizer=TOK)


def expected(rows, values) -> torch.Tensor:
    """Per-token advantages: piece k of row i gets values[i][k], EOS gets values[i][-1]; padded to the batch width."""
    out = []
    for (pieces, _), vals in zip(rows, values):
        out.append([v for p, v in zip(encode(pieces), vals) for _ in p] + [vals[-1]])
    width = max(map(len, out))
    return torch.tensor([o + [0.0] * (width - len(o)) for o in out])


# Pieces of hostile or malformed traces: valid and invalid search lines, answer tags, boxed answers, stray marks,
# non-ASCII and tabs; with raw token ids (special tokens included) they make batches no component may crash on.
GARBAGE_PIECES = ["9+7=16 [2 16]", "\n", " ", "16+2=18 x", "14+9=23 !", "7*2=14 [9 14]", "9+2=11 [7 11]", " 11+7=18 x",
                  "<answer>", "</answer>", "7*2+9", "\\boxed{", "}", "5", "2.5", "x", "!", "[", "]", "=", "+", "é", "\t",
                  "t0", "answer is 5."]
GARBAGE_METAS = [META, {}, {"numbers": "abc", "target": None}, {"numbers": [10**30, 2], "target": -4},
                 {"numbers": [-1, 3], "target": 2}, {"numbers": [], "target": 1}, None]


@st.composite
def garbage_batches(draw) -> GroupBatch:
    """1-6 rows in groups 'a'/'b' of garbage text or raw ids, any reward and correct flag, malformed task metadata."""
    samples = []
    for _ in range(draw(st.integers(1, 6))):
        if draw(st.booleans()):
            ids = TOK("".join(draw(st.lists(st.sampled_from(GARBAGE_PIECES), max_size=12))),
                      add_special_tokens=False)["input_ids"]
        else:  # raw ids, special tokens and all
            ids = draw(st.lists(st.integers(0, len(TOK) - 1), max_size=12))
        meta = draw(st.sampled_from(GARBAGE_METAS))
        info = {"answer": draw(st.sampled_from([None, "5", "", 23])), **({} if meta is None else {"metadata": meta})}
        samples.append(Sample(draw(st.sampled_from("ab")), "p", [1], ids, "?",
                              reward=draw(st.sampled_from([0.0, 1.0, 0.5, -1.0])), correct=draw(st.booleans()),
                              info=info))
    return GroupBatch.from_samples(samples, tokenizer=TOK)
