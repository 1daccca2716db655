"""Run by .ci/core_install.sh inside a fresh venv holding only the core wheel (no extras).

Every registered env that needs no extra is made, reset and stepped once; every env whose extra is missing must fail
at ``gymnasium.make`` with the error naming that extra. The harness evaluates a trivial agent and the CLI paths that
need an extra say which. Exits non-zero on any failure.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gymnasium as gym

import rlvr_envs
from rlvr_envs.data import DataNotFoundError
from rlvr_envs.extras import MissingExtraError, missing
from rlvr_envs.registration import all_entries

HEAVY = ("torch", "transformers", "faiss", "bm25s", "ot", "datasets", "accelerate", "vllm", "ray")
TEXT_ACTION = "Let me think. The answer is \\boxed{42}. <answer>42</answer>"
SMALL = {"size": 20}  # procedural reasoning-gym generators: a small dataset is enough to step once


def check_envs() -> list[str]:
    failures: list[str] = []
    stepped = refused = no_data = 0
    data_dir = os.environ.get("RLVR_DATA_DIR", "")
    started = time.perf_counter()
    for entry in all_entries():
        if entry.extra and missing(entry.extra):
            try:
                gym.make(entry.id)
            except MissingExtraError as exc:
                if f"[{entry.extra}]" not in str(exc) or entry.id not in str(exc):
                    failures.append(f"{entry.id}: the missing-extra error does not name the extra and env: {exc}")
                refused += 1
            except Exception as exc:
                failures.append(f"{entry.id}: expected MissingExtraError, got {type(exc).__name__}: {exc}")
            else:
                failures.append(f"{entry.id}: made without its [{entry.extra}] extra")
            continue
        kwargs = SMALL if entry.id.startswith("rlvr/rg-") or entry.id == "rlvr/ReasoningGym-v0" else {}
        try:
            env = gym.make(entry.id, **kwargs)
            env.reset(seed=0)
            action = TEXT_ACTION if not isinstance(env.action_space, gym.spaces.Discrete) else 0
            env.step(action)
            env.close()
            stepped += 1
        except DataNotFoundError as exc:
            if Path(data_dir).is_dir():  # the data is there: not finding it is a bug
                failures.append(f"{entry.id}: {exc}")
            no_data += 1
        except Exception as exc:
            failures.append(f"{entry.id}: {type(exc).__name__}: {exc}")
    print(f"envs: {stepped} made and stepped, {refused} refused for a missing extra (clear error), "
          f"{no_data} without data, {len(failures)} failed; {time.perf_counter() - started:.0f}s")
    return failures


class ConstantAgent:
    def act(self, observations: list[str], infos: list[dict]) -> list[str]:
        return ["\\boxed{7}"] * len(observations)


def check_harness_and_cli() -> list[str]:
    failures: list[str] = []
    from rlvr_envs.harness import evaluate

    with tempfile.TemporaryDirectory() as tmp:
        results = evaluate(ConstantAgent(), "rlvr/Arithmetic-v0", n_samples=2, limit=4, out=Path(tmp) / "r.json",
                           progress=False)
        print("harness:", next(line.strip() for line in results.summary().splitlines() if "pass@" in line))
    rlvr = [sys.executable, "-m", "rlvr_envs.cli"]
    listing = subprocess.run([*rlvr, "list"], capture_output=True, text=True)
    if listing.returncode != 0 or "rlvr-envs[search]" not in listing.stdout:
        failures.append(f"rlvr list: rc={listing.returncode} {listing.stderr[-500:]}")
    train = subprocess.run([*rlvr, "train", "--list"], capture_output=True, text=True)
    if train.returncode != 1 or "[agents]" not in train.stderr:
        failures.append(f"rlvr train --list without [agents]: rc={train.returncode} {train.stderr[-500:]}")
    else:
        print("rlvr train --list:", train.stderr.strip())
    try:
        importlib.import_module("agents.grpo")
        failures.append("agents.grpo imported without the [agents] extra")
    except MissingExtraError as exc:
        print("import agents.grpo:", exc)
    return failures


def main() -> int:
    print(f"rlvr_envs {rlvr_envs.__version__} from {Path(rlvr_envs.__file__).parent}")
    present = [m for m in HEAVY if importlib.util.find_spec(m) is not None]
    failures = [f"the core install has heavy modules: {present}"] if present else []
    failures += check_envs()
    failures += check_harness_and_cli()
    for line in failures:
        print("FAIL", line)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
