"""Board submission: schema, re-verification with the env's verifier, metric recomputation, names, atomic appends."""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest
from harness_toy import TOY_ID, SeededAgent, make_toy_env

from rlvr_envs.cli import main as rlvr_main
from rlvr_envs.harness import evaluate
from rlvr_envs.harness import leaderboard as lb
from rlvr_envs.harness.metrics import metrics_match

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
TOY_V1 = "rlvrtest/ToyOther-v0"
if TOY_V1 not in gym.registry:
    gym.register(TOY_V1, entry_point=make_toy_env)


def make_results(path: Path, seed: int = 5, env_id: str = TOY_ID, **kw) -> dict:
    args = dict(n_samples=2, seed=seed, limit=8, progress=False, batch_size=4)
    args.update(kw)
    evaluate(SeededAgent(), env_id, out=path, **args)
    return json.loads(path.read_text())


def write(path: Path, doc: dict) -> Path:
    path.write_text(json.dumps(doc))
    return path


@pytest.fixture
def results(tmp_path) -> tuple[Path, dict]:
    path = tmp_path / "results.json"
    return path, make_results(path)


def board_entries(boards: Path, name: str) -> list[dict]:
    return lb.load_board(boards / f"{name}.json")["entries"]


def test_accepts_valid_results_and_shows_them(results, tmp_path, capsys):
    path, doc = results
    boards = tmp_path / "boards"
    assert rlvr_main(["leaderboard", "--boards-dir", str(boards), "submit", str(path), "--board", "toy",
                      "--label", "fake run"]) == 0
    assert "accepted on board 'toy'" in capsys.readouterr().out
    (entry,) = board_entries(boards, "toy")
    assert entry["metrics"]["accuracy"] == doc["metrics"]["accuracy"]
    assert entry["model"] == "seeded-fake" and entry["label"] == "fake run" and entry["env_id"] == TOY_ID
    assert entry["provenance"]["data"]["fingerprint"] == doc["provenance"]["data"]["fingerprint"]
    assert rlvr_main(["leaderboard", "--boards-dir", str(boards), "show", "toy"]) == 0
    shown = capsys.readouterr().out
    assert "seeded-fake" in shown and f"{doc['metrics']['accuracy']:.4f}" in shown and TOY_ID in shown
    # The same file twice is refused; a different run is appended.
    with pytest.raises(lb.SubmissionRejected, match="already on board"):
        lb.submit(path, "toy", boards_dir=boards)
    lb.submit(write(tmp_path / "other.json", make_results(tmp_path / "r2.json", seed=6)), "toy", boards_dir=boards)
    assert len(board_entries(boards, "toy")) == 2


def test_flipped_verdict_is_rejected(results, tmp_path):
    _, doc = results
    flipped = json.loads(json.dumps(doc))
    rec = flipped["records"][1]
    rec["correct"] = not rec["correct"]
    with pytest.raises(lb.SubmissionRejected, match=r"1 record\(s\) disagree.*toy-0.*sample 1.*verifier says"):
        lb.submit(flipped, "toy", boards_dir=tmp_path)
    # Even with metrics recomputed to match the lie, the verifier catches it.
    from rlvr_envs.harness.metrics import compute_metrics

    flipped["metrics"] = compute_metrics(flipped["records"], 2, n_params=1000)
    with pytest.raises(lb.SubmissionRejected, match="disagree"):
        lb.submit(flipped, "toy", boards_dir=tmp_path)
    assert not (tmp_path / "toy.json").exists()


def test_edited_score_is_rejected(results, tmp_path, capsys):
    path, doc = results
    doc["metrics"]["accuracy"] = 0.9
    doc["metrics"]["pass@1"] = 0.9
    bad = write(tmp_path / "edited.json", doc)
    assert rlvr_main(["leaderboard", "--boards-dir", str(tmp_path), "submit", str(bad), "--board", "toy"]) == 1
    err = capsys.readouterr().err
    assert "rejected" in err and "accuracy: claimed 0.9, re-verified" in err
    assert not (tmp_path / "toy.json").exists()


