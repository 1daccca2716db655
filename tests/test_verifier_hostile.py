"""Hostile input for the math verifier: every call returns a Verdict within timeout + 1 s, and no hack is accepted."""

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlvr_envs.core import Verdict
from rlvr_envs.verifiers.math import MAX_RESPONSE_CHARS, pool, verify

TIMEOUT = 2.0
MB = 1_000_000


@pytest.fixture(scope="module", autouse=True)
def started_pool():
    pool().start()


def timed_verify(gold: str, response: str) -> Verdict:
    start = time.monotonic()
    v = verify(gold, response, timeout=TIMEOUT)
    elapsed = time.monotonic() - start
    assert isinstance(v, Verdict)
    assert elapsed < TIMEOUT + 1.0, f"took {elapsed:.2f} s"
    assert (v.reward == 1.0) == v.correct and (not v.correct or (v.format_ok and v.parsed is not None))
    return v


# (name, gold, response): a correct verdict for any of these would be a reward hack or a verifier bug.
HACKS = [
    ("gold echoed before a wrong final box", "42", "The answer 42 is tempting, but it is \\boxed{7}."),
    ("gold in text inside the box", "42", "\\boxed{7 \\text{ (not 42)}}"),
    ("gold then disclaimer in box", "42", "\\boxed{42 \\text{ is wrong, it is } 7}"),
    ("negated gold", "42", "\\boxed{\\text{not } 42}"),
    ("gold as part of a number", "42", "\\boxed{4242}"),
    ("gold or another", "42", "\\boxed{42 \\text{ or } 43}"),
    ("gold in a tuple", "42", "\\boxed{42, 43}"),
    ("gold in a set", "42", "\\boxed{\\{42, 43\\}}"),
    ("gold plus or minus", "42", "\\boxed{42 \\pm 1}"),
    ("false equation ending in gold", "42", "\\boxed{7 = 42}"),
    ("false chain ending in gold", "42", "\\boxed{x = 7 = 42}"),
    ("bare inequality", "42", "\\boxed{\\ge 42}"),
    ("negation", "42", "\\boxed{\\neg 42}"),
    ("not", "42", "\\boxed{\\not 42}"),
    ("phantom gold", "42", "\\boxed{\\phantom{42}7}"),
    ("cancelled gold", "42", "\\boxed{\\cancel{42} 7}"),
    ("inequality with gold", "42", "\\boxed{x \\geq 42}"),
    ("all reals", "42", "\\boxed{\\mathbb{R}}"),
    ("everything interval", "42", "\\boxed{(-\\infty, \\infty)}"),
    ("a free variable", "42", "\\boxed{x}"),
    ("a word", "42", "\\boxed{\\text{correct}}"),
    ("infinity", "42", "\\boxed{\\infty}"),
    ("hedge: gold or another", "1", "\\boxed{1} or \\boxed{2}"),
    ("hedge: another or gold", "2", "\\boxed{1} or \\boxed{2}"),
    ("hedge: adjacent boxes", "42", "$\\boxed{7}\\boxed{42}$"),
    ("answer spam with gold last", "4", " ".join(f"Maybe \\boxed{{{k}}}." for k in range(5))),
    ("answer spam, many", "17", " ".join(f"\\boxed{{{k}}}" for k in range(200))),
    ("gold in an answer tag, wrong box", "42", "<answer>42</answer> so \\boxed{7}"),
    ("gold after ####, wrong box", "42", "\\boxed{7}\n#### 42"),
    ("right-to-left override", "42", "\\boxed{\u202e24}"),
    ("zero-width joiner in gold", "42", "\\boxed{4\u200d2\u200d1}"),
    ("huge power tower", "10", "\\boxed{10^{10^{10}}}"),
    ("huge factorial", "10", "\\boxed{(10^{6})!}"),
    ("deeply nested braces", "2", "\\boxed{" + "{" * 5000 + "1" + "}" * 5000 + "}"),
    ("deeply nested fractions", "1", "\\boxed{" + "\\frac{1}{" * 2000 + "2" + "}" * 2000 + "}"),
    ("1 MB inside the box", "1", "\\boxed{" + "1" * MB + "}"),
    ("unbalanced box then gold", "42", "\\boxed{" + "{" * 1000 + " 42"),
]


@pytest.mark.parametrize("name,gold,response", HACKS, ids=[h[0] for h in HACKS])
def test_hacking_probes_are_rejected_in_time(name, gold, response):
    v = timed_verify(gold, response)
    assert not v.correct, (name, v)


JUNK_1MB = [
    "a" * MB,
    "{" * MB,
    "}" * MB,
    "\\" * MB,
    "$" * MB,
    "\\boxed{" * (MB // 7),
    "\\boxed 1 " * (MB // 9),
    "\\boxed{1}" * (MB // 9),
    "<answer>" * (MB // 8),
    "<answer>7</answer>" + "<answer>" * (MB // 8),
    "the answer is " * (MB // 14),
    "#### " * (MB // 5),
    "\\frac{" * (MB // 6),
    "1" * MB,
    "\U0001f600\u0301\u200b\ud800\x00" * (MB // 5),
    "x" * (3 * MB) + "\\boxed{42}",  # the response cap keeps the tail
]


@pytest.mark.parametrize("response", JUNK_1MB, ids=[repr(r[:12]) + f"x{len(r)}" for r in JUNK_1MB])
def test_megabyte_junk_returns_in_time(response):
    v = timed_verify("42", response)
    assert v.correct == response.endswith("\\boxed{42}")


def test_response_cap_reads_the_tail():
    assert timed_verify("42", "\\boxed{7}" + " " * MAX_RESPONSE_CHARS + "\\boxed{42}").correct
    assert not timed_verify("42", "\\boxed{42}" + " " * MAX_RESPONSE_CHARS).correct  # the box was cut off


def test_unicode_junk():
    for response in ["\x00\x01\x02", "\ud800\udfff", "Ω≈ç√∫˜µ≤≥÷", "\\boxed{\ud83d}", "\\boxed{\x00}", "🙂" * 1000]:
        assert not timed_verify("42", response).correct


def test_pool_recovers_after_hostile_input():
    # The probes above killed workers; legitimate work proceeds once replacements are up (30 s is generous).
    assert verify("x^2", "so \\boxed{x \\cdot x}", timeout=30, fast_path=False).correct


PIECES = ["\\boxed{", "{", "}", "\\frac", "^", "_", "\\sqrt", "10", "9", "x", "=", "<answer>", "</answer>", "####",
          "The answer is ", ",", ".", "\\left(", "\\right)", "\\text{", "\\infty", "!", "\\pi", " ", "\n", "\\", "$"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=8)), max_size=40), st.sampled_from(["42", "x^2"]))
def test_fuzz_any_text_gives_a_verdict_in_time(pieces, gold):
    timed_verify(gold, "".join(pieces))


@settings(max_examples=40, deadline=None)
@given(st.text(max_size=2000))
def test_fuzz_random_unicode(text):
    timed_verify("\\frac{1}{2}", text)
