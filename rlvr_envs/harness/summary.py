"""One row per method on a board: the mean of its runs' accuracy, a 95% Student-t interval over them, how many.

A board holds one entry per run, several seeds per method. An entry's method is ``training.method`` (set by
``rlvr leaderboard publish`` from the run's recipe); its seeds are grouped with it. Two qualifiers keep different
systems apart that share a method name: the base model (``training.base_model``) and the training budget
(``training.steps``), each named in the row only where the board holds more than one of them for that method.
Entries without a method (untrained baselines, plain ``rlvr eval`` submissions) stay rows of their own, named by
their label and model.

The seed is the unit of replication: a method's runs of one seed (repeat builds of the same recipe and seed) are
averaged first, and the interval is ``mean +- t(0.975, n-1) * sd / sqrt(n)`` over its n seeds (sd with n-1 in the
denominator; a run with no recorded seed counts as a seed of its own); with one seed there is no interval, only the
mean ("1 seed").
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from rlvr_envs.harness.leaderboard import ranked

# t(0.975, df) for df = 1..30 (two-sided 95%); larger df use the Cornish-Fisher expansion around the normal quantile.
_T975 = (12.706205, 4.302653, 3.182446, 2.776445, 2.570582, 2.446912, 2.364624, 2.306004, 2.262157, 2.228139,
         2.200985, 2.178813, 2.160369, 2.144787, 2.131450, 2.119905, 2.109816, 2.100922, 2.093024, 2.085963,
         2.079614, 2.073873, 2.068658, 2.063899, 2.059539, 2.055529, 2.051831, 2.048407, 2.045230, 2.042272)
_Z975 = 1.959963984540054


def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom (df >= 1)."""
    if df < 1:
        raise ValueError(f"t quantile needs df >= 1, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z, v = _Z975, float(df)
    return (z + (z ** 3 + z) / (4 * v) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * v ** 2)
            + (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / (384 * v ** 3))


def entry_name(entry: Mapping[str, Any]) -> str:
    """What an entry is, less its seed: the trained method's name for trained entries, else its label or model."""
    t = entry.get("training")
    if isinstance(t, dict) and t.get("method"):
        return str(t["method"])
    return entry.get("label") or re.sub(r"\s*\(seed \d+\)|,\s*seed \d+(?=\))", "", entry["model"])


def method_key(entry: Mapping[str, Any]) -> tuple[str, ...]:
    """The group an entry's score is averaged in: (method, base model, steps) for a trained entry, else the entry."""
    t = entry.get("training")
    if isinstance(t, dict) and t.get("method"):
        return ("method", str(t["method"]), str(t.get("base_model") or ""), str(t.get("steps") or ""))
    return ("entry", str(entry.get("id") or id(entry)))


def _seed(entry: Mapping[str, Any]) -> Any:
    t = entry.get("training")
    return t.get("seed") if isinstance(t, dict) and t.get("seed") is not None else entry.get("seed")


def interval(values: Sequence[float]) -> tuple[float, float | None, float | None, float | None]:
    """(mean, sd, low, high) of ``values``: a 95% Student-t interval with n-1 degrees of freedom; sd and the
    bounds are None for a single value."""
    n = len(values)
    if n == 0:
        raise ValueError("no values")
    mean = sum(values) / n
    if n == 1:
        return mean, None, None, None
    sd = math.sqrt(sum((x - mean) ** 2 for x in values) / (n - 1))
    half = t975(n - 1) * sd / math.sqrt(n)
    return mean, sd, mean - half, mean + half


def summarize(board: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One dict per method (see the module doc), best mean accuracy first (ties: more runs, then name): ``name``,
    ``key``, ``n`` (seeds: the units the interval is over), ``runs``, ``seeds`` (the distinct seeds), ``mean``
    (over seeds), ``sd``, ``low``/``high`` (the 95% t interval, None for one seed), ``min``/``max``, ``length_mean`` (mean of the runs' mean response lengths), ``length_unit``
    and ``entries`` (the method's per-seed entries, best first)."""
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for e in ranked(list(board["entries"])):
        groups.setdefault(method_key(e), []).append(e)
    # Qualify a method's name only where the board holds it with several base models / step counts.
    variants: dict[str, set[tuple[str, str]]] = {}
    for key in groups:
        if key[0] == "method":
            variants.setdefault(key[1], set()).add((key[2], key[3]))
    rows = []
    for key, entries in groups.items():
        name = entry_name(entries[0])
        if key[0] == "method":
            seen = variants[key[1]]
            if len({b for b, _ in seen}) > 1 and key[2]:
                name = f"{key[2]} + {name}"
            if len({s for _, s in seen}) > 1 and key[3]:
                name += f" ({key[3]} steps)"
        elif entries[0].get("label"):  # a labelled entry: name the model too
            name = f"{name} [{entry_name({'model': entries[0]['model']})}]"
        accs = [float(e["metrics"].get("accuracy", 0.0)) for e in entries]
        per_seed: dict[Any, list[float]] = {}
        for i, (e, acc) in enumerate(zip(entries, accs)):
            seed = _seed(e)
            per_seed.setdefault(("seed", str(seed)) if seed is not None else ("run", i), []).append(acc)
        mean, sd, low, high = interval([sum(v) / len(v) for v in per_seed.values()])
        lengths = [float(e["metrics"].get("length_mean", 0.0)) for e in entries]
        units = sorted({str(e["metrics"].get("length_unit", "?")) for e in entries})
        seeds = sorted({s for s in map(_seed, entries) if s is not None}, key=lambda s: (str(type(s)), s))
        rows.append({"name": name, "key": key, "n": len(per_seed), "runs": len(entries), "seeds": seeds,
                     "mean": mean, "sd": sd,
                     "low": low, "high": high, "min": min(accs), "max": max(accs),
                     "length_mean": sum(lengths) / len(lengths), "length_unit": "/".join(units), "entries": entries})
    rows.sort(key=lambda r: (-r["mean"], -r["n"], r["name"]))
    return rows


def interval_text(row: Mapping[str, Any]) -> str:
    """``[low, high]`` to 4 places, or ``1 seed`` where the row has a single seed."""
    if row["low"] is None:
        return "1 seed"
    return f"[{row['low']:.4f}, {row['high']:.4f}]"


def runs_text(row: Mapping[str, Any]) -> str:
    """The number of seeds, with the number of runs where a seed was run more than once."""
    text = str(row["n"])
    if row.get("runs", row["n"]) != row["n"]:
        text += f" ({row['runs']} runs)"
    return text


def format_summary(board: Mapping[str, Any]) -> str:
    """The board as one row per method, best mean first (plain text)."""
    from rlvr_envs.commands.list import format_table
    from rlvr_envs.harness.leaderboard import pin_summary

    rows = summarize(board)
    header = ("#", "method", "seeds", "mean acc", "95% t interval", "sd", "min", "max", "len mean")
    table = [(str(rank), r["name"], runs_text(r), f"{r['mean']:.4f}", interval_text(r),
              "" if r["sd"] is None else f"{r['sd']:.4f}", f"{r['min']:.4f}", f"{r['max']:.4f}",
              f"{r['length_mean']:.1f} {'tok' if r['length_unit'] == 'tokens' else r['length_unit']}")
             for rank, r in enumerate(rows, 1)]
    title = (f"board {board['board']}: {board['env_id']} ({len(rows)} methods over {len(board['entries'])} entries; "
             f"{pin_summary(board)})\n(mean accuracy over a method's seeds, repeat runs of a seed averaged first; 95% "
             "Student-t interval over seeds, n-1 dof; per-run rows: --per-seed)")
    return title + "\n" + format_table(table, header) if table else title
