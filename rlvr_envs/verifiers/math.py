"""Math answer verifier: Math-Verify equivalence behind a hard wall-clock limit.

``verify(gold, response, timeout=5.0) -> Verdict``, ``verify_many(pairs, timeout=5.0) -> list[Verdict]``;
``verify_answer(gold, answer)`` grades an answer that is already extracted, and ``same_answer(a, b)`` says whether two
extracted answers are equivalent (each correct with the other as the gold; used by majority votes, maj@k).

How a response is graded
1. Only the last ``MAX_RESPONSE_CHARS`` (1 MB) of the response are read; the final answer is extracted with
   ``rlvr_envs.extract`` (last ``\\boxed{}``, else the last ``<answer>`` tag, else ``####``, else "the answer is").
   An answer longer than ``MAX_ANSWER_CHARS`` (10k) is a format error.
2. Answer-spam policy (all three are format errors, reward 0, ``format_ok=False``):
   - more than ``MAX_DISTINCT_BOXED`` (4) *distinct* ``\\boxed{}`` candidates in the response;
   - more than ``MAX_BOXED_MARKERS`` (64) ``\\boxed``/``\\fbox`` markers at all (nothing honest needs that many);
   - a *hedged* final answer: the final ``\\boxed{}`` follows a different ``\\boxed{}`` with fewer than
     ``HEDGE_GAP_CHARS`` (40) characters between them, none of them words other than "or", "and", "maybe" and the
     like ("\\boxed{1} or \\boxed{2}", "\\boxed{1}, \\boxed{2}").
   Otherwise only the final candidate is graded: earlier boxed values (intermediate results) neither help nor hurt,
   and the gold string echoed anywhere else in the text counts for nothing.
3. Fast path, no subprocess: the normalized strings are equal (layout such as ``\\left``, ``\\,``, ``\\dfrac``, spaces
   and one outer brace group ignored), or both sides are plain exact numbers (integers with or without ``1,000``
   grouping, decimals, ``a/b``, ``\\frac{a}{b}``) that compare equal as rationals. Two different plain integers are
   wrong without asking Math-Verify.
4. Guards before Math-Verify: an answer nested deeper than ``MAX_BRACE_DEPTH`` (50) braces is a format error; when
   the gold is not a relation, an inequality or a negation (``\\ge 42``, ``\\neg 42``) is wrong, and in an equation
   (``7 = 42``) every side but a leading named one (``x = ...``) must equal the gold, since Math-Verify alone grades
   only the right-hand side.
5. Everything else goes to Math-Verify (``parse`` gold first, then the answer, each wrapped in ``\\boxed{}``;
   ``verify(gold, answer)``) in a small pool of worker processes. Math-Verify's own ``signal.alarm`` timeouts only
   work on the main thread, so they are off; instead each call has a hard wall-clock limit: a worker that runs past
   it (or crashes) is killed and replaced, and the call returns an *unverifiable* verdict (``correct=False``,
   reward 0, ``status == "unverifiable"``) with an ``error``; so does a gold answer Math-Verify cannot read, a worker
   that runs out of memory, or no free worker within the limit. The limit covers
   the wait for a free worker too, so ``verify`` returns within ``timeout`` plus a few ms from any thread (the very
   first call also pays the one-off pool start-up, ~1 s; ``pool().start()`` pays it up front, ``close_pool()`` stops
   the workers). Workers are fresh ``python -I`` processes (not ``multiprocessing``): the caller's ``__main__`` is
   never re-imported, and they work inside daemonic processes such as ``AsyncVectorEnv`` workers.
6. Verification cache: what the relation rules of step 4 and Math-Verify settle (correct or wrong, never
   unverifiable: a timeout may pass on a less loaded machine, so it is retried) is kept per (gold, extracted answer)
   in a bounded in-process LRU, so the rollouts of a GRPO group that repeat an answer ask Math-Verify once, even when
   they are graded at the same time (lookups are single-flight). The key is the extracted answer with
   surrounding whitespace stripped, not the fast path's looser normalization: that one also eats the ``\\ `` of a
   matrix row break (``\\begin{pmatrix} -2 \\\\ -14 \\end{pmatrix}`` becomes ``...-2\\-14...``, which Math-Verify
   grades wrong against the MATH-500 gold it came from), and a key that merged such answers would make a verdict
   depend on which form was checked first. ``cache_info()`` counts hits and misses, ``cache_clear()``
   empties it, ``configure_cache(maxsize)`` resizes it (0 disables it; ``RLVR_VERIFY_CACHE_SIZE`` sets the
   starting size, default ``CACHE_SIZE``).
``verify`` never raises on model text; it raises ``ValueError`` only for a non-positive timeout.
"""

