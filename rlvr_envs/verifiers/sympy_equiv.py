"""A second math verifier, independent of Math-Verify: LaTeX normalization written here + SymPy equivalence.

``rlvr audit`` re-checks results with it, so that the first verifier's false negatives (and false positives) show up
as disagreements. It shares no parsing code with Math-Verify or latex2sympy: the answer is normalized here, converted
to a SymPy expression string and read by ``sympy.parsing.sympy_parser.parse_expr``. (SymPy's own ``parse_latex``
needs ANTLR 4.11, and the environment pins the 4.13 runtime that latex2sympy wants, so it is not used.)

``judge(gold, answer) -> (status, reason)`` decides in this process; ``verify_answer(gold, answer, timeout)`` runs
``judge`` in the math verifier's killable worker processes (``rlvr_envs.verifiers.math.pool``) under a hard
wall-clock limit and returns a ``Verdict``. Three outcomes: "correct", "wrong", and "unverifiable" when either side
cannot be read (an unsupported LaTeX command, prose, a relation, anything outside the character whitelist) or the
check runs out of time or memory.

Normalization: ``\\boxed``/``$``/``\\(\\)`` wrappers, ``\\left``/``\\right`` and spacing commands, ``\\text{}`` unit
words (``5\\text{ cm}``) and trailing unit words, ``\\$``, degrees (``^\\circ``), percent signs (``25\\%`` is 25, the
MATH convention), thousands commas (``1,000``); ``\\frac``/``\\dfrac``/``\\tfrac``, ``\\sqrt[n]{}``, ``^``, ``\\pi``,
``\\cdot``, ``\\times``, ``\\div``, ``\\infty``, ``\\binom``, trig and log functions, ``|x|``, Greek letters, ``e``
and ``i`` as constants; structures: tuples and intervals (brackets must match: ``[1, 2)`` is not ``(1, 2)``), unions
of intervals (``\\cup``), sets ``\\{..\\}`` and bare comma lists (order-free), ``pmatrix``/``bmatrix`` matrices,
``x = 5`` (the value 5) and equations. A text answer (``\\text{Monday}``, ``(C)``) is compared as normalized text.

Equivalence: equal structures, and for every pair of values ``a == b``, else ``simplify(a - b) == 0``, else
numeric closeness (relative 1e-9) of ``a - b``: at the value itself when it has no symbols, at five fixed points
otherwise. Two equations are equivalent when one's ``lhs - rhs`` is a non-zero constant multiple of the other's.

Safety: ``parse_expr`` evaluates Python, so only a converted string that passes a character whitelist
(``[0-9A-Za-z+*/().!, -]``), whose every name is a single letter or a whitelisted SymPy function or constant, and
that is at most ``MAX_EXPR_CHARS`` long is ever handed to it, with ``__builtins__`` emptied and only SymPy number and
symbol constructors in its namespace. Underscores, quotes, brackets, colons and any non-ASCII character are refused
before conversion, so ``__import__``, ``lambda`` and attribute access cannot be written. Values whose numbers would
exceed ``MAX_DIGITS`` digits (power towers, huge exponents and factorials) are refused before they are evaluated;
``verify_answer`` adds the worker's time and memory caps (``simplify`` itself can be slow).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from rlvr_envs.core import CORRECT, UNVERIFIABLE, WRONG, Verdict
from rlvr_envs.extract import _braced

MAX_ANSWER_CHARS = 400
MAX_EXPR_CHARS = 600
MAX_DIGITS = 20_000  # a value whose numbers would have more digits than this is refused before it is evaluated
MAX_LITERAL_DIGITS = 60
REL_TOL = 1e-9
_SAMPLE_POINTS = (0.3718, 1.2457, -0.8123, 2.7183, 0.5772)  # where two symbolic expressions are compared numerically


class Unparseable(ValueError):
    """The text cannot be read by this verifier (the verdict is "unverifiable", not "wrong")."""


# -- names the converted string may contain ----------------------------------------------------------------------

_FUNCTIONS = ("sqrt", "sin", "cos", "tan", "cot", "sec", "csc", "asin", "acos", "atan", "sinh", "cosh", "tanh",
              "log", "exp", "Abs", "floor", "ceiling", "binomial", "root")
_CONSTANTS = ("pi", "oo", "E", "I")
_GREEK = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "mu", "nu", "xi",
          "rho", "sigma", "tau", "phi", "chi", "psi", "omega")
_COMMAND_NAMES = {  # LaTeX command -> name in the converted string
    "pi": "pi", "infty": "oo", "infinity": "oo",
    "sin": "sin", "cos": "cos", "tan": "tan", "cot": "cot", "sec": "sec", "csc": "csc",
    "arcsin": "asin", "arccos": "acos", "arctan": "atan", "sinh": "sinh", "cosh": "cosh", "tanh": "tanh",
    "ln": "log", "log": "log", "exp": "exp",
    **{g: g for g in _GREEK}, "varepsilon": "epsilon", "vartheta": "theta", "varphi": "phi",
}
_OPERATOR_COMMANDS = {"cdot": "*", "times": "*", "div": "/", "ast": "*"}
_DROP_COMMANDS = ("displaystyle", "textstyle", "left", "right", "bigl", "bigr", "Bigl", "Bigr", "big", "Big",
                  "quad", "qquad", "limits", "mathrm", "mathbf", "mathit", "boldsymbol")
_TEXT_COMMANDS = ("text", "textbf", "textit", "textrm", "mathrm", "mbox", "mathbf", "operatorname")
_UNIT_WORDS = {
    "unit", "units", "cm", "mm", "km", "m", "meter", "meters", "metre", "metres", "centimeter", "centimeters",
    "inch", "inches", "in", "foot", "feet", "ft", "yard", "yards", "mile", "miles", "mph", "kg", "g", "gram", "grams",
    "pound", "pounds", "lb", "lbs", "ounce", "ounces", "oz", "second", "seconds", "sec", "minute", "minutes", "min",
    "hour", "hours", "hr", "hrs", "day", "days", "week", "weeks", "month", "months", "year", "years",
    "dollar", "dollars", "cent", "cents", "degree", "degrees", "square", "sq", "cubic", "percent", "liter", "liters",
    "gallon", "gallons", "people", "students", "ways", "times", "points",
}
_INEQUALITY = re.compile(r"<|>|\\(?:le|ge|leq|geq|lt|gt|neq|ne|leqslant|geqslant|approx|sim)(?![a-zA-Z])|[≤≥≠]")
_SPACING = re.compile(r"(?<!\\)\\[,;:! ]|~")  # not the "\\ " that ends a matrix row
_THOUSANDS = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_SAFE = re.compile(r"[0-9A-Za-z+\-*/().!, ]*")
_BASE_N = re.compile(r"[0-9A-Fa-f]+\s*_\s*(?:\d+|\{\s*\d+\s*\})")
_PLUS_MINUS = re.compile(r"\\(?:pm|mp)(?![a-zA-Z])")
_MIXED_NUMBER = re.compile(r"([+-]?)\s*(\d+)\s*\\frac\{\s*(\d+)\s*\}\{\s*(\d+)\s*\}")
_TOKEN = re.compile(r"\s*(?:(\d+\.\d*|\.\d+|\d+)|([A-Za-z]+)|(\*\*|[-+*/(),!]))")


@dataclass(frozen=True)
class Parsed:
    """A read answer: ``kind`` is "value", "equation" (items: lhs - rhs), "tuple" (ordered; ``brackets`` such as
    "()" or "[)"), "set" (order-free), "union" (of intervals, order-free), "matrix" (rows of values) or "text"."""

    kind: str
    items: tuple[Any, ...]
    brackets: str = ""


# -- stage 1: LaTeX clean-up --------------------------------------------------------------------------------------


def _replace_groups(s: str, command: str, render: Any) -> str:
    """Replace every ``\\command{arg}`` (one brace group) with ``render(arg)``."""
    pattern = re.compile(r"\\" + command + r"(?![a-zA-Z])\s*")
    out, pos = [], 0
    while (m := pattern.search(s, pos)) is not None:
        j = m.end()
        if j < len(s) and s[j] == "{":
            got = _braced(s, j)
            if got is None:
                raise Unparseable("unbalanced braces")
            out.append(s[pos:m.start()] + render(got[0]))
            pos = got[1]
        else:
            out.append(s[pos:m.end()])
            pos = m.end()
    out.append(s[pos:])
    return "".join(out)


def _unwrap(s: str) -> str:
    s = s.strip()
    for _ in range(4):
        before = s
        s = s.strip().strip("$").strip()
        for left, right in (("\\(", "\\)"), ("\\[", "\\]")):
            if s.startswith(left) and s.endswith(right):
                s = s[len(left):-len(right)].strip()
        m = re.match(r"\\(?:boxed|fbox)\s*\{", s)
        if m and (got := _braced(s, m.end() - 1)) is not None and got[1] == len(s):
            s = got[0]
        if s.endswith("."):
            s = s[:-1]
        if s == before:
            break
    return s.strip()


def _text_key(s: str) -> str:
    """A text answer compared as text: wrappers, text commands, spacing, case, and outer parentheses ignored."""
    s = _unwrap(s)
    for cmd in _TEXT_COMMANDS:
        s = _replace_groups(s, cmd, lambda arg: arg)
    s = _SPACING.sub("", s).replace("\\", "")
    return re.sub(r"[\s(){}.]", "", s).lower()


def clean_latex(answer: str) -> str:
    """Stage 1: the answer with wrappers, layout, units, degrees, percent signs and thousands commas removed.
    Raises ``Unparseable`` for what this verifier does not read."""
    if not isinstance(answer, str):
        raise Unparseable(f"not text: {type(answer).__name__}")
    if len(answer) > MAX_ANSWER_CHARS:
        raise Unparseable(f"longer than {MAX_ANSWER_CHARS} characters")
    if not answer.isascii():
        allowed = {"°": "^\\circ", "−": "-", "π": "\\pi", "√": "\\sqrt", "∞": "\\infty", "×": "\\times",
                   "·": "\\cdot", "÷": "\\div", "∪": "\\cup"}
        answer = "".join(allowed.get(c, c) for c in answer)
        if not answer.isascii():
            raise Unparseable("non-ASCII characters")
    s = _unwrap(answer)
    if _INEQUALITY.search(s):
        raise Unparseable("a relation (inequality) is not compared")
    s = _SPACING.sub(" ", s)
    s = re.sub(r"\\(?:d|t)frac(?![a-zA-Z])", r"\\frac", s)
    s = re.sub(r"\\(?:d|t)binom(?![a-zA-Z])", r"\\binom", s)
    if "\\circ" in s and re.search(r"\\(?:sin|cos|tan|cot|sec|csc)(?![a-zA-Z])", s):
        raise Unparseable("a trigonometric function of degrees")  # dropping the degree sign would read radians
    s = re.sub(r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|\\circ|\\degree", "", s)
    s = s.replace("\\%", "").replace("%", "").replace("\\$", "").replace("{,}", ",")
    s = re.sub(r"\\(?:" + "|".join(_DROP_COMMANDS) + r")(?![a-zA-Z])", "", s)
    s = re.sub(r"\\in(?![a-zA-Z])", "=", s)  # "x \\in [2, 5]" names the answer like "x = ..."

    def text_group(arg: str) -> str:
        words = arg.strip().lower()
        if words in ("or", "and"):
            return ","
        if words and all(w.strip(".") in _UNIT_WORDS for w in re.split(r"[\s^\d]+", words) if w):
            return " "  # "5\text{ cm}", "\text{ square units}", "30\mbox{ degrees}"
        return "\\text{" + arg + "}"  # kept: a text answer, recognized in read_answer

    for cmd in ("text", "textbf", "textit", "textrm", "mbox", "operatorname"):
        s = _replace_groups(s, cmd, text_group)
    # trailing unit words written without \text ("5 cm", "12 square units", "45 degrees")
    # (a space before it, two letters at least: "2m" and "3 g" may be products)
    while (m := re.search(r"(?<=[\d})])\s+([A-Za-z]{2,}(?:\^\d)?)\s*$", s)) and \
            m.group(1).split("^")[0].lower() in _UNIT_WORDS:
        s = s[:m.start()]
    s = s.strip()
    if _THOUSANDS.fullmatch(s.replace(" ", "")):
        s = s.replace(",", "").replace(" ", "")
    return s


# -- stage 2: structure ------------------------------------------------------------------------------------------


def _split_top(s: str, sep: str) -> list[str]:
    """Split at ``sep`` outside braces and parentheses (brackets may be half-open intervals, so not counted)."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(s):
        c = s[i]
        if c == "\\" and s.startswith(sep, i) and depth == 0:
            parts.append(s[start:i])
            i += len(sep)
            start = i
            continue
        if c == "\\":
            i += 2
            continue
        if c in "{(":
            depth += 1
        elif c in "})":
            depth -= 1
        elif depth == 0 and s.startswith(sep, i):
            parts.append(s[start:i])
            i += len(sep)
            start = i
            continue
        i += 1
    parts.append(s[start:])
    return parts


