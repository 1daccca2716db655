"""The main job end to end on a tiny model: evaluate, submit to boards (re-verified), render; a re-run resumes."""

import json

import pytest

from rlvr_envs.cli import main


def test_demo_with_tiny_model_fills_boards_and_renders(tmp_path, data_dir, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--model", "tiny", "--scale", "0.05", "--out", str(out)]) == 0
    for board in ("arithmetic", "countdown"):
        doc = json.loads((out / "boards" / f"{board}.json").read_text())
        assert len(doc["entries"]) == 1 and doc["env_id"].startswith("rlvr/")
        assert (out / "site" / f"{board}.png").stat().st_size > 0
    assert "<table" in (out / "site" / "index.html").read_text()
    # A second run reuses the finished results: boards keep one entry each, nothing is lost or duplicated.
    assert main(["demo", "--model", "tiny", "--scale", "0.05", "--out", str(out)]) == 0
    for board in ("arithmetic", "countdown"):
        assert len(json.loads((out / "boards" / f"{board}.json").read_text())["entries"]) == 1
    assert "page:" in capsys.readouterr().out
    # Another scale is another task set: the board refuses it with a note, the run still finishes and renders.
    assert main(["demo", "--model", "tiny", "--scale", "0.1", "--out", str(out)]) == 0
    assert "is pinned to" in capsys.readouterr().out
    for board in ("arithmetic", "countdown"):
        assert len(json.loads((out / "boards" / f"{board}.json").read_text())["entries"]) == 1


def test_sweep_reports_gold_one_and_random_zero(capsys):
    assert main(["sweep", "--filter", "Arithmetic", "--tasks", "5"]) == 0
    out = capsys.readouterr().out
    assert "rlvr/Arithmetic-v0" in out and "1/1 environments" in out


@pytest.mark.parametrize("argv", [["demo", "--scale", "x"], ["nope"]])
def test_bad_cli_arguments_exit_with_usage(argv):
    with pytest.raises(SystemExit):
        main(argv)