from __future__ import annotations

import atexit
import os
import re
import subprocess
import sys
import threading
import time
import warnings
from collections import OrderedDict, deque
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction
from multiprocessing.connection import Connection
from typing import NamedTuple

from rlvr_envs.core import Verdict
from rlvr_envs.extract import BOXED_MARKER, _braced, after_hashes, answer_is, answer_tag, boxed_spans

MAX_RESPONSE_CHARS = 1_000_000
MAX_ANSWER_CHARS = 10_000
MAX_DISTINCT_BOXED = 4
MAX_BOXED_MARKERS = 64
HEDGE_GAP_CHARS = 40
MAX_BRACE_DEPTH = 50
POOL_SIZE = 2  # default; RLVR_MATH_WORKERS overrides it (say 1 per env process inside an AsyncVectorEnv)
WORKER_START_TIMEOUT = 120.0  # seconds a fresh worker may take to import SymPy on a loaded machine
CACHE_SIZE = 32_768  # cached (gold, answer) outcomes; RLVR_VERIFY_CACHE_SIZE overrides it (0: no cache)
CACHE_MAX_KEY_CHARS = 1_000  # longer (gold + answer) pairs are not cached: rare, and they would dominate the memory

_WORKER_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_math_worker.py")
_WORD = re.compile(r"[^\W\d_]+")
_CLOSE_TAG = re.compile(r"</answer>", re.IGNORECASE)
# A final box that follows a different box with only these words (and punctuation, $, spaces) between is a hedge.
_HEDGE_WORDS = {"or", "and", "maybe", "perhaps", "possibly", "either", "also", "else", "otherwise", "alternatively",
                "text", "quad", "qquad"}

# -- extraction and the answer-spam policy ----------------------------------------------------------------------


def _extract(text: str) -> tuple[str | None, str | None]:
    """``(answer, format_error)``; the order of styles is ``extract.DEFAULT_STYLES``."""
    if len(BOXED_MARKER.findall(text)) > MAX_BOXED_MARKERS:
        return None, f"answer spam: more than {MAX_BOXED_MARKERS} \\boxed markers"
    spans = boxed_spans(text)
    answer = spans[-1][2] if spans else None
    if answer:
        distinct = {_normalize(c) for _, _, c in spans}
        if len(distinct) > MAX_DISTINCT_BOXED:
            return None, f"answer spam: {len(distinct)} distinct \\boxed answers (at most {MAX_DISTINCT_BOXED} allowed)"
        if len(spans) >= 2:
            (_, prev_end, prev), (last_start, _, last) = spans[-2], spans[-1]
            gap = text[prev_end:last_start]
            hedge = len(gap) < HEDGE_GAP_CHARS and all(w.lower() in _HEDGE_WORDS for w in _WORD.findall(gap))
            if hedge and _normalize(prev) != _normalize(last):
                return None, "hedged final answer: several different \\boxed answers side by side"
        return answer, None
    # Cut at the last closing tag: opening tags after it would make the tag regex quadratic in the text length.
    close_end = max((m.end() for m in _CLOSE_TAG.finditer(text)), default=-1)
    for found in (
        answer_tag(text[:close_end]) if close_end >= 0 else None,
        after_hashes(text),
        answer_is(text),
    ):
        if found:
            return found, None
    return None, "no final answer found (\\boxed{}, <answer>, ####, 'the answer is')"


# -- relations: what Math-Verify would wave through ---------------------------------------------------------------

_INEQUALITY = re.compile(r"<|>|\\(?:le|ge|leq|geq|lt|gt|neq|ne|leqslant|geqslant)(?![a-zA-Z])|[≤≥≠]")
_EQUALS = re.compile(r"(?<![<>!=])=(?!=)")
_NEGATION = re.compile(r"\\(?:neg|lnot|not)(?![a-zA-Z])|¬")
_COMMAND = re.compile(r"\\[a-zA-Z]+")