def _matrix(s: str) -> Parsed | None:
    m = re.fullmatch(r"\\begin\{([pbvB]?matrix)\}(.*)\\end\{\1\}", s, re.DOTALL)
    if not m:
        return None
    rows = [r for r in m.group(2).split("\\\\") if r.strip()]
    cells = tuple(tuple(_value(c) for c in row.split("&")) for row in rows)
    if not cells or len({len(r) for r in cells}) != 1:
        raise Unparseable("a ragged matrix")
    return Parsed("matrix", cells)


def read_answer(answer: str) -> Parsed:
    """Read one answer (gold or model) into a ``Parsed`` structure; ``Unparseable`` if it cannot be read."""
    s = clean_latex(answer)
    if not s:
        raise Unparseable("empty answer")
    if re.fullmatch(r"(?:\\text\{[^{}]*\}\s*)+", s) or re.fullmatch(r"\(?[A-Ea-e]\)", s) or _BASE_N.fullmatch(s):
        return Parsed("text", (_text_key(answer),))  # "\text{Monday}", "(C)", "52_8" (digits in base 8)
    sides = _split_top(s, "=")
    if len(sides) == 2 and re.fullmatch(r"\s*[A-Za-z]\s*(?:\(\s*[A-Za-z]\s*\))?\s*", sides[0]):
        return read_answer(sides[1])  # "x = 5", "f(x) = ...", "x \\in [2, 5]": the named value
    if s in ("\\emptyset", "\\varnothing", "\\{\\}"):
        return Parsed("set", ())
    if (matrix := _matrix(s)) is not None:
        return matrix
    if s.startswith("\\{") and s.endswith("\\}"):
        return Parsed("set", _values(_split_top(s[2:-2], ",")))
    unions = _split_top(s, "\\cup")
    if len(unions) > 1:
        return Parsed("union", tuple(_interval(p.strip()) for p in unions))
    if s[0] in "([" and s[-1] in ")]" and _closes_at_end(s):
        inner = _split_top(s[1:-1], ",")
        if len(inner) > 1:
            return Parsed("tuple", tuple(_value(p) for p in inner), s[0] + s[-1])
    items = _split_top(s, ",")
    if len(items) > 1 or _PLUS_MINUS.search(s):  # "1, 2, 3", "1 \\pm \\sqrt{2}": solutions, order-free
        return Parsed("set", _values(items))
    if len(sides) == 2:
        return Parsed("equation", (_value(sides[0]) - _value(sides[1]),))
    if len(sides) > 2:
        raise Unparseable("a chain of equations")
    return Parsed("value", (_value(s),))


