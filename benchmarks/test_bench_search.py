"""Search benchmarks: HotpotQA-100 recall@5 (BM25 / dense / hybrid), per-hop oracle-query retrievability on
MultiHopSynth, and index build time + queries/s for BM25 and dense at 10^3, 10^4, 10^5 documents in one run.

Dense encoding is the slow part on a few CPU cores. ``RLVR_BENCH_DENSE_BUDGET_S`` (default 240) bounds the time spent
on full dense builds in the scaling table; a size whose projected encoding time does not fit is reported as
*projected* (measured docs/s x size) with the faiss part measured on that many vectors, and says so in its row.
The HotpotQA dense index lives in the normal cache (``RLVR_CACHE_DIR`` or ``~/.cache/rlvr_envs``): built once.
Queries/s must reach ``QPS_FLOOR`` (about a tenth of what one run measured on the shared 2-core machine).
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from rlvr_envs.search.retrievers import clear_shared, make_retriever
from rlvr_envs.search.synth import MultiHopSource, synth_corpus

pytestmark = pytest.mark.slow
K = 5
# Queries/s floors per (retriever, docs). Measured on the 2-core machine under load ~4.5 (other jobs):
# bm25 10379 / 1339 / 134, dense 158 / 156 / 64 at 10^3 / 10^4 / 10^5 docs. The floors are ~10x below that
# (the cores are shared), and still far above what rebuilding or re-encoding the index per query would give.
QPS_FLOOR = {("bm25", 1_000): 1000, ("bm25", 10_000): 100, ("bm25", 100_000): 10,
             ("dense", 1_000): 15, ("dense", 10_000): 15, ("dense", 100_000): 5}


def recall_at(retriever, corpus, queries, gold_titles, k):
    hits = retriever.search_many(queries, k)
    per_q, all_found = [], []
    for h, gold in zip(hits, gold_titles):
        got = {corpus[x.index].title for x in h}
        found = [t in got for t in gold]
        per_q.append(sum(found) / len(gold))
        all_found.append(all(found))
    return float(np.mean(per_q)), float(np.mean(all_found))


@pytest.mark.skipif(not os.environ.get("RLVR_DATA_DIR"), reason="needs RLVR_DATA_DIR (multihop/)")
def test_hotpotqa_recall_at_5():
    from rlvr_envs.search.hotpotqa import load_hotpotqa

    source, corpus = load_hotpotqa()
    tasks = [source.task(i) for i in range(len(source))]
    queries = [t.question for t in tasks]
    gold = [t.metadata["gold_titles"] for t in tasks]
    rows = []
    for kind in ("bm25", "dense", "hybrid"):
        start = time.perf_counter()
        r = make_retriever(kind, corpus)
        ready = time.perf_counter() - start
        start = time.perf_counter()
        rec, both = recall_at(r, corpus, queries, gold, K)
        rows.append((kind, rec, both, ready, r.built_now, len(queries) / (time.perf_counter() - start)))
    print(f"\nHotpotQA dev-100 over its 1000 paragraphs; query = the question; k = {K}")
    print("| retriever | recall@5 (supporting paragraphs) | both supporting in top 5 | index ready (s) | q/s |")
    print("|---|---|---|---|---|")
    for kind, rec, both, ready, built, qps in rows:
        how = "built" if built else "cache"
        print(f"| {kind} | {rec:.3f} | {both:.2f} | {ready:.1f} ({how}) | {qps:.1f} |")
    for _, rec, *_ in rows:
        assert rec > 0.3  # a random top-5 of 1000 would get 0.005


def test_synth_each_hop_retrievable_by_oracle_query(tmp_path):
    print("\nMultiHopSynth, BM25, oracle query = the hop's entity name; share of hops whose gold doc is ranked ...")
    print("| docs | hops | questions | rank 1 | top 5 |\n|---|---|---|---|---|")
    for n_docs, hops in ((1_000, 2), (10_000, 3), (100_000, 4)):
        kb, corpus = synth_corpus(n_docs, 0)
        source = MultiHopSource(kb, corpus, hops=hops, seed=0, num_tasks=200)
        titles = [t for i in range(len(source)) for t in source.task(i).metadata["gold_titles"]]
        r = make_retriever("bm25", corpus, cache_dir=tmp_path)
        ranked = [[corpus[h.index].title for h in hs] for hs in r.search_many(titles, K)]
        at1 = np.mean([hs[:1] == [t] for hs, t in zip(ranked, titles)])
        at5 = np.mean([t in hs for hs, t in zip(ranked, titles)])
        print(f"| {n_docs:,} | {hops} | {len(source)} | {at1:.3f} | {at5:.3f} |")
        assert at5 == 1.0
        clear_shared()


def _time_queries(retriever, queries, batch=100):
    start = time.perf_counter()
    for i in range(0, len(queries), batch):
        retriever.search_many(queries[i : i + batch], K)
    return len(queries) / (time.perf_counter() - start)


def test_index_build_and_query_throughput(tmp_path):
    import faiss

    budget = float(os.environ.get("RLVR_BENCH_DENSE_BUDGET_S", "240"))
    rows, dense_rate = [], None
    for n_docs in (1_000, 10_000, 100_000):
        kb, corpus = synth_corpus(n_docs, 0)
        source = MultiHopSource(kb, corpus, hops=2, seed=0, num_tasks=100)
        queries = [source.task(i).question for i in range(len(source))]

        start = time.perf_counter()
        bm25 = make_retriever("bm25", corpus, cache_dir=tmp_path)
        build = time.perf_counter() - start
        clear_shared()
        start = time.perf_counter()
        bm25 = make_retriever("bm25", corpus, cache_dir=tmp_path)
        load = time.perf_counter() - start
        rows.append(("bm25", n_docs, f"{build:.1f}", f"{load:.2f}", _time_queries(bm25, queries), "measured"))

        projected = n_docs / dense_rate if dense_rate else 0.0
        if projected <= budget:
            start = time.perf_counter()
            dense = make_retriever("dense", corpus, cache_dir=tmp_path)
            build = time.perf_counter() - start
            dense_rate = dense_rate or n_docs / build
            encoder = dense.encoder
            clear_shared()
            start = time.perf_counter()
            dense = make_retriever("dense", corpus, cache_dir=tmp_path, encoder=encoder)
            load = time.perf_counter() - start
            rows.append(("dense", n_docs, f"{build:.1f}", f"{load:.2f}", _time_queries(dense, queries), "measured"))
            budget -= build
        else:
            # Encoding projected from the measured rate; the faiss part (add + search) measured on n_docs vectors
            # (real embeddings of the first 1000 docs, tiled: a flat search costs the same whatever the vectors).
            sample = make_retriever("dense", synth_corpus(1_000, 0)[1], cache_dir=tmp_path)
            vecs = sample._index.reconstruct_n(0, sample._index.ntotal)
            tiled = np.ascontiguousarray(np.resize(vecs, (n_docs, vecs.shape[1])))
            start = time.perf_counter()
            index = faiss.IndexFlatIP(tiled.shape[1])
            index.add(tiled)
            faiss_build = time.perf_counter() - start
            q = sample.encoder.encode(queries)
            start = time.perf_counter()
            index.search(q, K)
            search_s = time.perf_counter() - start
            start = time.perf_counter()
            sample.encoder.encode(queries)
            encode_s = time.perf_counter() - start
            qps = len(queries) / (search_s + encode_s)
            rows.append(("dense", n_docs, f"~{projected + faiss_build:.0f} (projected)", "-", qps,
                         f"projected: encode at {dense_rate:.0f} docs/s; faiss measured"))
    clear_shared()
    print(f"\nMultiHopSynth corpora (hops=2), 100 queries in batches of 100, k={K}, {os.cpu_count()} CPU cores, "
          f"torch threads={__import__('torch').get_num_threads()}")
    print("| retriever | docs | index build (s) | cache load (s) | queries/s | note |\n|---|---|---|---|---|---|")
    for kind, n, build, load, qps, note in sorted(rows, key=lambda r: (r[1], r[0])):
        print(f"| {kind} | {n:,} | {build} | {load} | {qps:,.1f} | {note} |")
    slow = [f"{kind} at {n:,} docs: {qps:.1f} q/s < {QPS_FLOOR[kind, n]}" for kind, n, _, _, qps, _ in rows
            if qps < QPS_FLOOR[kind, n]]
    assert not slow, slow