@pytest.mark.parametrize("name", ["../evil", "a/b", "/etc/passwd", ".hidden", "", "a\\b", "x.json", "..", "a..b",
                                  "a" * 65, "name with space", "nul\x00"])
def test_path_like_board_names_are_refused(results, tmp_path, name):
    path, _ = results
    with pytest.raises(lb.SubmissionRejected, match="invalid board name"):
        lb.submit(path, name, boards_dir=tmp_path / "boards")
    assert not (tmp_path / "boards").exists() and not (tmp_path / "evil.json").exists()


def test_schema_partial_env_version_and_data_checks(results, tmp_path):
    path, doc = results
    broken = json.loads(json.dumps(doc))
    del broken["records"][0]["response"]
    with pytest.raises(lb.SubmissionRejected, match="schema: records\\[0\\]: missing field 'response'"):
        lb.submit(broken, "toy", boards_dir=tmp_path)
    partial = json.loads(json.dumps(doc))
    partial["complete"] = False
    with pytest.raises(lb.SubmissionRejected, match="partial"):
        lb.submit(partial, "toy", boards_dir=tmp_path)
    wrong_version = json.loads(json.dumps(doc))
    wrong_version["provenance"]["env"]["version"] = 3
    with pytest.raises(lb.SubmissionRejected, match="env version 3"):
        lb.submit(wrong_version, "toy", boards_dir=tmp_path)
    gone = json.loads(json.dumps(doc))
    gone["config"]["env_id"] = "rlvrtest/Toy-v7"
    gone["provenance"]["env"]["version"] = 7
    with pytest.raises(lb.SubmissionRejected, match="cannot make env"):
        lb.submit(gone, "toy", boards_dir=tmp_path)
    other_data = json.loads(json.dumps(doc))
    other_data["provenance"]["data"]["fingerprint"] = "0" * 64
    with pytest.raises(lb.SubmissionRejected, match="data fingerprint"):
        lb.submit(other_data, "toy", boards_dir=tmp_path)
    reseeded = json.loads(json.dumps(doc))
    reseeded["records"][0]["seed"] += 1
    with pytest.raises(lb.SubmissionRejected, match="not the one derived"):
        lb.submit(reseeded, "toy", boards_dir=tmp_path)
    (tmp_path / "junk.json").write_text("{oops")
    with pytest.raises(lb.SubmissionRejected, match="not valid JSON"):
        lb.submit(tmp_path / "junk.json", "toy", boards_dir=tmp_path)


def test_board_is_bound_to_one_env_version(results, tmp_path):
    path, _ = results
    lb.submit(path, "toy", boards_dir=tmp_path)
    v1 = make_results(tmp_path / "v1.json", env_id=TOY_V1)
    with pytest.raises(lb.SubmissionRejected, match="ranks rlvrtest/Toy-v0; these results are for rlvrtest/ToyOther-v0"):
        lb.submit(v1, "toy", boards_dir=tmp_path)
    other_kwargs = make_results(tmp_path / "k.json", env_kwargs={"n_tasks": 9})
    with pytest.raises(lb.SubmissionRejected, match="a different benchmark"):
        lb.submit(other_kwargs, "toy", boards_dir=tmp_path)


def subprocess_env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(REPO), os.environ.get("PYTHONPATH", "")])}


