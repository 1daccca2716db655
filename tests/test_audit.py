"""``rlvr audit``: a second verifier re-checks a results file and lists the records whose verdicts differ."""

import json

import gymnasium as gym
import pytest

from rlvr_envs.audit import audit, countdown_judge
from rlvr_envs.cli import main
from rlvr_envs.core import ListSource, Task, TextEnv
from rlvr_envs.harness.evaluate import evaluate
from rlvr_envs.harness.results import Results
from rlvr_envs.tasks.math import make_scorer

MATH_ID = "rlvrtest/MathAudit-v0"
# (gold, response): the first verifier (Math-Verify) and the second (SymPy) agree on every one of these.
GOLDEN = [
    ("\\frac{1}{2}", "So the answer is $\\boxed{0.5}$.", "correct"),
    ("2\\sqrt{3}", "Hence $\\boxed{\\sqrt{12}}$.", "correct"),
    ("(1, -2)", "The point is $\\boxed{\\left(1, -2\\right)}$.", "correct"),
    ("x^2+3x-4", "Expanding, $\\boxed{(x+4)(x-1)}$.", "correct"),
    ("1,000", "$\\boxed{1000}$", "correct"),
    ("5", "The answer is $\\boxed{6}$.", "wrong"),
    ("\\frac{1}{3}", "$\\boxed{0.333}$", "wrong"),
    ("[-2, 5)", "$\\boxed{(-2, 5)}$", "wrong"),
    ("42", "I am not sure.", "wrong"),  # no final answer: wrong for both
]
# Two boxes holding one value in two forms: the first verifier's hedge rule calls it wrong, SymPy reads the last
# box as correct (MATH-500's own reference solution for test/number_theory/459.json ends like this).
HEDGED = ("\\frac{639}{40}", "$d = \\boxed{15\\frac{39}{40}},$ or $\\boxed{\\frac{639}{40}}$ inches.")
TASKS = [*GOLDEN, (*HEDGED, "wrong")]


def make_math_toy() -> TextEnv:
    tasks = [Task(id=f"m-{i}", question=f"q{i}", answer=gold, metadata={"response": response})
             for i, (gold, response, _) in enumerate(TASKS)]
    return TextEnv(ListSource(tasks, "math-audit"), make_scorer(10.0), verifier_name="math-verify")


if MATH_ID not in gym.registry:
    gym.register(MATH_ID, entry_point=make_math_toy)


class ScriptedAgent:
    """Answers each task with the response stored in its metadata (or a fixed function of the task)."""

    def __init__(self, env_id: str, respond=None, **env_kwargs):
        self.env = gym.make(env_id, **env_kwargs).unwrapped
        self.respond = respond or (lambda task: task.metadata["response"])

    def act(self, observations, infos):
        return [self.respond(self.env.source.task(info["task_index"])) for info in infos]

    def describe(self):
        return {"model": "scripted"}


@pytest.fixture(scope="module")
def math_results(tmp_path_factory):
    out = tmp_path_factory.mktemp("audit") / "math.json"
    evaluate(ScriptedAgent(MATH_ID), MATH_ID, out=out, progress=False)
    return out


def test_golden_pairs_agree_and_the_hedge_rule_is_the_one_disagreement(math_results):
    results = Results.load(math_results)
    assert [r["status"] for r in results.records] == [status for _, _, status in TASKS]
    report = audit(results)
    assert report.second_verifier == "sympy-equivalence"
    assert [(r.first, r.second) for r in report.rows[: len(GOLDEN)]] == [(s, s) for _, _, s in GOLDEN]
    (row,) = report.disagreements
    assert (row.task_id, row.first, row.second, row.answer) == (f"m-{len(GOLDEN)}", "wrong", "correct",
                                                               "\\frac{639}{40}")
    assert "hedged" in row.first_error
    assert report.pairs[("correct", "correct")] == 5 and report.pairs[("wrong", "wrong")] == 4