def _brace_depth(s: str) -> int:
    depth = deepest = 0
    i, n = 0, len(s)
    while i < n:
        c = s[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            depth += 1
            deepest = max(deepest, depth)
        elif c == "}":
            depth -= 1
        i += 1
    return deepest


def _has_letters(s: str) -> bool:
    return bool(_WORD.search(_COMMAND.sub("", s)))


def _graded_parts(gold: str, answer: str) -> tuple[list[str], str | None]:
    """The pieces of ``answer`` that must each equal ``gold``, or an error why the answer is wrong as written.

    Math-Verify reads ``a = b`` as an assignment and grades ``b``; that is right for ``x = 5`` but would accept
    ``7 = 42`` for gold 42, and it reads ``\\ge 42`` and ``\\neg 42`` as 42. So, when the gold is no relation itself:
    an inequality or a negation is wrong, and in an equation every side must equal the gold except a leading side
    with letters (the name)."""
    if _INEQUALITY.search(gold) or _EQUALS.search(gold):
        return [answer], None
    if _INEQUALITY.search(answer):
        return [], "an inequality is not a value"
    if _NEGATION.search(answer) and not _NEGATION.search(gold):
        return [], "a negation is not a value"
    sides = [side.strip() for side in _EQUALS.split(answer)]
    if len(sides) < 2 or not all(sides):
        return [answer], None
    if len(sides) == 2 and _has_letters(sides[0]):
        return [answer], None  # "x = 5": Math-Verify's assignment rule grades 5
    if _has_letters(sides[0]):
        sides = sides[1:]
    return sides, None


# -- fast path ----------------------------------------------------------------------------------------------------

# Layout-only LaTeX and whitespace (but not whitespace between two digits: "2 3" is not 23).
_SPACING = re.compile(r"\\left|\\right|\\[,;:! ]|\\displaystyle|(?<!\d)\s+|\s+(?!\d)")
_INT = re.compile(r"[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)")
_DEC = re.compile(r"[+-]?(?:\d+\.\d*|\.\d+)")
_SLASH = re.compile(r"([+-]?\d+)/(\d+)")
_FRAC = re.compile(r"([+-]?)\\frac\{([+-]?\d+)\}\{(\d+)\}")


def _normalize(s: str) -> str:
    s = s.strip().strip("$").strip()
    if s.startswith("\\(") and s.endswith("\\)"):
        s = s[2:-2]
    s = _SPACING.sub("", s).replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").rstrip(".")
    if s.startswith("{") and (got := _braced(s, 0)) is not None and got[1] == len(s):
        s = got[0]  # "{x+1}": one group around everything
    return s


def _number(s: str) -> tuple[Fraction, bool] | None:
    """``(value, is_integer_literal)`` for a plain exact number, else None."""
    if _INT.fullmatch(s):
        return Fraction(int(s.replace(",", ""))), True
    if _DEC.fullmatch(s):
        return Fraction(s), False
    if m := _SLASH.fullmatch(s) or _FRAC.fullmatch(s):
        parts = m.groups()
        sign = -1 if len(parts) == 3 and parts[0] == "-" else 1
        num, den = int(parts[-2]), int(parts[-1])
        if den:
            return sign * Fraction(num, den), False
    return None


def _fast(gold: str, answer: str) -> bool | None:
    """True/False when the answer is trivially right or wrong, None when Math-Verify must decide."""
    g, a = _normalize(gold), _normalize(answer)
    if g and g == a:
        return True
    if len(g) > 40 or len(a) > 40:  # keep int() of long digit strings out of the fast path
        return None
    ng, na = _number(g), _number(a)
    if ng is None or na is None:
        return None
    if ng[0] == na[0]:
        return True
    if ng[1] and na[1]:
        return False
    return None


# -- the worker pool ----------------------------------------------------------------------------------------------


class _Worker:
    """One ``python -I _math_worker.py`` subprocess talking pickled messages over two pipes.

    A fresh interpreter (not ``multiprocessing`` spawn/forkserver) so the parent's ``__main__`` is never re-run,
    it works from daemonic processes (``AsyncVectorEnv`` workers), and it exits by itself when the parent dies."""

    def __init__(self) -> None:
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", _WORKER_PATH, str(to_child_r), str(from_child_w)],
                pass_fds=(to_child_r, from_child_w),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
            )
        except BaseException:
            for fd in (to_child_r, to_child_w, from_child_r, from_child_w):
                os.close(fd)
            raise
        os.close(to_child_r)
        os.close(from_child_w)
        self.tx = Connection(to_child_w, readable=False)
        self.rx = Connection(from_child_r, writable=False)
        self.warm = False  # True once the worker has parsed every WARM_UP shape (see _math_worker)

    def wait_ready(self, timeout: float) -> None:
        if not self.rx.poll(timeout):
            self.kill()
            raise TimeoutError(f"math-verify worker did not start within {timeout:.0f} s")
        try:
            self.rx.recv()
        except (EOFError, OSError) as exc:
            self.kill()
            raise RuntimeError(
                f"math-verify worker exited at start-up (exit code {self.proc.poll()}); is math-verify installed "
                f"in {sys.executable}?"
            ) from exc

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.tx.close()
        self.rx.close()


