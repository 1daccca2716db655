"""The math verifier: equivalence (Math-Verify in the pool), fast path, answer-spam policy, threads, worker recovery."""

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from rlvr_envs.core import Verdict
from rlvr_envs.verifiers import math as mv
from rlvr_envs.verifiers.math import pool, verify, verify_many


@pytest.fixture(scope="module", autouse=True)
def started_pool():
    pool().start()  # the one-off start-up (~1 s, more on a loaded machine) is not part of any timing below


def boxed(ans: str) -> str:
    return f"Let me work it out step by step. First, ... so we get\n\nThe final answer is $\\boxed{{{ans}}}$."


EQUIVALENT = [
    ("\\frac{1}{2}", "\\dfrac{1}{2}"),
    ("\\frac{1}{2}", "0.5"),
    ("\\frac{1}{2}", "1/2"),
    ("\\frac{3}{4}", "\\tfrac34"),
    ("0.75", "\\frac{3}{4}"),
    ("1000", "1,000"),
    ("-7", "-7.0"),
    ("-\\frac{2}{3}", "\\frac{-2}{3}"),
    ("2\\sqrt{3}", "\\sqrt{12}"),
    ("\\sqrt{2}/2", "\\frac{\\sqrt{2}}{2}"),
    ("x^2+2x+1", "(x+1)^2"),
    ("[-2, 3)", "[-2,3)"),
    ("(-\\infty, 5]", "(-\\infty,5]"),
    ("\\{1, 2, 3\\}", "\\{3, 2, 1\\}"),
    ("1, 2, 3", "3, 2, 1"),
    ("(3, \\frac{\\pi}{2})", "\\left( 3, \\frac{\\pi}{2} \\right)"),
    ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}"),
    ("\\begin{pmatrix} 1 & 0 \\\\ 0 & 1 \\end{pmatrix}", "\\begin{pmatrix} 1 & 0 \\\\ 0 & \\frac{2}{2} \\end{pmatrix}"),
    ("30^\\circ", "30"),
    ("30", "30^{\\circ}"),
    ("10\\%", "10"),
    ("5 \\text{ inches}", "5"),
    ("\\text{(C)}", "\\text{(C)}"),
    ("\\pi", "\\pi"),
    ("2\\pi", "\\pi \\cdot 2"),
    ("x = 3", "3"),
    ("-\\frac{1}{3}", "-0.333333333"),
]

NOT_EQUIVALENT = [
    ("\\frac{1}{2}", "\\frac{1}{3}"),
    ("1000", "100"),
    ("-7", "7"),
    ("2\\sqrt{3}", "3\\sqrt{2}"),
    ("x^2+2x+1", "(x-1)^2"),
    ("[-2, 3)", "[-2, 3]"),
    ("\\{1, 2, 3\\}", "\\{1, 2\\}"),
    ("(3, \\frac{\\pi}{2})", "(3, \\pi)"),
    ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\begin{pmatrix} 2 \\\\ 1 \\end{pmatrix}"),
    ("30", "31"),
    ("\\pi", "3"),
    ("x", "y"),
    ("0.5", "0.05"),
]


@pytest.mark.parametrize("gold,answer", EQUIVALENT)
def test_equivalent_forms_are_correct(gold, answer):
    v = verify(gold, boxed(answer))
    assert v == Verdict(correct=True, reward=1.0, parsed=answer, error=None, format_ok=True), v


@pytest.mark.parametrize("gold,answer", NOT_EQUIVALENT)
def test_different_answers_are_wrong(gold, answer):
    v = verify(gold, boxed(answer))
    assert not v.correct and v.reward == 0.0 and v.parsed == answer and v.format_ok and v.error is None, v


@pytest.mark.parametrize(
    "response,parsed",
    [
        ("reasoning...\n<answer>\\frac{1}{2}</answer>", "\\frac{1}{2}"),
        ("Natalia sold 24 clips.\n#### 0.5", "0.5"),
        ("So the answer is 1/2.", "1/2"),
        ("The final answer is: $\\frac{2}{4}$", "\\frac{2}{4}"),
    ],
)
def test_extraction_styles(response, parsed):
    v = verify("\\frac{1}{2}", response)
    assert v.correct and v.parsed == parsed and v.format_ok


def test_no_answer_is_a_format_error():
    v = verify("3", "I think it is three but I am not sure")
    assert not v.correct and not v.format_ok and v.parsed is None and "no final answer" in v.error


def test_only_the_final_boxed_candidate_counts():
    intermediate = "First \\boxed{2}, then we double it: \\boxed{4}. Finally adding 1 we get\n\n"
    assert verify("5", intermediate + "the answer \\boxed{5}").correct
    # the gold value boxed earlier does not rescue a wrong final answer
    assert not verify("2", intermediate + "the answer \\boxed{5}").correct


def test_answer_spam_policy():
    five_distinct = " ".join(f"Maybe \\boxed{{{k}}}, let me think more about it." for k in range(5))
    v = verify("4", five_distinct)
    assert not v.correct and not v.format_ok and "answer spam" in v.error
    four_distinct = " ".join(f"Maybe \\boxed{{{k}}}, let me think more about it." for k in range(1, 5))
    assert verify("4", four_distinct).correct  # up to four distinct candidates: the last one is graded
    repeated = "\\boxed{4} is it, as I said, \\boxed{4}."
    assert verify("4", repeated).correct  # repeating the same answer is not spam
    many_markers = "ok \\boxed{4} " * (mv.MAX_BOXED_MARKERS + 1)
    assert "answer spam" in verify("4", many_markers).error