def _closes_at_end(s: str) -> bool:
    """Whether the opening bracket at ``s[0]`` is the one closed by ``s[-1]`` (not "(1)(2)")."""
    depth = 0
    for i, c in enumerate(s):
        if c in "([":
            depth += 1
        elif c in ")]":
            depth -= 1
            if depth == 0:
                return i == len(s) - 1
    return False


def _interval(s: str) -> Parsed:
    if not (s and s[0] in "([" and s[-1] in ")]"):
        raise Unparseable("a union of something other than intervals")
    inner = _split_top(s[1:-1], ",")
    if len(inner) != 2:
        raise Unparseable("an interval needs two endpoints")
    return Parsed("tuple", tuple(_value(p) for p in inner), s[0] + s[-1])


# -- stage 3: LaTeX expression -> SymPy expression string -> SymPy --------------------------------------------------


def _convert_commands(s: str) -> str:
    s = _replace_groups(s, "text", lambda arg: _raise(f"text inside an expression: {arg[:40]!r}"))
    # \frac{a}{b} and \frac12, \binom{a}{b}, \sqrt[n]{x}, \sqrt{x}, \sqrt2: innermost first, by repeated passes
    for _ in range(64):
        m = re.search(r"\\(frac|binom|sqrt)(?![a-zA-Z])\s*", s)
        if not m:
            break
        j = m.end()
        name = m.group(1)
        if name == "sqrt":
            index = None
            if j < len(s) and s[j] == "[":
                close = s.find("]", j)
                if close < 0:
                    raise Unparseable("unclosed \\sqrt[")
                index, j = s[j + 1:close], close + 1
                while j < len(s) and s[j] == " ":
                    j += 1
            arg, j = _argument(s, j)
            rendered = f"sqrt({arg})" if index is None else f"(({arg})**(1/({index})))"
        else:
            a, j = _argument(s, j)
            while j < len(s) and s[j] == " ":
                j += 1
            b, j = _argument(s, j)
            rendered = f"(({a})/({b}))" if name == "frac" else f"binomial({a},{b})"
        s = s[:m.start()] + rendered + s[j:]
    else:
        raise Unparseable("too many nested commands")
    s = re.sub(r"\\lfloor(.*?)\\rfloor", r"floor(\1)", s)
    s = re.sub(r"\\lceil(.*?)\\rceil", r"ceiling(\1)", s)
    s = re.sub(r"\\[lr]vert|\\mid|\\vert", "|", s)
    if s.count("|") == 2:
        a, b = s.index("|"), s.rindex("|")
        s = f"{s[:a]}Abs({s[a + 1:b]}){s[b + 1:]}"
    elif "|" in s:
        raise Unparseable("absolute value bars that do not pair up")

    def command(m: re.Match) -> str:
        name = m.group(1)
        if name in _OPERATOR_COMMANDS:
            return _OPERATOR_COMMANDS[name]
        if name in _COMMAND_NAMES:
            return f" {_COMMAND_NAMES[name]} "
        raise Unparseable(f"unsupported command \\{name}")

    s = re.sub(r"\\([a-zA-Z]+)", command, s)
    if "\\" in s:
        raise Unparseable("a stray backslash")
    s = s.replace("{", "(").replace("}", ")").replace("^", "**")
    return s


