"""``rlvr eval``: evaluate a model (or any agent object) on an env and write one results file."""

from __future__ import annotations

import argparse
import functools
import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from rlvr_envs.commands import json_object
from rlvr_envs.extras import require_extra


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="evaluate a model or agent on an environment",
                       description="Evaluate a policy (--model) or any agent object (--agent module:factory).")
    p.add_argument("--env", required=True, help="env ID, e.g. rlvr/MATH500-v0")
    who = p.add_mutually_exclusive_group()
    who.add_argument("--model", default="smollm2", help="smollm2, tiny, a Hugging Face model id or a local path")
    who.add_argument("--agent", help="module:attr or path/to/file.py:attr of an agent class or factory (called with "
                     "--agent-kwargs); a module must be importable (run from its folder or put it on PYTHONPATH)")
    p.add_argument("--agent-kwargs", default="{}", help="JSON object of keyword arguments for --agent")
    p.add_argument("--samples", type=int, default=1, help="samples per task (n of pass@k / maj@k)")
    p.add_argument("--limit", type=int, default=None, help="evaluate only the first N tasks")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="results.json", help="results file (default: results.json)")
    p.add_argument("--resume", action="store_true", help="continue a partial results file")
    p.add_argument("--backend", choices=("hf", "vllm"), default="hf")
    p.add_argument("--batch-size", type=int, default=8, help="samples per act() call")
    p.add_argument("--precision", default="fp32", choices=("fp32", "bf16", "auto"),
                   help="hf engine decode precision (default fp32: the same records on every CPU and for any "
                        "--batch-size; auto picks bf16 where the CPU has it, faster, and records then depend on the "
                        "CPU and on how samples are batched)")
    p.add_argument("--decode-slots", type=int, default=64,
                   help="hf engine: rows decoded at once; a batch with more rows queues them into freed slots")
    p.add_argument("--static-batching", action="store_true",
                   help="hf engine: decode in fixed chunks of --decode-slots rows instead of refilling freed slots")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=None,
                   help="sampling temperature (default: 0 = greedy for --samples 1, else 1.0)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--dtype", default="float32", help="model dtype (float32, bfloat16, ...)")
    p.add_argument("--env-kwargs", default="{}", help="JSON object of keyword arguments for gym.make")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--remote", default=None, metavar="URL",
                   help="play the episodes on an `rlvr serve` server at URL (e.g. http://127.0.0.1:8000) instead of "
                   "in-process; the results file records the URL (provenance.remote)")
    ray = p.add_argument_group("Ray", "shard the tasks over Ray actors (the [ray] extra); same results file")
    ray.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                     help="evaluate on Ray workers: no ADDRESS starts a local Ray, else ray.init(address=ADDRESS)")
    ray.add_argument("--ray-workers", type=int, default=None,
                     help="actors, each loading the policy once (default: as many as the cluster's CPUs allow)")
    ray.add_argument("--ray-cpus", type=int, default=None, help="CPUs of a local Ray (default: all)")
    ray.add_argument("--ray-worker-cpus", type=float, default=1.0, help="CPUs reserved per actor (default: 1)")
    ray.add_argument("--ray-worker-gpus", type=float, default=0.0, help="GPUs reserved per actor (default: 0)")
    p.set_defaults(func=run)