def test_a_record_marked_wrong_by_mistake_is_listed(math_results, tmp_path, capsys):
    doc = json.loads(math_results.read_text())
    record = doc["records"][1]  # 2\sqrt{3} answered \sqrt{12}: correct
    assert record["correct"]
    record.update(correct=False, status="wrong", reward=0.0, error="edited: marked wrong")
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(doc))
    out = tmp_path / "disagreements.json"
    assert main(["audit", str(edited), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "m-1" in printed and "edited: marked wrong" in printed
    assert "disagreement rate 20.0% (2/10): 2 correct-vs-wrong, 0 with one side unverifiable" in printed
    saved = json.loads(out.read_text())
    assert saved["disagreements"] == 2 and saved["pairs"]["wrong/correct"] == 2
    assert [(r["task_id"], r["first"], r["second"]) for r in saved["rows"]] == \
        [("m-1", "wrong", "correct"), (f"m-{len(GOLDEN)}", "wrong", "correct")]


def test_an_unreadable_answer_is_unverifiable_not_wrong(tmp_path):
    def respond(task):
        return "\\boxed{__import__('os')}" if task.id == "m-0" else task.metadata["response"]

    out = tmp_path / "hostile.json"
    report = audit(evaluate(ScriptedAgent(MATH_ID, respond), MATH_ID, out=out, progress=False))
    row = report.rows[0]
    assert (row.first, row.second) == ("wrong", "unverifiable") and "unreadable" in row.reason


@pytest.mark.parametrize(("response", "status"), [
    ("<answer>(8 - 2) * 4</answer>", "correct"), ("<answer>4 * (8 - 2) = 24</answer>", "correct"),
    ("\\boxed{(8 - 2) \\times 4}", "correct"), ("<answer>8 * 4 - 2</answer>", "wrong"),
    ("<answer>(8 - 2) * 4 * 1</answer>", "wrong"), ("<answer>-(2 - 8) * 4</answer>", "wrong"),
    ("<answer>8 ** 2 - 4</answer>", "wrong"), ("<answer>(8 - 2 * 4</answer>", "wrong"),
    ("<answer>8 / (4 - 4) + 2</answer>", "wrong"), ("<answer>__import__('os')</answer>", "wrong"), ("24", "wrong"),
])
def test_countdown_second_check(response, status):
    assert countdown_judge([8, 2, 4], 24, response)[0] == status


def test_countdown_results_agree_and_an_edited_record_shows(tmp_path):
    kwargs = {"min_numbers": 3, "max_numbers": 3, "max_number": 9, "max_target": 40}

    def respond(task):
        index = int(task.id.rsplit("-", 1)[1])
        return f"<answer>{task.metadata['solution']}</answer>" if index % 2 else "<answer>1 + 2</answer>"

    out = tmp_path / "countdown.json"
    results = evaluate(ScriptedAgent("rlvr/Countdown-v0", respond, **kwargs), "rlvr/Countdown-v0", limit=12,
                       env_kwargs=kwargs, out=out, progress=False)
    report = audit(results)
    assert report.second_verifier == "countdown-sympy" and not report.disagreements
    assert report.pairs[("correct", "correct")] == 6 and report.pairs[("wrong", "wrong")] == 6
    results.records[1].update(correct=False, status="wrong")
    assert [(r.task_id, r.first, r.second) for r in audit(results).disagreements] == \
        [("countdown-1", "wrong", "correct")]


def test_envs_without_a_second_verifier_say_so(tmp_path, capsys):
    out = tmp_path / "arith.json"
    evaluate(ScriptedAgent("rlvr/Arithmetic-v0", lambda task: f"\\boxed{{{task.answer}}}"), "rlvr/Arithmetic-v0",
             limit=4, out=out, progress=False)
    doc = json.loads(out.read_text())
    doc["provenance"]["env"]["verifier"] = "qa-em"  # as a QA run would name its verifier
    qa = tmp_path / "qa.json"
    qa.write_text(json.dumps(doc))
    assert main(["audit", str(qa)]) == 0
    assert "no second verifier (QA exact match" in capsys.readouterr().out
    assert audit(Results.load(out)).pairs[("correct", "correct")] == 4  # Arithmetic: SymPy on the integer
    assert main(["audit", str(tmp_path / "missing.json")]) == 2
