"""Three-way verdicts (correct / wrong / unverifiable) through verifiers, envs, the harness and the boards; and the
math verifier's in-process verification cache."""

import json
import re
import shutil
from collections import OrderedDict
from pathlib import Path

import gymnasium as gym
import pytest
from harness_toy import SeededAgent, exact_scorer
from hypothesis import given, settings
from hypothesis import strategies as st

from rlvr_envs.core import UNVERIFIABLE, VERDICT_STATUSES, ListSource, Task, TextEnv, Verdict, verdict_status
from rlvr_envs.harness import Results, SchemaError, evaluate, validate
from rlvr_envs.harness import leaderboard as lb
from rlvr_envs.harness.metrics import compute_metrics, metrics_match, record_status
from rlvr_envs.harness.render import render_site
from rlvr_envs.verifiers import countdown, qa
from rlvr_envs.verifiers import math as mv

REPO = Path(__file__).resolve().parents[1]
UNVERIFIABLE_TOY_ID = "rlvrtest/ToyUnverifiable-v0"


def boxed(answer: str) -> str:
    return f"Working through it step by step, we find\n\nThe final answer is $\\boxed{{{answer}}}$."


@pytest.fixture
def fresh_cache():
    """An empty, enabled verification cache with zeroed counters; the previous size limit is restored after."""
    size = mv.configure_cache(mv.CACHE_SIZE)
    mv.cache_clear()
    yield
    mv.cache_clear()
    mv.configure_cache(size)


@pytest.fixture(scope="module")
def started_pool():
    mv.pool().start()  # the one-off start-up is not part of any deadline below


# -- Verdict -------------------------------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(correct=st.booleans(), reward=st.floats(-2, 2, allow_nan=False), parsed=st.none() | st.text(max_size=5),
       error=st.none() | st.text(max_size=5), format_ok=st.booleans())
def test_existing_constructor_calls_derive_the_status_from_correct(correct, reward, parsed, error, format_ok):
    v = Verdict(correct=correct, reward=reward, parsed=parsed, error=error, format_ok=format_ok)
    assert v.status == ("correct" if correct else "wrong") and not v.unverifiable
    assert v == Verdict(correct, reward, parsed, error, format_ok)  # positional calls keep their meaning
    assert Verdict.failed("why", parsed=parsed).status == "wrong"


@settings(max_examples=200, deadline=None)
@given(correct=st.booleans(), reported=st.none() | st.sampled_from(VERDICT_STATUSES) | st.text(max_size=8))
def test_verdict_status_lets_only_unverifiable_refine_a_not_correct_outcome(correct, reported):
    status = verdict_status(correct, reported)
    assert status in VERDICT_STATUSES
    assert (status == "correct") == correct  # whatever is reported, "correct" follows the flag accuracy counts
    assert (status == UNVERIFIABLE) == (not correct and reported == UNVERIFIABLE)


def test_unverifiable_verdicts_earn_nothing_and_cannot_be_correct():
    v = Verdict.could_not_verify("math-verify timed out", parsed="7", format_ok=True)
    assert v.status == "unverifiable" and v.unverifiable and not v.correct and v.reward == 0.0
    assert v.parsed == "7" and v.format_ok and v != Verdict.failed("math-verify timed out", "7", True)
    with pytest.raises(ValueError, match="both correct and unverifiable"):
        Verdict(correct=True, reward=1.0, unverifiable=True)
    with pytest.raises(ValueError, match="reward 0"):
        Verdict(correct=False, reward=0.5, unverifiable=True)


# -- the math verifier: statuses ---------------------------------------------------------------------------------


class HangingPool:
    """The real pool with the worker told to hang first (the test hook of ``VerifierPool.run``): a real timeout,
    with the worker killed and replaced."""

    def __init__(self, real: mv.VerifierPool):
        self.real = real

    def run(self, gold: str, answer: str, timeout: float, **kwargs) -> mv.CheckResult:
        return self.real.run(gold, answer, timeout, _test_sleep=30, **kwargs)


