"""The static leaderboard page: table, plots, provenance, escaping; and that it renders in headless Chromium."""

import shutil
import subprocess
from pathlib import Path

import matplotlib.image as mpimg
import numpy as np
import pytest
from harness_toy import TOY_ID, SeededAgent

from rlvr_envs.cli import main as rlvr_main
from rlvr_envs.harness import evaluate
from rlvr_envs.harness import leaderboard as lb
from rlvr_envs.harness.render import render_site

CHROMIUM = "/usr/bin/chromium"
EVIL = "<script>alert('x')</script>"


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("lb")
    # A board is pinned to one task set and sample count: the "toy" runs differ by seed only.
    for i, (board, samples, limit) in enumerate([("toy", 2, 8), ("toy", 2, 8), ("toy", 2, 8), ("toy-big", 3, 12)]):
        out = root / f"r{i}.json"
        evaluate(SeededAgent(report_tokens=i % 2 == 0), TOY_ID, n_samples=samples, seed=i, limit=limit,
                 out=out, progress=False, batch_size=4)
        lb.submit(out, board, boards_dir=root / "boards", label=EVIL if i == 1 else f"run {i}")
    assert rlvr_main(["leaderboard", "--boards-dir", str(root / "boards"), "render", "--out", str(root / "site")]) == 0
    return root / "site"


def test_page_has_tables_plots_and_provenance(site):
    page = (site / "index.html").read_text()
    assert page.count('<table class="board">') == 2
    assert page.count("<tr>") == 2 + 4  # two header rows, four entries
    for board in ("toy", "toy-big"):
        png = site / f"{board}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f'src="{board}.png"' in page
        img = mpimg.imread(png)
        assert img.shape[0] > 200 and img[..., :3].std() > 0.05  # a drawn plot, not a blank canvas
    assert "<details>" in page and "fingerprint" in page and "seeded-fake" in page
    assert "pinned to 8 tasks x 2 samples" in page and "pinned to 12 tasks x 3 samples" in page
    assert "addEventListener('click'" in page  # the sorting script
    # User-supplied text is escaped, never injected as markup.
    assert EVIL not in page and "&lt;script&gt;alert(" in page


def test_rows_are_ranked_by_accuracy(site, tmp_path):
    board = lb.load_board(site.parent / "boards" / "toy.json")
    accs = [e["metrics"]["accuracy"] for e in lb.ranked(board["entries"])]
    assert accs == sorted(accs, reverse=True) and len(accs) == 3
    text = lb.format_board(board)
    lines = text.splitlines()
    assert lines[0] == f"board toy: {TOY_ID} (3 entries; pinned to 8 tasks x 2 samples, task ids sha256 " \
                       f"{board['pin']['task_ids_sha256'][:12]})"
    assert "pass@n" in lines[1] and "maj@n" in lines[1]
    assert [line.split()[0] for line in lines[3:]] == ["1", "2", "3"]


def test_render_with_no_boards(tmp_path):
    index = render_site(tmp_path / "none", tmp_path / "site")
    assert "No boards" in index.read_text()


def chromium(*args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}"]
    return subprocess.run([CHROMIUM, *flags, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(not Path(CHROMIUM).exists() or shutil.which(CHROMIUM) is None,
                    reason=f"{CHROMIUM} is absent (CI installs the Debian chromium package)")
def test_page_renders_in_headless_chromium(site, tmp_path):
    shot = tmp_path / "shot.png"
    url = (site / "index.html").as_uri()
    proc = chromium(f"--screenshot={shot}", "--window-size=1400,1800", "--dump-dom", url, tmp_path=tmp_path)
    assert shot.exists(), proc.stderr[-2000:]
    img = mpimg.imread(shot)
    assert img.shape[:2] == (1800, 1400)
    rgb = img[..., :3]
    assert (rgb < 0.5).mean() > 0.005  # text and plot pixels, not a blank page
    q = (rgb * 255).astype(np.uint32)
    assert len(np.unique(q[..., 0] << 16 | q[..., 1] << 8 | q[..., 2])) > 50  # the plot's colours
    # The DOM Chromium built: both tables and both plots are there.
    assert proc.stdout.count('<table class="board">') == 2 and proc.stdout.count('class="plot"') == 2


def test_accuracy_vs_length_plot_groups_seeds_of_a_method(tmp_path):
    from rlvr_envs.harness.render import plot_board, plot_curves
    from rlvr_envs.harness.summary import entry_name

    def entry(model: str, acc: float, length: float, method: str | None = None, unit: str = "tokens") -> dict:
        e = {"model": model, "label": None, "metrics": {"accuracy": acc, "length_mean": length, "length_unit": unit}}
        if method:
            e["training"] = {"method": method}
        return e

    entries = [entry("m + grpo (seed 0)", 0.5, 20, "grpo"), entry("m + grpo (seed 1)", 0.4, 22, "grpo"),
               entry("m + dapo (seed 0)", 0.6, 30, "dapo"), entry("base (seed 3)", 0.1, 40),
               entry("cascade: m + agon (seed 1) drafts -> m (agon partner, seed 1) answers", 0.2, 10)]
    assert entry_name(entries[3]) == "base"  # an untrained entry: its model name less the seed
    assert entry_name(entries[4]) == "cascade: m + agon drafts -> m (agon partner) answers"
    labels = plot_board({"board": "b", "env_id": "toy", "entries": entries}, tmp_path / "b.png")
    # one legend entry per system, best mean accuracy first, with its number of entries
    assert labels[:3] == ["dapo (1)", "grpo (2)", "cascade: m + agon drafts -> m (agon p... (1)"]
    assert labels[3] == "base (1)" and len(labels) == 4
    img = mpimg.imread(tmp_path / "b.png")
    assert img[..., :3].std() > 0.05
    mixed = plot_board({"board": "b", "env_id": "toy", "entries": [entry("x", 0.3, 5, unit="chars"), entries[0]]},
                       tmp_path / "c.png")
    assert mixed == ["grpo (1) [tokens]", "x (1) [chars]"]  # units are named only when a board mixes them
    for e in entries[:3]:
        e["training"]["curve"] = [{"rollouts": 0, "eval_accuracy": 0.1}, {"rollouts": 64, "eval_accuracy": 0.5}]
        e["training"]["rollouts"] = 64
    # the learning curves: trained entries only, one legend entry per method
    assert plot_curves({"board": "b", "entries": entries}, tmp_path / "d.png") == ["dapo (1)", "grpo (2)"]
