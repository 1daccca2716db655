"""Publish a finished training run to its lane's leaderboard: evaluate the final policy with the harness, submit it.

``publish_run(run_dir)`` rebuilds the run's final policy (the base model ``load_policy(cfg.model)`` with the newest
checkpoint's trainable weights on top), evaluates it greedily with ``rlvr_envs.harness.evaluate`` on the lane's
held-out env (``cfg.env`` with ``env_kwargs`` + ``eval_env_kwargs``, the first ``cfg.eval_size`` tasks: the same
tasks for every method of a lane), writes the results file and submits it to board ``lane-<lane>``. The board
re-verifies every record with the env's verifier exactly as for any other submission and pins the task set.

The entry also carries a ``training`` block (method, lane, seed, steps, rollouts, tokens, estimated FLOPs, wall time,
learning curve) read from the run's checkpoint and ``metrics.jsonl``. It is the run's own report: nothing on the board
can re-derive it, and the page says so.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# Prompts whose token counts estimate the mean prompt length of the training distribution (FLOPs only).
PROMPT_SAMPLE = 64

FLOPS_FORMULA = (
    "approximate: generation 2*N*(rollouts*P + R) + updates sum_steps passes*samples*(P + L_step)*(2*N + 4*N_train) "
    "+ no-grad passes 2*N per extra pass; N = all parameters, N_train = trainable ones, P = mean prompt tokens "
    f"(over the first {PROMPT_SAMPLE} training prompts), R = response tokens generated, L_step = the step's mean "
    "response length; attention's context-length term and held-out evaluations are not counted")


MEASURED_FLOPS = (
    "counted by the trainer (agents.grpo.flops): 2 FLOPs per linear weight per token plus causal attention "
    "(4 * context * d_attn per layer) for every prefill, decoded token, training forward and backward (through the "
    "trainable span) and no-grad pass; held-out evaluations are not counted")


class RunNotPublishable(ValueError):
    """A run directory that cannot be published (no checkpoint, unfinished, no lane, ...), with the reason."""


def _final_state(run_dir: Path) -> tuple[dict[str, Any], Path]:
    from agents.grpo import checkpoint

    if not run_dir.is_dir():
        raise RunNotPublishable(f"{run_dir}: no such run directory")
    path = checkpoint.latest(run_dir)
    if path is None:
        raise RunNotPublishable(
            f"{run_dir}: no checkpoint (expected {run_dir / 'checkpoints' / 'latest'} naming a step-<k>.pt); the run "
            "was not trained here, or was killed before its first checkpoint")
    state = checkpoint.load(path)
    if not isinstance(state, dict) or not isinstance(state.get("config"), dict) or not isinstance(state.get("model"), dict):
        raise RunNotPublishable(f"{path}: not a trainer checkpoint (needs 'config' and 'model')")
    return state, path


def _config(state: Mapping[str, Any], path: Path) -> Any:
    from agents.grpo.config import from_dict

    try:
        return from_dict(dict(state["config"]))
    except (TypeError, ValueError) as exc:
        raise RunNotPublishable(f"{path}: its recorded config does not load with this code: {exc}") from None


def method_name(cfg: Any, run_dir: Path) -> str:
    """The built-in recipe whose stages and stage params equal the run's (a lane never sets those), else the run
    directory's name. Several matching recipes: the one the run directory is named after, else the first by name."""
    from agents.grpo.config import list_recipes, load_recipe

    matches = []
    for name in list_recipes():
        try:
            recipe = load_recipe(name)
        except (ValueError, FileNotFoundError):
            continue
        if recipe.stages == cfg.stages and recipe.params == cfg.params:
            matches.append(name)
    named = [m for m in matches if run_dir.name == m or run_dir.name.startswith(f"{m}-s")]
    return (named or matches or [run_dir.name])[0]


def model_label(cfg: Any, method: str) -> str:
    """What the board's model column says: ``micro-countdown + grpo (seed 0)``."""
    return f"{cfg.model} + {method} (seed {cfg.seed})"


def final_policy(run_dir: str | os.PathLike, *, method: str | None = None) -> Any:
    """The run's final policy: ``load_policy(cfg.model, dtype=cfg.dtype, seed=cfg.seed)`` (deterministic: ``tiny`` from
    the seed, ``micro-countdown`` the cached warm start, ``smollm2``) with the newest checkpoint's trainable parameters
    copied in. Its name is the board label (``<model> + <method> (seed <s>)``) and its ``weights_hash`` hashes the
    loaded weights. Raises ``RunNotPublishable`` when the run has no checkpoint or the checkpoint does not fit."""
    run_dir = Path(run_dir)
    state, path = _final_state(run_dir)
    return _policy(run_dir, state, path, method)