def _raise(message: str) -> str:
    raise Unparseable(message)


def _argument(s: str, j: int) -> tuple[str, int]:
    """The argument at ``s[j]``: a brace group or a single character (``\\frac12``)."""
    if j >= len(s):
        raise Unparseable("a command without its argument")
    if s[j] == "{":
        got = _braced(s, j)
        if got is None:
            raise Unparseable("unbalanced braces")
        return got
    if s[j].isalnum():
        return s[j], j + 1
    raise Unparseable("a command without its argument")


def latex_to_sympy_text(latex: str) -> str:
    """Stage 3a: one LaTeX value as a SymPy expression string over whitelisted names, with explicit ``*``."""
    s = _convert_commands(latex.strip())
    if not _SAFE.fullmatch(s):  # no quotes, underscores, brackets, colons, dots outside numbers' reach, non-ASCII
        bad = sorted({c for c in s if not _SAFE.fullmatch(c)})[:5]
        raise Unparseable(f"characters outside the whitelist: {bad!r}")
    tokens: list[tuple[str, str]] = []  # (kind, text): kind is "num", "name", "func" or the operator itself
    pos = 0
    while pos < len(s):
        m = _TOKEN.match(s, pos)
        if m is None or m.end() == pos:
            if s[pos:].strip() == "":
                break
            raise Unparseable(f"cannot read {s[pos:pos + 20]!r}")
        pos = m.end()
        num, name, op = m.groups()
        if num is not None:
            if len(num) > MAX_LITERAL_DIGITS:
                raise Unparseable("a number literal that is too long")
            tokens.append(("num", num))
        elif name is not None:
            tokens.extend(_names(name))
        else:
            tokens.append((op, op))
    out: list[str] = []
    prev = ""
    for kind, text in tokens:
        operand_start = kind in ("num", "name", "func", "(")
        if operand_start and prev in ("num", "name", ")", "!"):
            out.append("*")  # implicit multiplication: 2x, 2(x+1), (x+1)(x-1), x sqrt(2)
        if prev == "func" and kind != "(":
            if kind not in ("num", "name"):
                raise Unparseable("a function without its argument")
            out.append(f"({text})")  # "\\ln 2", "\\sin x": the function of the next number or name
            prev = ")"
            continue
        out.append(text)
        prev = kind
    text = "".join(out)
    if len(text) > MAX_EXPR_CHARS:
        raise Unparseable(f"expression longer than {MAX_EXPR_CHARS} characters")
    return text


