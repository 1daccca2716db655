"""``rlvr/MultiHopSynth-v0``: multi-hop questions over a generated knowledge base of fictional entities.

The knowledge base (seeded) holds people, organizations and cities, each with one document stating its functional
relations (born in, works for, mentor, founded by, headquartered in, mayor, sister city). A question follows a chain
of ``hops`` relations from a start entity, e.g. "What is the name of the mayor of the city where Kamo Velirun was
born?"; answering needs the documents of every entity on the chain but the last (the gold documents, one per hop).
Names are built from syllables by a seeded bijection, so they are unique, unambiguous and cannot be memorized.
Corpus size runs from a few dozen documents to 10^6 (10^5 documents generate in ~5 s, 10^6 in about a
minute on a busy 2-core machine).
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlvr_envs.core import Task, TaskSource
from rlvr_envs.search.corpus import Corpus, Document
from rlvr_envs.search.env import SearchEnv
from rlvr_envs.search.retrievers import require_retriever
from rlvr_envs.splits import check_seed_base

_CONS = ["b", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "th", "sh", "ch", "kr", "dr"]
_VOW = ["a", "e", "i", "o", "u"]
SYLLABLES = [c + v for c in _CONS for v in _VOW]  # 100; every syllable is consonant(s)+one vowel, so decoding is unique
_ENDS = ["n", "r", "s", "th", "x"]
_ORG_KINDS = ["Holdings", "Foundry", "Guild", "Institute", "Works", "Collective", "Labs", "Trading"]
_PROFESSIONS = ["engineer", "painter", "chemist", "architect", "teacher", "pilot", "merchant", "poet", "surgeon", "judge"]
_INDUSTRIES = ["shipping", "textile", "mining", "software", "brewing", "insurance", "publishing", "robotics"]
_REGIONS = ["northern", "southern", "eastern", "western", "central", "coastal", "highland", "river"]

PERSON, ORG, CITY = 0, 1, 2
# relation -> (source type, target type, noun phrase of the target given the source X)
RELATIONS: dict[str, tuple[int, int, str]] = {
    "born_in": (PERSON, CITY, "the city where {x} was born"),
    "works_for": (PERSON, ORG, "the organization that {x} works for"),
    "mentor": (PERSON, PERSON, "the mentor of {x}"),
    "founded_by": (ORG, PERSON, "the founder of {x}"),
    "headquartered_in": (ORG, CITY, "the city where {x} is headquartered"),
    "mayor": (CITY, PERSON, "the mayor of {x}"),
    "sister_city": (CITY, CITY, "the sister city of {x}"),
}
MAX_DOCS = 2_000_000


def _scrambled(count: int, capacity: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` distinct codes in [0, capacity): an affine bijection (a * i + b) mod capacity, a coprime to it."""
    if count > capacity:
        raise ValueError(f"{count} names requested, only {capacity} available")
    while True:
        a = int(rng.integers(capacity // 3, capacity - 1))
        if np.gcd(a, capacity) == 1:
            break
    b = int(rng.integers(capacity))
    return (np.arange(count, dtype=np.int64) * a + b) % capacity


def _word(code: int, n_syll: int, end: int | None) -> str:
    parts = []
    for _ in range(n_syll):
        code, d = divmod(code, 100)
        parts.append(SYLLABLES[d])
    word = "".join(parts) + (_ENDS[end] if end is not None else "")
    return word.capitalize()


@dataclass
class KnowledgeBase:
    names: list[str]
    types: np.ndarray  # int8 per entity
    rel: dict[str, np.ndarray]  # relation -> target entity per entity (-1 where the relation does not apply)
    extra: np.ndarray  # one small attribute index per entity (profession / industry / region)
    year: np.ndarray

    def documents(self) -> list[Document]:
        """One document per entity (plain lists, not numpy scalars, in the loop: several times faster)."""
        n = self.names
        r = {k: v.tolist() for k, v in self.rel.items()}
        types, extra, year = self.types.tolist(), self.extra.tolist(), self.year.tolist()
        docs = []
        for i, name in enumerate(n):
            if types[i] == PERSON:
                text = (f"{name} is a {_PROFESSIONS[extra[i] % len(_PROFESSIONS)]} born in {year[i]} in "
                        f"{n[r['born_in'][i]]}. {name} works for {n[r['works_for'][i]]}. "
                        f"The mentor of {name} is {n[r['mentor'][i]]}.")
            elif types[i] == ORG:
                text = (f"{name} is a {_INDUSTRIES[extra[i] % len(_INDUSTRIES)]} company founded in {year[i]} "
                        f"by {n[r['founded_by'][i]]}. {name} is headquartered in {n[r['headquartered_in'][i]]}.")
            else:
                text = (f"{name} is a city in the {_REGIONS[extra[i] % len(_REGIONS)]} province. The mayor of {name} "
                        f"is {n[r['mayor'][i]]}. The sister city of {name} is {n[r['sister_city'][i]]}.")
            docs.append(Document(id=f"e{i}", title=name, text=text))
        return docs


def build_kb(num_docs: int, seed: int = 0) -> KnowledgeBase:
    """Half people, a quarter organizations, a quarter cities; every relation target drawn uniformly (seeded)."""
    if not 12 <= num_docs <= MAX_DOCS:
        raise ValueError(f"corpus_size must be in [12, {MAX_DOCS}], got {num_docs}")
    rng = np.random.default_rng([seed, 0])
    n_org = n_city = num_docs // 4
    n_person = num_docs - n_org - n_city
    start = {PERSON: 0, ORG: n_person, CITY: n_person + n_org}
    count = {PERSON: n_person, ORG: n_org, CITY: n_city}
    types = np.repeat(np.array([PERSON, ORG, CITY], dtype=np.int8), [n_person, n_org, n_city])

    names: list[str] = []
    for code in _scrambled(n_person, 100**2 * 100**3 * len(_ENDS), rng).tolist():
        first, last = divmod(code, 100**3 * len(_ENDS))
        last_syll, end = divmod(last, len(_ENDS))
        names.append(f"{_word(first, 2, None)} {_word(last_syll, 3, end)}")
    for code in _scrambled(n_org, 100**3 * len(_ENDS) * len(_ORG_KINDS), rng).tolist():
        rest, kind = divmod(code, len(_ORG_KINDS))
        syll, end = divmod(rest, len(_ENDS))
        names.append(f"{_word(syll, 3, end)} {_ORG_KINDS[kind]}")
    for code in _scrambled(n_city, 100**3 * len(_ENDS), rng).tolist():
        syll, end = divmod(code, len(_ENDS))
        names.append(_word(syll, 3, end))

    rel: dict[str, np.ndarray] = {}
    for name, (src, dst, _) in RELATIONS.items():
        target = np.full(num_docs, -1, dtype=np.int64)
        lo, n = start[src], count[src]
        if src == dst:  # never oneself: an offset in [1, n) from one's own position
            own = np.arange(n, dtype=np.int64)
            target[lo : lo + n] = start[dst] + (own + rng.integers(1, n, size=n)) % n
        else:
            target[lo : lo + n] = start[dst] + rng.integers(0, count[dst], size=n)
        rel[name] = target
    extra = rng.integers(0, 1 << 16, size=num_docs)
    year = rng.integers(1820, 2010, size=num_docs)
    return KnowledgeBase(names=names, types=types, rel=rel, extra=extra, year=year)


@functools.lru_cache(maxsize=4)
def synth_corpus(num_docs: int, seed: int = 0) -> tuple[KnowledgeBase, Corpus]:
    kb = build_kb(num_docs, seed)
    return kb, Corpus(kb.documents(), name=f"multihopsynth-s{seed}-n{num_docs}")


class MultiHopSource(TaskSource):
    """Question ``i`` is drawn from its own seeded stream: any index is generated directly, in any order."""

    _ID = re.compile(r"^mhs-s(-?\d+)-n(\d+)-h(\d+)(?:-b\d+)?-(\d+)$")

    def __init__(self, kb: KnowledgeBase, corpus: Corpus, *, hops: int, seed: int, num_tasks: int,
                 seed_base: int = 0):
        if not 1 <= hops <= 10:
            raise ValueError(f"hops must be in [1, 10], got {hops}")
        if num_tasks < 1:
            raise ValueError("num_tasks must be >= 1")
        self.kb, self.corpus, self.hops, self.seed, self.num_tasks = kb, corpus, int(hops), int(seed), int(num_tasks)
        # seed_base: another stream of questions over the same knowledge base (rlvr_envs.splits); its ids carry
        # "-b<seed_base>" so the two streams' ids never name each other's questions. 0 keeps the original ids.
        self.seed_base = check_seed_base(seed_base)
        self._split = f"-b{self.seed_base}" if self.seed_base else ""
        self.name = f"multihopsynth-s{seed}-n{len(corpus)}-h{hops}{self._split}"
        self._by_type = {t: [r for r, (s, _, _) in RELATIONS.items() if s == t] for t in (PERSON, ORG, CITY)}

    def __len__(self) -> int:
        return self.num_tasks

    def _task_id(self, index: int) -> str:
        return f"mhs-s{self.seed}-n{len(self.corpus)}-h{self.hops}{self._split}-{index}"

    def index_of(self, task_id: str) -> int:
        m = self._ID.match(task_id)
        if m is None or task_id != self._task_id(int(m.group(4))) or int(m.group(4)) >= self.num_tasks:
            raise KeyError(f"{self.name}: unknown task id {task_id!r}")
        return int(m.group(4))

    def chain(self, index: int) -> tuple[list[int], list[str]]:
        """(entities e0..e_hops, relations r1..r_hops) of question ``index``; entities along a chain are distinct."""
        rng = np.random.default_rng([self.seed, 1, index] + ([self.seed_base] if self.seed_base else []))
        n = len(self.corpus)
        for _ in range(1000):
            entities = [int(rng.integers(n))]
            relations: list[str] = []
            for _hop in range(self.hops):
                options = self._by_type[int(self.kb.types[entities[-1]])]
                r = options[int(rng.integers(len(options)))]
                relations.append(r)
                entities.append(int(self.kb.rel[r][entities[-1]]))
            if len(set(entities)) == len(entities):
                return entities, relations
        raise RuntimeError(f"{self.name}: no {self.hops}-hop chain without repeats; use a larger corpus_size")

    def task(self, index: int) -> Task:
        if not 0 <= index < self.num_tasks:
            raise IndexError(f"{self.name}: index {index} out of range [0, {self.num_tasks})")
        entities, relations = self.chain(index)
        phrase = self.kb.names[entities[0]]
        for r in relations:
            phrase = RELATIONS[r][2].format(x=phrase)
        question = f"What is the name of {phrase}?"
        gold_titles = tuple(self.kb.names[e] for e in entities[:-1])
        return Task(id=self._task_id(index), question=question, answer=self.kb.names[entities[-1]],
                    metadata={"gold_titles": gold_titles, "relations": tuple(relations),
                              "entities": tuple(entities), "hops": self.hops})

    @property
    def fingerprint(self) -> str:
        h = hashlib.sha256(f"{self.name}|tasks={self.num_tasks}|".encode())
        h.update(self.corpus.content_hash.encode())
        return h.hexdigest()


def make_env(*, corpus_size: int = 1000, hops: int = 2, seed: int = 0, num_tasks: int = 1000, seed_base: int = 0,
             **env_kwargs: Any) -> SearchEnv:
    """``seed`` fixes the knowledge base and the questions, ``seed_base`` draws another stream of questions over the
    same knowledge base (the trainer's held-out split); ``reset(seed=)`` only picks among the questions."""
    retriever = env_kwargs.get("retriever", "bm25")
    if isinstance(retriever, str):  # the index is built at the first search; fail at make time instead
        require_retriever(retriever, "rlvr/MultiHopSynth-v0")
    kb, corpus = synth_corpus(int(corpus_size), int(seed))
    source = MultiHopSource(kb, corpus, hops=hops, seed=seed, num_tasks=num_tasks, seed_base=seed_base)
    env_kwargs.setdefault("max_turns", hops + 2)
    env_kwargs.setdefault("max_searches", hops + 1)
    return SearchEnv(source, corpus, **env_kwargs)