class CheckResult(NamedTuple):
    """One worker check: Math-Verify's ``correct``, the ``error`` text if any, and whether it could not decide."""

    correct: bool
    error: str | None
    unverifiable: bool


class _Waiter:
    """A caller queued for a worker: ``_put_back`` hands workers to waiters first come, first served."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.worker: _Worker | None = None


class VerifierPool:
    """``size`` persistent Math-Verify worker processes, each used by one caller at a time.

    Started on first use (synchronously: ~1 s). A worker that overruns its deadline or dies is killed at once and a
    replacement is started in a background thread, so the caller that hit the limit does not wait for it. Callers
    get free workers in arrival order (a plain semaphore lets a busy thread starve the others)."""

    def __init__(self, size: int | None = None):
        self.size = size or int(os.environ.get("RLVR_MATH_WORKERS", POOL_SIZE))
        self.replaced = 0  # workers killed after a timeout or crash (for tests and monitoring)
        self._idle: list[_Worker] = []
        self._waiters: deque[_Waiter] = deque()
        self._lock = threading.Lock()
        self._start_lock = threading.Lock()
        self._started = False
        self._closed = False
        self._pid = os.getpid()

    def start(self) -> None:
        """Start every worker now and wait until they are ready (idempotent)."""
        with self._start_lock:
            if self._started:
                return
            workers = [_Worker() for _ in range(self.size)]
            for w in workers:
                w.wait_ready(WORKER_START_TIMEOUT)
            self._started = True
        for w in workers:
            self._put_back(w)

    def _acquire(self, deadline: float) -> _Worker | None:
        with self._lock:
            if self._idle and not self._waiters:
                return self._idle.pop()
            waiter = _Waiter()
            self._waiters.append(waiter)
        waiter.event.wait(max(0.0, deadline - time.monotonic()))
        with self._lock:
            if waiter.worker is None:
                self._waiters.remove(waiter)
            return waiter.worker

    def _put_back(self, worker: _Worker) -> None:
        with self._lock:
            if self._closed:
                worker.kill()
                return
            if self._waiters:
                waiter = self._waiters.popleft()
                waiter.worker = worker
                waiter.event.set()
            else:
                self._idle.append(worker)

    def _replace(self) -> None:
        for attempt in range(3):
            try:
                worker = _Worker()
                worker.wait_ready(WORKER_START_TIMEOUT)
            except Exception as exc:  # keep trying a few times; a broken install surfaces at start()
                error = exc
                time.sleep(1.0 + attempt)
                continue
            self._put_back(worker)
            return
        warnings.warn(f"math verifier: could not replace a worker ({error}); pool shrinks", stacklevel=1)

    def run(self, gold: str, answer: str, timeout: float, *, _test_sleep: float = 0.0,
            job: tuple | None = None) -> CheckResult:
        """Math-Verify's verdict on ``answer`` against ``gold`` within a hard wall-clock ``timeout`` (seconds), the
        wait for a free worker included. ``unverifiable`` is set when no verdict came back in time or at all (timeout,
        worker crash, no free worker, out of memory) or the gold cannot be read.

        ``job`` runs another verifier's untrusted-input scoring in the same killable workers instead (see
        ``_math_worker.run_job``). ``_test_sleep`` makes the worker hang that long first (tests of the kill path)."""
        self.start()
        deadline = time.monotonic() + timeout
        while True:
            worker = self._acquire(deadline)
            if worker is None:
                return CheckResult(False, f"verifier busy: no free worker within {timeout:g} s", True)
            if worker.proc.poll() is None:
                break
            self._discard(worker)  # died while idle (killed from outside, OOM): take another
        try:
            worker.tx.send((gold, answer, _test_sleep, job))
            while worker.rx.poll(max(0.0, deadline - time.monotonic())):
                reply = worker.rx.recv()
                if reply[0] == "warm":  # the idle warm-up finished just before our request arrived
                    worker.warm = True
                    continue
                _, correct, error, unverifiable = reply
                self._put_back(worker)
                return CheckResult(bool(correct) and not unverifiable, error, bool(unverifiable))
            error = f"math-verify timed out after {timeout:g} s (worker killed and replaced)"
        except (EOFError, OSError) as exc:
            error = f"math-verify worker died ({type(exc).__name__}, exit code {worker.proc.poll()}); replaced"
        self._discard(worker)
        return CheckResult(False, error, True)

    def check(self, gold: str, answer: str, timeout: float, *, _test_sleep: float = 0.0,
              job: tuple | None = None) -> tuple[bool, str | None]:
        """``(correct, error)`` of ``run`` (for callers that do not tell unverifiable from wrong)."""
        result = self.run(gold, answer, timeout, _test_sleep=_test_sleep, job=job)
        return result.correct, result.error

    def _discard(self, worker: _Worker) -> None:
        worker.kill()
        self.replaced += 1
        threading.Thread(target=self._replace, name="rlvr-math-verify-replace", daemon=True).start()

    def wait_warm(self, timeout: float = WORKER_START_TIMEOUT) -> bool:
        """Start the pool and wait until every worker has finished its idle warm-up (for benchmarks)."""
        self.start()
        deadline = time.monotonic() + timeout
        taken = []
        try:
            for _ in range(self.size):
                worker = self._acquire(deadline)
                if worker is None:
                    return False
                taken.append(worker)
            for w in taken:
                while not w.warm and w.rx.poll(max(0.0, deadline - time.monotonic())):
                    w.warm = w.rx.recv()[0] == "warm"
            return all(w.warm for w in taken)
        finally:
            for w in taken:
                self._put_back(w)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for w in idle:
            w.kill()


_POOL: VerifierPool | None = None
_POOL_LOCK = threading.Lock()


def pool() -> VerifierPool:
    """The process-wide pool (created on first use, closed at exit; a forked child gets its own)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL._pid != os.getpid():  # pipes inherited through fork must not be shared
            _POOL = VerifierPool()
            atexit.register(_POOL.close)
        return _POOL