def _names(word: str) -> list[tuple[str, str]]:
    """A run of letters as tokens: a whitelisted function or constant, a Greek letter, ``e``/``i`` as E/I, or
    single-letter symbols (``xy`` is x*y). A longer run of letters that is none of these is prose: unreadable."""
    if word in _FUNCTIONS:
        return [("func", word)]
    if word in _CONSTANTS or word in _GREEK:
        return [("name", word)]
    if len(word) > 2:
        raise Unparseable(f"a word, not math: {word[:20]!r}")
    return [("name", {"e": "E", "i": "I"}.get(c, c)) for c in word]


def _namespace() -> tuple[dict[str, Any], dict[str, Any]]:
    import sympy

    globals_ = {"__builtins__": {}, "Integer": sympy.Integer, "Float": sympy.Float, "Rational": sympy.Rational,
                "Symbol": sympy.Symbol, "factorial": sympy.factorial, "Add": sympy.Add, "Mul": sympy.Mul,
                "Pow": sympy.Pow}  # Add, Mul, Pow: what parse_expr(evaluate=False) writes
    locals_: dict[str, Any] = {name: getattr(sympy, name) for name in _FUNCTIONS if name != "root"}
    locals_.update(pi=sympy.pi, oo=sympy.oo, E=sympy.E, I=sympy.I)
    locals_.update({g: sympy.Symbol(g) for g in _GREEK})
    return globals_, locals_


