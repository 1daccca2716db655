"""Bridge to reasoning-gym: ``rlvr/ReasoningGym-v0`` (``task=``) and one ``rlvr/rg-<name>-v0`` per generator.

Scoring uses each generator's own ``score_answer`` on the extracted, whitespace-normalised answer, with two guards:
- reward is 1 only for a full score; reasoning-gym's partial credit (e.g. 0.1 for a near-miss format, substring
  credit) is hackable and is not passed on;
- a few scorers call Python's ``eval`` on the model's text to try alternative formats, and one
  (``game_of_life_halting``) compares ``bool(answer)``, so any non-empty text scores 1. For those generators we never
  call ``score_answer``: we check an exact (case-insensitive) match with the oracle answer ourselves.
  ``tests/test_tasks_reasoning_gym.py`` re-scans the installed reasoning-gym so a new release cannot add one silently.

Some generators have no single oracle answer (the scorer checks validity, e.g. ``graph_color``); their reference
answer is the example solution in the entry's metadata, and ``boxnet``/``rush_hour`` have none at all, so their
``gold_response`` raises ``NotImplementedError`` (the gold-vs-random sweep reports them as such).

Reproducibility: task ``i`` depends only on ``(seed, i)`` within a process, but a few generators (e.g.
``polynomial_multiplication``) iterate over sets and so also depend on Python's hash seed: set ``PYTHONHASHSEED`` to
get identical tasks across processes.

Importing reasoning-gym takes seconds, so the generator names are a static table checked against the library in tests.
"""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Mapping
from typing import Any

from rlvr_envs.core import Task, TaskSource, TextEnv, Verdict
from rlvr_envs.extract import extract_answer
from rlvr_envs.registration import EnvEntry

# reasoning-gym 0.1.25 generator names (tests check this against reasoning_gym.factory.DATASETS).
RG_TASKS: tuple[str, ...] = (
    "ab", "acre", "advanced_geometry", "aiw", "arc_1d", "arc_agi", "base_conversion", "basic_arithmetic", "bf",
    "binary_alternation", "binary_matrix", "bitwise_arithmetic", "boxnet", "caesar_cipher", "calendar_arithmetic",
    "chain_sum", "circuit_logic", "codeio", "coin_flip", "color_cube_rotation", "complex_arithmetic", "composite",
    "count_bits", "count_primes", "countdown", "course_schedule", "cryptarithm", "decimal_arithmetic",
    "decimal_chain_sum", "dice", "emoji_mystery", "family_relationships", "figlet_font", "fraction_simplification",
    "futoshiki", "game_of_life", "game_of_life_halting", "gcd", "graph_color", "group_anagrams", "gsm_symbolic",
    "intermediate_integration", "isomorphic_strings", "jugs", "kakurasu", "knight_swap", "knights_knaves",
    "largest_island", "lcm", "leg_counting", "letter_counting", "letter_jumble", "list_functions", "mahjong_puzzle",
    "manipulate_matrix", "maze", "mini_sudoku", "modulo_grid", "n_queens", "needle_haystack", "number_filtering",
    "number_format", "number_sequence", "number_sorting", "palindrome_generation", "palindrome_partitioning",
    "path_star", "polynomial_equations", "polynomial_multiplication", "pool_matrix", "power_function",
    "prime_factorization", "products", "propositional_logic", "puzzle24", "quantum_lock", "ransom_note", "rearc",
    "rectangle_count", "rotate_matrix", "rotten_oranges", "rubiks_cube", "rush_hour", "self_reference",
    "sentence_reordering", "shortest_path", "simple_equations", "simple_geometry", "simple_integration", "sokoban",
    "spell_backward", "spiral_matrix", "string_insertion", "string_manipulation", "string_splitting",
    "string_synthesis", "sudoku", "survo", "syllogism", "time_intervals", "tower_of_hanoi", "tsumego", "word_ladder",
    "word_sequence_reversal", "word_sorting", "zebra_puzzles",
)

# Generators whose score_answer evals model text (or is trivially hackable): exact matches only.
EXACT_MATCH_ONLY = frozenset({"binary_matrix", "n_queens", "spiral_matrix", "string_insertion", "game_of_life_halting"})
# Where a generator's entry has no "answer", the example solution it keeps in metadata (if any).
_EXAMPLE_ANSWER_KEYS = ("possible_answer", "example_answer", "example_correct_answer")
# `composite` needs a mixture; its registered default mixes three easy generators.
COMPOSITE_DEFAULT = {"datasets": [{"name": n, "weight": 1.0, "config": {}}
                                  for n in ("basic_arithmetic", "leg_counting", "word_sorting")]}

_GLOBAL_RANDOM_LOCK = threading.Lock()
MAX_ANSWER_CHARS = 20_000
DEFAULT_TIMEOUT = 5.0
WARM_UP_TIMEOUT = 60.0
DEFAULT_SIZE = 100_000
SYSTEM_PROMPT = (
    "Think step by step, then give your final answer inside <answer></answer> tags, exactly in the format the "
    "question asks for."
)