def _policy(run_dir: Path, state: Mapping[str, Any], path: Path, method: str | None) -> Any:
    import torch

    from agents.policy.models import Policy, load_policy, weights_hash

    cfg = _config(state, path)
    base = load_policy(cfg.model, dtype=cfg.dtype, seed=cfg.seed)
    params = dict(base.model.named_parameters())
    unknown = sorted(set(state["model"]) - set(params))
    if unknown:
        raise RunNotPublishable(f"{path}: parameters {unknown[:3]} are not in the base model {cfg.model!r}")
    with torch.no_grad():
        for name, value in state["model"].items():
            if tuple(params[name].shape) != tuple(value.shape):
                raise RunNotPublishable(f"{path}: {name} has shape {tuple(value.shape)}, the base model "
                                        f"{cfg.model!r} {tuple(params[name].shape)}")
            params[name].copy_(value.to(params[name].dtype))
    base.model.eval()
    label = model_label(cfg, method or method_name(cfg, run_dir))
    info = {**base.info, "base_model": base.name, "base_weights_hash": base.weights_hash,
            "checkpoint": str(path), "step": int(state.get("step", 0)),
            "n_trainable": int(sum(v.numel() for v in state["model"].values()))}
    return Policy(base.model, base.tokenizer, label, weights_hash(base.model),
                  source=f"trained: {path.name} of {run_dir.name} on {base.name}", info=info)