def test_timeout_is_unverifiable_with_reward_zero_and_is_not_cached(started_pool, fresh_cache, monkeypatch):
    real = mv.pool()
    replaced = real.replaced
    monkeypatch.setattr(mv, "pool", lambda: HangingPool(real))
    v = mv.verify("x^2", boxed("x \\cdot x"), timeout=0.5, fast_path=False)
    assert v.status == "unverifiable" and not v.correct and v.reward == 0.0
    assert "timed out" in v.error and v.parsed == "x \\cdot x" and v.format_ok
    assert real.replaced == replaced + 1  # the hung worker was killed
    assert mv.cache_info().currsize == 0  # a timeout is not an answer
    monkeypatch.undo()
    again = mv.verify("x^2", boxed("x \\cdot x"), timeout=60, fast_path=False)  # retried, not served from the cache
    assert again.status == "correct" and again.reward == 1.0
    info = mv.cache_info()
    assert (info.hits, info.misses, info.currsize) == (0, 2, 1)
    assert mv.verify("x^2", boxed("x \\cdot x"), fast_path=False) == again and mv.cache_info().hits == 1


def test_timeout_reaches_the_env_info_as_unverifiable(started_pool, fresh_cache, monkeypatch, data_dir):
    env = gym.make("rlvr/MATH500-v0", verify_timeout=0.5).unwrapped
    real = mv.pool()
    monkeypatch.setattr(mv, "pool", lambda: HangingPool(real))
    _, info = env.reset(options={"index": 0})  # gold "\left( 3, \frac{\pi}{2} \right)": Math-Verify decides
    _, reward, terminated, _, info = env.step(boxed("(3, \\pi/2)"))
    assert terminated and reward == 0.0 and info["verdict"] == "unverifiable" and not info["correct"]


def test_unreadable_or_missing_gold_is_unverifiable_and_a_bad_response_is_wrong(started_pool, fresh_cache):
    v = mv.verify("}{", boxed("1"), timeout=60, fast_path=False)  # Math-Verify cannot parse this gold
    assert v.status == "unverifiable" and "gold" in v.error and v.reward == 0.0
    assert mv.cache_info().currsize == 0
    assert mv.verify("", boxed("1")).status == "unverifiable"
    assert mv.verify(None, boxed("1")).status == "unverifiable"  # type: ignore[arg-type]
    # the model's fault, however it fails, is a settled wrong answer
    assert mv.verify("1", None).status == "wrong"  # type: ignore[arg-type]
    assert mv.verify("1", "no box at all").status == "wrong"
    assert mv.verify("1", "\\boxed{1} or \\boxed{2}").status == "wrong"  # hedged
    assert mv.verify("1", boxed("\\frac{")).status == "wrong"  # Math-Verify cannot read the answer: wrong


def test_math_env_reports_correct_and_wrong(started_pool, data_dir):
    env = gym.make("rlvr/MATH500-v0").unwrapped
    task = env.source.task(0)
    for response, status in [(env.gold_response(task), "correct"), (boxed("(3, \\pi)"), "wrong"),
                             ("I give up.", "wrong")]:
        env.reset(options={"index": 0})
        _, reward, _, _, info = env.step(response)
        assert info["verdict"] == status and info["correct"] == (status == "correct") and reward == float(
            status == "correct"), (response, info)


# -- the math verifier: the cache ---------------------------------------------------------------------------------


def _variants(gold: str, other: str) -> list[str]:
    """Answers a group might give: the gold, rewrites of it, the next task's gold, a near miss."""
    near = re.sub(r"\d(?=\D*$)", lambda m: str((int(m.group()) + 1) % 10), gold, count=1)
    return [gold, f" {gold} ", gold.replace("\\frac", "\\dfrac"), other, near if near != gold else f"-{gold}"]