class CacheInfo(NamedTuple):
    """Counters of the verification cache (the shape of ``functools.lru_cache``'s ``cache_info()``)."""

    hits: int
    misses: int
    maxsize: int
    currsize: int


_Outcome = tuple[bool, str | None]  # a settled check: (correct, error)


class _VerdictCache:
    """A thread-safe LRU of settled outcomes ``(correct, error)`` per (gold, answer): the rollouts of a GRPO group
    repeat the same answers. ``maxsize`` 0 disables it (lookups then neither hit nor count).

    Lookups are single-flight: ``claim`` hands a missing key to one caller, which verifies it and ``settle``s it;
    concurrent callers with the same key (``verify_many`` grades a whole group at once) wait for that outcome
    instead of asking Math-Verify again, and count as hits when it arrives. An outcome settled as None (unverifiable)
    is not stored, and a waiter then claims the key and verifies it itself."""

    def __init__(self, maxsize: int = CACHE_SIZE, max_key_chars: int = CACHE_MAX_KEY_CHARS):
        self.maxsize, self.max_key_chars = _check_size(maxsize), max_key_chars
        self.hits = self.misses = 0
        self._data: OrderedDict[tuple[str, str], _Outcome] = OrderedDict()
        self._pending: dict[tuple[str, str], threading.Event] = {}
        self._lock = threading.Lock()

    def claim(self, key: tuple[str, str], deadline: float | None = None) -> tuple[_Outcome | None, bool]:
        """``(outcome, claimed)``: a cached outcome (a hit), or None and whether the caller now owns the key (it must
        then call ``settle``). Waits for another caller verifying the same key until ``deadline`` (monotonic)."""
        while True:
            with self._lock:
                if not self.maxsize:
                    return None, False
                found = self._data.get(key)
                if found is not None:
                    self.hits += 1
                    self._data.move_to_end(key)
                    return found, False
                cacheable = len(key[0]) + len(key[1]) <= self.max_key_chars
                pending = self._pending.get(key) if cacheable else None
                if pending is None:
                    self.misses += 1
                    if cacheable:
                        self._pending[key] = threading.Event()
                    return None, cacheable
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not pending.wait(left):
                with self._lock:
                    self.misses += 1
                return None, False  # out of time while another caller verifies: the caller's own deadline decides

    def settle(self, key: tuple[str, str], outcome: _Outcome | None) -> None:
        """Finish a claimed key: store ``outcome`` (None: unverifiable, not stored) and wake its waiters."""
        with self._lock:
            if outcome is not None and self.maxsize:
                self._data[key] = outcome
                self._data.move_to_end(key)
                while len(self._data) > self.maxsize:
                    self._data.popitem(last=False)
            event = self._pending.pop(key, None)
        if event is not None:
            event.set()

    def resize(self, maxsize: int) -> int:
        with self._lock:
            old, self.maxsize = self.maxsize, _check_size(maxsize)
            while len(self._data) > self.maxsize:
                self._data.popitem(last=False)
            return old

    def info(self) -> CacheInfo:
        with self._lock:
            return CacheInfo(self.hits, self.misses, self.maxsize, len(self._data))

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self.hits = self.misses = 0


