"""Publishing trained runs to their lane's board: final policy, harness evaluation, re-verification, pin, training
block, rendering (tiny model, two-step runs on the micro lane)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gymnasium as gym
import matplotlib.image as mpimg
import pytest
import torch

from agents.grpo import checkpoint
from agents.grpo.config import load_recipe
from agents.grpo.metrics import MetricsLog
from agents.grpo.publish import (
    RunNotPublishable,
    estimate_flops,
    final_policy,
    method_name,
    publish_run,
    wall_time,
)
from agents.grpo.trainer import Trainer
from agents.policy import PolicyAgent, SamplingParams, load_policy, make_engine
from rlvr_envs.cli import main as rlvr_main
from rlvr_envs.harness import evaluate
from rlvr_envs.harness import leaderboard as lb
from rlvr_envs.harness.render import render_site


def _train(out: Path, seed: int, eval_size: int = 4, greedy: bool = True) -> Path:
    # greedy eval so the harness's evaluation can be compared with the trainer's exactly (the micro lane itself
    # evaluates mean@4 at T = 1: see test_a_sampled_lane_eval_publishes_its_samples)
    cfg = load_recipe("grpo", ["model=tiny", "steps=2", "prompts_per_step=2", "max_new_tokens=8", f"eval_size={eval_size}", "final_eval_size=0",
                               "eval_every=1", "progress=false", "plot=false", f"out_dir={out}", f"seed={seed}",
                               *(["eval_temperature=0.0", "eval_samples=1"] if greedy else [])],
                      lane="micro")
    Trainer(cfg).run()
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("runs")
    return {"s0": _train(root / "grpo-s0", 0), "s1": _train(root / "grpo-s1", 1),
            "eval3": _train(root / "grpo-eval3", 2, eval_size=3)}


def _cfg(run: Path):
    from agents.grpo.config import from_dict

    return from_dict(checkpoint.load(checkpoint.latest(run))["config"])


def test_a_sampled_lane_eval_publishes_its_samples(tmp_path):
    run = _train(tmp_path / "grpo-sampled", 0, greedy=False)
    cfg = _cfg(run)
    assert (cfg.eval_temperature, cfg.eval_samples) == (1.0, 4)
    entry = publish_run(run, boards_dir=tmp_path / "boards", results_dir=tmp_path / "res")
    board = lb.load_board(tmp_path / "boards" / "lane-micro.json")
    assert board["pin"]["n_samples"] == 4 and entry["n_samples"] == 4
    assert entry["provenance"]["agent"]["sampling"]["temperature"] == 1.0


def test_publish_creates_the_pinned_lane_board_with_a_training_block(runs, tmp_path):
    run = runs["s0"]
    entry = publish_run(run, boards_dir=tmp_path / "boards", results_dir=tmp_path / "res")
    board = lb.load_board(tmp_path / "boards" / "lane-micro.json")
    cfg = _cfg(run)
    # the pin: the first eval_size tasks of the lane's held-out env, one greedy sample each
    env = gym.make(cfg.env, **{**cfg.env_kwargs, **cfg.eval_env_kwargs})
    ids = [env.unwrapped.source.task(i).id for i in range(cfg.eval_size)]
    env.close()
    assert board["pin"] == lb.make_pin(ids, 1)
    assert board["env_id"] == "rlvr/Countdown-v0" and board["env_kwargs"] == {**cfg.env_kwargs, **cfg.eval_env_kwargs}
    assert board["entries"] == [entry] and entry["model"] == "tiny + grpo (seed 0)"

    records = MetricsLog(run / "metrics.jsonl").read()
    train = [r for r in records if r["kind"] == "train"]
    evals = [r for r in records if r["kind"] == "eval"]
    t = entry["training"]
    assert (t["method"], t["lane"], t["seed"], t["steps"], t["base_model"]) == ("grpo", "micro", 0, 2, "tiny")
    assert t["rollouts"] == train[-1]["rollouts_total"] == 2 * 2 * 8  # steps x prompts x group size
    assert t["response_tokens"] == train[-1]["tokens_total"] > 0
    assert [(p["step"], p["rollouts"], p["eval_accuracy"]) for p in t["curve"]] == \
           [(0, 0, evals[0]["eval_accuracy"]), (1, train[0]["rollouts_total"], evals[1]["eval_accuracy"]),
            (2, train[1]["rollouts_total"], evals[2]["eval_accuracy"])]
    assert t["wall_time_s"] == pytest.approx(sum(r["gen_s"] + r["train_s"] for r in train)
                                             + sum(r["eval_s"] for r in evals), abs=1e-3)
    assert t["flops_estimate"] == pytest.approx(t["flops_generation"] + t["flops_update"]) and t["flops_generation"] > 0
    # the trainer's own count, not an estimate
    assert (t["flops_estimate"], t["flops_generation"], t["flops_update"]) == \
           (train[-1]["flops_total"], train[-1]["flops_gen"], train[-1]["flops_train"])
    assert t["flops_formula"].startswith("counted by the trainer")
    assert t["weights_hash"] == entry["weights_hash"]
    # the harness's greedy evaluation of the final policy is the trainer's last held-out eval
    assert entry["metrics"]["accuracy"] == evals[-1]["eval_accuracy"]
    assert entry["metrics"]["length_mean"] == pytest.approx(evals[-1]["eval_len_mean"])
    assert entry["provenance"]["agent"]["sampling"]["temperature"] == 0.0
    assert entry["provenance"]["agent"]["sampling"]["max_new_tokens"] == cfg.eval_max_new_tokens
    assert "rollouts" in lb.format_board(board) and "not re-verified" in lb.format_board(board)


def test_tampered_results_are_rejected_with_a_training_block(runs, tmp_path):
    entry = publish_run(runs["s0"], boards_dir=tmp_path / "boards", results_dir=tmp_path / "res")
    doc = json.loads((tmp_path / "res" / entry["results_file"]).read_text())
    doc["records"][0]["correct"] = not doc["records"][0]["correct"]
    with pytest.raises(lb.SubmissionRejected, match="disagree with the rlvr/Countdown-v0 verifier"):
        lb.submit(doc, "lane-micro", boards_dir=tmp_path / "boards", training=entry["training"])
    doc = json.loads((tmp_path / "res" / entry["results_file"]).read_text())
    doc["metrics"]["accuracy"] = 1.0
    with pytest.raises(lb.SubmissionRejected, match="claimed metrics do not match"):
        lb.submit(doc, "lane-micro", boards_dir=tmp_path / "boards", training=entry["training"])
    assert len(lb.load_board(tmp_path / "boards" / "lane-micro.json")["entries"]) == 1
    # a training block that names other weights than the evaluated ones is refused too
    clean = json.loads((tmp_path / "res" / entry["results_file"]).read_text())
    with pytest.raises(lb.SubmissionRejected, match="belongs to another policy"):
        lb.submit(clean, "other", boards_dir=tmp_path / "boards", training={**entry["training"], "weights_hash": "0" * 64})


def test_a_second_seed_joins_the_same_board_and_a_republish_is_refused(runs, tmp_path):
    boards = tmp_path / "boards"
    publish_run(runs["s0"], boards_dir=boards, results_dir=tmp_path / "res")
    second = publish_run(runs["s1"], boards_dir=boards, results_dir=tmp_path / "res")
    board = lb.load_board(boards / "lane-micro.json")
    assert [e["model"] for e in board["entries"]] == ["tiny + grpo (seed 0)", "tiny + grpo (seed 1)"]
    assert second["training"]["seed"] == 1 and second["task_ids_sha256"] == board["pin"]["task_ids_sha256"]
    with pytest.raises(lb.SubmissionRejected, match="already on board 'lane-micro'"):
        publish_run(runs["s0"], boards_dir=boards, results_dir=tmp_path / "res")  # the evaluation is reused


def test_a_run_evaluated_on_another_eval_size_is_rejected_by_the_pin(runs, tmp_path):
    boards = tmp_path / "boards"
    publish_run(runs["s0"], boards_dir=boards, results_dir=tmp_path / "res")
    with pytest.raises(lb.SubmissionRejected, match="pinned to 4 tasks .* these results have 3 tasks"):
        publish_run(runs["eval3"], boards_dir=boards, results_dir=tmp_path / "res")
    with pytest.raises(lb.SubmissionRejected, match="Different task set"):
        publish_run(runs["s1"], boards_dir=boards, results_dir=tmp_path / "res", limit=3)
    assert len(lb.load_board(boards / "lane-micro.json")["entries"]) == 1


def test_render_shows_training_columns_and_learning_curves(runs, tmp_path):
    boards = tmp_path / "boards"
    for key in ("s0", "s1"):
        publish_run(runs[key], boards_dir=boards, results_dir=tmp_path / "res")
    # an untrained baseline on the same pinned tasks: blank training cells, no curve
    cfg = _cfg(runs["s0"])
    policy = load_policy("tiny", seed=7)
    out = tmp_path / "res" / "baseline.json"
    evaluate(PolicyAgent(policy, make_engine(policy, "hf", precision=cfg.precision),
                         SamplingParams(temperature=0.0, max_new_tokens=cfg.eval_max_new_tokens)),
             cfg.env, env_kwargs={**cfg.env_kwargs, **cfg.eval_env_kwargs}, limit=cfg.eval_size, out=out, progress=False)
    lb.submit(out, "lane-micro", boards_dir=boards, label="untrained")
    board = lb.load_board(boards / "lane-micro.json")
    assert [bool(e.get("training")) for e in board["entries"]] == [True, True, False]

    site = tmp_path / "site"
    assert rlvr_main(["leaderboard", "--boards-dir", str(boards), "render", "--out", str(site)]) == 0
    page = (site / "index.html").read_text()
    for head in ("train rollouts", "train tokens", "train FLOPs", "train wall s"):
        assert f"<th>{head}</th>" in page
    assert "not re-verifiable" in page and 'src="curves/lane-micro.png"' in page
    assert page.count("tiny + grpo (seed") >= 2 and f'data-v="{board["entries"][0]["training"]["rollouts"]}"' in page
    per_entry = page[page.index('<table class="board">'):]  # the per-run table (the "By method" one leads)
    baseline_row = next(row for row in per_entry.split("<tr>") if "untrained" in row)
    assert baseline_row.count('<td data-v=""></td>') == 4  # the four training cells, and only they, are blank
    png = site / "curves" / "lane-micro.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    img = mpimg.imread(png)
    assert img.shape[0] > 200 and img[..., :3].std() > 0.05


def test_untrained_boards_render_without_training_columns(tmp_path):
    from harness_toy import TOY_ID, SeededAgent

    out = tmp_path / "r.json"
    evaluate(SeededAgent(), TOY_ID, n_samples=2, seed=0, limit=4, out=out, progress=False)
    lb.submit(out, "toy", boards_dir=tmp_path / "boards")
    page = render_site(tmp_path / "boards", tmp_path / "site").read_text()
    assert "train rollouts" not in page and "curves/" not in page and not (tmp_path / "site" / "curves").exists()
    assert "rollouts" not in lb.format_board(lb.load_board(tmp_path / "boards" / "toy.json"))


def test_final_policy_loads_the_newest_checkpoint(runs, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(runs["s0"], run)
    path = checkpoint.latest(run)
    state = checkpoint.load(path)
    name = sorted(state["model"])[0]
    state["model"][name] = state["model"][name] + 0.5
    checkpoint.save(run, state["step"], state)
    policy = final_policy(run)
    assert torch.equal(dict(policy.model.named_parameters())[name].detach(), state["model"][name])
    base = load_policy("tiny", seed=0)
    assert policy.name == "tiny + grpo (seed 0)" and policy.weights_hash != base.weights_hash
    assert policy.info["base_weights_hash"] == base.weights_hash and policy.info["step"] == 2

    # no checkpoint: a clear error
    empty = tmp_path / "empty"
    (empty / "checkpoints").mkdir(parents=True)
    with pytest.raises(RunNotPublishable, match="no checkpoint"):
        final_policy(empty)
    with pytest.raises(RunNotPublishable, match="no such run directory"):
        publish_run(tmp_path / "missing", boards_dir=tmp_path / "boards")
    # an unfinished run is not published
    state["step"] = 1
    checkpoint.save(run, 1, state)
    (run / "checkpoints" / "step-2.pt").unlink(missing_ok=True)
    with pytest.raises(RunNotPublishable, match="step 1 of 2; finish the run first"):
        publish_run(run, boards_dir=tmp_path / "boards")
    # a checkpoint from another model does not load silently
    state["step"] = 2
    state["model"] = {"model.layers.0.mlp.up_proj.weight": torch.zeros(3, 3)}
    checkpoint.save(run, 2, state)
    with pytest.raises(RunNotPublishable, match="has shape"):
        final_policy(run)


def test_cli_publish(runs, tmp_path, capsys):
    boards = tmp_path / "boards"
    argv = ["leaderboard", "publish", str(runs["s1"]), "--boards-dir", str(boards), "--results-dir",
            str(tmp_path / "res"), "--label", "cli"]
    assert rlvr_main(argv) == 0
    out = capsys.readouterr().out
    assert "accepted on board 'lane-micro'" in out and "tiny + grpo (seed 1)" in out and "(re-verified)" in out
    assert lb.load_board(boards / "lane-micro.json")["entries"][0]["label"] == "cli"
    assert rlvr_main(["leaderboard", "show", "lane-micro", "--boards-dir", str(boards)]) == 0
    assert "grpo" in capsys.readouterr().out  # one row per method
    assert rlvr_main(["leaderboard", "show", "lane-micro", "--boards-dir", str(boards), "--per-seed"]) == 0
    assert "train tok" in capsys.readouterr().out  # each run's own row, with its training columns
    assert rlvr_main(argv) == 1
    assert "rejected: these results are already on board" in capsys.readouterr().err
    assert rlvr_main(["leaderboard", "publish", str(tmp_path), "--boards-dir", str(boards)]) == 1
    assert "no checkpoint" in capsys.readouterr().err


def test_method_name_is_the_recipe_whose_stages_the_run_used(tmp_path):
    for recipe in ("grpo", "dapo", "vigor", "err_plus"):
        assert method_name(load_recipe(recipe, lane="micro"), tmp_path / "anything") == recipe
    custom = load_recipe("grpo", ["params.rollout_allocator.n=4"], lane="micro")
    assert method_name(custom, tmp_path / "my-run") == "my-run"


def test_validate_training_checks_the_shape():
    good = {"method": "grpo", "lane": "micro", "seed": 0, "steps": 2, "rollouts": 32, "response_tokens": 100,
            "flops_estimate": 1e9, "wall_time_s": 1.5,
            "curve": [{"step": 0, "rollouts": 0, "eval_accuracy": 0.1}, {"step": 2, "rollouts": 32, "eval_accuracy": 0.5}]}
    assert lb.validate_training(good) == good
    bad = [({k: v for k, v in good.items() if k != "rollouts"}, "missing field 'rollouts'"),
           ({**good, "seed": True}, "training.seed"),
           ({**good, "flops_estimate": float("nan")}, "not JSON-serialisable"),
           ({**good, "rollouts": -1}, "must be >= 0"),
           ({**good, "curve": [{"step": 0, "rollouts": 0, "eval_accuracy": 1.5}]}, r"not in \[0, 1\]"),
           ({**good, "curve": list(reversed(good["curve"]))}, "must not decrease"),
           ({**good, "curve": [{"step": 0, "rollouts": 0}]}, "eval_accuracy"),
           ([1, 2], "expected an object")]
    for block, match in bad:
        with pytest.raises(lb.SubmissionRejected, match=match):
            lb.validate_training(block)


def test_estimate_flops_follows_its_formula():
    records = [{"kind": "eval", "step": 0, "eval_s": 2.0},
               {"kind": "train", "step": 1, "samples": 4, "response_len_mean": 10.0, "gen_s": 1.0, "train_s": 0.5},
               {"kind": "train", "step": 2, "skipped": True, "gen_s": 1.0, "train_s": 0.0},
               {"kind": "train", "step": 3, "samples": 2, "response_len_mean": 20.0, "gen_s": 1.0, "train_s": 0.5}]
    n, nt, p = 1000, 100, 5.0
    got = estimate_flops(records, n_params=n, n_trainable=nt, prompt_tokens=p, rollouts=12, response_tokens=80,
                         update_passes=2, no_grad_passes=1)
    assert got["generation"] == 2 * n * (12 * p + 80)
    tokens = 4 * (p + 10) + 2 * (p + 20)
    assert got["update"] == pytest.approx(tokens * (2 * (2 * n + 4 * nt) + 2 * n))
    assert got["total"] == pytest.approx(got["generation"] + got["update"])
    assert wall_time(records) == pytest.approx(2.0 + 1.5 + 1.0 + 1.5)


def test_a_results_file_of_another_run_with_the_same_method_and_seed_is_kept(runs, tmp_path):
    """A board's results file from an earlier run of the same method and seed (an older build) is not overwritten
    or resumed into: the new run's evaluation gets a file named after its own run folder (its key, for a suite run)."""
    res = tmp_path / "res"
    res.mkdir()
    older = res / "lane-micro-grpo-s0.json"
    older.write_text(json.dumps({"provenance": {"agent": {"source": "trained: step-60.pt of grpo-s0-0ld on tiny"}}}))
    before = older.read_text()
    entry = publish_run(runs["s0"], boards_dir=tmp_path / "boards", results_dir=res)
    assert older.read_text() == before
    mine = res / f"lane-micro-grpo-s0-{runs['s0'].name}.json"
    assert mine.is_file() and entry["model"] == "tiny + grpo (seed 0)"
    # its own file is found again by name: a republish reuses the evaluation (and the board refuses the duplicate)
    with pytest.raises(lb.SubmissionRejected, match="already on board"):
        publish_run(runs["s0"], boards_dir=tmp_path / "boards", results_dir=res)


def test_run_tag_is_the_key_of_a_suite_run_folder():
    from agents.grpo.publish import run_tag

    # a suite run folder keeps only its key: the results file name already has the method and seed
    assert run_tag(Path("/x/grpo-s0-29ba3467ead39fd1")) == "29ba3467ead39fd1"
    assert run_tag(Path("/x/modes_vs-s12-0123456789abcdef")) == "0123456789abcdef"
    for name in ("grpo-s0", "grpo-s0-29ba3467", "grpo-29ba3467ead39fd1", "my-run"):
        assert run_tag(Path("/x") / name) == name
