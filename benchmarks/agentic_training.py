"""Agentic RL on the tool and search envs: SmolLM2 before and after an SFT warm start on the oracle's trajectories,
then GRPO, with the held-out success and the calling behaviour at each point.

``--env tooluse`` (``rlvr/ToolUse-v0``): seed 003's tool-orchestration paper (2606.03892) trains with a correct-outcome
reward scaled by call precision (the minimal plan's length over the calls made) and argues that it avoids the verbose
calling a recall-style reward teaches. Two RL arms from the same SFT weights and seed (our reading of the rewards):

- ``precision`` (the env's default reward): ``correct * min(1, plan_length / calls_made)``.
- ``recall``: ``correct + 0.5 * min(1, plan_calls_hit / plan_length)`` (the rubric's ``tool_recall`` term: every call of
  the gold plan made successfully earns its share, extra calls cost nothing), precision scaling off.

The tool schemas are left out of the prompt (``tools_in_prompt=false``): with them a prompt is 1,332 SmolLM2 tokens,
and a full fine-tuning step over 16 such episodes takes many minutes on 2 CPU cores; the model learns the tool names
and arguments from the demonstrations (the tool set is the same in training and held-out tasks).

``--env multihop`` (``rlvr/MultiHopSynth-v0``, 2 hops): exact match of the final answer; one arm, ``em``.

Stages (each resumable; a finished stage is read back, not rerun), into ``--out/<env>``:

    python benchmarks/agentic_training.py sft    --env tooluse                     # oracle demos -> SmolLM2
    python benchmarks/agentic_training.py base   --env tooluse                     # held-out eval, untuned model
    python benchmarks/agentic_training.py rl     --env tooluse --reward precision  # GRPO from the SFT weights
    python benchmarks/agentic_training.py rl     --env tooluse --reward recall
    python benchmarks/agentic_training.py report --env tooluse                     # -> benchmarks/results/

Held-out tasks: the env's generator seed 1 (SFT and RL train on seed 0: another database or knowledge base), greedy,
one episode each. Success is the env's ``correct``; ``precision_solved`` is plan length over calls made, mean over
solved episodes; calls per episode and ``plan_recall`` are means over all episodes (agents/grpo/multiturn.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DEFAULT_OUT = Path(os.environ.get("RLVR_CACHE_DIR", Path.home() / ".cache" / "rlvr_envs")) / "agentic-training"
ENVS: dict[str, dict[str, Any]] = {
    "tooluse": {"id": "rlvr/ToolUse-v0", "env_kwargs": {"tools_in_prompt": False},
                "rewards": {"precision": {},
                            "recall": {"precision_penalty": False,
                                       "rubric": {"correctness": 1.0, "tool_recall": 0.5}}}},
    "multihop": {"id": "rlvr/MultiHopSynth-v0", "env_kwargs": {}, "rewards": {"em": {}}},
}
HELD_OUT = {"seed": 1}
# The RL setting: SmolLM2 fully fine-tuned as on the smollm2 lane; 4 tasks x a group of 4 episodes per step (a step
# is ~2 minutes on one core).
RL_OVERRIDES = ("prompts_per_step=4", "params.rollout_allocator.n=4", "max_new_tokens=96", "temperature=0.7", "lr=1e-5",
                "train_layers=-1", "micro_batch=4", "eval_size=48", "eval_every=10", "eval_max_new_tokens=96",
                "checkpoint_every=2", "precision=\"fp32\"", "progress=false", "plot=false")


def _cfg(env: str, model: str, reward: str, seed: int, steps: int, out_dir: Path) -> Any:
    from agents.grpo.config import load_recipe

    spec = ENVS[env]
    cfg = load_recipe("grpo", [*RL_OVERRIDES, f'env="{spec["id"]}"', f'model="{model}"', f"seed={seed}",
                               f"steps={steps}", f'out_dir="{out_dir}"'])
    cfg.env_kwargs = {**spec["env_kwargs"], **spec["rewards"][reward]}
    cfg.eval_env_kwargs = dict(HELD_OUT)
    return cfg


def stage_sft(env: str, out: Path, tasks: int, epochs: int, lr: float, seed: int) -> None:
    from agents.grpo.sft import main as sft_main

    target = out / "sft"
    if (target / "sft.json").is_file():
        print(f"SFT done: {target}")
        return
    if target.exists():  # an interrupted SFT left a partial folder: nothing in it is reusable
        import shutil

        shutil.rmtree(target)
    sft_main(["--env", ENVS[env]["id"], "--env-kwargs", json.dumps(ENVS[env]["env_kwargs"]), "--model", "smollm2",
              "--tasks", str(tasks), "--epochs", str(epochs), "--lr", str(lr), "--seed", str(seed),
              "--out", str(target)])


def stage_base(env: str, out: Path, seed: int) -> None:
    from agents.grpo.trainer import Trainer

    path = out / "base_eval.json"
    if path.is_file():
        print(f"base eval done: {path}")
        return
    cfg = _cfg(env, "smollm2", next(iter(ENVS[env]["rewards"])), seed, 0, out / "base-run")
    t0 = time.perf_counter()
    ev = Trainer(cfg).evaluate()
    path.write_text(json.dumps({**ev, "wall_s": time.perf_counter() - t0}, indent=1))
    print(json.dumps(ev)[:400])


def stage_rl(env: str, out: Path, reward: str, seed: int, steps: int) -> None:
    from agents.grpo.trainer import Trainer

    sft_dir = out / "sft"
    if not (sft_dir / "sft.json").is_file():
        raise SystemExit(f"no SFT model at {sft_dir}: run the sft stage first")
    run = out / f"rl-{reward}-s{seed}"
    if reward not in ENVS[env]["rewards"]:
        raise SystemExit(f"--reward {reward!r}: {env} has {sorted(ENVS[env]['rewards'])}")
    cfg = _cfg(env, str(sft_dir), reward, seed, steps, run)
    cfg.progress = True
    Trainer(cfg).run(resume=True)


def stage_report(env: str, out: Path, seed: int, result: Path) -> dict[str, Any]:
    import numpy as np

    from agents.grpo.comparisons import evals as eval_records
    from agents.grpo.comparisons import paired_bootstrap
    from agents.grpo.metrics import MetricsLog

    keys = ("eval_accuracy", "precision_solved", "plan_recall", "calls_per_episode", "turns_per_episode",
            "invalid_call_rate", "tool_use_rate", "eval_len_mean")

    def row(ev: dict[str, Any]) -> dict[str, Any]:
        return {k: ev.get(k, ev.get(f"eval_{k}")) for k in keys}

    rewards = ENVS[env]["rewards"]
    report: dict[str, Any] = {"env": ENVS[env]["id"], "env_kwargs": ENVS[env]["env_kwargs"],
                              "definition": __doc__.split("Stages")[0].strip(), "held_out": HELD_OUT, "seed": seed,
                              "rl_overrides": list(RL_OVERRIDES), "rewards": rewards}
    base = out / "base_eval.json"
    if base.is_file():
        report["base"] = row(json.loads(base.read_text()))
    sft = out / "sft" / "sft.json"
    if sft.is_file():
        meta = json.loads(sft.read_text())
        report["sft"] = {"stats": meta["stats"], "args": meta["args"], "loss_first": meta["losses"][0],
                         "loss_last": meta["losses"][-1], "command": meta["command"]}
    runs: dict[str, list[dict[str, Any]]] = {}
    for reward in rewards:
        metrics = out / f"rl-{reward}-s{seed}" / "metrics.jsonl"
        if not metrics.is_file():
            continue
        recs = MetricsLog(metrics).read()
        runs[reward] = recs
        evals = eval_records(recs)
        train = [r for r in recs if r.get("kind") == "train"]
        report[f"rl_{reward}"] = {
            "steps_done": max((r["step"] for r in train), default=0),
            "evals": [{"step": e["step"], **row(e)} for e in evals],
            "train_curve": [{"step": t["step"], "reward": t.get("reward_mean"), "accuracy": t.get("accuracy"),
                             "calls_per_episode": t.get("calls_per_episode"), "plan_recall": t.get("plan_recall"),
                             "precision_solved": t.get("precision_solved"), "step_s": t.get("gen_s", 0) + t.get("train_s", 0)}
                            for t in train],
        }
        if evals:
            report.setdefault("after_sft", row(evals[0]) | {"from": f"step-0 eval of rl-{reward}"})
    if set(runs) == {"precision", "recall"}:
        finals = {k: eval_records(v)[-1] for k, v in runs.items()}
        if finals["precision"]["step"] == finals["recall"]["step"]:
            bits = {k: [int(c) for c in f["eval_correct"]] for k, f in finals.items()}
            lo, hi = paired_bootstrap([bits["precision"]], [bits["recall"]])
            report["precision_minus_recall"] = {
                "step": finals["precision"]["step"],
                "success": float(np.mean(bits["precision"]) - np.mean(bits["recall"])), "interval95": [lo, hi],
                "calls_per_episode": finals["precision"].get("eval_calls_per_episode", 0)
                - finals["recall"].get("eval_calls_per_episode", 0),
                "interval_definition": "paired bootstrap over the held-out tasks (one seed)"}
    arms = ",".join(f"rl --reward {r}" for r in rewards)
    report["command"] = f"python benchmarks/agentic_training.py {{sft,base,{arms},report}} --env {env}"
    result.parent.mkdir(parents=True, exist_ok=True)
    result.write_text(json.dumps(report, indent=1) + "\n")
    if runs:
        plot(report, list(rewards), result.with_suffix(".png"))
    print(json.dumps({k: v for k, v in report.items() if k not in ("definition",)}, indent=1)[:3000])
    return report


def plot(report: dict[str, Any], arms: list[str], path: Path) -> Path:
    """Left: calls per episode over training, each arm; right: held-out success before SFT, after SFT, after RL."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    bars = {"base": (report.get("base") or {}).get("eval_accuracy"),
            "SFT": (report.get("after_sft") or {}).get("eval_accuracy")}
    for arm in arms:
        run = report.get(f"rl_{arm}")
        if not run:
            continue
        curve = run["train_curve"]
        left.plot([c["step"] for c in curve], [c["calls_per_episode"] for c in curve], marker=".", label=arm)
        bars[f"RL {arm}\n(step {run['evals'][-1]['step']})"] = run["evals"][-1]["eval_accuracy"]
    left.set_xlabel("RL step")
    left.set_ylabel("tool calls / searches per episode (training)")
    left.legend(fontsize=8)
    names = [k for k, v in bars.items() if v is not None]
    right.bar(names, [bars[k] for k in names], color="tab:blue")
    right.set_ylabel("held-out success (greedy)")
    right.set_ylim(0, 1)
    fig.suptitle(f"{report['env']}: SmolLM2, SFT on oracle trajectories, then GRPO (seed {report['seed']})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("stage", choices=("sft", "base", "rl", "report"))
    ap.add_argument("--env", choices=tuple(ENVS), required=True)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--reward", default=None, help="the RL arm (tooluse: precision | recall; multihop: em)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--sft-tasks", type=int, default=192)
    ap.add_argument("--sft-epochs", type=int, default=1)
    ap.add_argument("--sft-lr", type=float, default=5e-5)
    ap.add_argument("--result", type=Path, default=None, help="default: benchmarks/results/<env>_training.json")
    args = ap.parse_args(argv)
    out = args.out / args.env
    out.mkdir(parents=True, exist_ok=True)
    if args.stage == "sft":
        stage_sft(args.env, out, args.sft_tasks, args.sft_epochs, args.sft_lr, args.seed)
    elif args.stage == "base":
        stage_base(args.env, out, args.seed)
    elif args.stage == "rl":
        stage_rl(args.env, out, args.reward or next(iter(ENVS[args.env]["rewards"])), args.seed, args.steps)
    else:
        result = args.result or ROOT / "benchmarks" / "results" / f"{args.env}_training.json"
        stage_report(args.env, out, args.seed, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
