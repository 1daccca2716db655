"""Math verifier throughput: ``rlvr_envs.verifiers.math`` (hard timeouts, process pool) vs plain Math-Verify.

Responses are built from MATH-500 (``RLVR_DATA_DIR/math/math500.jsonl``): the reference solution (long CoT ending in
the boxed answer), the same with the answer rewritten in an equivalent form, the same with the next problem's answer
(wrong), and the solution with its box removed (no final answer). Plain Math-Verify is used as its README shows:
``parse(gold)``, ``parse(response)``, ``verify(gold, answer)`` with its default (signal-based) timeouts, on the main
thread. Both run in this one process, one after the other, on the same pairs, ``RLVR_BENCH_ROUNDS`` times (default 2,
best time kept; caches are cleared between runs). ``RLVR_BENCH_N`` problems (default 200).
"""

import json
import logging
import os
import time
from pathlib import Path

import pytest
from math_variants import equivalent_form, replace_last_box

from rlvr_envs.verifiers._math_worker import WARM_UP
from rlvr_envs.verifiers.math import _extract, _fast, close_pool, pool, verify, verify_many

N_PROBLEMS = int(os.environ.get("RLVR_BENCH_N", "200"))
ROUNDS = int(os.environ.get("RLVR_BENCH_ROUNDS", "2"))


def build_pairs(rows: list[dict]) -> list[tuple[str, str, str, bool]]:
    """``(kind, gold, response, expected_correct)``."""
    out = []
    for i, row in enumerate(rows):
        gold, sol = row["answer"], row["solution"]
        if "\\boxed" not in sol:
            continue
        nxt = rows[(i + 1) % len(rows)]["answer"]
        out.append(("reference solution", gold, replace_last_box(sol, gold), True))
        out.append(("equivalent form", gold, replace_last_box(sol, equivalent_form(gold)), True))
        if nxt.strip() != gold.strip():
            out.append(("wrong answer", gold, replace_last_box(sol, nxt), False))
        out.append(("no box", gold, sol.replace("\\boxed", ""), False))
    return out


def plain_math_verify(gold: str, response: str) -> bool:
    from math_verify import parse
    from math_verify import verify as mv_verify

    return bool(mv_verify(parse(f"${gold}$"), parse(response)))  # gold in $...$ as in Math-Verify's README


@pytest.mark.slow
def test_bench_verifier_vs_plain_math_verify():
    root = os.environ.get("RLVR_DATA_DIR")
    path = Path(root or "/nonexistent") / "math" / "math500.jsonl"
    if not path.is_file():
        pytest.skip("needs RLVR_DATA_DIR with math/math500.jsonl")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()][:N_PROBLEMS]
    pairs = build_pairs(rows)
    logging.getLogger("math_verify").setLevel(logging.ERROR)

    # Same warm-up for both sides (the ANTLR parser is slow on the first expression of each shape), outside timing;
    # each of our runs gets a fresh pool, so no run profits from another's caches.
    for expr in WARM_UP:
        plain_math_verify(expr, f"$\\boxed{{{expr}}}$")

    def fresh_pool() -> float:
        close_pool()
        start = time.perf_counter()
        pool().start()
        elapsed = time.perf_counter() - start
        assert pool().wait_warm(), "the workers did not finish their warm-up"
        return elapsed

    def clear_plain_caches() -> None:  # Math-Verify memoizes parsed LaTeX; a later round must not profit from it
        from math_verify import parser

        parser.parse_latex_cached.cache_clear()
        parser.parse_expr_cached.cache_clear()

    golds_responses = [(g, r) for _, g, r, _ in pairs]
    runs = {
        "Math-Verify, plain (default timeouts)": lambda: [plain_math_verify(g, r) for g, r in golds_responses],
        "rlvr verify() sequential": lambda: [verify(g, r, timeout=5.0).correct for g, r in golds_responses],
        "rlvr verify_many() (2 workers)": lambda: [v.correct for v in verify_many(golds_responses, timeout=5.0)],
        "rlvr verify_many(), fast path off": lambda: [
            v.correct for v in verify_many(golds_responses, timeout=5.0, fast_path=False)],
    }
    # The machine may be shared: run every configuration ROUNDS times, interleaved, and keep each one's best time.
    times: dict[str, float] = {}
    results: dict[str, list[bool]] = {}
    for _ in range(ROUNDS):
        for name, run in runs.items():
            if name.startswith("Math-Verify"):
                clear_plain_caches()
            else:
                startup = fresh_pool()
            start = time.perf_counter()
            results[name] = run()
            times[name] = min(times.get(name, float("inf")), time.perf_counter() - start)
    t_plain = times["Math-Verify, plain (default timeouts)"]
    ours_many = verify_many(golds_responses, timeout=5.0)

    expected = [e for *_, e in pairs]
    kinds = sorted({k for k, *_ in pairs})
    print(f"\n{len(pairs)} responses from {len(rows)} MATH-500 problems; pool start-up {startup:.2f} s (not timed); "
          f"{os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.1f}; best of {ROUNDS} rounds")
    print("| verifier | verifications/s | speed-up | agrees with label | " + " | ".join(kinds) + " |")
    print("|---|---|---|---|" + "---|" * len(kinds))
    for name, got in results.items():
        rate = len(pairs) / times[name]
        per_kind = []
        for kind in kinds:
            idx = [i for i, p in enumerate(pairs) if p[0] == kind]
            per_kind.append(f"{sum(got[i] == expected[i] for i in idx)}/{len(idx)}")
        agree = sum(a == b for a, b in zip(got, expected))
        print(f"| {name} | {rate:.1f} | {t_plain / times[name]:.2f}x | "
              f"{agree}/{len(pairs)} | " + " | ".join(per_kind) + " |")
    fast = sum(a is not None and _fast(g, a) is not None for (_, g, r, _), (a, _) in
               zip(pairs, (_extract(r) for _, _, r, _ in pairs)))
    no_answer = sum(v.parsed is None for v in ours_many)
    print(f"decided by the fast path: {fast}/{len(pairs)}; no final answer (no worker call): {no_answer}/{len(pairs)}")
    errors = [v.error for v in ours_many if v.error and "no final answer" not in v.error]
    print(f"verify_many errors other than 'no final answer': {len(errors)} {errors[:3]}")

    # The hard-timeout verifier must be at least as right as plain Math-Verify on this mix.
    assert sum(v.correct == e for v, e in zip(ours_many, expected)) >= sum(
        a == e for a, e in zip(results["Math-Verify, plain (default timeouts)"], expected))