def _sympy_value(text: str, *, evaluate: bool) -> Any:
    from sympy.parsing.sympy_parser import auto_number, auto_symbol, factorial_notation, parse_expr

    globals_, locals_ = _namespace()
    try:
        return parse_expr(text, local_dict=locals_, global_dict=globals_, evaluate=evaluate,
                          transformations=(auto_symbol, auto_number, factorial_notation))
    except Exception as exc:  # SyntaxError, TypeError, TokenError...: the text is not an expression
        raise Unparseable(f"SymPy could not parse {text[:60]!r}: {type(exc).__name__}") from None


def _magnitude(node: Any) -> float:
    """A rough upper bound on the decimal digits of the numbers that evaluating ``node`` (unevaluated) produces;
    ``Unparseable`` as soon as it is clearly too big (power towers, huge exponents or factorials)."""
    import sympy

    if node.is_Integer:
        return math.log10(abs(int(node)) + 1)
    if node.is_Rational:
        return math.log10(abs(node.p) + 1) + math.log10(node.q + 1)
    if node.is_Float or node.is_Atom:
        return 1.0  # floats keep their precision; symbols and constants are not expanded
    if isinstance(node, (sympy.Pow, sympy.factorial, sympy.binomial)):
        args = node.args
        if any(a.free_symbols for a in args):  # symbolic: SymPy does not expand it
            return sum(_magnitude(a) for a in args)
        size = [_magnitude(a) for a in args]
        if max(size[1:] if isinstance(node, sympy.Pow) else size) > 6:
            raise Unparseable("an exponent, factorial or binomial argument of a million or more")
        if isinstance(node, sympy.Pow):
            exponent = abs(complex(node.exp.evalf(15)))
            digits = max(1.0, size[0]) * max(1.0, exponent)
        else:
            n = abs(complex(args[0].evalf(15)))
            digits = n * math.log10(n + 1) + 1
    elif isinstance(node, sympy.Mul):
        digits = sum(_magnitude(a) for a in node.args)
    else:  # Add, elementary functions, Abs, floor...
        digits = max((_magnitude(a) for a in node.args), default=1.0) + 1
    if digits > MAX_DIGITS:
        raise Unparseable(f"a value of more than {MAX_DIGITS} digits")
    return digits


