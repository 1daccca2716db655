"""Retrievers over a ``Corpus``: BM25 (bm25s), dense (MiniLM + faiss) and a hybrid (reciprocal rank fusion).

Every index is built once per (corpus content hash, parameters) and cached on disk (see ``cache.py``); in-process,
``make_retriever`` also shares one instance between envs on the same corpus. bm25s, faiss and torch are imported only
when an index is built or loaded, never at ``import rlvr_envs``.
"""

from __future__ import annotations

import abc
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlvr_envs.extras import require, require_extra
from rlvr_envs.search.cache import cache_key, cache_root, cached_build
from rlvr_envs.search.corpus import Corpus

RETRIEVERS = ("bm25", "dense", "hybrid")
# What each retriever imports; all of it comes with the [search] extra.
RETRIEVER_MODULES: dict[str, tuple[str, ...]] = {
    "bm25": ("bm25s",),
    "dense": ("faiss", "torch", "transformers"),
    "hybrid": ("bm25s", "faiss", "torch", "transformers"),
}


def require_retriever(kind: str, what: str) -> None:
    """Raise ``MissingExtraError`` naming the [search] extra when ``kind``'s modules are missing (none are imported:
    the index is built at the first search, so this is what makes ``gym.make`` fail early and clearly)."""
    require_extra("search", what, RETRIEVER_MODULES.get(kind, ()), context=f"retriever={kind!r}")


@dataclass(frozen=True)
class Hit:
    index: int  # position in the corpus
    score: float


class Retriever(abc.ABC):
    kind: str = ""

    def __init__(self, corpus: Corpus):
        self.corpus = corpus
        self.cache_path: Path | None = None
        self.built_now = False  # True when this instance built its index (False: loaded from the cache)

    @abc.abstractmethod
    def search_many(self, queries: Sequence[str], k: int) -> list[list[Hit]]: ...

    def search(self, query: str, k: int) -> list[Hit]:
        return self.search_many([query], k)[0]

    def _k(self, k: int) -> int:
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        return min(int(k), len(self.corpus))


