"""The audit's second math verifier: golden pairs it agrees on with Math-Verify, its own calls, hostile input."""

import time

import pytest
import sympy.parsing.sympy_parser as sympy_parser

from rlvr_envs.verifiers.math import pool
from rlvr_envs.verifiers.math import verify_answer as math_verify_answer
from rlvr_envs.verifiers.sympy_equiv import Unparseable, judge, read_answer, verify_answer

# (gold, answer): the same answer written another way; both verifiers must call these correct.
EQUIVALENT = [
    ("\\frac{1}{2}", "0.5"), ("\\frac12", "1/2"), ("2\\sqrt{3}", "\\sqrt{12}"), ("1,000", "1000"),
    ("\\frac{\\pi}{4}", "\\pi/4"), ("x^2+3x-4", "(x+4)(x-1)"), ("(1, -2)", "\\left(1,-2\\right)"),
    ("\\{1, 2\\}", "\\{2, 1\\}"), ("\\sqrt[3]{27}", "3"), ("\\dbinom{6}{2}", "15"), ("3 - 4i", "3-4i"),
    ("\\frac{9\\pi}{2}", "4.5\\pi"), ("\\begin{pmatrix} 1 \\\\ -2 \\end{pmatrix}", "\\begin{pmatrix}1\\\\-2\\end{pmatrix}"),
    ("(-\\infty, 0) \\cup (1, \\infty)", "(-\\infty,0)\\cup(1,\\infty)"), ("[-2, 5)", "[-2,5)"), ("6", "6.0"),
    ("\\frac{\\sqrt{3}}{2}", "\\frac{1}{2}\\sqrt{3}"),
]
# (gold, answer): a different answer; both verifiers must call these wrong.
DIFFERENT = [
    ("5", "6"), ("\\frac{1}{3}", "0.333"), ("x+1", "x+2"), ("[-2, 5)", "(-2, 5)"), ("(1, 2)", "(2, 1)"),
    ("2\\sqrt{3}", "3\\sqrt{2}"), ("\\{1, 2\\}", "\\{1, 3\\}"), ("-\\infty", "\\infty"), ("\\pi", "3.14"),
]


@pytest.fixture(scope="module", autouse=True)
def started_pool():
    pool().start()


@pytest.mark.parametrize(("gold", "answer"), EQUIVALENT)
def test_equivalent_pairs_agree_with_math_verify(gold, answer):
    assert judge(gold, answer) == ("correct", None)
    assert math_verify_answer(gold, answer, timeout=10.0).correct


@pytest.mark.parametrize(("gold", "answer"), DIFFERENT)
def test_different_pairs_agree_with_math_verify(gold, answer):
    assert judge(gold, answer)[0] == "wrong"
    verdict = math_verify_answer(gold, answer, timeout=10.0)
    assert verdict.status == "wrong"


@pytest.mark.parametrize(("gold", "answer", "status"), [
    ("25\\%", "25", "correct"), ("90^\\circ", "90", "correct"), ("5 \\text{ cm}", "5", "correct"),
    ("12", "12 \\text{ square units}", "correct"), ("\\$5.00", "5", "correct"), ("10", "10 degrees", "correct"),
    ("\\text{Monday}", "Monday", "correct"), ("\\text{(C)}", "C", "correct"), ("\\text{(C)}", "(D)", "wrong"),
    ("52_8", "52_{8}", "correct"), ("52_8", "52", "wrong"), ("y = 2x + 1", "2x+1", "correct"),
    ("x^2+y^2=25", "2x^2+2y^2=50", "correct"), ("x \\in [2, 5]", "[2,5]", "correct"), ("k = 3", "3", "correct"),
    ("1 \\pm \\sqrt{19}", "1+\\sqrt{19}, 1-\\sqrt{19}", "correct"), ("\\frac{639}{40}", "15\\frac{39}{40}", "correct"),
    ("\\frac{\\sqrt{3}}{2}", "\\sin(\\pi/3)", "correct"), ("\\ln 2", "\\log(2)", "correct"),
    ("a^2 - b^2", "(a-b)(a+b)", "correct"), ("|x|", "\\left| x \\right|", "correct"), ("4", "e^{i\\pi}+5", "correct"),
    ("\\frac{\\sqrt{3}}{2}", "\\sin 60^\\circ", "unverifiable"),  # degrees would be read as radians
    ("3", "three", "unverifiable"), ("x \\ge 3", "x \\ge 3", "unverifiable"), ("5", "", "unverifiable"),
])
def test_normalization_and_structures(gold, answer, status):
    assert judge(gold, answer)[0] == status


# Python written as an answer: refused by the character and name whitelist before anything is evaluated.
INJECTIONS = [
    "__import__('os').system('echo pwned')", "lambda: 4", "(lambda x: x)(4)", "4 if True else 5", "().__class__",
    "exec('4')", "eval(\"4\")", "globals()", "x.__dict__", "[4][0]", "open('/etc/passwd').read()", "４", "４２", "𝟒",
    "4\u200b", "\u202e4", "1" * 5000,
]
def test_text_answers_are_compared_as_text_not_run(monkeypatch):
    evaluated = _recording_eval(monkeypatch)
    assert read_answer("\\text{__import__('os')}").kind == "text"
    assert evaluated == []
    assert judge("4", "\\text{__import__('os')}")[0] == "wrong"  # a text answer to a number question


# Valid math whose value would not fit in memory or time: refused before it is evaluated.
BLOWUPS = ["9^{9^{9}}", "(10^{9999})!", "2^{2^{2^{2^{2}}}}", "((10^{999})^{999})^{999}", "2^{100000}",
           "\\binom{10^{50}}{10^{49}}", "(" * 300 + "4" + ")" * 300, "\\frac{" * 100 + "4" + "}{2}" * 100]


def _recording_eval(monkeypatch) -> list:
    evaluated = []
    real_eval = sympy_parser.eval_expr
    monkeypatch.setattr(sympy_parser, "eval_expr", lambda code, *a: evaluated.append(code) or real_eval(code, *a))
    return evaluated


@pytest.mark.parametrize("answer", INJECTIONS)
def test_injected_code_is_unverifiable_and_never_evaluated(answer, monkeypatch):
    status, reason = judge("4", answer)
    assert status == "unverifiable", reason
    evaluated = _recording_eval(monkeypatch)
    with pytest.raises(Unparseable):
        read_answer(answer)
    assert evaluated == []


@pytest.mark.parametrize("answer", BLOWUPS)
def test_huge_values_are_unverifiable_at_once(answer, monkeypatch):
    start = time.monotonic()
    status, reason = judge("4", answer)
    assert status == "unverifiable", reason
    assert time.monotonic() - start < 5.0
    evaluated = _recording_eval(monkeypatch)
    with pytest.raises(Unparseable):
        read_answer(answer)
    assert len(evaluated) <= 1  # at most the unevaluated parse that the size check reads


def test_verify_answer_runs_in_the_worker_with_a_hard_limit():
    assert verify_answer("\\frac{1}{2}", "0.5", timeout=10.0).status == "correct"
    assert verify_answer("\\frac{1}{2}", "0.6", timeout=10.0).status == "wrong"
    assert verify_answer("4", "__import__('os')", timeout=10.0).status == "unverifiable"
    assert verify_answer("4", "x" * 10_000, timeout=10.0).status == "unverifiable"
    start = time.monotonic()  # a check that outlives its limit: the worker is killed, the verdict unverifiable
    late = verify_answer("x^2+3x-4", "(x+4)(x-1)", timeout=0.001)
    assert late.status == "unverifiable" and late.reward == 0.0
    assert time.monotonic() - start < 2.0
