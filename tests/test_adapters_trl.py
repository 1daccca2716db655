"""TRL ``environment_factory`` classes (rlvr_envs/integrations/trl_env.py) against the real TRL: the env plays gold
and wrong episodes through the methods TRL would call, and ``trl.GRPOTrainer`` runs two steps with a tiny model
through one class per env family (CPU, offline)."""

from __future__ import annotations

import inspect
import json

import pytest

trl = pytest.importorskip("trl")
pytest.importorskip("transformers")

from rlvr_envs.integrations.trl_env import (  # noqa: E402
    environment_dataset,
    environment_factory,
    environment_reward,
)

TOOLS_KW = {"services": ("files",), "distractor_tools": 0, "max_steps": 2}
SEARCH_KW = {"corpus_size": 40, "num_tasks": 4, "hops": 1}


def _gold_plan(env):
    from rlvr_envs.tools.env import plan_calls

    task = env._env.unwrapped.task
    return task, plan_calls(task), env._env.unwrapped.gold_turns(task)[-1]


def test_tool_methods_are_the_sandbox_tools_with_their_schemas():
    from transformers.utils import get_json_schema

    from rlvr_envs.tools.services import TOOLS

    cls = environment_factory("rlvr/ToolUse-v0", **TOOLS_KW)
    public = sorted(n for n, _ in inspect.getmembers(cls, inspect.isfunction) if not n.startswith("_"))
    files = sorted(n for n, t in TOOLS.items() if t.service == "files")
    assert public == sorted(files + ["reset"])  # what TRL exposes as tools: the service's tools, nothing else
    for name in files:
        schema = get_json_schema(getattr(cls(), name))["function"]
        params = TOOLS[name].parameters
        assert schema["name"] == name
        assert set(schema["parameters"]["properties"]) == set(params["properties"])
        assert sorted(schema["parameters"].get("required", [])) == sorted(params["required"])
        for arg, spec in params["properties"].items():
            assert schema["parameters"]["properties"][arg]["type"] == spec["type"]
    # with distractor tools an episode can expose any tool, so every tool is a method
    every = environment_factory("rlvr/ToolUse-v0", distractor_tools=1)
    assert set(TOOLS) <= {n for n, _ in inspect.getmembers(every, inspect.isfunction)}


def test_tool_use_gold_episode_scores_1_and_wrong_or_unfinished_scores_0():
    cls = environment_factory("rlvr/ToolUse-v0", **TOOLS_KW)
    data = environment_dataset("rlvr/ToolUse-v0", 4, env_kwargs=TOOLS_KW)
    assert all(m["role"] != "system" or "<tools>" not in m["content"] for p in data["prompt"] for m in p)
    scored = []
    for row in data:
        gold_env, wrong_env, open_env = cls(), cls(), cls()
        for env in (gold_env, wrong_env, open_env):
            assert env.reset(**row) is None  # the prompt comes from the row
        task, plan, final = _gold_plan(gold_env)
        for call in plan:
            result = getattr(gold_env, call.name)(**call.arguments)
            assert "error" not in json.loads(result) if result.startswith("{") else True
            getattr(wrong_env, call.name)(**call.arguments)
        assert gold_env.info["calls_made"] == len(plan) and not gold_env.done
        msg = [{"role": "assistant", "content": final}]
        wrong = [{"role": "assistant", "content": "<answer>certainly wrong zzqx</answer>"}]
        pending = [{"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
            "name": plan[0].name, "arguments": plan[0].arguments}}]}]
        rewards = environment_reward([msg, wrong, pending], [gold_env, wrong_env, open_env])
        scored.append((task.metadata["answer_kind"], rewards))
        assert rewards[0] == 1.0 and gold_env.info["verdict"] == "correct"
        assert rewards[2] == 0.0 and "without a final answer" in open_env.info["error"]
        if task.metadata["answer_kind"] != "none":
            assert rewards[1] == 0.0
    # an invalid call is the env's: counted, reported to the model, state untouched
    env = cls()
    env.reset(**data[0])
    out = json.loads(env.read_file(path="not a path"))
    assert "error" in out and env.info["invalid_calls"] == 1
    with pytest.raises(ValueError, match="task_id"):
        env.reset(prompt=data[0]["prompt"])


def test_search_environment_plays_the_oracle_through_its_search_method():
    pytest.importorskip("bm25s")
    cls = environment_factory("rlvr/MultiHopSynth-v0", **SEARCH_KW)
    assert sorted(n for n, _ in inspect.getmembers(cls, inspect.isfunction) if not n.startswith("_")) == \
        ["reset", "search"]
    data = environment_dataset("rlvr/MultiHopSynth-v0", 2, env_kwargs=SEARCH_KW)
    assert "search tool" in data[0]["prompt"][-1]["content"]
    for row in data:
        env, wrong = cls(), cls()
        env.reset(**row)
        wrong.reset(**row)
        inner = env._env.unwrapped
        *searches, answer = inner.oracle_actions(inner.source.task(inner.source.index_of(row["task_id"])))
        for s in searches:
            query = s.removeprefix("<search>").removesuffix("</search>")
            out = env.search(query=query)
            assert "<information>" in out and query.split()[0] in out
        assert env.info["searches"] == len(searches)
        rewards = environment_reward([[{"role": "assistant", "content": answer}],
                                      [{"role": "assistant", "content": "no answer tags"}]], [env, wrong])
        assert rewards == [1.0, 0.0]
        assert "did not end the episode" in wrong.info["error"]


