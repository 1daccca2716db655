"""Corpus hashing, BM25 / dense / hybrid retrieval on small corpora, on-disk caches keyed by content, lazy imports."""

import json
import subprocess
import sys

import pytest

from rlvr_envs.search import Corpus, Document, make_retriever
from rlvr_envs.search.cache import cache_root
from rlvr_envs.search.retrievers import clear_shared

DOCS = [
    ("Photosynthesis", "Plants convert sunlight, water and carbon dioxide into glucose and oxygen."),
    ("Volcano", "A rupture in the crust of a planet through which lava, ash and gases escape."),
    ("Piano", "A keyboard instrument whose strings are struck by felt hammers."),
    ("Football", "A team sport played with a ball between two teams of eleven players."),
    ("Jupiter", "The largest planet in the Solar System, a gas giant with a great red storm."),
    ("Espresso", "Coffee brewed by forcing hot water through finely ground beans under pressure."),
    ("Glacier", "A persistent body of dense ice that moves slowly under its own weight."),
    ("Violin", "A wooden string instrument played with a bow, the smallest of its family."),
    ("Bread", "A staple food baked from a dough of flour and water, usually leavened with yeast."),
    ("Submarine", "A watercraft that operates independently underwater."),
    ("Earthquake", "Shaking of the surface of the Earth caused by a sudden release of energy in the lithosphere."),
    ("Honeybee", "A flying insect that collects nectar and makes honey in colonies."),
]


@pytest.fixture()
def corpus():
    return Corpus(Document(str(i), t, x) for i, (t, x) in enumerate(DOCS))


@pytest.fixture(autouse=True)
def _fresh_instances():
    clear_shared()
    yield
    clear_shared()


def titles(corpus, hits):
    return [corpus[h.index].title for h in hits]


def test_corpus_hash_is_content_and_order_sensitive(corpus, tmp_path):
    path = tmp_path / "c.jsonl"
    corpus.to_jsonl(path)
    assert Corpus.from_jsonl(path).content_hash == corpus.content_hash
    edited = list(corpus)
    edited[3] = Document("3", "Football", "A team sport.")
    assert Corpus(edited).content_hash != corpus.content_hash
    assert Corpus(reversed(list(corpus))).content_hash != corpus.content_hash
    assert corpus.index_of_title("Violin") == 7
    with pytest.raises(KeyError):
        corpus.index_of_title("Cello")
    path.write_text('{"id": 1, "title": "x"}\n')
    with pytest.raises(ValueError, match="text"):
        Corpus.from_jsonl(path)
    with pytest.raises(ValueError, match="empty"):
        Corpus([])


def test_bm25_ranks_the_matching_document_first_and_caches_by_hash(corpus, tmp_path):
    r = make_retriever("bm25", corpus, cache_dir=tmp_path)
    assert r.built_now and r.cache_path.parent.parent == tmp_path
    assert titles(corpus, r.search("lava and ash from the crust", 3))[0] == "Volcano"
    assert titles(corpus, r.search("Espresso", 1)) == ["Espresso"]
    assert r.search("zzzz qqqq", 3) == []  # no known term: nothing rather than noise
    many = r.search_many(["keyboard hammers", "honey nectar"], 2)
    assert [titles(corpus, h)[0] for h in many] == ["Piano", "Honeybee"]
    assert len(r.search("planet", 100)) <= len(corpus)
    with pytest.raises(ValueError):
        r.search("planet", 0)

    clear_shared()
    again = make_retriever("bm25", corpus, cache_dir=tmp_path)
    assert not again.built_now and again.cache_path == r.cache_path  # loaded from disk
    assert titles(corpus, again.search("lava and ash from the crust", 3)) == titles(corpus, r.search(
        "lava and ash from the crust", 3))
    edited = Corpus([*list(corpus)[:-1], Document("11", "Honeybee", "A bee.")])
    other = make_retriever("bm25", edited, cache_dir=tmp_path)
    assert other.built_now and other.cache_path != r.cache_path


def test_env_var_sets_the_default_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("RLVR_CACHE_DIR", str(tmp_path / "c"))
    assert cache_root() == tmp_path / "c"
    assert cache_root("/x/y") == __import__("pathlib").Path("/x/y")
    monkeypatch.delenv("RLVR_CACHE_DIR")
    assert cache_root().parts[-2:] == (".cache", "rlvr_envs")


def test_dense_and_hybrid_retrieve_by_meaning(corpus, tmp_path):
    dense = make_retriever("dense", corpus, cache_dir=tmp_path)
    # No shared content words with the target passages: only the embedding can find them.
    assert titles(corpus, dense.search("a drink made from roasted beans", 1)) == ["Espresso"]
    assert titles(corpus, dense.search("tremor of the ground", 2))[0] == "Earthquake"
    hits = dense.search("musical instrument", 3)
    assert {"Piano", "Violin"} <= set(titles(corpus, hits))
    assert all(-1.0 <= h.score <= 1.0 + 1e-5 for h in hits)
    hybrid = make_retriever("hybrid", corpus, cache_dir=tmp_path)
    assert titles(corpus, hybrid.search("frozen ice moving slowly", 1)) == ["Glacier"]
    assert titles(corpus, hybrid.search("a drink made from roasted beans", 1)) == ["Espresso"]
    clear_shared()
    cached = make_retriever("dense", corpus, cache_dir=tmp_path)
    assert not cached.built_now
    meta = json.loads((cached.cache_path / "meta.json").read_text())
    assert meta["docs"] == len(corpus) and meta["index"] == "Flat"
    # An approximate faiss index (for 10^6-doc corpora) is another cache entry with the same answers here.
    hnsw = make_retriever("dense", corpus, cache_dir=tmp_path, index_factory="HNSW8")
    assert hnsw.built_now and hnsw.cache_path != cached.cache_path
    assert titles(corpus, hnsw.search("a drink made from roasted beans", 1)) == ["Espresso"]


def test_unknown_retriever_is_a_clear_error(corpus):
    with pytest.raises(ValueError, match="unknown retriever"):
        make_retriever("tfidf", corpus)


def test_importing_the_package_loads_no_heavy_library():
    code = ("import sys, rlvr_envs, rlvr_envs.search, rlvr_envs.search.synth, rlvr_envs.search.hotpotqa; "
            "print([m for m in ('torch', 'faiss', 'bm25s', 'transformers') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
