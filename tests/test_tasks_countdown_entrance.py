"""rlvr/Countdown-v0's entrance option: explicit entrances, drawn hints (deterministic), rejection of invalid ones,
and prompts byte-identical to before when the option is unused."""

import hashlib
import json
from fractions import Fraction

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import given, settings
from hypothesis import strategies as st

import rlvr_envs  # noqa: F401  (registers the IDs)
from agents.policy.countdown_traces import check_trace, write_trace
from rlvr_envs.tasks.countdown import (
    DEFAULT_TEMPLATE,
    Entrance,
    draw_entrance,
    entrances,
    gold_response,
    make_env,
    parse_entrance,
    reachable,
    solvable_entrances,
    solve,
)
from rlvr_envs.verifiers.countdown import evaluate_expression

MICRO_HELD_OUT = dict(min_numbers=3, max_numbers=3, min_number=1, max_number=9, min_target=2, max_target=40,
                      prompt_template="{question}", seed_base=1)


def prompts_hash(kwargs: dict, seeded: bool = False) -> str:
    env = gym.make("rlvr/Countdown-v0", **kwargs)
    out = []
    for i in range(50):
        obs, info = env.reset(seed=i) if seeded else env.reset(options={"index": i})
        out.append([info["task_id"], obs, info["messages"], sorted(info)])
    return hashlib.sha256(json.dumps(out).encode()).hexdigest()


def test_default_prompts_and_infos_are_byte_identical_to_before():
    # Hashes recorded with the code before the entrance option existed (task ids, observations, messages, info keys).
    assert prompts_hash({}) == "d8c27fab01792cfe89344a6f49a02dc08e7fa6dc05a3229a1006a3e4397da91c"
    assert prompts_hash({}, seeded=True) == "b202d8abd59adfc6fff244995a0dc8a5e4945693b6c88a69ef30ea9dd145d296"
    assert prompts_hash(MICRO_HELD_OUT) == "310deaddde427923d2d0b25fa3b27addbdfbf98b0a3dad82b80cc7b28e3dd008"
    assert prompts_hash({"entrance_hint": False}) == prompts_hash({})
    env = make_env()
    obs, info = env.reset(options={"index": 3})
    assert obs == DEFAULT_TEMPLATE.format(question=env.source.task(3).question) and "entrance" not in info
    _, _, _, _, step_info = env.step("x")
    assert "entrance" not in step_info


def test_entrances_of_a_task_by_hand():
    # numbers 6, 3, 2: pairs (6,3) (6,2) (3,2); '-' larger first; '/' only exact by > 1: 6/3, 6/2 (3/2 is not exact)
    got = [e.text for e in entrances([6, 3, 2])]
    assert got == ["3 + 2 = 5", "3 - 2 = 1", "3 * 2 = 6",
                   "6 + 2 = 8", "6 + 3 = 9", "6 - 2 = 4", "6 - 3 = 3", "6 * 2 = 12", "6 * 3 = 18",
                   "6 / 2 = 3", "6 / 3 = 2"]
    # duplicates: 4, 4, 1 -> (4,4) and (4,1) once each; 4/1 excluded (divisor 1), 4/4 = 1 allowed
    assert [e.key for e in entrances([4, 4, 1])] == ["4 + 1", "4 + 4", "4 - 1", "4 - 4", "4 * 1", "4 * 4", "4 / 4"]
    # target 12 from [6, 3, 2], each entrance's rest by hand (+, -, *, / both ways):
    #   3+2=5 -> [5, 6]: 11 1 30 6/5 no;  3-2=1 -> [1, 6]: 7 5 6 no;  3*2=6 -> [6, 6]: 6+6=12 yes
    #   6+2=8 -> [3, 8]: 11 5 24 8/3 no;  6+3=9 -> [2, 9]: 11 7 18 9/2 no;  6-2=4 -> [3, 4]: 3*4=12 yes
    #   6-3=3 -> [2, 3]: 5 1 6 no;  6*2=12 -> [3, 12]: 15 9 36 4 no;  6*3=18 -> [2, 18]: 20 16 36 9 no
    #   6/2=3 -> [3, 3]: 6 0 9 1 no;  6/3=2 -> [2, 2]: 4 0 4 1 no
    assert [e.key for e in solvable_entrances([6, 3, 2], 12)] == ["3 * 2", "6 - 2"]
    assert Entrance(6, "-", 2, 4).rest([6, 3, 2]) == [3, 4]
    with pytest.raises(ValueError, match="not in"):
        Entrance(9, "-", 2, 7).rest([6, 3, 2])


def test_parse_entrance_accepts_the_forms_and_canonicalizes():
    nums = [7, 3, 5]
    assert parse_entrance("3 + 7", nums) == Entrance(7, "+", 3, 10)  # commutative: larger first
    assert parse_entrance("3*5 = 15", nums) == Entrance(5, "*", 3, 15)
    assert parse_entrance(" 7 - 5 = 2. ", nums) == Entrance(7, "-", 5, 2)
    assert parse_entrance((7, "-", 3), nums) == Entrance(7, "-", 3, 4)
    assert parse_entrance(Entrance(7, "+", 5, 12), nums).text == "7 + 5 = 12"
    assert parse_entrance("4 / 2", [4, 2, 9]) == Entrance(4, "/", 2, 2)


