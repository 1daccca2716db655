"""The program each math-verifier worker process runs (see ``rlvr_envs.verifiers.math``).

Started as ``python -I _math_worker.py FD_IN FD_OUT``: it imports Math-Verify/SymPy (so ``rlvr_envs`` itself stays
light), warms the LaTeX parser, says "ready" and then answers ``(gold, answer)`` requests until its input closes. Math-Verify's own signal-based
timeouts are switched off here (``parsing_timeout=None``, ``timeout_seconds=None``): the parent process enforces a
hard wall-clock limit by killing the worker.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import warnings
from functools import lru_cache
from multiprocessing.connection import Connection

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

# Math-Verify warns once that its timeouts are off (we enforce our own) and logs every parse failure of model text;
# SymPy emits deprecation warnings on odd model input. None of it is news to the caller, whose stderr we share.
logging.getLogger("math_verify").setLevel(logging.ERROR)
warnings.simplefilter("ignore")

_CONFIG = (LatexExtractionConfig(), ExprExtractionConfig())
# Address-space cap so a runaway SymPy computation (say 10^(10^10)) fails with MemoryError instead of swapping.
MEMORY_LIMIT_BYTES = int(os.environ.get("RLVR_MATH_WORKER_MEM", str(3 * 1024**3)))


@lru_cache(maxsize=4096)  # a GRPO group repeats the same answers
def _parse(text: str) -> list:
    """``text`` is one bare answer; wrapping it in ``\\boxed{}`` makes Math-Verify read exactly it (boxed has top
    priority), and plain expressions like ``1/2`` still parse through ``ExprExtractionConfig``."""
    found = parse(f"\\boxed{{{text}}}", extraction_config=_CONFIG, parsing_timeout=None)
    if not found:  # unbalanced braces etc.: let Math-Verify look at the raw text
        found = parse(text, extraction_config=_CONFIG, parsing_timeout=None)
    return found


class GoldError(ValueError):
    """The reference side cannot be used (a gold answer Math-Verify cannot read, a generator that will not build):
    the verdict is "unverifiable", not a wrong answer."""


def check(gold: str, answer: str) -> bool:
    """Math-Verify equivalence of one gold answer and one extracted model answer (gold first: it is asymmetric)."""
    try:
        gold_parsed = _parse(gold)
    except Exception as exc:  # the gold, not the model's text, broke the parser
        raise GoldError(f"Math-Verify failed on the gold answer {gold[:200]!r}: {type(exc).__name__}") from exc
    if not gold_parsed:
        raise GoldError(f"Math-Verify could not parse the gold answer {gold[:200]!r}")
    return bool(verify(gold_parsed, _parse(answer), timeout_seconds=None))


@lru_cache(maxsize=64)
def _rg_dataset(task: str, config_json: str, seed: int, size: int):
    import json

    import reasoning_gym

    kwargs = json.loads(config_json)
    if task == "composite":
        from reasoning_gym.composite import DatasetSpec

        kwargs["datasets"] = [DatasetSpec(**d) for d in kwargs["datasets"]]
    return reasoning_gym.create_dataset(task, size=size, seed=seed, **kwargs)


def run_job(job: tuple, answer: str) -> bool:
    """Other verifiers that run untrusted-input code needing the same hard limit. ``("rg", task, config_json, seed,
    size, entry)``: reasoning-gym's ``score_answer`` on the parent's entry (some generators depend on the hash seed,
    so the entry is sent rather than regenerated here); full credit only. ``("sympy", gold)``: the audit's second
    math verifier (``rlvr_envs.verifiers.sympy_equiv.judge``); an answer or gold it cannot read is unverifiable."""
    if job[0] == "sympy":
        from rlvr_envs.verifiers.sympy_equiv import judge

        status, reason = judge(job[1], answer)
        if status == "unverifiable":
            raise GoldError(reason or "unverifiable")
        return status == "correct"
    if job[0] != "rg":
        raise ValueError(f"unknown verifier job {job[0]!r}")
    _, task, config_json, seed, size, entry = job
    try:
        dataset = _rg_dataset(task, config_json, seed, size)
    except Exception as exc:  # the task's generator, not the answer, is broken
        raise GoldError(f"reasoning-gym could not build {task!r}: {type(exc).__name__}: {str(exc)[:200]}") from exc
    return float(dataset.score_answer(answer, entry)) >= 1.0


def _limit_memory() -> None:
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        cap = MEMORY_LIMIT_BYTES if hard == resource.RLIM_INFINITY else min(MEMORY_LIMIT_BYTES, hard)
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    except (ImportError, ValueError, OSError):  # not on this platform; the wall-clock kill still applies
        pass


def serve(rx: Connection, tx: Connection) -> None:
    """Worker main loop: receive ``(gold, answer, sleep_s)``, reply ``("result", correct, error, unverifiable)``;
    exit when the pipe closes. It also says ``("ready", ..)`` once at start and ``("warm", ..)`` when the idle
    warm-up is done. ``unverifiable`` is True when the check could not decide (a gold it cannot read, out of memory).

    ``sleep_s`` is a test hook that simulates a hung computation (the parent must kill and replace the worker)."""
    _limit_memory()
    _warm_up(WARM_UP[:1])  # loads the grammar (~1 s); the other shapes are parsed while the worker is idle
    tx.send(("ready", None, None))
    warm_up_left = list(WARM_UP[1:])
    while True:
        try:
            while warm_up_left and not rx.poll(0):
                _warm_up(warm_up_left[:1])
                del warm_up_left[0]
                if not warm_up_left:
                    tx.send(("warm", None, None))
            gold, answer, sleep_s, *job = rx.recv()
        except (EOFError, OSError):
            return
        if sleep_s:
            time.sleep(sleep_s)
        try:
            reply = ("result", run_job(job[0], answer) if job and job[0] else check(gold, answer), None, False)
        except GoldError as exc:
            reply = ("result", False, str(exc), True)
        except MemoryError:  # the memory cap, like the wall-clock limit, stopped the check before it decided
            reply = ("result", False, "math-verify ran out of memory", True)
        except RecursionError:
            reply = ("result", False, "math-verify hit the recursion limit (input too deeply nested)", False)
        except Exception as exc:  # any failure on model text is a wrong answer with a reason, never a crash
            reply = ("result", False, f"math-verify error: {type(exc).__name__}: {str(exc)[:200]}", False)
        try:
            tx.send(reply)
        except (EOFError, OSError):
            return


# Common shapes of competition answers. latex2sympy's ANTLR parser caches its prediction DFA per expression shape:
# the first parse of a new shape costs 10-50x a later one (over 1 s for the very first), so a fresh worker parses
# these once: the first before it reports ready, the rest whenever it has no request waiting.
WARM_UP = (
    "\\frac{1}{2}", "0.5", "-\\frac{7}{2}", "\\dfrac{3}{5}", "1/4", "-0.125", "1,000", "25\\%", "90^\\circ",
    "x^2 + 3x - 4", "(x+4)(x-1)", "3x^2 - 2x + 1", "\\frac{x+1}{x-1}", "a^2 - b^2", "2^{10}", "n!",
    "2\\sqrt{3}", "\\frac{\\sqrt{3}}{2}", "\\frac{1}{\\sqrt{2}}", "2+\\sqrt{3}", "\\sqrt{a^2+b^2}", "\\sqrt[3]{27}",
    "\\pi", "\\frac{\\pi}{4}", "4\\pi", "\\frac{9\\pi}{2}", "\\pi r^2",
    "\\left( 3, \\frac{\\pi}{2} \\right)", "(1, -2)", "(2, 3, -1)", "[-2, 5)", "(-\\infty, 0) \\cup (1, \\infty)",
    "\\{1, 2\\}", "1, 2, 3", "\\emptyset", "\\infty", "\\mathbb{R}",
    "\\begin{pmatrix} 1 \\\\ -2 \\end{pmatrix}", "\\begin{pmatrix} 2 & -1 \\\\ 0 & 3 \\end{pmatrix}",
    "\\begin{bmatrix} 1 \\\\ 2 \\end{bmatrix}",
    "5 \\text{ cm}", "\\text{(A)}", "\\textbf{(C)}", "\\text{Monday}", "\\$5.00",
    "y = 2x + 1", "x = -\\frac{3}{4}", "x^2 + y^2 = 25",
    "\\cos \\theta", "\\sin^2 x", "\\tan^{-1}(2)", "\\arctan 1", "\\log_2 8", "\\ln 2", "e^{2}",
    "3 - 4i", "\\frac{1}{2} + \\frac{\\sqrt{3}}{2}i", "\\dbinom{6}{2}", "\\binom{10}{3}", "|x|", "-\\frac{a+b}{c^2}",
)


def _warm_up(exprs: tuple[str, ...] | list[str]) -> None:
    for expr in exprs:  # parsing is what warms the DFA
        try:
            _parse(expr)
        except Exception:
            pass


def main(argv: list[str]) -> None:
    fd_in, fd_out = int(argv[0]), int(argv[1])
    serve(Connection(fd_in, writable=False), Connection(fd_out, readable=False))


if __name__ == "__main__":
    main(sys.argv[1:])