def _import_file(path: Path) -> ModuleType:
    """Import a ``.py`` file as a module named after it (its folder goes first on ``sys.path``, so its own sibling
    imports resolve as they would when run from there)."""
    name = f"rlvr_agent_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_agent_factory(spec: str) -> Any:
    """``package.module:attr`` or ``path/to/file.py:attr`` -> the attribute (import only; nothing is evaluated)."""
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise SystemExit(f"--agent {spec!r}: expected module:attr or path/to/file.py:attr")
    as_file = module_name.endswith(".py") or "/" in module_name or "\\" in module_name
    try:
        if as_file:
            path = Path(module_name).expanduser().resolve()
            if not path.is_file():
                raise SystemExit(f"--agent {spec!r}: no file {path}")
            obj: Any = _import_file(path)
        else:
            obj = importlib.import_module(module_name)
    except ImportError as exc:
        hint = ""
        if not as_file and isinstance(exc, ModuleNotFoundError) and exc.name == module_name.split(".")[0]:
            hint = (f"; Python looks for it on sys.path: run from the folder that holds {module_name.split('.')[0]}"
                    f".py, add that folder to PYTHONPATH (PYTHONPATH=path/to/folder rlvr eval ...), or give the "
                    f"file: --agent path/to/{module_name.replace('.', '/')}.py:{attr}")
        raise SystemExit(f"--agent {spec!r}: cannot import {module_name!r} ({exc}){hint}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise SystemExit(f"--agent {spec!r}: {module_name} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def make_agent(spec: str, kwargs: dict[str, Any]) -> Any:
    """The agent of ``--agent spec --agent-kwargs kwargs`` (module-level, so a Ray worker can build its own)."""
    return load_agent_factory(spec)(**kwargs)


def check_policy_extras(args: argparse.Namespace) -> None:
    require_extra("agents", f"rlvr eval --model {args.model}")
    if args.backend == "vllm":
        require_extra("vllm", "rlvr eval --backend vllm")


def build_policy_agent(args: argparse.Namespace, temperature: float) -> Any:
    # agents is imported lazily here: rlvr_envs itself never depends on it, and its deps are the [agents] extra.
    check_policy_extras(args)
    from agents.policy import PolicyAgent, load_policy
    from agents.policy.engine import SamplingParams, make_engine

    if args.no_progress:  # transformers' weight-loading bar is its own; the harness's flag covers it too
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    policy = load_policy(args.model, dtype=args.dtype, seed=args.seed)
    engine_kwargs = ({"max_batch_size": args.decode_slots, "continuous": not args.static_batching,
                      "precision": getattr(args, "precision", "fp32")} if args.backend == "hf" else {})
    engine = make_engine(policy, backend=args.backend, **engine_kwargs)
    sampling = SamplingParams(temperature=temperature, top_p=args.top_p, max_new_tokens=args.max_new_tokens,
                              seed=args.seed)
    return PolicyAgent(policy, engine, sampling)


def run(args: argparse.Namespace) -> int:
    from rlvr_envs.harness import evaluate

    if (args.samples < 1 or args.batch_size < 1 or getattr(args, "decode_slots", 1) < 1
            or (args.limit is not None and args.limit < 1)):
        raise SystemExit("--samples, --batch-size, --decode-slots and --limit must be >= 1")
    from rlvr_envs.remote import RemoteEnvError

    env_kwargs = json_object(args.env_kwargs, "--env-kwargs")
    remote = getattr(args, "remote", None)
    # A factory rather than an agent: with --ray every worker calls it once (loads its own policy).
    agent_factory: Callable[[], Any]
    if args.agent:
        load_agent_factory(args.agent)  # a bad spec fails here, before any worker starts
        agent_factory = functools.partial(make_agent, args.agent, json_object(args.agent_kwargs, "--agent-kwargs"))
    else:
        check_policy_extras(args)
        temperature = args.temperature if args.temperature is not None else (0.0 if args.samples == 1 else 1.0)
        agent_factory = functools.partial(build_policy_agent, args, temperature)
    common = dict(n_samples=args.samples, seed=args.seed, limit=args.limit, env_kwargs=env_kwargs, out=args.out,
                  resume=args.resume, progress=not args.no_progress, batch_size=args.batch_size)
    try:
        if args.ray is not None:
            from rlvr_envs.harness.ray_eval import evaluate_ray

            require_extra("ray", "rlvr eval --ray")
            results = evaluate_ray(agent_factory, args.env, address=args.ray, num_cpus=args.ray_cpus,
                                   workers=args.ray_workers, cpus_per_worker=args.ray_worker_cpus,
                                   gpus_per_worker=args.ray_worker_gpus, remote=remote, **common)
        else:
            results = evaluate(agent_factory(), args.env, remote=remote, **common)
    except (FileExistsError, ValueError) as exc:
        print(f"rlvr eval: {exc}", file=sys.stderr)
        return 2
    except RemoteEnvError as exc:
        print(f"rlvr eval --remote {remote}: {exc}", file=sys.stderr)
        return 2
    print(results.summary())
    print(f"wrote {args.out}")
    return 0