def _values(items: list[str]) -> tuple[Any, ...]:
    """The values of a list's items; an item with one ``\\pm`` (or ``\\mp``) is two values."""
    out = []
    for item in items:
        signs = _PLUS_MINUS.findall(item)
        if len(signs) > 1:
            raise Unparseable("more than one \\pm in an item")
        if signs:
            out += [_value(_PLUS_MINUS.sub(sign, item)) for sign in "+-"]
        else:
            out.append(_value(item))
    return tuple(out)


def _value(latex: str) -> Any:
    """One LaTeX value as a SymPy expression (``Unparseable`` if it cannot be read safely)."""
    if not latex.strip():
        raise Unparseable("an empty item")
    if m := _MIXED_NUMBER.fullmatch(latex.strip()):  # "15\\frac{39}{40}" is 15 + 39/40, not 15 * 39/40
        latex = f"{m.group(1)}({m.group(2)}+\\frac{{{m.group(3)}}}{{{m.group(4)}}})"
    text = latex_to_sympy_text(latex)
    _magnitude(_sympy_value(text, evaluate=False))  # refuse values whose evaluation would not end
    return _sympy_value(text, evaluate=True)


# -- stage 4: equivalence ----------------------------------------------------------------------------------------


def _numeric(expr: Any) -> complex | None:
    try:
        value = complex(expr.evalf(30))
    except (TypeError, ValueError, OverflowError, ZeroDivisionError):
        return None
    return value if math.isfinite(value.real) and math.isfinite(value.imag) else None


def same_value(a: Any, b: Any) -> bool:
    """Whether two SymPy values are equal: structurally, by ``simplify(a - b) == 0``, or numerically close."""
    import sympy

    if a == b:
        return True
    if a.has(sympy.oo, -sympy.oo, sympy.zoo, sympy.nan) or b.has(sympy.oo, -sympy.oo, sympy.zoo, sympy.nan):
        return False  # infinities compare structurally only (oo - oo is nan)
    diff = a - b
    symbols = sorted(diff.free_symbols, key=str)
    if not symbols:
        d, ref = _numeric(diff), _numeric(b)
        if d is not None and ref is not None:
            return abs(d) <= REL_TOL * max(1.0, abs(ref))
    if sympy.simplify(diff) == 0:
        return True
    for point in _SAMPLE_POINTS:  # symbolic: equal as functions at several points
        at = {s: sympy.Float(point + 0.1 * k) for k, s in enumerate(symbols)}
        d, ref = _numeric(diff.subs(at)), _numeric(b.subs(at))
        if d is None or ref is None or abs(d) > REL_TOL * max(1.0, abs(ref)):
            return False
    return True


def _same_equation(a: Any, b: Any) -> bool:
    import sympy

    if same_value(a, b) or same_value(a, -b):
        return True
    if b == 0:
        return False
    ratio = sympy.simplify(a / b)
    return not ratio.free_symbols and ratio != 0 and ratio.is_finite is not False