class ReasoningGymSource(TaskSource):
    """Tasks ``0..size-1`` of one reasoning-gym generator; entry ``i`` depends only on ``(seed, i)``."""

    def __init__(self, task: str, *, size: int = DEFAULT_SIZE, seed: int = 0, config: Mapping[str, Any] | None = None):
        if task not in RG_TASKS:
            raise ValueError(f"unknown reasoning-gym task {task!r}; see rlvr_envs.tasks.reasoning_gym.RG_TASKS")
        import reasoning_gym

        self.task_name = task
        self.name = f"reasoning_gym/{task}"
        self._config = dict(config or (COMPOSITE_DEFAULT if task == "composite" else {}))
        self._seed = int(seed)
        kwargs = dict(self._config)
        if task == "composite":
            from reasoning_gym.composite import DatasetSpec

            kwargs["datasets"] = [d if isinstance(d, DatasetSpec) else DatasetSpec(**d) for d in kwargs["datasets"]]
        self._dataset = reasoning_gym.create_dataset(task, size=int(size), seed=self._seed, **kwargs)
        self._size = int(size)

    def __len__(self) -> int:
        return self._size

    def task(self, index: int) -> Task:
        if not 0 <= index < self._size:
            raise IndexError(f"{self.name}: index {index} out of range [0, {self._size})")
        with _GLOBAL_RANDOM_LOCK:
            # Some generators draw from the global `random` module besides their own seeded Random: seed it per task
            # and restore it, so task i is the same on every call and the caller's random state is untouched.
            saved = random.getstate()
            random.seed(f"{self._seed}:{index}")
            try:
                entry = self._dataset[index]
            finally:
                random.setstate(saved)
        meta = entry.get("metadata", {})
        answer = entry["answer"]
        if answer is None:
            answer = next((meta[k] for k in _EXAMPLE_ANSWER_KEYS if meta.get(k) is not None), None)
        return Task(
            id=f"rg-{self.task_name}-{index}",
            question=entry["question"],
            answer="" if answer is None else answer if isinstance(answer, str) else json.dumps(answer),
            metadata={"entry": entry, "source_dataset": meta.get("source_dataset", self.task_name),
                      "has_reference": answer is not None},
        )

    def index_of(self, task_id: str) -> int:
        prefix = f"rg-{self.task_name}-"
        if task_id.startswith(prefix) and task_id[len(prefix):].isdigit():
            index = int(task_id[len(prefix):])
            if index < self._size:
                return index
        raise KeyError(f"{self.name}: unknown task id {task_id!r}")

    @property
    def fingerprint(self) -> str:
        import hashlib

        import reasoning_gym

        key = json.dumps([self.task_name, self._seed, self._size, self._config, reasoning_gym.__version__],
                         sort_keys=True, default=str)
        return hashlib.sha256(key.encode()).hexdigest()


def normalize_answer(answer: str) -> str:
    return answer.strip().strip("`").strip()


def make_scorer(source: ReasoningGymSource, timeout: float = DEFAULT_TIMEOUT):
    """Scores in the math verifier's killable worker processes: several reasoning-gym scorers run SymPy on the model's
    text, which can hang (``simplify`` of a hostile expression); a hard wall-clock limit bounds every call."""
    config_json = json.dumps(source._config, sort_keys=True)
    warmed = False  # the first job in a worker imports reasoning-gym (seconds): give it room once

    def score(task: Task, response: str) -> Verdict:
        nonlocal warmed
        raw, _ = extract_answer(response, styles=("answer_tag", "boxed"))
        if raw is None:
            return Verdict.failed("no <answer> or \\boxed{} found")
        if len(raw) > MAX_ANSWER_CHARS:
            return Verdict.failed(f"answer longer than {MAX_ANSWER_CHARS} characters", format_ok=True)
        answer = normalize_answer(raw)
        entry = task.metadata["entry"]
        if task.metadata.get("source_dataset") in EXACT_MATCH_ONLY:
            full = answer.casefold() == normalize_answer(str(entry["answer"])).casefold()
            return Verdict(correct=full, reward=float(full), parsed=answer, format_ok=True)
        from rlvr_envs.verifiers.math import pool

        job = ("rg", source.task_name, config_json, source._seed, len(source), entry)
        full, error, unverifiable = pool().run("", answer, timeout if warmed else max(timeout, WARM_UP_TIMEOUT),
                                               job=job)
        warmed = warmed or error is None
        return Verdict(correct=full, reward=float(full), parsed=answer, error=error, format_ok=True,
                       unverifiable=unverifiable)

    return score


def make_env(task: str = "leg_counting", *, size: int = DEFAULT_SIZE, seed: int = 0,
             config: Mapping[str, Any] | None = None, system_prompt: str | None = SYSTEM_PROMPT,
             timeout: float = DEFAULT_TIMEOUT, **env_kwargs: Any) -> TextEnv:
    """A single-turn env over reasoning-gym generator ``task`` (``config`` goes to its config dataclass);
    ``timeout`` is the hard wall-clock limit of one scoring call."""
    source = ReasoningGymSource(task, size=size, seed=seed, config=config)
    return TextEnv(source, make_scorer(source, timeout), system_prompt=system_prompt, verifier_name="reasoning-gym",
                   gold_formatter=gold_response, **env_kwargs)


def gold_response(task: Task) -> str:
    if not task.metadata.get("has_reference", True):
        raise NotImplementedError(f"{task.metadata.get('source_dataset')}: the generator keeps no reference solution")
    return f"<answer>{task.answer}</answer>"


def registry_entries() -> list[EnvEntry]:
    entry_point = "rlvr_envs.tasks.reasoning_gym:make_env"
    verifier = "reasoning-gym score_answer (full credit only)"
    rows = [EnvEntry("rlvr/ReasoningGym-v0", entry_point, "reasoning-gym (task=NAME)", "procedural", verifier)]
    rows += [EnvEntry(f"rlvr/rg-{name}-v0", entry_point, f"reasoning-gym {name}", "procedural", verifier,
                      {"task": name}) for name in RG_TASKS]
    return rows
