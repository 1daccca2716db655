"""``rlvr train RECIPE [--set key=value ...]``: run a GRPO-core recipe; ``rlvr train --list`` shows the registries."""

from __future__ import annotations

import argparse
import os
import sys

from rlvr_envs.extras import require_extra


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a policy with a GRPO-core recipe (agents/recipes/*.toml)",
                       description="Run a training recipe: a built-in name (grpo, vigor, ...) or a TOML path. "
                                   "Re-running with the same out_dir resumes from its last checkpoint.")
    p.add_argument("recipe", nargs="?", help="recipe name or path to a .toml file")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a recipe key (dotted for tables: stages.advantage=lampo, params.loss.clip_high=0.3)")
    p.add_argument("--lane", default=None,
                   help="put the recipe on a lane (agents/lanes/*.toml: micro, smollm2): the lane fixes model, env, "
                        "sampling, budget and held-out eval; the recipe keeps the method's stages")
    p.add_argument("--list", action="store_true", help="list recipes and every stage's registered components")
    p.add_argument("--fresh", action="store_true", help="ignore an existing checkpoint in out_dir and start over")
    p.add_argument("--dry-run", action="store_true", help="print the resolved recipe and exit")
    p.add_argument("--env-url", default=None, metavar="URL",
                   help="play the recipe's env on an `rlvr serve` server instead of in-process (training and "
                        "held-out envs, with the recipe's env kwargs); rewards are computed by the server")
    p.add_argument("--nproc", type=int, default=1,
                   help="data-parallel ranks on this machine (torch.distributed through torchrun's launcher: gloo on "
                        "CPU, NCCL on GPU); the update is split by groups, the result equals one process's")
    p.add_argument("--rollout-workers", type=int, default=0,
                   help="spread rollouts over this many Ray actors, each with its own engine (0: the trainer's own)")
    p.set_defaults(func=run)


def remote_envs(cfg, url: str) -> dict:
    """The trainer's ``env`` and ``eval_env`` as sessions on an ``rlvr serve`` server (made through the registry, so
    a multi-turn env's episode pool can open more sessions)."""
    import gymnasium as gym

    from rlvr_envs.remote import REMOTE_ID

    def session(env_kwargs: dict) -> gym.Env:
        return gym.make(f"rlvr_envs.remote:{REMOTE_ID}", url=url, env_id=cfg.env, env_kwargs=env_kwargs,
                        disable_env_checker=True)

    return {"env": session(dict(cfg.env_kwargs)), "eval_env": session({**cfg.env_kwargs, **cfg.eval_env_kwargs})}


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    require_extra("agents", "rlvr train")
    from agents.grpo.config import list_lanes, list_recipes, load_recipe
    from agents.grpo.registry import STAGES, names, package_of

    if args.list:
        print("recipes: " + ", ".join(list_recipes()))
        print("lanes: " + ", ".join(list_lanes()))
        for stage, registered in names().items():
            # a plugin's component carries its distribution: "name (package)"
            labels = [n if package_of(stage, n) == "rlvr-envs" else f"{n} ({package_of(stage, n)})" for n in registered]
            print(f"{STAGES[stage]:<20} ({stage}): {', '.join(labels)}")
        return 0
    if not args.recipe:
        print("rlvr train: give a recipe (see `rlvr train --list`)", file=sys.stderr)
        return 2
    try:
        cfg = load_recipe(args.recipe, args.overrides, lane=args.lane)
    except (ValueError, FileNotFoundError) as exc:
        print(f"rlvr train: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:
        import json

        print(json.dumps(cfg.to_dict(), indent=2))
        return 0
    if args.nproc < 1 or args.rollout_workers < 0:
        print("rlvr train: --nproc must be >= 1 and --rollout-workers >= 0", file=sys.stderr)
        return 2
    if args.nproc > 1:
        from agents.distributed.data_parallel import check_data_parallel
        from agents.distributed.launch import launch

        try:
            check_data_parallel(cfg)
        except ValueError as exc:
            print(f"rlvr train: {exc}", file=sys.stderr)
            return 2
        return launch(args.nproc, args, cfg.out_dir)
    from agents.grpo.trainer import Trainer

    kwargs = remote_envs(cfg, args.env_url) if args.env_url else {}
    if args.rollout_workers:
        from agents.distributed.launch import rollout_engine

        kwargs["policy"], kwargs["engine"] = rollout_engine(cfg, args.rollout_workers)
    trainer = Trainer(cfg, **kwargs)
    records = trainer.run(resume=not args.fresh)
    evals = [r for r in records if r.get("kind") == "eval"]
    if evals:
        print(f"held-out accuracy: {evals[0].get('eval_accuracy', float('nan')):.3f} (step {evals[0]['step']}) -> "
              f"{evals[-1].get('eval_accuracy', float('nan')):.3f} (step {evals[-1]['step']})")
    print(f"metrics: {trainer.metrics.path}  curves: {trainer.out / 'curves.png'}")
    return 0