def test_cache_gives_the_uncached_verdicts_on_real_math500_pairs(started_pool, fresh_cache, data_dir):
    rows = [json.loads(line) for line in (data_dir / "math" / "math500.jsonl").read_text().splitlines()[:40]]
    golds = [r["answer"] for r in rows]
    pairs = [(g, boxed(a)) for i, g in enumerate(golds) for a in _variants(g, golds[(i + 1) % len(golds)])]

    def verdicts() -> list[tuple]:
        return [(v.correct, v.status, v.parsed, v.error)
                for v in mv.verify_many(pairs, timeout=60, fast_path=False)]

    mv.configure_cache(0)
    uncached = verdicts()
    assert mv.cache_info() == mv.CacheInfo(0, 0, 0, 0)  # disabled: no lookups counted, nothing kept
    assert {s for _, s, _, _ in uncached} == {"correct", "wrong"}  # settled outcomes only (a 60 s limit)
    mv.configure_cache(mv.CACHE_SIZE)
    first = verdicts()
    after_first = mv.cache_info()
    second = verdicts()
    after_second = mv.cache_info()
    assert first == uncached and second == uncached
    assert after_first.hits + after_first.misses == len(pairs)
    distinct = len({(g, a.strip()) for g, r in pairs for a in [mv._extract(r)[0]]})
    assert after_first.currsize == distinct < len(pairs)  # " gold " and "gold" share an entry
    assert after_second.hits == after_first.hits + len(pairs) and after_second.misses == after_first.misses


def test_cache_key_keeps_answers_that_math_verify_reads_differently_apart(started_pool, fresh_cache):
    """The fast path's normalization would merge these two (it eats the row break's backslash-space); Math-Verify
    grades them differently, so a key built from it would make the second verdict depend on the first."""
    gold = "\\begin{pmatrix} -2 \\\\ -14 \\\\ -7 \\end{pmatrix}"  # MATH-500's answer, as written there
    squashed = "\\begin{pmatrix}-2\\-14\\-7\\end{pmatrix}"
    assert mv._normalize(gold) == mv._normalize(squashed)
    assert mv.verify_answer(gold, gold, fast_path=False, timeout=60).status == "correct"
    assert mv.verify_answer(gold, squashed, fast_path=False, timeout=60).status == "wrong"
    assert mv.cache_info().hits == 0 and mv.cache_info().currsize == 2


def test_cache_can_be_disabled_resized_and_cleared(started_pool, fresh_cache):
    mv.verify("x^2", boxed("x \\cdot x"), fast_path=False)
    mv.verify("x^2", boxed("x \\cdot x"), fast_path=False)
    assert mv.cache_info() == mv.CacheInfo(hits=1, misses=1, maxsize=mv.CACHE_SIZE, currsize=1)
    assert mv.configure_cache(0) == mv.CACHE_SIZE
    mv.verify("x^2", boxed("x \\cdot x"), fast_path=False)
    assert mv.cache_info() == mv.CacheInfo(hits=1, misses=1, maxsize=0, currsize=0)
    mv.configure_cache(4)
    mv.cache_clear()
    assert mv.cache_info() == mv.CacheInfo(0, 0, 4, 0)
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="cache size"):
            mv.configure_cache(bad)  # type: ignore[arg-type]


_KEYS = st.tuples(st.sampled_from("gh"), st.sampled_from("abcde"))
# one verification each: the key, and its outcome (None: unverifiable) should it have to be checked
_CHECKS = st.lists(st.tuples(_KEYS, st.none() | st.booleans()), max_size=60)


