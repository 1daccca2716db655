"""Each policy of a finished Agon run evaluated alone (no draft in its prompt), beside the cascade that is its entry.

``python benchmarks/agon_alone.py RUN_DIR [RUN_DIR ...] [--out benchmarks/results/agon_alone.json]``

The run's held-out metric is the cascade (this run's policy drafts, the partner answers after reading the draft). This
script asks what each of the two trained policies does on its own: the same held-out tasks, samples and temperature as
the lane's eval, through the harness (``rlvr_envs.harness.evaluate``), one policy at a time. Several run directories
(the seeds of one comparison) give one entry each under ``runs``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from agents.grpo.publish import _config, _final_state, final_policy
    from agents.methods.agon import published_cascade
    from agents.policy import PolicyAgent, SamplingParams, make_engine
    from rlvr_envs.harness import evaluate

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    loaded = []
    for run_dir in map(Path, args.run_dirs):  # check every run before evaluating any
        state, path = _final_state(run_dir)
        cfg = _config(state, path)
        if (cfg.stages or {}).get("orchestrator") != "agon":
            p.error(f"{run_dir} is not an Agon run (orchestrator {cfg.stages.get('orchestrator')!r})")
        loaded.append((run_dir, state, cfg))
    keep = ("n_tasks", "n_samples", "mean@4", "pass@1", "pass@4", "maj@4", "accuracy", "length_mean")
    result: dict[str, Any] = {"command": "python benchmarks/agon_alone.py "
                              + " ".join(argv if argv is not None else sys.argv[1:]), "runs": []}
    for run_dir, state, cfg in loaded:
        sampling = SamplingParams(temperature=float(cfg.eval_temperature),
                                  max_new_tokens=cfg.eval_max_new_tokens or cfg.max_new_tokens)
        policy = final_policy(run_dir)
        drafter = PolicyAgent(policy, make_engine(policy, "hf", precision=cfg.precision), sampling)
        cascade, _ = published_cascade(cfg, state, drafter, sampling)
        run: dict[str, Any] = {"run_dir": run_dir.name, "seed": cfg.seed, "env": cfg.env,
                               "eval_samples": cfg.eval_samples, "eval_temperature": cfg.eval_temperature}
        with tempfile.TemporaryDirectory() as tmp:
            for name, agent in (("this_run_policy_alone", drafter), ("partner_alone", cascade.solver)):
                out = Path(tmp) / f"{name}.json"
                evaluate(agent, cfg.env, env_kwargs={**cfg.env_kwargs, **cfg.eval_env_kwargs},
                         n_samples=int(cfg.eval_samples), seed=0, limit=cfg.eval_size, batch_size=64, out=out)
                metrics = json.loads(out.read_text())["metrics"]
                run[name] = {k: metrics[k] for k in keep if k in metrics}
                print(f"{run_dir.name} {name}: accuracy {metrics['accuracy']:.4f}", flush=True)
        result["runs"].append(run)
        if args.out:  # written after each run, so an interrupted call keeps what it measured
            Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