@pytest.mark.parametrize("response", ["\\boxed{1} or \\boxed{2}", "\\boxed{1}, \\boxed{2}", "$\\boxed{1}$\n$\\boxed{2}$"])
def test_hedged_answers_are_rejected_whichever_is_right(response):
    for gold in ("1", "2"):
        v = verify(gold, response)
        assert not v.correct and not v.format_ok and "hedged" in v.error


def test_fast_path_skips_the_pool(monkeypatch):
    def no_pool():
        raise AssertionError("the fast path must not use the worker pool")

    monkeypatch.setattr(mv, "pool", no_pool)
    for gold, answer, expected in [
        ("1000", "1,000", True),
        ("1,000", "1000", True),
        ("\\frac{1}{2}", "0.5", True),
        ("\\frac{1}{2}", "\\dfrac{1}{2}", True),
        ("-3", "-3.00", True),
        ("\\left( 3, \\frac{\\pi}{2} \\right)", "\\left(3,\\frac{\\pi}{2}\\right)", True),
        ("17", "18", False),
        ("1,000", "1,001", False),
    ]:
        v = verify(gold, boxed(answer))
        assert (v.correct, v.format_ok) == (expected, True), (gold, answer, v)


def test_fast_path_agrees_with_math_verify():
    for gold, answer in [("1000", "1,000"), ("\\frac{1}{2}", "0.5"), ("-3", "-3.00"), ("17", "18"), ("1/4", "0.25")]:
        assert verify(gold, boxed(answer)).correct == verify(gold, boxed(answer), fast_path=False).correct


def test_bad_arguments():
    with pytest.raises(ValueError):
        verify("1", "\\boxed{1}", timeout=0)
    v = verify("1", None)  # type: ignore[arg-type]
    assert not v.correct and "must be str" in v.error


def test_works_from_threads_and_verify_many_keeps_order():
    pairs = [(str(k), boxed(f"{k}.0" if k % 2 else f"{k + 1}")) for k in range(40)]
    pairs += [("\\frac{1}{3}", boxed("\\frac{2}{6}")), ("x^2", boxed("x\\cdot x"))] * 5
    expected = [k % 2 == 1 for k in range(40)] + [True] * 10
    with ThreadPoolExecutor(8) as ex:
        got = list(ex.map(lambda p: verify(p[0], p[1], fast_path=False).correct, pairs))
    assert got == expected
    assert [v.correct for v in verify_many(pairs)] == expected


def test_hung_worker_is_killed_and_replaced():
    p = pool()
    before = p.replaced
    start = time.monotonic()
    correct, error = p.check("1", "1", timeout=0.5, _test_sleep=30)
    assert time.monotonic() - start < 1.5
    assert not correct and "timed out" in error
    assert p.replaced == before + 1
    # the next calls work (the other worker serves them while the replacement starts)
    assert verify("x^2", boxed("x \\cdot x"), fast_path=False).correct
    # and the pool gets back to full size
    deadline = time.monotonic() + 60
    while len(p._idle) < p.size and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(p._idle) == p.size
    assert all(w.proc.poll() is None for w in p._idle)


def test_worker_that_died_while_idle_is_replaced():
    p = pool()
    p.start()
    deadline = time.monotonic() + 60
    while len(p._idle) < p.size and time.monotonic() < deadline:
        time.sleep(0.1)
    victim = p._idle[-1]
    os.kill(victim.proc.pid, 9)
    victim.proc.wait()
    results = [verify("\\frac{1}{3}", boxed("\\frac{2}{6}"), fast_path=False) for _ in range(3)]
    assert all(v.correct and v.error is None for v in results), results


def test_math500_gold_answers_all_verify(data_dir):
    path = data_dir / "math" / "math500.jsonl"
    if not path.is_file():
        pytest.skip(f"{path} is absent")
    golds = [json.loads(line)["answer"] for line in path.read_text().splitlines() if line.strip()]
    assert len(golds) == 500
    # Through the fast path (what envs use) and through Math-Verify alone (the fast path would hide parse failures).
    assert sum(v.correct for v in verify_many([(g, boxed(g)) for g in golds])) == 500
    via_math_verify = verify_many([(g, boxed(g)) for g in golds], fast_path=False)
    assert [(g, v.error) for g, v in zip(golds, via_math_verify) if not v.correct] == []
    # a wrong gold (the next task's answer) fails, unless the two answers really are the same value
    # (in MATH-500 that is '7'/'7', '3'/'3' and '5'/'x=5': neighbours with equal answers)
    shifted = verify_many([(g, boxed(golds[(i + 1) % 500])) for i, g in enumerate(golds)])
    accepted = [(g, golds[(i + 1) % 500]) for i, (g, v) in enumerate(zip(golds, shifted)) if v.correct]
    assert len(accepted) <= 3, accepted
    assert all(verify(b, boxed(a)).correct for a, b in accepted), accepted  # same value both ways round


def _verify_in_child(queue) -> None:
    os.environ["RLVR_MATH_WORKERS"] = "1"
    v = verify("x^2", boxed("x \\cdot x"), timeout=60, fast_path=False)
    queue.put((v.correct, v.error))


def test_works_in_a_forked_daemonic_process():
    # AsyncVectorEnv workers are daemonic (multiprocessing forbids them children); a forked child must not share
    # the parent's worker pipes. The verifier starts its own subprocess workers there.
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=_verify_in_child, args=(queue,), daemon=True)
    proc.start()
    try:
        assert queue.get(timeout=120) == (True, None)
    finally:
        proc.join(10)
    assert verify("x^2", boxed("x \\cdot x"), fast_path=False).correct  # the parent's pool is untouched
