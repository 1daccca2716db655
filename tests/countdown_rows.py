"""Hand-written Countdown search-trace batches for the step-credit tests (DASH, GraphPO): each response is a list of
pieces whose tokens are known, so a golden per-token advantage can be written piece by piece."""

from __future__ import annotations

import torch

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
