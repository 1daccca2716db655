"""Agentic-search environments: pinned corpora, BM25 / dense / hybrid retrievers with cached indexes, multi-hop QA.

Light to import: bm25s, faiss and torch load only when an index is built or searched.
"""

from rlvr_envs.search.corpus import Corpus, Document
from rlvr_envs.search.env import OracleAgent, SearchEnv, run_episode, run_episodes
from rlvr_envs.search.retrievers import RETRIEVERS, make_retriever

__all__ = ["RETRIEVERS", "Corpus", "Document", "OracleAgent", "SearchEnv", "make_retriever", "run_episode",
           "run_episodes"]