@pytest.mark.parametrize("spec, why", [
    ("7 + 8", "not given"),                 # 8 is not a number of the task
    ("7 + 7", "not given"),                 # 7 only once
    ("3 - 7", "negative"),
    ("7 / 3", "not an exact division"),
    ("7 / 1", "not an exact division"),     # with numbers [7, 3, 1]: dividing by 1 is not a move
    ("7 + 3 = 11", "is 10, not 11"),
    ("seven plus three", "expected 'a op b'"),
    ("7 ** 3", "expected 'a op b'"),
    ("7 % 3", "expected 'a op b'"),
    ((7, "^", 3), "unknown operator"),
    (("a", "+", 3), "expected integers"),
    (42, "expected a string"),
    ("__import__('os')", "expected 'a op b'"),
])
def test_invalid_entrances_are_rejected_with_a_clear_error(spec, why):
    nums = [7, 3, 5] if spec != "7 / 1" else [7, 3, 1]
    with pytest.raises(ValueError, match="invalid entrance") as err:
        parse_entrance(spec, nums)
    assert why in str(err.value) and "valid entrances: " in str(err.value)
    env = make_env(**{k: v for k, v in MICRO_HELD_OUT.items()})
    with pytest.raises(ValueError, match="invalid entrance"):
        env.reset(options={"index": 0, "entrance": "1 + 1000"})


def test_explicit_entrance_renders_into_any_template_and_infos():
    env = make_env(**MICRO_HELD_OUT)
    task = env.source.task(0)
    entrance = entrances(task.metadata["numbers"])[0]
    obs, info = env.reset(options={"index": 0, "entrance": entrance.key})
    assert obs == f"{task.question} Start with {entrance.text}."  # template "{question}": the bare question + hint
    assert info["entrance"] == entrance.text and info["messages"] == [{"role": "user", "content": obs}]
    assert info["task_id"] == task.id and info["index"] == 0
    _, reward, _, _, step_info = env.step(gold_response(task))
    assert reward == 1.0 and step_info["entrance"] == entrance.text  # grading is unchanged
    # the default template: the hint sits right after the question, before the format instructions
    env = make_env()
    obs, _ = env.reset(options={"index": 5, "entrance": entrances(env.source.task(5).metadata["numbers"])[-1].key})
    q = env.source.task(5).question
    assert obs.startswith(q + " Start with ") and obs.endswith(DEFAULT_TEMPLATE.split("{question}")[1])
    # messages for any other task (not this episode's) are the plain ones
    assert env.messages_for(env.source.task(6)) == [{"role": "user", "content": DEFAULT_TEMPLATE.format(
        question=env.source.task(6).question)}]
    # the next reset without the option is a plain episode again
    obs2, info2 = env.reset(options={"index": 5})
    assert obs2 == DEFAULT_TEMPLATE.format(question=q) and "entrance" not in info2
    # a custom instruction
    env = make_env(entrance_template="Begin: {entrance}")
    obs, _ = env.reset(options={"index": 1, "entrance": entrances(env.source.task(1).metadata["numbers"])[0].key})
    assert "Begin: " in obs and "Start with" not in obs


def test_hint_is_deterministic_under_the_seed_and_solvable():
    def draws(mode, seeds):
        env = gym.make("rlvr/Countdown-v0", **MICRO_HELD_OUT, entrance_hint=mode)
        return [env.reset(seed=s, options={"index": 2})[1]["entrance"] for s in seeds]

    a = draws(True, range(40))
    assert a == draws(True, range(40)) == draws("sample", range(40))  # same seeds, fresh envs: same entrances
    assert len(set(a)) > 1  # ... and the seed matters
    # "task": one entrance per task whatever the reset seed; entrance_seed picks another rule
    t = draws("task", range(10))
    assert len(set(t)) == 1
    env = gym.make("rlvr/Countdown-v0", **MICRO_HELD_OUT, entrance_hint="task", entrance_seed=3)
    per_task = {i: {env.reset(seed=s, options={"index": i})[1]["entrance"] for s in range(3)} for i in range(30)}
    assert all(len(v) == 1 for v in per_task.values())
    # every drawn entrance is valid and leaves the target reachable
    env = make_env(**MICRO_HELD_OUT, entrance_hint=True)
    for i in range(60):
        obs, info = env.reset(seed=i, options={"index": i})
        task = env.unwrapped.task
        nums, target = task.metadata["numbers"], int(task.answer)
        e = parse_entrance(info["entrance"], nums)
        assert e.text == info["entrance"] and f"Start with {e.text}." in obs
        assert solve(e.rest(nums), target) is not None


