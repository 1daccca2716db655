"""``rlvr/HotpotQA-v0``: 100 HotpotQA dev (distractor) questions over their 1,000 unique context paragraphs.

Files (JSON lines) under ``RLVR_DATA_DIR`` or ``data_dir=``: ``multihop/hotpotqa_dev_distractor_100.jsonl`` (``_id``,
``question``, ``answer``, ``type``, ``level``, ``supporting_facts``) and ``multihop/hotpotqa_corpus_1000.jsonl``
(``id``, ``title``, ``text``). A user's own questions / corpus: ``questions_path=`` / ``corpus_path=`` (same schemas;
questions may give ``gold_titles`` instead of ``supporting_facts``).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from rlvr_envs.core import ListSource, Task
from rlvr_envs.data import load_rows, read_jsonl
from rlvr_envs.search.corpus import Corpus
from rlvr_envs.search.env import SearchEnv
from rlvr_envs.search.retrievers import require_retriever
from rlvr_envs.splits import check_seed_base, seeded_source

QUESTIONS = "multihop/hotpotqa_dev_distractor_100.jsonl"
CORPUS = "multihop/hotpotqa_corpus_1000.jsonl"


def _gold_titles(row: dict[str, Any]) -> list[str]:
    if "gold_titles" in row:
        return [str(t) for t in row["gold_titles"]]
    titles: list[str] = []
    for fact in row.get("supporting_facts", []):
        if fact[0] not in titles:
            titles.append(str(fact[0]))
    return titles


def load_hotpotqa(*, data_dir: str | os.PathLike | None = None, questions_path: str | os.PathLike | None = None,
                  corpus_path: str | os.PathLike | None = None) -> tuple[ListSource, Corpus]:
    """(question source, corpus); the source's fingerprint covers both files' contents."""
    if corpus_path is not None:
        corpus = Corpus.from_jsonl(corpus_path)
    else:
        rows, _, origin = load_rows(CORPUS, data_dir=data_dir)
        corpus = Corpus.from_rows(rows, name=os.path.basename(origin))
    if questions_path is not None:
        qrows = read_jsonl(Path(questions_path))
    else:
        qrows, _, _ = load_rows(QUESTIONS, data_dir=data_dir)
    tasks = []
    for n, row in enumerate(qrows):
        try:
            question, answer = str(row["question"]), str(row["answer"])
        except KeyError as exc:
            raise ValueError(f"question row {n} lacks {exc}") from None
        titles = _gold_titles(row)
        missing = [t for t in titles if not _has_title(corpus, t)]
        if missing:
            raise ValueError(f"question {row.get('_id', n)}: supporting titles {missing} are not in the corpus")
        tasks.append(Task(id=str(row.get("_id", row.get("id", n))), question=question, answer=answer,
                          metadata={"gold_titles": tuple(titles), "type": row.get("type"), "level": row.get("level"),
                                    "aliases": tuple(row.get("aliases", ()))}))
    h = hashlib.sha256()
    for t in tasks:
        h.update(f"{t.id}\x1f{t.question}\x1f{t.answer}\x1e".encode())
    h.update(corpus.content_hash.encode())
    return ListSource(tasks, name="hotpotqa", fingerprint=h.hexdigest()), corpus


def _has_title(corpus: Corpus, title: str) -> bool:
    try:
        corpus.index_of_title(title)
        return True
    except KeyError:
        return False


def make_env(*, data_dir: str | os.PathLike | None = None, questions_path: str | os.PathLike | None = None,
             corpus_path: str | os.PathLike | None = None, seed_base: int = 0, **env_kwargs: Any) -> SearchEnv:
    """``seed_base``: a fixed set has no other stream, so another value is the same questions in a seeded order
    (``rlvr_envs.splits``)."""
    retriever = env_kwargs.get("retriever", "bm25")
    if isinstance(retriever, str):  # before loading data: a missing [search] extra should be the error seen
        require_retriever(retriever, "rlvr/HotpotQA-v0")
    check_seed_base(seed_base)  # before loading data
    source, corpus = load_hotpotqa(data_dir=data_dir, questions_path=questions_path, corpus_path=corpus_path)
    if seed_base:
        source = seeded_source([source.task(i) for i in range(len(source))], source.name, source.fingerprint,
                               seed_base)
    env_kwargs.setdefault("max_turns", 4)
    return SearchEnv(source, corpus, **env_kwargs)