@settings(max_examples=300, deadline=None)
@given(maxsize=st.integers(0, 4), checks=_CHECKS)
def test_verdict_cache_is_a_bounded_lru_of_settled_outcomes(maxsize, checks):
    """Against a reference LRU: the same answers and hit/miss counts, at most ``maxsize`` entries, and an
    unverifiable outcome (None) never stored."""
    cache = mv._VerdictCache(maxsize)
    model: OrderedDict = OrderedDict()
    hits = misses = 0
    for key, correct in checks:
        outcome = None if correct is None else (correct, None)
        found, claimed = cache.claim(key, deadline=0.0)
        expected = model.get(key) if maxsize else None
        assert found == expected and claimed == (maxsize > 0 and expected is None)
        if maxsize:
            hits, misses = hits + (expected is not None), misses + (expected is None)
        if expected is not None:
            model.move_to_end(key)
        if claimed:
            cache.settle(key, outcome)
            if outcome is not None:
                model[key] = outcome
                while len(model) > maxsize:
                    model.popitem(last=False)
        assert len(cache._data) <= maxsize and not cache._pending
    assert cache.info() == mv.CacheInfo(hits, misses, maxsize, len(model))


def test_concurrent_identical_checks_ask_math_verify_once(started_pool, fresh_cache, monkeypatch):
    """A GRPO group graded at once: every thread with the same (gold, answer) waits for the first one's outcome."""
    import threading

    real = mv.pool()
    calls = []

    class CountingPool:
        def run(self, gold, answer, timeout, **kwargs):
            calls.append(answer)
            return real.run(gold, answer, timeout, **kwargs)

    monkeypatch.setattr(mv, "pool", lambda: CountingPool())
    start = threading.Barrier(8)
    got = []

    def grade():
        start.wait()
        got.append(mv.verify_answer("\\frac{\\sqrt{3}}{2}", "\\dfrac{\\sqrt{3}}{2}", timeout=60, fast_path=False))

    threads = [threading.Thread(target=grade) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(got) == 8 and all(v.status == "correct" for v in got)
    assert mv.cache_info()[:2] == (7, 1)


# -- other verifiers and envs ----------------------------------------------------------------------------------------


def test_other_verifiers_mark_what_they_cannot_check():
    assert qa.verify(["Paris"], "<answer>paris</answer>").status == "correct"
    assert qa.verify(["Paris"], "<answer>Lyon</answer>").status == "wrong"
    assert qa.verify(["Paris"], "no tag").status == "wrong"
    for unusable in ([], ["the"], ""):
        v = qa.verify(unusable, "<answer>paris</answer>")
        assert v.status == "unverifiable" and v.reward == 0.0 and v.parsed == "paris"
    assert countdown.verify([1, 2, 3], 6, "<answer>1+2+3</answer>").status == "correct"
    assert countdown.verify([1, 2, 3], 6, "<answer>1+2</answer>").status == "wrong"
    assert countdown.verify([1, 2, 3], "six", "<answer>1+2+3</answer>").status == "unverifiable"
    assert countdown.verify([], 6, "<answer>1+2+3</answer>").status == "unverifiable"


def test_bfcl_answer_naming_an_undocumented_function_is_unverifiable():
    from rlvr_envs.tools.bfcl import score_bfcl

    fn = {"name": "f", "parameters": {"type": "dict", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}
    good = Task("t", "q", "[]", metadata={"category": "simple_python", "functions": [fn],
                                          "ground_truth": [{"f": {"a": [1]}}]})
    assert score_bfcl(good, "f(a=1)").status == "correct" and score_bfcl(good, "f(a=2)").status == "wrong"
    broken = Task("t", "q", "[]", metadata={"category": "simple_python", "functions": [fn],
                                            "ground_truth": [{"g": {"a": [1]}}]})
    v = score_bfcl(broken, "f(a=1)")
    assert v.status == "unverifiable" and "undocumented function 'g'" in v.error
    odd_type = {**fn, "parameters": {**fn["parameters"], "properties": {"a": {"type": "quaternion"}}}}
    odd = Task("t", "q", "[]", metadata={"category": "simple_python", "functions": [odd_type],
                                         "ground_truth": [{"f": {"a": [1]}}]})
    assert score_bfcl(odd, "f(a=1)").status == "unverifiable"


def test_text_env_puts_the_status_in_info_and_a_crashing_scorer_is_unverifiable():
    def scorer(task: Task, response: str) -> Verdict:
        if task.answer == "boom":
            raise RuntimeError("scorer bug")
        return exact_scorer(task, response)

    env = TextEnv(ListSource([Task("a", "q", "1"), Task("b", "q", "boom")], "t"), scorer, format_reward=0.5)
    for index, response, status, reward in [(0, "\\boxed{1}", "correct", 1.5), (0, "\\boxed{2}", "wrong", 0.5),
                                            (1, "\\boxed{1}", "unverifiable", 0.0)]:
        env.reset(options={"index": index})
        _, r, _, _, info = env.step(response)
        assert info["verdict"] == status and r == reward, info


def test_tool_env_reports_the_verdict_when_the_episode_ends():
    env = gym.make("rlvr/ToolUse-v0").unwrapped
    try:
        task = env.source.task(0)
        env.reset(options={"index": 0})
        info = {}
        for turn in env.gold_turns(task):
            _, _, terminated, truncated, info = env.step(turn)
            assert info["verdict"] == ("correct" if terminated else None)  # None while the episode is open
        assert info["final"] and info["correct"]
        assert env.score(task, env.gold_turns(task)).status == "correct"
    finally:
        env.close()


# -- the harness, results files and boards --------------------------------------------------------------------------


def record(ti: int, si: int, correct: bool, status: str | None = None) -> dict:
    rec = {"task_index": ti, "task_id": f"t{ti}", "sample_index": si, "seed": 0, "response": "r",
           "parsed_answer": "1", "correct": correct, "reward": float(correct), "format_ok": True, "error": None,
           "truncated_response": False, "tokens": 3, "metadata": {}}
    if status is not None:
        rec["status"] = status
    return rec


def test_metrics_report_the_unverifiable_rate_separately():
    recs = [record(0, 0, True, "correct"), record(0, 1, False, "unverifiable"), record(1, 0, False, "wrong"),
            record(1, 1, False, "unverifiable")]
    m = compute_metrics(recs, 2)
    assert m["unverifiable_rate"] == 0.5 and m["accuracy"] == 0.25  # unverifiable is not correct, and said apart
    old = [{k: v for k, v in r.items() if k != "status"} for r in recs]
    assert compute_metrics(old, 2)["unverifiable_rate"] == 0.0  # no status: derived from correct
    assert [record_status(r) for r in old] == ["correct", "wrong", "wrong", "wrong"]
    # a claim from before the metric may lack it; a claimed value must still be right
    assert metrics_match({k: v for k, v in m.items() if k != "unverifiable_rate"}, m) == []
    assert metrics_match({**m, "unverifiable_rate": 0.0}, m) == ["unverifiable_rate: claimed 0.0, re-verified 0.5"]


def make_unverifiable_toy() -> TextEnv:
    """The harness toy, but the verifier cannot decide every third task (as if it always timed out there)."""
    tasks = [Task(id=f"toy-{i}", question=f"What is {i} + {2 * i + 1}?", answer=str(3 * i + 1)) for i in range(12)]

    def scorer(task: Task, response: str) -> Verdict:
        if int(task.id.split("-")[1]) % 3 == 0:
            return Verdict.could_not_verify("verifier timed out (simulated)")
        return exact_scorer(task, response)

    return TextEnv(ListSource(tasks, "toy-unverifiable"), scorer, verifier_name="exact, every third undecided")


if UNVERIFIABLE_TOY_ID not in gym.registry:
    gym.register(UNVERIFIABLE_TOY_ID, entry_point=make_unverifiable_toy)


def test_evaluate_records_statuses_and_boards_show_the_rate(tmp_path):
    out = tmp_path / "r.json"
    res = evaluate(SeededAgent(), UNVERIFIABLE_TOY_ID, n_samples=2, seed=3, limit=9, out=out, progress=False,
                   batch_size=4)
    statuses = [r["status"] for r in res.records]
    assert all(s == "unverifiable" for r, s in zip(res.records, statuses) if r["task_index"] % 3 == 0)
    assert all(s == ("correct" if r["correct"] else "wrong") for r, s in zip(res.records, statuses)
               if r["task_index"] % 3)
    assert res.metrics["unverifiable_rate"] == pytest.approx(6 / 18)
    assert "unverifiable_rate=0.333" in res.summary()
    assert Results.load(out).data == json.loads(json.dumps(res.data))
    entry = lb.submit(out, "undecided", boards_dir=tmp_path / "boards")
    assert entry["metrics"]["unverifiable_rate"] == pytest.approx(1 / 3)
    board = lb.load_board(tmp_path / "boards" / "undecided.json")
    table = lb.format_board(board)
    header, rule, row = table.splitlines()[1:4]
    start = header.index("unverif")
    end = rule.find(" ", start)  # the column's dashes end where its width does
    assert row[start:end].strip() == "0.333"
    page = render_site(tmp_path / "boards", tmp_path / "site").read_text()
    assert "<th>unverifiable</th>" in page and 'data-v="0.3333333333333333">0.333</td>' in page


def test_results_schema_accepts_no_status_and_rejects_an_unknown_one(tmp_path):
    res = evaluate(SeededAgent(), UNVERIFIABLE_TOY_ID, n_samples=1, seed=0, limit=4, progress=False)
    doc = json.loads(json.dumps(res.data))
    validate(doc)
    doc["records"][1]["status"] = "maybe"
    with pytest.raises(SchemaError, match=r"records\[1\]\.status"):
        validate(doc)


def test_a_results_file_without_statuses_still_submits(tmp_path):
    res = evaluate(SeededAgent(), UNVERIFIABLE_TOY_ID, n_samples=2, seed=1, limit=6, progress=False, batch_size=4)
    old = json.loads(json.dumps(res.data))
    for r in old["records"]:  # as written before statuses existed
        del r["status"]
    del old["metrics"]["unverifiable_rate"]
    entry = lb.submit(old, "old", boards_dir=tmp_path)
    # the board re-scores correct (unchanged) and derives the missing statuses from it
    assert entry["metrics"]["unverifiable_rate"] == 0.0 and entry["metrics"]["accuracy"] == res.metrics["accuracy"]


def test_published_results_files_load_verify_and_render_unchanged(tmp_path, data_dir):
    results = REPO / "leaderboards" / "results" / "bfcl-simple_python.json"
    board_file = REPO / "leaderboards" / "boards" / "bfcl-simple_python.json"
    if not results.is_file() or not board_file.is_file():
        pytest.skip("the published BFCL results or board are absent")
    doc = json.loads(results.read_text())
    assert all("status" not in r for r in doc["records"]) and "unverifiable_rate" not in doc["metrics"]
    loaded = Results.load(results)
    assert "unverifiable_rate=n/a" in loaded.summary()
    recomputed = lb.verify_results(doc)  # re-verified with the env's verifier, as a submission would be
    assert recomputed["unverifiable_rate"] == 0.0 and metrics_match(doc["metrics"], recomputed) == []
    assert recomputed["accuracy"] == doc["metrics"]["accuracy"]
    boards = tmp_path / "boards"
    boards.mkdir()
    shutil.copy(board_file, boards / board_file.name)
    board = lb.load_board(boards / board_file.name)
    assert all("unverifiable_rate" not in e["metrics"] for e in board["entries"])
    assert " n/a " in lb.format_board(board)
    page = render_site(boards, tmp_path / "site").read_text()
    assert "<th>unverifiable</th>" in page and 'data-v="">n/a</td>' in page
    assert json.loads((boards / board_file.name).read_text()) == json.loads(board_file.read_text())  # untouched