def test_draw_is_uniform_over_the_solvable_entrances():
    nums, target = [6, 3, 2], 12
    pool = {e.key for e in solvable_entrances(nums, target)}
    rng = np.random.default_rng(0)
    counts: dict[str, int] = {}
    for _ in range(3000):
        key = draw_entrance(nums, target, rng).key
        counts[key] = counts.get(key, 0) + 1
    assert set(counts) == pool
    expected = 3000 / len(pool)
    assert all(abs(c - expected) < 5 * expected ** 0.5 for c in counts.values())


def test_env_checker_and_bad_kwargs():
    check_env(gym.make("rlvr/Countdown-v0", entrance_hint=True).unwrapped, skip_render_check=True)
    for bad in ({"entrance_hint": "always"}, {"entrance_hint": 1.5}, {"entrance_template": "no slot"},
                {"entrance_seed": "0"}, {"entrance_seed": -1}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            make_env(**bad)


def test_reachable_agrees_with_the_solver():
    rng = np.random.default_rng(0)
    for _ in range(400):
        nums = [int(x) for x in rng.integers(0, 8, size=int(rng.integers(1, 5)))]
        target = int(rng.integers(-3, 30))
        assert reachable(nums, target) == (solve(nums, target) is not None), (nums, target)
    assert reachable([1, 3, 4, 6], 24)  # needs a fraction: 6 / (1 - 3/4)
    assert not reachable([1, 1, 1], 100)
    assert reachable([0, 5], 0) and not reachable([0], 5)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(1, 30), min_size=3, max_size=5), st.integers(1, 60), st.integers(0, 2**31))
def test_trace_line_is_a_valid_first_trace_step(nums, target, seed):
    # every entrance round-trips through its text, and its trace line is a valid first step for check_trace
    for e in entrances(nums):
        assert parse_entrance(e.text, nums) == e == parse_entrance(e.key, nums)
        step = check_trace(nums, target, e.trace_line(nums, target)).steps[0]
        assert step.valid and (step.a, step.op, step.b, step.result) == (e.a, e.op, e.b, e.result)
        assert Fraction(e.result) == evaluate_expression(f"{e.a}{e.op}{e.b}", [e.a, e.b])
    # a solver-written trace's first line is one of the entrances
    try:
        trace = write_trace(nums, target, np.random.default_rng(seed))
    except ValueError:  # unreachable with integer moves
        return
    first = check_trace(nums, target, trace).first_move
    assert parse_entrance(first, nums).key in {e.key for e in entrances(nums)}


class _EchoEngine:
    """Records prompts; every continuation is the same fixed text."""

    def __init__(self, text: str):
        self.text, self.prompts = text, []

    def generate(self, prompts, n, sampling, *, seeds=None):
        from agents.policy.engine import Rollout

        self.prompts.extend(prompts)
        return [Rollout(prompt_ids=[1], response_ids=[2, 3], text=self.text, logprobs=[0.0, 0.0],
                        entropies=[0.0, 0.0], finish_reason="stop") for _ in prompts for _ in range(n)]


def test_prefilled_entrance_from_a_per_task_table_is_continued_and_graded_whole():
    """``entrances`` picks a task's entrance, ``entrance_as="prefill"`` puts it in ``info["response_prefix"]`` (prompt
    unchanged) and PolicyAgent continues from it: the env grades prefix + continuation."""
    from types import SimpleNamespace

    from agents.policy.agent import PolicyAgent

    kw = dict(min_numbers=3, max_numbers=3, min_number=1, max_number=9, min_target=2, max_target=40,
              prompt_template="{question}")
    plain = gym.make("rlvr/Countdown-v0", **kw)
    obs0, info0 = plain.reset(options={"index": 0})
    task = plain.unwrapped.task
    numbers, target = task.metadata["numbers"], int(task.answer)
    entrance = solvable_entrances(numbers, target)[0]
    env = gym.make("rlvr/Countdown-v0", **kw, entrance_as="prefill", entrances={task.id: entrance.text})
    obs, info = env.reset(options={"index": 0})
    assert obs == obs0 and info["messages"] == info0["messages"]  # the prompt is unchanged
    line = entrance.trace_line(numbers, target)
    assert info["response_prefix"] == line + "\n" and info["entrance"] == entrance.text
    policy = SimpleNamespace(prompt_text=lambda messages: messages[-1]["content"] + "\n", name="echo",
                             weights_hash="", n_params=0)
    solution = task.metadata["solution"]
    engine = _EchoEngine(f"<answer>{solution}</answer>")
    agent = PolicyAgent(policy, engine=engine)
    [response] = agent.act([obs], [info])
    assert engine.prompts == [obs0 + "\n" + line + "\n"] and response == line + "\n" + f"<answer>{solution}</answer>"
    _, reward, _, _, step_info = env.step(response)
    assert reward == 1.0 and step_info["entrance"] == entrance.text
    # another task is untouched by the table
    _, other = env.reset(options={"index": 1})
    assert "response_prefix" not in other and "entrance" not in other
    with pytest.raises(ValueError, match="entrance_as"):
        gym.make("rlvr/Countdown-v0", **kw, entrance_as="suffix")
