"""A pinned document collection: JSON lines of ``{id, title, text}``; its content hash is part of an env's identity.

Indexes are cached on disk under a key that starts with this hash, so editing one paragraph rebuilds them.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Document:
    id: str
    title: str
    text: str

    def indexed_text(self) -> str:
        """What retrievers see: the title is part of the passage (as in DPR / Search-R1 corpora)."""
        return f"{self.title}\n{self.text}" if self.title else self.text


class Corpus(Sequence[Document]):
    """An ordered, immutable list of documents with title lookup and a content hash."""

    def __init__(self, docs: Iterable[Document], name: str = "corpus"):
        self._docs = list(docs)
        self.name = name
        if not self._docs:
            raise ValueError(f"{name}: empty corpus")
        self._by_title: dict[str, int] | None = None
        self._hash: str | None = None

    # -- construction ----------------------------------------------------------------------------------------------
    @classmethod
    def from_rows(cls, rows: Iterable[dict], name: str = "corpus") -> Corpus:
        docs = []
        for n, row in enumerate(rows):
            if not isinstance(row, dict) or "text" not in row:
                raise ValueError(f"{name}: row {n} needs at least a 'text' field (got {str(row)[:80]!r})")
            docs.append(Document(id=str(row.get("id", n)), title=str(row.get("title", "")), text=str(row["text"])))
        return cls(docs, name=name)

    @classmethod
    def from_jsonl(cls, path: str | os.PathLike, name: str | None = None) -> Corpus:
        path = Path(path)
        rows = []
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as exc:
                        raise ValueError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
        return cls.from_rows(rows, name=name or path.stem)

    def to_jsonl(self, path: str | os.PathLike) -> None:
        with open(path, "w", encoding="utf-8") as f:
            for d in self._docs:
                f.write(json.dumps({"id": d.id, "title": d.title, "text": d.text}, ensure_ascii=False) + "\n")

    # -- sequence protocol -----------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._docs)

    def __getitem__(self, i):  # type: ignore[override]
        return self._docs[i]

    def texts(self) -> list[str]:
        return [d.indexed_text() for d in self._docs]

    def index_of_title(self, title: str) -> int:
        """Index of the first document with this exact title (KeyError if none)."""
        if self._by_title is None:
            self._by_title = {}
            for i, d in enumerate(self._docs):
                self._by_title.setdefault(d.title, i)
        try:
            return self._by_title[title]
        except KeyError:
            raise KeyError(f"{self.name}: no document titled {title!r}") from None

    @property
    def content_hash(self) -> str:
        """sha256 over (id, title, text) of every document, in order (length-prefixed fields: unambiguous)."""
        if self._hash is None:
            h = hashlib.sha256()
            for start in range(0, len(self._docs), 4096):  # one update per chunk: 10^6 docs hash in about a second
                h.update("".join(f"{len(d.id)}:{d.id}{len(d.title)}:{d.title}{len(d.text)}:{d.text}"
                                 for d in self._docs[start : start + 4096]).encode())
            self._hash = h.hexdigest()
        return self._hash