def _check_size(maxsize: int) -> int:
    if isinstance(maxsize, bool) or not isinstance(maxsize, int) or maxsize < 0:
        raise ValueError(f"cache size must be an int >= 0 (0 disables the cache), got {maxsize!r}")
    return maxsize


def _default_cache_size() -> int:
    raw = os.environ.get("RLVR_VERIFY_CACHE_SIZE", "").strip()
    if not raw:
        return CACHE_SIZE
    try:
        return _check_size(int(raw))
    except ValueError:
        raise ValueError(f"RLVR_VERIFY_CACHE_SIZE must be an integer >= 0 (0 disables the cache), got {raw!r}") \
            from None


_CACHE = _VerdictCache(_default_cache_size())


def cache_info() -> CacheInfo:
    """Hits, misses, size limit and current size of this process's verification cache (see the module doc, 6)."""
    return _CACHE.info()


def cache_clear() -> None:
    """Forget every cached outcome and zero the hit and miss counters."""
    _CACHE.clear()


def configure_cache(maxsize: int) -> int:
    """Set the cache's size limit (entries; 0 disables it, dropping what it holds); returns the previous limit."""
    return _CACHE.resize(maxsize)


def close_pool() -> None:
    """Stop the worker processes and forget cached verdicts (the next ``verify`` starts a fresh pool)."""
    global _POOL
    with _POOL_LOCK:
        old, _POOL = _POOL, None
    if old is not None:
        old.close()
    _CACHE.clear()


# -- public API ---------------------------------------------------------------------------------------------------


def verify(gold: str, response: str, *, timeout: float = 5.0, fast_path: bool = True) -> Verdict:
    """Grade ``response`` against the reference answer ``gold`` (see the module docstring for the policy).

    ``fast_path=False`` sends every extracted answer to Math-Verify (for tests and benchmarks)."""
    if not timeout > 0:
        raise ValueError(f"timeout must be positive, got {timeout!r}")
    if not isinstance(gold, str):  # nothing to grade against: the task, not the response, is at fault
        return Verdict.could_not_verify(f"gold and response must be str, got {type(gold).__name__}, "
                                        f"{type(response).__name__}")
    if not isinstance(response, str):
        return Verdict.failed(f"gold and response must be str, got {type(gold).__name__}, {type(response).__name__}")
    answer, format_error = _extract(response[-MAX_RESPONSE_CHARS:])
    if answer is None:
        return Verdict.failed(format_error or "no final answer found")
    return verify_answer(gold, answer, timeout=timeout, fast_path=fast_path)