class BM25Retriever(Retriever):
    """Okapi BM25 (Lucene variant) from ``bm25s`` over title + text; English stopwords, no stemming."""

    kind = "bm25"

    def __init__(self, corpus: Corpus, *, cache_dir: str | os.PathLike | None = None, k1: float = 1.5,
                 b: float = 0.75):
        super().__init__(corpus)
        bm25s = require("bm25s", "search", "the BM25 retriever")
        self._bm25s = bm25s
        params = {"k1": k1, "b": b, "stopwords": "en", "bm25s": bm25s.__version__}
        folder = cache_root(cache_dir) / "search" / cache_key(self.kind, corpus.content_hash, params)

        def build(tmp: Path) -> None:
            tokens = bm25s.tokenize(corpus.texts(), stopwords="en", show_progress=False)
            model = bm25s.BM25(k1=k1, b=b)
            model.index(tokens, show_progress=False)
            model.save(str(tmp), show_progress=False)

        self.cache_path, self.built_now = cached_build(folder, build)
        self._model = bm25s.BM25.load(str(self.cache_path), show_progress=False, verbosity=0)

    def search_many(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        if not queries:
            return []
        k = self._k(k)
        tokens = self._bm25s.tokenize(list(queries), stopwords="en", return_ids=False, show_progress=False)
        docs, scores = self._model.retrieve(tokens, k=k, show_progress=False, n_threads=1)
        out = []
        for row_d, row_s in zip(docs, scores):
            # A query with no known term scores 0 everywhere: retrieving "something" would be noise, so nothing.
            out.append([Hit(int(d), float(s)) for d, s in zip(row_d, row_s) if s > 0])
        return out


class DenseRetriever(Retriever):
    """MiniLM embeddings in a faiss inner-product index (exact ``Flat`` by default; any faiss factory string works,
    e.g. ``"HNSW32"`` for corpora of 10^6 documents)."""

    kind = "dense"

    def __init__(self, corpus: Corpus, *, cache_dir: str | os.PathLike | None = None, index_factory: str = "Flat",
                 encoder: Any = None, batch_size: int = 64, max_length: int = 256):
        super().__init__(corpus)
        faiss = require("faiss", "search", "the dense retriever")
        self.encoder = encoder or _shared_encoder(batch_size=batch_size, max_length=max_length)
        params = {"encoder": self.encoder.identity, "index": index_factory, "faiss": faiss.__version__}
        folder = cache_root(cache_dir) / "search" / cache_key(self.kind, corpus.content_hash, params)

        def build(tmp: Path) -> None:
            emb = self.encoder.encode(corpus.texts())
            index = faiss.index_factory(emb.shape[1], index_factory, faiss.METRIC_INNER_PRODUCT)
            if not index.is_trained:
                index.train(emb)
            index.add(emb)
            faiss.write_index(index, str(tmp / "index.faiss"))
            (tmp / "meta.json").write_text(json.dumps({"docs": len(corpus), **params}, default=str))

        self.cache_path, self.built_now = cached_build(folder, build)
        self._index = faiss.read_index(str(self.cache_path / "index.faiss"))
        if self._index.ntotal != len(corpus):
            raise RuntimeError(f"{self.cache_path}: index holds {self._index.ntotal} vectors for {len(corpus)} docs; "
                               "delete the folder to rebuild")

    def search_many(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        if not queries:
            return []
        k = self._k(k)
        q = self.encoder.encode(list(queries))
        scores, docs = self._index.search(q, k)
        return [[Hit(int(d), float(s)) for d, s in zip(rd, rs) if d >= 0] for rd, rs in zip(docs, scores)]


class HybridRetriever(Retriever):
    """Reciprocal rank fusion (Cormack et al. 2009) of BM25 and dense rankings: score = sum 1 / (rrf_k + rank)."""

    kind = "hybrid"

    def __init__(self, corpus: Corpus, *, cache_dir: str | os.PathLike | None = None, rrf_k: int = 60,
                 depth: int = 50, **dense_kwargs: Any):
        super().__init__(corpus)
        self.sparse = make_retriever("bm25", corpus, cache_dir=cache_dir)
        self.dense = make_retriever("dense", corpus, cache_dir=cache_dir, **dense_kwargs)
        self.rrf_k = int(rrf_k)
        self.depth = int(depth)

    def search_many(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        if not queries:
            return []
        k = self._k(k)
        depth = max(self.depth, k)
        out = []
        for sparse, dense in zip(self.sparse.search_many(queries, depth), self.dense.search_many(queries, depth)):
            fused: dict[int, float] = {}
            for ranking in (sparse, dense):
                for rank, hit in enumerate(ranking, 1):
                    fused[hit.index] = fused.get(hit.index, 0.0) + 1.0 / (self.rrf_k + rank)
            best = sorted(fused.items(), key=lambda kv: (-kv[1], kv[0]))[:k]
            out.append([Hit(i, s) for i, s in best])
        return out


_ENCODERS: dict[tuple, Any] = {}
_RETRIEVERS: dict[tuple, Retriever] = {}


def _shared_encoder(**kwargs: Any) -> Any:
    from rlvr_envs.search.encoder import MiniLMEncoder

    key = tuple(sorted(kwargs.items()))
    if key not in _ENCODERS:
        _ENCODERS[key] = MiniLMEncoder(**kwargs)
    return _ENCODERS[key]


def clear_shared() -> None:
    """Drop the in-process retriever and encoder instances (benchmarks over many corpora free memory with this)."""
    _RETRIEVERS.clear()
    _ENCODERS.clear()


def make_retriever(kind: str, corpus: Corpus, *, cache_dir: str | os.PathLike | None = None,
                   **kwargs: Any) -> Retriever:
    """A retriever of ``kind`` over ``corpus``, shared in-process between callers with the same arguments."""
    classes = {"bm25": BM25Retriever, "dense": DenseRetriever, "hybrid": HybridRetriever}
    if kind not in classes:
        raise ValueError(f"unknown retriever {kind!r}; known: {RETRIEVERS}")
    key = (kind, corpus.content_hash, str(cache_root(cache_dir)), tuple(sorted(kwargs.items())))
    if key not in _RETRIEVERS:
        _RETRIEVERS[key] = classes[kind](corpus, cache_dir=cache_dir, **kwargs)
    return _RETRIEVERS[key]
