"""Launching a data-parallel run: ``rlvr train RECIPE --nproc N [--rollout-workers M]``, or torchrun directly::

    torchrun --standalone --nproc-per-node 2 -m agents.distributed.launch grpo --lane micro

Every rank runs ``main`` with the same arguments (recipe, ``--set``, ``--lane``, ``--fresh``, ``--rollout-workers``);
rank 0 prints what a one-process ``rlvr train`` prints. ``launch`` wraps torchrun's own launcher
(``torch.distributed.run``) and turns a rank's death into one clear error that says how to resume.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import Any

from agents.grpo.config import TrainConfig


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("recipe", help="recipe name or path to a .toml file")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--lane", default=None)
    p.add_argument("--fresh", action="store_true")
    p.add_argument("--rollout-workers", type=int, default=0,
                   help="spread rank 0's rollouts over this many Ray actors (0: its own engine)")
    p.add_argument("--env-url", default=None, help="rank 0 plays the env on this `rlvr serve` server")


def worker_args(args: argparse.Namespace) -> list[str]:
    """The per-rank command line for ``args`` (``rlvr train``'s namespace)."""
    out = [args.recipe, *[a for kv in args.overrides for a in ("--set", kv)]]
    if args.lane:
        out += ["--lane", args.lane]
    if args.fresh:
        out.append("--fresh")
    if getattr(args, "rollout_workers", 0):
        out += ["--rollout-workers", str(args.rollout_workers)]
    if getattr(args, "env_url", None):
        out += ["--env-url", args.env_url]
    return out


def rollout_engine(cfg: TrainConfig, workers: int) -> Any:
    """A Ray pool of ``workers`` engines of the recipe's backend over the recipe's policy."""
    from agents.distributed.rollout_workers import RayRolloutEngine
    from agents.policy.models import load_policy

    policy = load_policy(cfg.model, dtype=cfg.dtype, seed=cfg.seed)
    gpus = 1 if cfg.engine == "vllm" else 0
    kwargs = {"precision": cfg.precision} if cfg.engine == "hf" else {}
    return policy, RayRolloutEngine(policy, workers, backend=cfg.engine, engine_kwargs=kwargs, gpus_per_worker=gpus,
                                    threads=cfg.threads or 1)


def main(argv: list[str] | None = None) -> int:
    """One rank of a data-parallel run (torchrun sets ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``)."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    p = argparse.ArgumentParser(prog="python -m agents.distributed.launch", description=__doc__)
    add_arguments(p)
    args = p.parse_args(argv)
    from agents.distributed.data_parallel import DataParallelTrainer, init_process_group
    from agents.grpo.config import load_recipe

    cfg = load_recipe(args.recipe, args.overrides, lane=args.lane)
    rank, world = init_process_group()
    kwargs: dict[str, Any] = {}
    if args.env_url:  # every rank: the others never step it, but then need no local copy of the env's data
        from rlvr_envs.commands.train import remote_envs

        kwargs.update(remote_envs(cfg, args.env_url))
    if args.rollout_workers and rank == 0:
        kwargs["policy"], kwargs["engine"] = rollout_engine(cfg, args.rollout_workers)
    trainer = DataParallelTrainer(cfg, **kwargs)
    records = trainer.run(resume=not args.fresh)
    if rank == 0:
        evals = [r for r in records if r.get("kind") == "eval"]
        if evals:
            print(f"held-out accuracy: {evals[0].get('eval_accuracy', float('nan')):.3f} (step {evals[0]['step']}) -> "
                  f"{evals[-1].get('eval_accuracy', float('nan')):.3f} (step {evals[-1]['step']}), {world} ranks")
        print(f"metrics: {trainer.metrics.path}")
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


def describe_failure(failure: Any) -> str:
    """``rank 1 (pid 123) was killed by SIGKILL`` / ``... exited with code 1``, from torchrun's ProcessFailure."""
    code = failure.exitcode
    how = (f"was killed by {signal.Signals(-code).name}" if code < 0 and -code in signal.Signals._value2member_map_
           else f"exited with code {code}")
    return f"rank {failure.local_rank} (pid {failure.pid}) {how}"


def launch(nproc: int, args: argparse.Namespace, out_dir: str | Path) -> int:
    """Run ``nproc`` ranks on this machine through torchrun's launcher; on a rank's death print which rank, how, and
    the step a rerun of the same command resumes from."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    from agents.grpo import checkpoint

    if nproc < 1:
        raise ValueError(f"--nproc must be >= 1, got {nproc}")
    torchrun_args = get_args_parser().parse_args(
        ["--standalone", f"--nproc-per-node={nproc}", "--max-restarts=0", "--module", "agents.distributed.launch",
         *worker_args(args)])
    try:
        run(torchrun_args)
    except ChildFailedError as exc:
        first = exc.get_first_failure()[1]
        others = [describe_failure(f) for r, f in sorted(exc.failures.items()) if f is not first]
        last = checkpoint.latest(Path(out_dir))
        where = (f"resumes from {last.name} in {out_dir}" if last is not None
                 else f"starts over: {out_dir} holds no checkpoint yet")
        print(f"rlvr train: {describe_failure(first)}; the run stopped"
              + (f" ({'; '.join(others)})" if others else "")
              + f". Rerunning the same command {where} (any --nproc).", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