# -- the training block -----------------------------------------------------------------------------------------------
def learning_curve(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Held-out accuracy per eval, with the rollouts and response tokens generated up to that step."""
    train = [r for r in records if r.get("kind") == "train"]
    curve = []
    for r in sorted((r for r in records if r.get("kind") == "eval" and r.get("eval_accuracy") is not None),
                    key=lambda r: int(r["step"])):
        before = [t for t in train if int(t["step"]) <= int(r["step"])]
        curve.append({"step": int(r["step"]),
                      "rollouts": int(max((t.get("rollouts_total", 0) for t in before), default=0)),
                      "tokens": int(max((t.get("tokens_total", 0) for t in before), default=0)),
                      "eval_accuracy": float(r["eval_accuracy"])})
    return curve


def wall_time(records: Sequence[Mapping[str, Any]]) -> float:
    """Seconds spent generating, updating and evaluating (``gen_s + train_s`` of train records, ``eval_s`` of eval
    records); time a killed session lost after its last checkpoint is not in ``metrics.jsonl`` and not counted."""
    return float(sum((r.get("gen_s") or 0.0) + (r.get("train_s") or 0.0) for r in records if r.get("kind") == "train")
                 + sum(r.get("eval_s") or 0.0 for r in records if r.get("kind") == "eval"))


def estimate_flops(records: Sequence[Mapping[str, Any]], *, n_params: int, n_trainable: int,
                   prompt_tokens: float, rollouts: int, response_tokens: int, update_passes: int = 1,
                   no_grad_passes: int = 0) -> dict[str, float]:
    """An approximate FLOPs count of a run (see ``FLOPS_FORMULA``).

    generation = 2·N·(rollouts·P + R): a forward per prompt token (prefill, once per rollout) and per response token.
    updates    = Σ_steps samples·(P + L_step)·(update_passes·(2·N + 4·N_train) + no_grad_passes·2·N): each optimizer
                 pass runs the whole model forward and backpropagates (≈ 2x a forward) through the trainable
                 parameters; ``no_grad_passes`` are extra log-prob passes (old policy for ppo_epochs > 1, KL
                 reference).
    """
    gen = 2.0 * n_params * (rollouts * prompt_tokens + response_tokens)
    per_token = update_passes * (2.0 * n_params + 4.0 * n_trainable) + no_grad_passes * 2.0 * n_params
    trained_tokens = sum((r.get("samples") or 0) * (prompt_tokens + (r.get("response_len_mean") or 0.0))
                         for r in records if r.get("kind") == "train" and not r.get("skipped"))
    update = per_token * trained_tokens
    return {"generation": gen, "update": update, "total": gen + update}


def mean_prompt_tokens(policy: Any, env_id: str, env_kwargs: Mapping[str, Any], n: int = PROMPT_SAMPLE) -> float:
    """Mean token count of the first ``n`` training prompts as the trainer builds them (chat template, no specials)."""
    import gymnasium as gym

    import rlvr_envs  # noqa: F401  (registers the IDs)

    env = gym.make(env_id, **dict(env_kwargs))
    try:
        count = min(n, len(env.unwrapped.source))
        lengths = []
        for i in range(count):
            _, info = env.reset(options={"index": i})
            text = policy.prompt_text(info["messages"])
            lengths.append(len(policy.tokenizer(text, add_special_tokens=False)["input_ids"]))
    finally:
        env.close()
    return float(sum(lengths) / len(lengths)) if lengths else 0.0


def training_block(run_dir: str | os.PathLike, policy: Any, *, method: str) -> dict[str, Any]:
    """The board entry's ``training`` block: the run's self-reported cost and learning curve (not re-verifiable)."""
    run_dir = Path(run_dir)
    state, path = _final_state(run_dir)
    return _training(run_dir, state, path, policy, method)


def _training(run_dir: Path, state: Mapping[str, Any], path: Path, policy: Any, method: str) -> dict[str, Any]:
    from agents.grpo.metrics import MetricsLog

    cfg = _config(state, path)
    step = int(state.get("step", 0))
    records = [r for r in MetricsLog(run_dir / "metrics.jsonl").read() if int(r.get("step", -1)) <= step]
    rollouts, tokens = int(state.get("rollouts_total", 0)), int(state.get("tokens_total", 0))
    n_params, n_trainable = int(policy.n_params), int(policy.info.get("n_trainable", 0))
    prompt_tokens = mean_prompt_tokens(policy, cfg.env, cfg.env_kwargs)
    kl = bool(cfg.kl_reference or (cfg.params.get("loss") or {}).get("kl_coef"))
    measured = [r for r in records if r.get("kind") == "train" and "flops_total" in r]
    if measured:  # counted by the trainer from the tokens it processed (agents.grpo.flops)
        last = max(measured, key=lambda r: int(r["step"]))
        flops = {"total": float(last["flops_total"]), "generation": float(last["flops_gen"]),
                 "update": float(last["flops_train"])}
        formula = MEASURED_FLOPS
    else:  # runs from before the trainer counted FLOPs
        flops = estimate_flops(records, n_params=n_params, n_trainable=n_trainable, prompt_tokens=prompt_tokens,
                               rollouts=rollouts, response_tokens=tokens, update_passes=cfg.ppo_epochs,
                               no_grad_passes=int(kl) + int(cfg.ppo_epochs > 1))
        formula = FLOPS_FORMULA
    return {
        "method": method, "description": cfg.description, "lane": cfg.lane, "seed": int(cfg.seed),
        "base_model": cfg.model, "steps": step, "rollouts": rollouts, "response_tokens": tokens,
        "prompt_tokens_mean_est": round(prompt_tokens, 2), "n_params": n_params, "n_trainable": n_trainable,
        "flops_estimate": flops["total"], "flops_generation": flops["generation"], "flops_update": flops["update"],
        "flops_formula": formula, "wall_time_s": round(wall_time(records), 3),
        "curve": learning_curve(records), "checkpoint": path.name, "run_dir": run_dir.name,
        "weights_hash": policy.weights_hash,
    }


# -- publishing -------------------------------------------------------------------------------------------------------
def publish_run(run_dir: str | os.PathLike, *, boards_dir: str | os.PathLike | None = None, board: str | None = None,
                results_dir: str | os.PathLike | None = None, limit: int | None = None, method: str | None = None,
                label: str | None = None, progress: bool = False) -> dict[str, Any]:
    """Evaluate a finished run's final policy on its lane's held-out tasks (as the lane evaluates: greedy, or
    ``eval_samples`` samples per task at ``eval_temperature``), submit it; return the board entry.

    ``board`` defaults to ``lane-<cfg.lane>``; ``limit`` (default ``cfg.eval_size``) is the number of held-out tasks;
    the results file goes to ``results_dir`` (default ``<run_dir>/published``) as ``<board>-<method>-s<seed>.json``
    and is reused when it already holds this policy's evaluation. The board's usual checks apply (re-verification of
    every record, the task-set pin) and raise ``SubmissionRejected``; an unfinished run raises ``RunNotPublishable``.
    """
    from agents.policy import PolicyAgent, SamplingParams, make_engine
    from rlvr_envs.harness import evaluate
    from rlvr_envs.harness.leaderboard import check_board_name, submit

    run_dir = Path(run_dir)
    state, path = _final_state(run_dir)
    cfg = _config(state, path)
    flops_spent = sum(float(v) for v in (state.get("flops") or {}).values())
    if int(state.get("step", 0)) < cfg.steps and not (cfg.flop_budget and flops_spent >= cfg.flop_budget):
        raise RunNotPublishable(f"{run_dir}: the newest checkpoint ({path.name}) is at step {state.get('step')} of "
                                f"{cfg.steps}; finish the run first (rerun the same command: it resumes)")
    if board is None:
        if not cfg.lane:
            raise RunNotPublishable(f"{run_dir}: the run was not trained on a lane (cfg.lane is empty); pass a board "
                                    "name (--board) to publish it")
        board = f"lane-{cfg.lane}"
    check_board_name(board)
    n_tasks = cfg.eval_size if limit is None else int(limit)
    if n_tasks < 1:
        raise RunNotPublishable(f"{run_dir}: eval_size is {cfg.eval_size}; pass limit >= 1 held-out tasks")
    method = method or method_name(cfg, run_dir)
    policy = _policy(run_dir, state, path, method)  # the checkpoint is read once (it holds the optimizer state too)
    # the lane's own held-out eval: greedy, or eval_samples samples per task at eval_temperature (mean@k)
    sampling = SamplingParams(temperature=float(cfg.eval_temperature),
                              max_new_tokens=cfg.eval_max_new_tokens or cfg.max_new_tokens)
    # the hf engine at the run's decoding precision, whatever engine trained it: one decoder for every method
    agent = PolicyAgent(policy, make_engine(policy, "hf", precision=cfg.precision), sampling)
    if (cfg.stages or {}).get("orchestrator") == "agon":  # two policies deployed as one: the cascade is the entry
        from agents.methods.agon import published_cascade

        agent, policy = published_cascade(cfg, state, agent, sampling)
    out_dir = Path(results_dir) if results_dir is not None else run_dir / "published"
    out = out_dir / f"{board}-{method}-s{cfg.seed}.json"
    if out.is_file() and f" of {run_dir.name} on " not in _evaluated_source(out):
        # the same method and seed from another run (an earlier build of the code) keeps its file; this run's is
        # named after its own run too
        out = out_dir / f"{board}-{method}-s{cfg.seed}-{run_tag(run_dir)}.json"
    evaluate(agent, cfg.env, env_kwargs={**cfg.env_kwargs, **cfg.eval_env_kwargs}, n_samples=int(cfg.eval_samples), seed=0,
                       limit=n_tasks, batch_size=64, out=out, resume=True, progress=progress)
    training = _training(run_dir, state, path, policy, method)
    return submit(out, board, boards_dir=boards_dir, label=label, training=training)


def run_tag(run_dir: Path) -> str:
    """What tells a run apart in a results file name: the run key of a suite run folder (``<recipe>-s<seed>-<key>``,
    which the name already carries the rest of), else the whole folder name."""
    m = re.fullmatch(r".+-s\d+-([0-9a-f]{16})", run_dir.name)
    return m.group(1) if m else run_dir.name


def _evaluated_source(results_file: Path) -> str:
    """The trained policy a results file was evaluated from (``provenance.agent.source``), '' if unreadable."""
    try:
        doc = json.loads(Path(results_file).read_text())
    except (OSError, ValueError):
        return ""
    return str(((doc.get("provenance") or {}).get("agent") or {}).get("source") or "")


def describe_entry(entry: Mapping[str, Any]) -> str:
    """One line for the CLI: the verified accuracy beside the reported training cost."""
    t = entry.get("training") or {}
    flops = t.get("flops_estimate")
    return (f"{entry['model']}: accuracy {entry['metrics']['accuracy']:.4f} over {entry['n_tasks']} held-out tasks "
            f"(re-verified); training: {t.get('steps')} steps, {t.get('rollouts')} rollouts, "
            f"{t.get('response_tokens')} response tokens, "
            f"~{'n/a' if flops is None or not math.isfinite(flops) else format(flops, '.3g')} FLOPs, "
            f"{t.get('wall_time_s', 0.0):.1f} s (reported)")