def test_a_row_built_with_other_env_kwargs_is_refused_at_reset():
    rows = environment_dataset("rlvr/Arithmetic-v0", 1, env_kwargs={"max_operand": 999})
    with pytest.raises(ValueError, match="max_operand"):
        environment_factory("rlvr/Arithmetic-v0")().reset(**rows[0])
    environment_factory("rlvr/Arithmetic-v0", max_operand=999)().reset(**rows[0])  # the same kwargs: accepted


def test_single_turn_environment_scores_the_final_message():
    cls = environment_factory("rlvr/Arithmetic-v0")
    assert [n for n, _ in inspect.getmembers(cls, inspect.isfunction) if not n.startswith("_")] == ["reset"]
    data = environment_dataset("rlvr/Arithmetic-v0", 3)
    envs = [cls() for _ in range(6)]
    completions = []
    for i, row in enumerate(data):
        for env in envs[2 * i: 2 * i + 2]:
            env.reset(**row)
        inner = envs[2 * i]._env.unwrapped
        completions += [[{"role": "assistant", "content": inner.gold_response(inner.task)}],
                        "The answer is \\boxed{-99999}."]
    assert environment_reward(completions, envs) == [1.0, 0.0] * 3
    with pytest.raises(ValueError, match="environments"):
        environment_reward(completions)


def _tiny_tool_policy():
    """The tiny character-level policy with TRL's Qwen2.5 chat template (TRL needs one that renders tool calls)."""
    from trl.chat_template_utils import qwen2_5_chat_template

    from agents.policy.models import tiny_model, tiny_tokenizer

    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = qwen2_5_chat_template
    return tiny_model(tokenizer, seed=0, max_position_embeddings=4096), tokenizer


def _two_step_trainer(tmp_path, model, tokenizer, factory, dataset):
    """A ``GRPOTrainer`` for two steps of 4 prompts x 2 generations through ``factory``, and the list its reward
    function fills with every reward it returns."""
    seen: list[float] = []

    def reward(completions, environments=None, **kw):
        out = environment_reward(completions, environments, **kw)
        seen.extend(out)
        return out

    reward.__name__ = environment_reward.__name__
    args = trl.GRPOConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=2, max_completion_length=8,
        max_steps=2, use_cpu=True, report_to="none", logging_steps=1, save_strategy="no", learning_rate=1e-3,
        bf16=False, seed=0, dataloader_num_workers=0, max_tool_calling_iterations=1)
    return trl.GRPOTrainer(model=model, reward_funcs=reward, args=args, environment_factory=factory,
                           train_dataset=dataset, processing_class=tokenizer), seen


@pytest.mark.parametrize(("env_id", "kwargs"), [
    ("rlvr/Arithmetic-v0", {}),
    ("rlvr/ToolUse-v0", TOOLS_KW),
    ("rlvr/MultiHopSynth-v0", SEARCH_KW),
])
def test_grpo_trainer_two_steps_through_the_environment_factory(tmp_path, monkeypatch, env_id, kwargs):
    if env_id == "rlvr/MultiHopSynth-v0":
        pytest.importorskip("bm25s")
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    model, tokenizer = _tiny_tool_policy()
    factory = environment_factory(env_id, **kwargs)
    made: list = []

    class Counted(factory):  # the same class, keeping the instances TRL makes
        def __init__(self):
            super().__init__()
            made.append(self)

    trainer, seen = _two_step_trainer(tmp_path, model, tokenizer, Counted, environment_dataset(env_id, 4,
                                                                                               env_kwargs=kwargs))
    assert {t.__name__ for t in trainer.tools} == {n for n, _ in inspect.getmembers(factory, inspect.isfunction)
                                                   if not n.startswith("_") and n != "reset"}
    result = trainer.train()
    assert result.global_step == 2
    assert len(seen) == 2 * 4 and all(0.0 <= r <= 1.0 for r in seen)
    # every rollout's episode was reset to a dataset task and ended with the env's own verdict
    finished = [e for e in made if e.reward is not None]
    assert finished and all(e.done and e.info.get("task_id") for e in finished)
    assert [h for h in trainer.state.log_history if "reward" in h]


