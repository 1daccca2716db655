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
import re
from collections import Counter
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
p.reported { font-size: 13px; color: #555; }
"""


def _system(entry: dict[str, Any]) -> str:
    """What an entry is, less its seed: the trained method's name for trained entries, else its label or model."""
    t = entry.get("training")
    if isinstance(t, dict) and t.get("method"):
        return str(t["method"])
    return entry.get("label") or re.sub(r"\s*\(seed \d+\)|,\s*seed \d+(?=\))", "", entry["model"])


def _mean_accuracy(entries: list[dict[str, Any]]) -> float:
    return sum(e["metrics"].get("accuracy", 0.0) for e in entries) / len(entries)


def _styles(entries: list[dict[str, Any]]) -> dict[str, tuple[Any, str]]:
    """One (colour, marker) per system, best mean accuracy first, so a method looks the same in both of a board's
    plots."""
    import matplotlib.pyplot as plt

    by_system: dict[str, list[dict[str, Any]]] = {}
    for e in entries:
        by_system.setdefault(_system(e), []).append(e)
    colors = plt.get_cmap("tab20").colors
    order = sorted(by_system, key=lambda name: -_mean_accuracy(by_system[name]))
    return {name: (colors[k % len(colors)], "osD^v<>P"[(k // len(colors)) % 8]) for k, name in enumerate(order)}


def _legend_name(name: str) -> str:
    return name if len(name) <= 40 else name[:37] + "..."


def _legend(ax: Any, n: int, title: str) -> None:
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), title=title, title_fontsize=7,
              ncol=1 if n <= 22 else 2)


def plot_board(board: dict[str, Any], path: Path) -> list[str]:
    """Accuracy against mean response length: each entry a faint point, each system (a method over its seeds) a large
    marker at its mean, named in the legend (returned, best first). Labels beside points overlap once a board holds
    dozens of runs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    entries = ranked(list(board["entries"]))
    styles = _styles(entries)
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for e in entries:
        groups.setdefault((_system(e), e["metrics"].get("length_unit", "?")), []).append(e)
    units = sorted({unit for _, unit in groups})
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    labels = []
    for (name, unit), pts in sorted(groups.items(), key=lambda kv: -_mean_accuracy(kv[1])):
        xs = [e["metrics"].get("length_mean", 0.0) for e in pts]
        ys = [e["metrics"].get("accuracy", 0.0) for e in pts]
        color, marker = styles[name]
        ax.scatter(xs, ys, s=18, color=color, marker=marker, alpha=0.35, zorder=2)
        label = _legend_name(name) + f" ({len(pts)})" + (f" [{unit}]" if len(units) > 1 else "")
        labels.append(label)
        ax.scatter([sum(xs) / len(xs)], [sum(ys) / len(ys)], s=70, color=color, marker=marker, edgecolors="black",
                   linewidths=0.6, zorder=3, label=label)
    ax.set_xlabel(f"mean response length ({' / '.join(units)})" if entries else "mean response length")
    ax.set_ylabel("accuracy (mean@n)")
    ax.set_ylim(-0.05, 1.05)
    ax.set_title(f"{board['board']}: {board['env_id']}", fontsize=10)
    ax.grid(alpha=0.3)
    if entries:
        _legend(ax, len(groups), "mean over entries (n)")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return labels


def plot_curves(board: dict[str, Any], path: Path) -> list[str]:
    """Held-out accuracy against rollouts generated, one line per trained entry (its reported curve), coloured by
    system as in the accuracy-vs-length plot with one legend entry per system (returned); an ``x`` marks the entry's
    re-verified board accuracy at the run's final rollout count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    entries = ranked(list(board["entries"]))
    styles = _styles(entries)
    trained = [e for e in entries if isinstance(e.get("training"), dict)]
    counts = Counter(map(_system, trained))
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    labels = []
    for e in trained:
        t, name = e["training"], _system(e)
        color, marker = styles[name]
        curve = t.get("curve") or []
        label = None
        if name in counts:  # the system's first (best) entry carries its legend entry
            label = f"{_legend_name(name)} ({counts.pop(name)})"
            labels.append(label)
        ax.plot([p["rollouts"] for p in curve], [p["eval_accuracy"] for p in curve], marker=marker, markersize=3,
                color=color, alpha=0.8, linewidth=1, label=label)
        ax.scatter([t["rollouts"]], [e["metrics"].get("accuracy", 0.0)], marker="x", s=50, color=color, zorder=3)
    ax.set_xlabel("rollouts generated in training")
    ax.set_ylabel("held-out accuracy (the run's own eval)")
    ax.set_ylim(-0.05, 1.05)
    ax.set_title(f"{board['board']}: learning curves (x: re-verified final)", fontsize=10)
    ax.grid(alpha=0.3)
    if labels:
        _legend(ax, len(labels), "runs per system")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return labels


def _cell(value: Any, text: str | None = None, *, cls: str = "") -> str:
    sort_value = "" if value is None else str(value)
    shown = text if text is not None else ("" if value is None else str(value))
    klass = f' class="{cls}"' if cls else ""
    return f'<td{klass} data-v="{html.escape(sort_value, quote=True)}">{html.escape(shown)}</td>'


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
            f'alt="accuracy vs response length for {name}"></a>{curves}{board_table(board)}</section>')
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
        "submitter's report, <em>self-reported</em>. Click a column header to sort.</p>"
        + "".join(sections) + f"<script>{_SORT_JS}</script></body></html>\n"
    )
    index = out / "index.html"
    tmp = index.with_name(".index.html.tmp")
    tmp.write_text(page, encoding="utf-8")
    os.replace(tmp, index)
    return index