def _matched(golds: tuple[Any, ...], answers: tuple[Any, ...], same: Any) -> bool:
    """Order-free equality: every gold item matched by a distinct answer item."""
    if len(golds) != len(answers):
        return False
    left = list(answers)
    for g in golds:
        hit = next((k for k, a in enumerate(left) if same(g, a)), None)
        if hit is None:
            return False
        del left[hit]
    return True


def equivalent(gold: Parsed, answer: Parsed) -> bool:
    """Whether two read answers are the same answer (see the module docstring)."""
    if gold.kind == "text" or answer.kind == "text":
        return gold.kind == answer.kind and gold.items == answer.items  # (judge compares a text gold as text)
    if gold.kind == "set" and len(gold.items) == 1 and answer.kind == "value":
        gold = Parsed("value", gold.items)  # "\{5\}" and "5"
    if answer.kind == "set" and len(answer.items) == 1 and gold.kind == "value":
        answer = Parsed("value", answer.items)
    if gold.kind != answer.kind:
        return False
    if gold.kind == "value":
        return same_value(gold.items[0], answer.items[0])
    if gold.kind == "equation":
        return _same_equation(gold.items[0], answer.items[0])
    if gold.kind == "tuple":
        return gold.brackets == answer.brackets and len(gold.items) == len(answer.items) and \
            all(same_value(g, a) for g, a in zip(gold.items, answer.items))
    if gold.kind == "set":
        return _matched(gold.items, answer.items, same_value)
    if gold.kind == "union":
        return _matched(gold.items, answer.items, equivalent)
    if gold.kind == "matrix":
        return len(gold.items) == len(answer.items) and all(
            len(gr) == len(ar) and all(same_value(g, a) for g, a in zip(gr, ar))
            for gr, ar in zip(gold.items, answer.items))
    raise Unparseable(f"unknown answer kind {gold.kind!r}")


def judge(gold: str, answer: str) -> tuple[str, str | None]:
    """``(status, reason)`` in this process: "correct", "wrong" or "unverifiable" (either side unreadable). No time
    limit: use ``verify_answer`` on untrusted text."""
    try:
        gold_parsed = read_answer(gold)
    except Unparseable as exc:
        return UNVERIFIABLE, f"gold unreadable: {exc}"
    except Exception as exc:  # SymPy failing on its own input is this verifier's limit, not a wrong answer
        return UNVERIFIABLE, f"gold unreadable: {type(exc).__name__}"
    if gold_parsed.kind == "text":  # "\\text{Monday}", "(C)": the answer is compared as text whatever it looks like
        same_text = _text_key(gold) == _text_key(answer)
        return (CORRECT, None) if same_text else (WRONG, "different text")
    try:
        answer_parsed = read_answer(answer)
    except Unparseable as exc:
        return UNVERIFIABLE, f"answer unreadable: {exc}"
    except Exception as exc:
        return UNVERIFIABLE, f"answer unreadable: {type(exc).__name__}"
    try:
        same = equivalent(gold_parsed, answer_parsed)
    except Exception as exc:
        return UNVERIFIABLE, f"comparison failed: {type(exc).__name__}"
    return (CORRECT, None) if same else (WRONG, "not equivalent")


def verify_answer(gold: str, answer: str, *, timeout: float = 10.0) -> Verdict:
    """``judge`` in a killable worker process with a hard wall-clock ``timeout`` (seconds) and the worker's memory
    cap; a check that runs out of either is unverifiable."""
    from rlvr_envs.verifiers.math import pool

    if not isinstance(gold, str) or not isinstance(answer, str):
        return Verdict.could_not_verify("gold and answer must be str")
    if len(answer) > MAX_ANSWER_CHARS:  # refused without a round trip
        return Verdict.could_not_verify(f"answer unreadable: longer than {MAX_ANSWER_CHARS} characters", parsed=answer[:200])
    result = pool().run("", answer, timeout, job=("sympy", gold))
    if result.unverifiable:
        return Verdict.could_not_verify(result.error or "unverifiable", parsed=answer, format_ok=True)
    if result.correct:
        return Verdict(correct=True, reward=1.0, parsed=answer, format_ok=True)
    return Verdict.failed(result.error or "not equivalent (sympy)", parsed=answer, format_ok=True)