def verify_answer(gold: str, answer: str, *, timeout: float = 5.0, fast_path: bool = True) -> Verdict:
    """Grade an already extracted final answer against ``gold``: ``verify`` without the extraction and the
    answer-spam checks (steps 3-6 of the module docstring)."""
    if not timeout > 0:
        raise ValueError(f"timeout must be positive, got {timeout!r}")
    if not isinstance(gold, str):
        return Verdict.could_not_verify(f"gold and answer must be str, got {type(gold).__name__}, "
                                        f"{type(answer).__name__}")
    if not isinstance(answer, str):
        return Verdict.failed(f"gold and answer must be str, got {type(gold).__name__}, {type(answer).__name__}")
    if len(answer) > MAX_ANSWER_CHARS:
        return Verdict.failed(f"final answer longer than {MAX_ANSWER_CHARS} characters", parsed=answer[:200])
    gold = gold[:MAX_ANSWER_CHARS]
    if not gold.strip():
        return Verdict.could_not_verify("the gold answer is empty", parsed=answer, format_ok=True)
    fast = _fast(gold, answer) if fast_path else None
    if fast is not None:
        return Verdict(correct=fast, reward=float(fast), parsed=answer, format_ok=True)
    if _brace_depth(answer) > MAX_BRACE_DEPTH:
        return Verdict.failed(f"final answer nested deeper than {MAX_BRACE_DEPTH} braces", parsed=answer[:200])
    deadline = time.monotonic() + timeout  # covers a wait for another thread verifying the same pair, too
    key = (gold, answer.strip())  # surrounding whitespace changes nothing below (see the module doc, 6)
    cached, claimed = _CACHE.claim(key, deadline)
    if cached is not None:
        correct, error = cached
        return Verdict(correct=correct, reward=float(correct), parsed=answer, error=error, format_ok=True)
    outcome = None  # stays None for an unverifiable check: a timeout may pass on a less loaded machine, so retry it
    try:
        parts, rule_error = _graded_parts(gold, answer)
        if rule_error:
            outcome = (False, rule_error)
            return Verdict(correct=False, reward=0.0, parsed=answer, error=rule_error, format_ok=True)
        correct, error, unverifiable = False, None, False
        for part in parts:  # every part must be right; one deadline for all of them
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                correct, error, unverifiable = False, f"math-verify timed out after {timeout:g} s", True
                break
            correct, error, unverifiable = pool().run(gold, part, remaining)
            if not correct:
                break
        if not unverifiable:
            outcome = (correct, error)
        return Verdict(correct=correct, reward=float(correct), parsed=answer, error=error, format_ok=True,
                       unverifiable=unverifiable)
    finally:
        if claimed:  # also on an exception: waiters must not wait for an outcome that never comes
            _CACHE.settle(key, outcome)


def same_answer(a: str, b: str, *, timeout: float = 5.0) -> bool:
    """Whether two extracted final answers are one answer (majority votes group answers with this): equal after
    the fast path's normalization, else each is graded correct with the other as the gold. Math-Verify is not
    symmetric (the gold side is parsed more leniently), so both directions must hold; a timeout counts as different."""
    if not isinstance(a, str) or not isinstance(b, str):
        return False
    if _normalize(a) == _normalize(b):
        return True
    return verify_answer(a, b, timeout=timeout).correct and verify_answer(b, a, timeout=timeout).correct


def verify_many(
    pairs: Iterable[tuple[str, str]], *, timeout: float = 5.0, fast_path: bool = True
) -> list[Verdict]:
    """``verify`` over ``(gold, response)`` pairs, using every pool worker at once; results in input order."""
    pairs = list(pairs)
    if len(pairs) <= 1:
        return [verify(g, r, timeout=timeout, fast_path=fast_path) for g, r in pairs]
    with ThreadPoolExecutor(max_workers=pool().size) as ex:
        return list(ex.map(lambda p: verify(p[0], p[1], timeout=timeout, fast_path=fast_path), pairs))