def test_trl_calls_the_search_method_of_a_model_that_calls_the_tool(tmp_path, monkeypatch):
    """A tiny model taught (80 Adam steps on two prompts) to emit one search tool call: TRL parses it, calls our
    ``search`` method, feeds the env's passages back, and the rollout's env counts the search."""
    pytest.importorskip("bm25s")
    import torch
    from transformers.utils import get_json_schema

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    kwargs = {**SEARCH_KW, "top_k": 1, "max_passage_chars": 80}
    model, tokenizer = _tiny_tool_policy()
    factory = environment_factory("rlvr/MultiHopSynth-v0", **kwargs)
    data = environment_dataset("rlvr/MultiHopSynth-v0", 2, env_kwargs=kwargs)
    call = '<tool_call>\n{"name": "search", "arguments": {"query": "Kamo"}}\n</tool_call><|im_end|>'
    target = tokenizer(call, add_special_tokens=False)["input_ids"]
    prompts = [tokenizer(tokenizer.apply_chat_template(p, tools=[get_json_schema(factory().search)],
                                                       add_generation_prompt=True, tokenize=False),
                         add_special_tokens=False)["input_ids"] for p in data["prompt"]]
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(80):
        loss = sum(model(input_ids=torch.tensor([p + target]), labels=torch.tensor([[-100] * len(p) + target])).loss
                   for p in prompts)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    made: list = []

    class Counted(factory):
        def __init__(self):
            super().__init__()
            made.append(self)

    completions_seen: list = []

    def reward(completions, environments=None, **kw):
        completions_seen.extend(completions)
        return environment_reward(completions, environments, **kw)

    reward.__name__ = environment_reward.__name__
    args = trl.GRPOConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=2, num_generations=2, max_completion_length=320,
        max_steps=1, use_cpu=True, report_to="none", logging_steps=1, save_strategy="no", learning_rate=1e-6,
        bf16=False, seed=0, dataloader_num_workers=0, max_tool_calling_iterations=1, temperature=0.05)
    trainer = trl.GRPOTrainer(model=model, reward_funcs=reward, args=args, environment_factory=Counted,
                              train_dataset=data, processing_class=tokenizer)
    assert trainer.train().global_step == 1
    assert sum(e.info.get("searches", 0) for e in made) >= 1  # TRL called SearchEnvironment.search
    tool_messages = [m for c in completions_seen for m in c if m.get("role") == "tool"]
    assert tool_messages and all(m["name"] == "search" and "<information>" in m["content"] for m in tool_messages)
    assert all(e.reward == 0.0 for e in made if e.done)  # the rollouts never answered


# -- over rlvr serve: the same classes with env_url ----------------------------------------------------------------
@pytest.fixture(scope="module")
def served_tools():
    pytest.importorskip("openenv")
    pytest.importorskip("websockets")
    from rlvr_envs.serve import create_app, running_server

    app = create_app(["rlvr/ToolUse-v0", "rlvr/Arithmetic-v0"], max_sessions=32)
    with running_server(app) as url:
        yield url, app.state.rlvr


def test_tool_use_over_the_server_scores_gold_1_and_wrong_0(served_tools):
    url, server = served_tools
    remote_cls = environment_factory("rlvr/ToolUse-v0", env_url=url, **TOOLS_KW)
    local_cls = environment_factory("rlvr/ToolUse-v0", **TOOLS_KW)
    assert {n for n, _ in inspect.getmembers(remote_cls, inspect.isfunction)} == \
        {n for n, _ in inspect.getmembers(local_cls, inspect.isfunction)}
    before = server.metrics.counters["steps_total"]
    for row in environment_dataset("rlvr/ToolUse-v0", 3, env_kwargs=TOOLS_KW):
        twin = local_cls()  # the plan comes from a local twin: a served task carries no reference
        twin.reset(**row)
        _, plan, final = _gold_plan(twin)
        gold, wrong = remote_cls(), remote_cls()
        for env in (gold, wrong):
            env.reset(**row)
        results = [getattr(gold, call.name)(**call.arguments) for call in plan]
        twin_results = [getattr(twin, call.name)(**call.arguments) for call in plan]
        assert results == twin_results  # the server ran the same sandbox
        rewards = environment_reward([[{"role": "assistant", "content": final}],
                                      [{"role": "assistant", "content": "<answer>certainly wrong zzqx</answer>"}]],
                                     [gold, wrong])
        assert rewards[0] == 1.0
        if twin._env.unwrapped.task.metadata["answer_kind"] != "none":
            assert rewards[1] == 0.0
    assert server.metrics.counters["steps_total"] - before >= 3


def test_grpo_trainer_two_steps_against_the_server(served_tools, tmp_path, monkeypatch):
    import gc

    from test_serve import wait_until

    url, server = served_tools
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    model, tokenizer = _tiny_tool_policy()
    factory = environment_factory("rlvr/ToolUse-v0", env_url=url, **TOOLS_KW)
    before = server.metrics.counters["resets_total"]
    trainer, seen = _two_step_trainer(tmp_path, model, tokenizer, factory,
                                      environment_dataset("rlvr/ToolUse-v0", 4, env_kwargs=TOOLS_KW))
    assert trainer.train().global_step == 2
    assert len(seen) == 2 * 4 and all(0.0 <= r <= 1.0 for r in seen)
    assert server.metrics.counters["resets_total"] - before >= 2 * 4  # every rollout's episode was a served session
    del trainer
    gc.collect()
    assert wait_until(lambda: server.active_sessions == 0), "environment instances left sessions open"
