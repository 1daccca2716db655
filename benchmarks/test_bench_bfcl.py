"""Our BFCL AST match vs the official checker (PyPI ``bfcl-eval``) on the ground truth and on systematic perturbations.

bfcl-eval pins numpy==1.26.4 and ~30 API clients, so it is not a project dependency: install it without them
(``pip install --no-deps bfcl-eval``). Its checker module imports the model registry only to decide whether a model
writes ``a.b`` as ``a_b``; we give it a registry stub that says "no" (we never rename), and run its checker unmodified.
Irrelevance is decided outside the AST checker in BFCL (success = no decodable call), so it is not compared here.
Prints the agreement rate per category (run with -s).
"""

import collections
import os
import sys
import types
from pathlib import Path

import pytest

from rlvr_envs.tools.bfcl import gold_calls, load_tasks
from rlvr_envs.tools.bfcl_perturb import perturbations, rewrites
from rlvr_envs.verifiers.calls import match_bfcl

AST_CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple", "live_simple", "live_multiple")


def official_checker():
    pytest.importorskip("bfcl_eval", reason="pip install --no-deps bfcl-eval to compare with the official checker")
    stub = types.ModuleType("bfcl_eval.constants.model_config")

    class _NoRename:
        underscore_to_dot = False

    stub.MODEL_CONFIG_MAPPING = collections.defaultdict(_NoRename)
    sys.modules.setdefault("bfcl_eval.constants.model_config", stub)
    from bfcl_eval.constants.enums import Language
    from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker

    def check(task, calls):
        output = [{c.name: dict(c.arguments)} for c in calls]
        try:
            return bool(ast_checker(task.metadata["functions"], output, task.metadata["ground_truth"], Language.PYTHON,
                                    task.metadata["category"], "stub-model")["valid"])
        except Exception:  # the official checker crashes on some malformed predictions: it is not a pass
            return False

    return check


@pytest.mark.slow
def test_agreement_with_bfcl_eval():
    check = official_checker()
    root = os.environ.get("RLVR_DATA_DIR")
    if not root or not Path(root, "bfcl").is_dir():
        pytest.skip("RLVR_DATA_DIR does not hold the BFCL data")
    tasks, _ = load_tasks(AST_CATEGORIES, root)
    agree = collections.Counter()
    total = collections.Counter()
    disagreements = []
    verdicts = collections.Counter()
    for task in tasks:
        cases = {"gold": gold_calls(task), **perturbations(task), **rewrites(task)}
        for kind, calls in cases.items():
            if calls is None:
                continue
            ours = match_bfcl(calls, task.metadata["ground_truth"], task.metadata["functions"],
                              task.metadata["category"]) is None
            theirs = check(task, calls)
            key = (task.metadata["category"], kind)
            total[key] += 1
            agree[key] += ours == theirs
            verdicts[(kind, ours)] += 1
            if ours != theirs:
                disagreements.append((task.id, kind, ours, theirs))
    n, a = sum(total.values()), sum(agree.values())
    version = __import__("importlib.metadata").metadata.version("bfcl-eval")
    print(f"\nBFCL checker agreement (ours vs bfcl-eval {version}): {a}/{n} = {a / n:.4%}")
    for category in AST_CATEGORIES:
        row = {kind: f"{agree[(category, kind)]}/{total[(category, kind)]}" for (c, kind) in total if c == category}
        print(f"  {category:18s} {row}")
    gold_pass = sum(check(t, gold_calls(t)) for t in tasks)
    print(f"  official checker passes our rendered ground truth on {gold_pass}/{len(tasks)} items")
    print(f"  our verdicts by case (kind, pass): {dict(sorted(verdicts.items()))}")
    print(f"  disagreements: {disagreements[:20]}")
    assert a / n >= 0.99, disagreements[:20]