def test_submit_script_runs_the_same_code(tmp_path):
    # A fresh interpreter does not know the toy env; "module:id" makes gymnasium import it.
    doc = make_results(tmp_path / "r.json", env_id=f"harness_toy:{TOY_ID}")
    proc = subprocess.run([sys.executable, str(REPO / "leaderboards" / "submit.py"), str(tmp_path / "r.json"),
                           "--board", "toy", "--boards-dir", str(tmp_path / "b")], env=subprocess_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert board_entries(tmp_path / "b", "toy")[0]["metrics"]["accuracy"] == doc["metrics"]["accuracy"]
    proc = subprocess.run([sys.executable, str(REPO / "leaderboards" / "submit.py"), str(tmp_path / "r.json"),
                           "--board", "../escape", "--boards-dir", str(tmp_path / "b")], env=subprocess_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "invalid board name" in proc.stderr


# Each writer holds the lock for a while (slow write), so without the lock concurrent appends would overwrite
# each other; with it every entry survives.
CONCURRENT = """
import sys, time
from rlvr_envs.harness import leaderboard as lb
from rlvr_envs.harness.metrics import metrics_match
write = lb.atomic_write_json
def slow_write(path, doc):
    time.sleep(0.2)
    write(path, doc)
lb.atomic_write_json = slow_write
lb.submit(sys.argv[1], "conc", boards_dir=sys.argv[2])
"""

CRASH = """
import os, signal, sys
from rlvr_envs.harness import results
def crash(fd):
    os.kill(os.getpid(), signal.SIGKILL)  # die after the temp file is written, before it replaces the board
results.os.fsync = crash
from rlvr_envs.harness import leaderboard as lb
from rlvr_envs.harness.metrics import metrics_match
lb.submit(sys.argv[1], "toy", boards_dir=sys.argv[2])
"""


def test_concurrent_submits_lose_nothing(tmp_path):
    files = [tmp_path / f"r{i}.json" for i in range(5)]
    for i, f in enumerate(files):
        make_results(f, seed=100 + i, env_id=f"harness_toy:{TOY_ID}", limit=4)
    procs = [subprocess.Popen([sys.executable, "-c", CONCURRENT, str(f), str(tmp_path / "b")], env=subprocess_env(),
                              stderr=subprocess.PIPE, text=True) for f in files]
    for p in procs:
        _, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
    entries = board_entries(tmp_path / "b", "conc")
    assert sorted(e["seed"] for e in entries) == [100, 101, 102, 103, 104]


def test_crash_mid_write_leaves_the_old_board(tmp_path):
    first = tmp_path / "first.json"
    make_results(first, env_id=f"harness_toy:{TOY_ID}", limit=4)
    lb.submit(first, "toy", boards_dir=tmp_path / "b")
    before = (tmp_path / "b" / "toy.json").read_bytes()
    second = tmp_path / "second.json"
    make_results(second, seed=9, env_id=f"harness_toy:{TOY_ID}", limit=4)
    proc = subprocess.run([sys.executable, "-c", CRASH, str(second), str(tmp_path / "b")], env=subprocess_env(),
                          timeout=120)
    assert proc.returncode == -9
    assert (tmp_path / "b" / "toy.json").read_bytes() == before
    # The dead writer's lock is released with its process: the next submit goes through.
    lb.submit(second, "toy", boards_dir=tmp_path / "b")
    assert len(board_entries(tmp_path / "b", "toy")) == 2


def test_corrupt_board_is_never_overwritten(results, tmp_path):
    path, _ = results
    (tmp_path / "toy.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        lb.submit(path, "toy", boards_dir=tmp_path)
    assert (tmp_path / "toy.json").read_text() == "{not json"


def test_default_boards_dir(monkeypatch, tmp_path):
    monkeypatch.setenv(lb.BOARDS_ENV_VAR, str(tmp_path))
    assert lb.default_boards_dir() == tmp_path
    monkeypatch.delenv(lb.BOARDS_ENV_VAR)
    assert lb.default_boards_dir() == REPO / "leaderboards" / "boards"


def test_multi_turn_records_are_replayed_through_the_env(tmp_path):
    from harness_toy import MULTI_ID, HintAgent

    out = tmp_path / "multi.json"
    res = evaluate(HintAgent(), MULTI_ID, n_samples=2, seed=3, batch_size=4, progress=False, out=out)
    assert 0 < res.metrics["accuracy"] < 1
    lb.submit(out, "hint", boards_dir=tmp_path)
    doc = json.loads(out.read_text())
    right = next(r for r in doc["records"] if r["correct"])
    right["turns"] = right["turns"][-1:]  # drop the hint turn: still a correct final answer, but not this run's...
    right["response"] = right["turns"][-1]
    lb.submit(doc, "hint2", boards_dir=tmp_path)  # ...which replay accepts: the verdict depends on the answer only
    wrong = next(r for r in doc["records"] if not r["correct"] and len(r["turns"]) == 2)
    wrong["correct"] = True
    with pytest.raises(lb.SubmissionRejected, match="verifier says False"):
        lb.submit(doc, "hint3", boards_dir=tmp_path)
    capped = next(r for r in doc["records"] if len(r["turns"]) == 3)
    capped["turns"] = capped["turns"][:2] + ["HINT again", "\\boxed{1}"]  # turns after the episode ended
    capped["response"] = "\\boxed{1}"
    wrong["correct"] = False
    with pytest.raises(lb.SubmissionRejected, match="ended after turn 3 of the 4 recorded"):
        lb.submit(doc, "hint4", boards_dir=tmp_path)
    capped["turns"] = capped["turns"][:2]
    capped["response"] = capped["turns"][-1]
    with pytest.raises(lb.SubmissionRejected, match="had not ended after the 2 recorded turns"):
        lb.submit(doc, "hint5", boards_dir=tmp_path)


def pin_sha(ids: list[str]) -> str:
    """The documented task-set fingerprint: SHA-256 of the distinct ids, sorted, as a compact JSON list."""
    return hashlib.sha256(json.dumps(sorted(set(ids)), separators=(",", ":")).encode()).hexdigest()


TOY_IDS = [f"toy-{i}" for i in range(12)]


def test_board_pins_task_set_and_sample_count(results, tmp_path):
    path, _ = results  # 8 tasks x 2 samples
    lb.submit(path, "toy", boards_dir=tmp_path)
    board = lb.load_board(tmp_path / "toy.json")
    assert board["schema_version"] == 2
    assert board["pin"] == {"n_tasks": 8, "task_ids_sha256": pin_sha(TOY_IDS[:8]), "n_samples": 2}
    # A run on fewer tasks (which would rank first if its tasks were easier) is refused, naming both sets.
    fewer = make_results(tmp_path / "fewer.json", limit=3)
    with pytest.raises(lb.SubmissionRejected) as exc:
        lb.submit(fewer, "toy", boards_dir=tmp_path)
    msg = str(exc.value)
    assert f"pinned to 8 tasks (task ids sha256 {pin_sha(TOY_IDS[:8])}) x 2 samples per task" in msg
    assert f"these results have 3 tasks (task ids sha256 {pin_sha(TOY_IDS[:3])}) x 2 samples per task" in msg
    assert "Different task set:" in msg
    more = make_results(tmp_path / "more.json", limit=8, n_samples=3)
    with pytest.raises(lb.SubmissionRejected, match=r"x 2 samples per task; .* x 3 samples per task\. "
                                                     r"Different samples per task:"):
        lb.submit(more, "toy", boards_dir=tmp_path)
    # The same task set listed in another order is the same set.
    reordered = make_results(tmp_path / "r6.json", seed=6)
    reordered["records"].reverse()
    entry = lb.submit(reordered, "toy", boards_dir=tmp_path)
    assert entry["task_ids_sha256"] == board["pin"]["task_ids_sha256"]
    assert len(board_entries(tmp_path, "toy")) == 2
    assert lb.task_ids_sha256(reversed(TOY_IDS[:8])) == lb.task_ids_sha256(TOY_IDS[:8] + ["toy-0"])


def test_explicitly_created_board_is_pinned_before_any_submission(tmp_path, capsys):
    boards = str(tmp_path / "b")
    assert rlvr_main(["leaderboard", "create", "toy", "--env", TOY_ID, "--limit", "8", "--samples", "2",
                      "--boards-dir", boards]) == 0
    assert "pinned to 8 tasks x 2 samples" in capsys.readouterr().out
    board = lb.load_board(tmp_path / "b" / "toy.json")
    assert board["entries"] == [] and board["env_kwargs"] == {}
    assert board["pin"] == {"n_tasks": 8, "task_ids_sha256": pin_sha(TOY_IDS[:8]), "n_samples": 2}
    # The first submission must match the pin too.
    with pytest.raises(lb.SubmissionRejected, match="pinned to 8 tasks .* these results have 4 tasks"):
        lb.submit(make_results(tmp_path / "r4.json", limit=4), "toy", boards_dir=boards)
    lb.submit(make_results(tmp_path / "r8.json", limit=8), "toy", boards_dir=boards)
    assert rlvr_main(["leaderboard", "create", "toy", "--env", TOY_ID, "--limit", "8", "--samples", "2",
                      "--boards-dir", boards]) == 1
    assert "already exists" in capsys.readouterr().err
    with pytest.raises(ValueError, match="has 12 tasks; cannot pin a board to 13"):
        lb.create_board("big", TOY_ID, n_tasks=13, n_samples=1, boards_dir=boards)


def test_unpinned_board_is_shown_refuses_submissions_and_migrates_from_its_results(results, tmp_path, capsys):
    path, _ = results
    lb.submit(path, "toy", boards_dir=tmp_path)
    legacy = json.loads((tmp_path / "toy.json").read_text())  # what a board looked like before pins
    del legacy["pin"], legacy["entries"][0]["task_ids_sha256"]
    legacy["schema_version"] = 1
    write(tmp_path / "toy.json", legacy)
    assert "no task-set pin" in lb.format_board(lb.load_board(tmp_path / "toy.json"))
    other = make_results(tmp_path / "r6.json", seed=6)
    with pytest.raises(lb.SubmissionRejected, match="predates task-set pins .* rlvr leaderboard migrate toy"):
        lb.submit(other, "toy", boards_dir=tmp_path)
    with pytest.raises(lb.SubmissionRejected, match="none of the given results files"):
        lb.migrate_board("toy", [tmp_path / "r6.json"], boards_dir=tmp_path)
    assert rlvr_main(["leaderboard", "--boards-dir", str(tmp_path), "migrate", "toy", str(path)]) == 0
    assert "pinned to 8 tasks x 2 samples" in capsys.readouterr().out
    board = lb.load_board(tmp_path / "toy.json")
    assert board["pin"] == {"n_tasks": 8, "task_ids_sha256": pin_sha(TOY_IDS[:8]), "n_samples": 2}
    assert board["entries"][0]["task_ids_sha256"] == pin_sha(TOY_IDS[:8])
    lb.submit(other, "toy", boards_dir=tmp_path)
    with pytest.raises(lb.SubmissionRejected, match="Different task set"):
        lb.submit(make_results(tmp_path / "r3.json", limit=3), "toy", boards_dir=tmp_path)


def test_committed_boards_are_pinned_to_the_results_they_were_verified_from():
    boards = sorted((REPO / "leaderboards" / "boards").glob("*.json"))
    assert boards
    for path in boards:
        board = lb.load_board(path)
        assert board["schema_version"] == lb.BOARD_SCHEMA_VERSION, path.name
        for e in board["entries"]:
            doc = json.loads((REPO / "leaderboards" / "results" / e["results_file"]).read_text())
            digest = hashlib.sha256(json.dumps(doc, sort_keys=True, ensure_ascii=False).encode()).hexdigest()
            assert digest == e["results_sha256"], path.name  # the very file the entry was verified from
            ids = [r["task_id"] for r in doc["records"]]
            assert board["pin"] == {"n_tasks": len(set(ids)), "task_ids_sha256": pin_sha(ids),
                                    "n_samples": doc["config"]["n_samples"]}, path.name
            assert e["task_ids_sha256"] == board["pin"]["task_ids_sha256"], path.name


COMMITTED_RESULTS = sorted((REPO / "leaderboards" / "results").glob("*.json"))


@pytest.mark.parametrize("path", COMMITTED_RESULTS, ids=lambda p: p.name)
def test_committed_results_still_reverify(path, tmp_path):
    """Every committed results file passes today's verifiers and yields the metrics its board shows."""
    from rlvr_envs.data import DataNotFoundError

    cfg = json.loads(path.read_text())["config"]
    try:
        gym.make(cfg["env_id"], **cfg["env_kwargs"]).close()
    except DataNotFoundError as exc:
        pytest.skip(f"{path.name} needs data RLVR_DATA_DIR lacks: {str(exc)[:200]}")
    entry = lb.submit(path, "reverify", boards_dir=tmp_path)  # a results file name may exceed a board name's 64
    (shown,) = [e for b in (REPO / "leaderboards" / "boards").glob("*.json")
                for e in lb.load_board(b)["entries"] if e["results_file"] == path.name]
    assert metrics_match(shown["metrics"], entry["metrics"]) == []
