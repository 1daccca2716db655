"""Static leaderboard site: ``index.html`` (sortable tables, provenance per row) and one accuracy-vs-length PNG per board.

Boards with trained entries (a ``training`` block, see ``agents.grpo.publish``) also get training-cost columns and a
learning-curve PNG (``curves/<board>.png``: held-out accuracy against rollouts, one line per entry); the page marks
those figures as the runs' own report, not re-verified.

Every string from a board (model names, labels, provenance) is user-supplied, so all of it is HTML-escaped.
"""

from __future__ import annotations

import html
import json
import os
import random
from pathlib import Path
from typing import Any

from rlvr_envs.harness.leaderboard import (
    has_training,
    list_boards,
    load_board,
    pin_summary,
    ranked,
    training_cells,
    unverifiable_cell,
)
from rlvr_envs.harness.reproduce import entry_evidence, evidence_text
from rlvr_envs.harness.summary import interval_text, runs_text, summarize

_SORT_JS = """
document.querySelectorAll('table.board').forEach(function (table) {
  table.querySelectorAll('th').forEach(function (th, col) {
    th.addEventListener('click', function () {
      var body = table.tBodies[0];
      var rows = Array.prototype.slice.call(body.rows);
      var asc = th.getAttribute('data-dir') !== 'asc';
      table.querySelectorAll('th').forEach(function (h) { h.removeAttribute('data-dir'); });
      th.setAttribute('data-dir', asc ? 'asc' : 'desc');
      rows.sort(function (a, b) {
        var x = a.cells[col].getAttribute('data-v'), y = b.cells[col].getAttribute('data-v');
        var nx = parseFloat(x), ny = parseFloat(y);
        var c = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : String(x).localeCompare(String(y));
        return asc ? c : -c;
      });
      rows.forEach(function (r) { body.appendChild(r); });
    });
  });
});
"""

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table.board { border-collapse: collapse; margin: 1em 0; font-size: 14px; }
table.board th, table.board td { border: 1px solid #ccc; padding: 4px 8px; text-align: right; vertical-align: top; }
table.board td.text { text-align: left; }
table.board th { background: #eef; cursor: pointer; user-select: none; }
table.board th[data-dir=asc]::after { content: ' \\25B2'; }
table.board th[data-dir=desc]::after { content: ' \\25BC'; }
details pre { text-align: left; max-width: 60em; white-space: pre-wrap; font-size: 11px; }
img.plot { max-width: 720px; border: 1px solid #ddd; }
table.summary th { background: #efe; }
details.per-seed > summary { cursor: pointer; margin: 0.5em 0; }
p.reported { font-size: 13px; color: #555; }
"""


# Per-seed points are shifted sideways by up to this share of the x axis's span so that runs with the same accuracy
# and length (repeat runs of a seed, or methods that all collapsed) do not hide one another; accuracy (y) is never
# moved.
JITTER = 0.01
_MARKERS = "osD^v<>Ph*Xd"


def _styles(board: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[tuple[str, ...], tuple[Any, str]]]:
    """The board's methods (``summarize``, best mean first) and one (colour, marker) per method, so a method looks
    the same in both of a board's plots; markers cycle with a different period from colours so that neighbouring
    methods differ in both."""
    import matplotlib.pyplot as plt

    rows = summarize(board)
    colors = plt.get_cmap("tab20").colors
    return rows, {r["key"]: (colors[k % len(colors)], _MARKERS[k % len(_MARKERS)]) for k, r in enumerate(rows)}


def _jittered(xs: list[float], span: float, rng: random.Random) -> list[float]:
    return [x + rng.uniform(-JITTER, JITTER) * span for x in xs]


def _legend_name(name: str) -> str:
    return name if len(name) <= 40 else name[:37] + "..."


def _legend(ax: Any, n: int, title: str) -> None:
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), title=title, title_fontsize=7,
              ncol=1 if n <= 22 else 2)


def plot_board(board: dict[str, Any], path: Path) -> list[str]:
    """Accuracy against mean response length: each entry (one run, one seed) a faint point; each method a large
    semi-transparent marker at its mean with a vertical bar for its 95% Student-t interval over seeds (``summarize``;
    none for one seed), named in the legend (returned, best mean first) with its number of runs. Every marker is shifted sideways by up to
    ``JITTER`` of the x span (deterministic) and methods differ in both colour and shape, so that runs or methods
    at the same place do not hide one another; accuracy is never moved."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, styles = _styles(board)
    groups: list[tuple[dict[str, Any], str, list[dict[str, Any]]]] = []
    for r in rows:
        by_unit: dict[str, list[dict[str, Any]]] = {}
        for e in r["entries"]:
            by_unit.setdefault(e["metrics"].get("length_unit", "?"), []).append(e)
        groups += [(r, unit, pts) for unit, pts in by_unit.items()]
    units = sorted({unit for _, unit, _ in groups})
    all_x = [e["metrics"].get("length_mean", 0.0) for e in board["entries"]] or [0.0]
    # entries at (nearly) one length: a tenth of that length as the span, so the axis is not zoomed into rounding
    span = max(max(all_x) - min(all_x), 0.1 * max(abs(x) for x in all_x), 1.0)
    rng = random.Random(0)
    fig, ax = plt.subplots(figsize=(9 if len(groups) <= 22 else 11, 5), dpi=100)
    labels = []
    for r, unit, pts in groups:
        xs = [e["metrics"].get("length_mean", 0.0) for e in pts]
        ys = [e["metrics"].get("accuracy", 0.0) for e in pts]
        color, marker = styles[r["key"]]
        ax.scatter(_jittered(xs, span, rng), ys, s=18, color=color, marker=marker, alpha=0.45, linewidths=0, zorder=2)
        label = _legend_name(r["name"]) + f" ({len(pts)})" + (f" [{unit}]" if len(units) > 1 else "")
        labels.append(label)
        whole = len(pts) == len(r["entries"])  # the method's every run (not one length unit of several)
        mean_y = r["mean"] if whole else sum(ys) / len(ys)  # the summary's mean over seeds, where its bar is centred
        (mean_x,) = _jittered([sum(xs) / len(xs)], span, rng)
        if whole and r["low"] is not None:
            ax.errorbar([mean_x], [mean_y], yerr=[[mean_y - r["low"]], [r["high"] - mean_y]], fmt="none",
                        ecolor=color, elinewidth=1.2, capsize=3, alpha=0.9, zorder=3)
        ax.scatter([mean_x], [mean_y], s=70, color=color, marker=marker, edgecolors="black", linewidths=0.6,
                   alpha=0.6, zorder=4, label=label)
    unit_text = {"tokens": "tokens per response", "words": "words per response"}
    ax.set_xlabel("mean response length (" + " / ".join(unit_text.get(u, u) for u in units) + ")" if units
                  else "mean response length")
    ax.set_ylabel("accuracy (fraction of samples correct, mean@n)")
    ax.set_ylim(-0.05, 1.05)
    ax.set_xlim(min(all_x) - 0.1 * span, max(all_x) + 0.1 * span)
    ax.ticklabel_format(axis="x", useOffset=False, style="plain")
    ax.set_title(f"{board['board']}: {board['env_id']}\nlarge: method mean over runs, bar: its 95% t interval\n"
                 f"small: one run (seed) each; markers see-through, jittered sideways (up to {JITTER:.0%} of x span)",
                 fontsize=8)
    ax.grid(alpha=0.3)
    if groups:
        _legend(ax, len(groups), "method (runs)")
    fig.tight_layout()
    fig.savefig(path, bbox_inches="tight")  # the legend and title sit outside the axes
    plt.close(fig)
    return labels


def plot_curves(board: dict[str, Any], path: Path) -> list[str]:
    """Held-out accuracy against rollouts generated, one line per trained entry (its reported curve), coloured by
    system as in the accuracy-vs-length plot with one legend entry per system (returned); an ``x`` marks the entry's
    re-verified board accuracy at the run's final rollout count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, styles = _styles(board)
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    labels = []
    for r in rows:
        trained = [e for e in r["entries"] if isinstance(e.get("training"), dict)]
        color, marker = styles[r["key"]]
        for k, e in enumerate(trained):
            t = e["training"]
            curve = t.get("curve") or []
            label = None
            if k == 0:  # the method's first (best) entry carries its legend entry
                label = f"{_legend_name(r['name'])} ({len(trained)})"
                labels.append(label)
            ax.plot([p["rollouts"] for p in curve], [p["eval_accuracy"] for p in curve], marker=marker,
                    markersize=3, color=color, alpha=0.8, linewidth=1, label=label)
            ax.scatter([t["rollouts"]], [e["metrics"].get("accuracy", 0.0)], marker="x", s=50, color=color, zorder=3)
    ax.set_xlabel("rollouts generated in training (count)")
    ax.set_ylabel("held-out accuracy (fraction correct, run's own eval)")
    ax.set_ylim(-0.05, 1.05)
    ax.set_title(f"{board['board']}: learning curves (x: re-verified final)", fontsize=10)
    ax.grid(alpha=0.3)
    if labels:
        _legend(ax, len(labels), "method (runs)")
    fig.tight_layout()
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    return labels


def _cell(value: Any, text: str | None = None, *, cls: str = "") -> str:
    sort_value = "" if value is None else str(value)
    shown = text if text is not None else ("" if value is None else str(value))
    klass = f' class="{cls}"' if cls else ""
    return f'<td{klass} data-v="{html.escape(sort_value, quote=True)}">{html.escape(shown)}</td>'


def summary_table(board: dict[str, Any]) -> str:
    """One row per method (``summarize``): mean accuracy over its seeds (repeat runs of a seed averaged first), the
    95% Student-t interval over them, how many seeds (and runs where more), best mean first. Its own class,
    ``summary``, beside ``board``; its rows are ``<tr class="method">``."""
    head = ["#", "method", "seeds", "mean accuracy", "95% t interval", "sd over seeds", "min", "max", "mean length"]
    rows = []
    for rank, r in enumerate(summarize(board), 1):
        unit = "tok" if r["length_unit"] == "tokens" else r["length_unit"]
        cells = [
            _cell(rank), _cell(r["name"], cls="text"), _cell(r["n"], runs_text(r)),
            _cell(r["mean"], f"{r['mean']:.4f}"), _cell(r["low"], interval_text(r)),
            _cell(r["sd"], "" if r["sd"] is None else f"{r['sd']:.4f}"),
            _cell(r["min"], f"{r['min']:.4f}"), _cell(r["max"], f"{r['max']:.4f}"),
            _cell(r["length_mean"], f"{r['length_mean']:.1f} {unit}"),
        ]
        rows.append('<tr class="method">' + "".join(cells) + "</tr>")
    thead = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    return (f'<table class="board summary"><thead><tr class="method">{thead}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table>')


def board_table(board: dict[str, Any]) -> str:
    entries = ranked(list(board["entries"]))
    trained = has_training(board)
    head = ["#", "model", "label", "tasks", "samples", "accuracy", "pass@n", "maj@n", "mean length", "median length",
            "format errors", "unverifiable", "tokens", "wall s",
            *(["train rollouts", "train tokens", "train FLOPs", "train wall s"] if trained else []),
            "submitted", "evidence", "provenance"]
    rows = []
    for rank, e in enumerate(entries, 1):
        m, n = e["metrics"], e["n_samples"]
        unit = "tok" if m.get("length_unit") == "tokens" else "words"
        prov = json.dumps({"weights_hash": e.get("weights_hash"), "n_params": e.get("n_params"), "seed": e.get("seed"),
                           "results_sha256": e.get("results_sha256"), **(e.get("provenance") or {}),
                           **({"training (reported, not re-verified)": e["training"]} if e.get("training") else {})},
                          indent=1)
        t = e.get("training") if isinstance(e.get("training"), dict) else {}
        train = [_cell(t.get(k), text) for k, text in
                 zip(("rollouts", "response_tokens", "flops_estimate", "wall_time_s"), training_cells(e))]
        pass_n, maj_n = m.get(f"pass@{n}"), m.get(f"maj@{n}")
        cells = [
            _cell(rank), _cell(e["model"], cls="text"), _cell(e.get("label") or "", cls="text"),
            _cell(e["n_tasks"]), _cell(n), _cell(m.get("accuracy"), f"{m.get('accuracy', 0):.4f}"),
            _cell(pass_n, f"{pass_n:.4f} (n={n})" if pass_n is not None else ""),
            _cell(maj_n, f"{maj_n:.4f} (n={n})" if maj_n is not None else ""),
            _cell(m.get("length_mean"), f"{m.get('length_mean', 0):.1f} {unit}"),
            _cell(m.get("length_median"), f"{m.get('length_median', 0):.1f} {unit}"),
            _cell(m.get("format_error_rate"), f"{m.get('format_error_rate', 0):.3f}"),
            _cell(m.get("unverifiable_rate"), unverifiable_cell(m)),
            _cell(m.get("tokens_generated")),
            _cell(e.get("wall_time_s"), f"{e['wall_time_s']:.1f}" if e.get("wall_time_s") is not None else ""),
            *(train if trained else []),
            _cell(e.get("submitted_at", ""), cls="text"),
            _cell(entry_evidence(e).get("tier"), evidence_text(e), cls="text"),
            f'<td class="text" data-v=""><details><summary>show</summary><pre>{html.escape(prov)}</pre></details></td>',
        ]
        rows.append("<tr>" + "".join(cells) + "</tr>")
    thead = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    return f'<table class="board"><thead><tr>{thead}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def render_site(boards_dir: str | os.PathLike | None = None, out_dir: str | os.PathLike | None = None) -> Path:
    """Write ``index.html`` and ``<board>.png`` files into ``out_dir``; return the HTML path."""
    from rlvr_envs.harness.leaderboard import default_boards_dir

    root = Path(boards_dir) if boards_dir is not None else default_boards_dir()
    out = Path(out_dir) if out_dir is not None else root.parent / "site"
    out.mkdir(parents=True, exist_ok=True)
    sections = []
    for path in list_boards(root):
        board = load_board(path)
        png = out / f"{path.stem}.png"
        plot_board(board, png)
        name = html.escape(board["board"])
        curves = ""
        if has_training(board):
            (out / "curves").mkdir(exist_ok=True)  # a folder of their own: no board name can collide with them
            plot_curves(board, out / "curves" / f"{path.stem}.png")
            src = html.escape(f"curves/{path.stem}.png", quote=True)
            curves = (f' <a href="{src}"><img class="plot" src="{src}" alt="learning curves for {name}"></a>'
                      '<p class="reported">Trained entries: the accuracy columns are re-verified like every entry; '
                      "the training columns (rollouts, tokens, FLOPs, wall time) and the learning curves are the "
                      "training run's own report, stored as submitted and not re-verifiable. FLOPs are the "
                      "trainer's count (an estimate for runs from before it counted; how, in each row's "
                      "provenance).</p>")
        sections.append(
            f'<section id="{html.escape(path.stem, quote=True)}"><h2>{name} &mdash; {html.escape(board["env_id"])}</h2>'
            f'<p class="pin">{html.escape(pin_summary(board))}</p>'
            f'<a href="{html.escape(png.name, quote=True)}"><img class="plot" src="{html.escape(png.name, quote=True)}" '
            f'alt="accuracy vs response length for {name}"></a>{curves}'
            f'<h3>By method</h3>{summary_table(board)}'
            f'<details class="per-seed"><summary>every entry: one row per run (seed), {len(board["entries"])} rows'
            f'</summary>{board_table(board)}</details></section>')
    if not sections:
        sections.append(f"<p>No boards in {html.escape(str(root))} yet.</p>")
    page = (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>rlvr-envs leaderboards</title>"
        f"<style>{_CSS}</style></head><body><h1>rlvr-envs leaderboards</h1>"
        "<p>Every entry was re-verified with the environment's own verifier when submitted. "
        "<em>unverifiable</em>: the share of samples the verifier could not decide (timeouts, crashed checks, "
        "unreadable gold answers), counted as not correct in the accuracy columns; n/a for entries submitted "
        "before it was recorded. <em>evidence</em>: model name, responses and token counts are <em>reproduced</em> "
        "where the evaluated policy loads here with the claimed weights hash (a seeded sample of records decoded "
        "again must match exactly, token counts recounted with its tokenizer); everywhere else they are the "
        "submitter's report, <em>self-reported</em>. <em>By method</em>: one row per method (a trained entry's "
        "<code>training.method</code>, split by base model or step count where a board holds several; entries "
        "without a method are rows of their own): the mean accuracy over its seeds (the unit of replication; repeat "
        "runs of one seed are averaged first), a 95% Student-t interval over them (n-1 degrees of freedom; none for "
        "a single seed) and the number of seeds, best mean first; every run's own row is under <em>every entry</em>. Click a column header to sort.</p>"
        + "".join(sections) + f"<script>{_SORT_JS}</script></body></html>\n"
    )
    index = out / "index.html"
    tmp = index.with_name(".index.html.tmp")
    tmp.write_text(page, encoding="utf-8")
    os.replace(tmp, index)
    return index
