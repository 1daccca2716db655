"""The Countdown verifier: whitelist, exactly-once rule, exact arithmetic, bounds, and a fuzz test."""

import time
from collections import Counter
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlvr_envs.verifiers.countdown import verify

NUMS = [30, 100, 93]


def ans(expr: str) -> str:
    return f"Let me think... <answer>{expr}</answer>"


@pytest.mark.parametrize("expr", ["30 - (100 - 93)", "30+93-100", "(30 + 93) - 100", "93 - 100 + 30",
                                  "30 - 100 + 93 = 23", "23 = 30 - 100 + 93", "$30 − (100 − 93)$",
                                  "((30) - ((100) - (93)))", " 30 - ( 100 - 93 ) \n"])
def test_accepts_correct_expressions(expr):
    v = verify(NUMS, 23, ans(expr))
    assert v.correct and v.reward == 1.0 and v.format_ok and v.error is None


def test_latex_operators_and_boxed_fallback():
    assert verify([2, 3, 4], 24, ans("2 \\times 3 \\times 4")).correct
    assert verify([8, 2, 3], 12, ans("8 \\div 2 \\cdot 3")).correct
    assert verify([8, 2, 3], 12, ans("8 ÷ 2 × 3")).correct
    v = verify(NUMS, 23, "so \\boxed{30 - (100 - 93)}")
    assert v.correct and not v.format_ok  # graded, but not the requested <answer> format


def test_exact_rational_arithmetic():
    assert verify([1, 3, 4, 6], 24, ans("6 / (1 - 3 / 4)")).correct
    assert not verify([1, 2, 3], 1, ans("1 / 2 * 3")).correct  # 3/2, not 1 (no float rounding, no int division)
    assert not verify([7, 2, 1], 3, ans("7 / 2 - 1")).correct  # 5/2 is not 3 (floor division would say 2)


@pytest.mark.parametrize("expr, why", [
    ("30 + 93 - 100 + 100 - 100", "exactly once"),    # a number used twice
    ("30 - 100 + 93 + 0", "exactly once"),            # a number not given
    ("30 - 7", "exactly once"),                       # numbers missing
    ("-30 + 100 - 93 + 46", "characters|exactly once|unary"),
    ("30 - (100 - 93", "unbalanced"),
    ("30 + 93 - 100 = 24", "equation"),
    ("30 + 93 - 100 = 23 = 23", "equation"),
    ("30 ** 2", "not allowed|exactly once"),
    ("2 ** 10 ** 10 ** 10", "not allowed"),
    ("30 // 100 + 93", "not allowed"),
    ("30 % 100 + 93", "characters"),
    ("-(30 - 100) - 93", "unary"),
    ("+30 - 100 + 93", "unary"),
    ("30.0 - 100 + 93", "characters"),
    ("0x1e - 100 + 93", "characters"),
    ("__import__('os').system('ls')", "characters"),
    ("abs(30) - 100 + 93", "characters"),
    ("(30).real - 100 + 93", "characters"),
    ("[30][0] - 100 + 93", "characters"),
    ("30 if 1 else 2", "characters"),
    ("30 (100) 93", "not allowed|not a valid"),
    ("30 100 93", "not a valid"),
    ("030 - 100 + 93", "not a valid"),
    ("30 / (100 - 100) + 93", "division by zero|exactly once"),
    ("", "no final answer|empty"),
    ("1" * 20 + " + 100 + 93", "longer than"),
    ("(" * 50 + "30" + ")" * 50 + " - 100 + 93", "nested deeper|too long"),
    (" + ".join(["1"] * 200), "too long|more than"),
])
def test_rejects(expr, why):
    v = verify(NUMS, 23, ans(expr))
    assert not v.correct and v.reward == 0.0
    assert v.error is not None and any(w in v.error for w in why.split("|")), v.error


def test_division_by_zero_is_an_error_not_a_crash():
    v = verify([5, 3, 3], 5, ans("5 / (3 - 3)"))
    assert not v.correct and "division by zero" in v.error


def test_magnitude_bound():
    nums = [999999999999] * 6
    v = verify(nums, 1, ans(" * ".join(map(str, nums))))  # 10^72: beyond the magnitude bound
    assert not v.correct and "too large" in v.error


def test_only_the_last_answer_counts_and_no_answer_fails():
    assert not verify(NUMS, 23, ans("30 - (100 - 93)") + " wait, " + ans("30 + 100 + 93")).correct
    assert verify(NUMS, 23, ans("30 + 100 + 93") + " no: " + ans("30 - (100 - 93)")).correct
    v = verify(NUMS, 23, "30 - (100 - 93) = 23")
    assert not v.correct and "no final answer" in v.error
    assert not verify(NUMS, 23, "<answer>23</answer>").correct  # the target alone is not an expression of the numbers


def test_hostile_sizes_return_fast():
    for text in ["<answer>" + "(" * 100_000 + "</answer>", "<answer>" + "9" * 1_000_000 + "</answer>",
                 "<answer>" + "1+" * 500_000 + "1</answer>", "\\boxed{" * 10_000, "<answer>" * 100_000]:
        t0 = time.perf_counter()
        v = verify(NUMS, 23, text)
        assert not v.correct and time.perf_counter() - t0 < 2.0


# -- property tests -----------------------------------------------------------------------------------------------

def _tree(leaves):
    ops = st.sampled_from("+-*/")
    return st.recursive(leaves, lambda kids: st.tuples(kids, ops, kids), max_leaves=6)


def _render(node) -> str:
    if isinstance(node, int):
        return str(node)
    a, op, b = node
    return f"({_render(a)} {op} {_render(b)})"


def _value(node):
    if isinstance(node, int):
        return Fraction(node)
    a, op, b = node
    x, y = _value(a), _value(b)
    if op == "/" and y == 0:
        return None
    if x is None or y is None:
        return None
    return {"+": x + y, "-": x - y, "*": x * y, "/": x / y if y else None}[op]


def _leaves(node):
    return [node] if isinstance(node, int) else _leaves(node[0]) + _leaves(node[2])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_tree(st.integers(0, 120)), st.data())
def test_property_exactly_once_rule(tree, data):
    """An expression is accepted iff its literals are exactly the given multiset and its exact value is the target."""
    leaves = _leaves(tree)
    value = _value(tree)
    target = int(value) if value is not None and value.denominator == 1 else 7
    mode = data.draw(st.sampled_from(["same", "extra", "missing", "swap"]))
    numbers = list(leaves)
    if mode == "extra":
        numbers.append(data.draw(st.integers(0, 120)))
    elif mode == "missing" and len(numbers) > 1:
        numbers.pop()
    elif mode == "swap":
        numbers[0] = data.draw(st.integers(0, 120))
    v = verify(numbers, target, ans(_render(tree)))
    expected = Counter(numbers) == Counter(leaves) and value is not None and value == target
    assert v.correct == expected, (numbers, target, _render(tree), v)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300), st.lists(st.integers(0, 100), min_size=3, max_size=6), st.integers(-10, 1000))
def test_property_never_raises_on_any_text(text, numbers, target):
    for response in (text, ans(text), f"\\boxed{{{text}}}"):
        v = verify(numbers, target, response)
        assert isinstance(v.correct, bool) and v.reward in (0.0, 1.0)
        if v.correct:  # anything accepted really is a whitelisted expression over exactly these numbers
            assert v.error is None


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="0123456789+-*/() ", max_size=80), st.lists(st.integers(0, 20), min_size=3, max_size=4))
def test_property_operator_soup_never_raises(expr, numbers):
    v = verify(numbers, 10, ans(expr))
    assert v.reward in (0.0, 1.0)
