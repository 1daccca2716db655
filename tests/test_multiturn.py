"""Multi-turn training: token-exact episodes (agents/policy/episodes.py), env tokens out of the loss, one rollout loop
for the harness and the trainer (agents/grpo/multiturn.py), collapse guards."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from agents.grpo.batch import GroupBatch
from agents.grpo.config import load_recipe
from agents.grpo.logprobs import response_logprobs
from agents.grpo.multiturn import ToolUseMonitor, episode_samples, episode_stats, model_turn_lengths, play
from agents.grpo.registry import build
from agents.grpo.trainer import Trainer
from agents.policy import PolicyAgent, SamplingParams, load_policy, make_engine
from agents.policy.episodes import TokenEpisode
from rlvr_envs.core import ListSource, Task
from rlvr_envs.harness.evaluate import EnvPool, evaluate
from rlvr_envs.spaces import TextSpace

CHAT_ID = "rlvrtest/ToyChat-v0"


class ChatToyEnv(gym.Env):
    """Three turns per episode whatever the model says: each turn is answered by a ``tool`` message (the chat grows
    in ``info["messages"]``); the last turn is scored by the parity of its length (a reward that varies)."""

    metadata = {"render_modes": []}

    def __init__(self, n_tasks: int = 6, turns: int = 3):
        self.n_tasks, self.turns = n_tasks, turns
        self.observation_space, self.action_space = TextSpace(10_000), TextSpace(10_000)
        self.source = ListSource([Task(id=str(i), question=f"what is {i} squared?", answer=str(i * i))
                                  for i in range(n_tasks)], "toy-chat")

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._index = int((options or {}).get("index", 0))
        self._turn = 0
        self.task = self.source.task(self._index)
        self._messages = [{"role": "system", "content": "Use the tool."},
                          {"role": "user", "content": f"Question {self._index}: what is {self._index} squared?"}]
        return self._messages[-1]["content"], {"messages": [dict(m) for m in self._messages], "task_id": str(self._index),
                                               "index": self._index, "calls_made": 0}

    def step(self, action):
        self._turn += 1
        self._messages.append({"role": "assistant", "content": action})
        info = {"task_id": str(self._index), "calls_made": self._turn - 1, "invalid_calls": 0}
        if self._turn >= self.turns:
            correct = len(action) % 2 == 0
            return "", float(correct), True, False, {**info, "messages": [dict(m) for m in self._messages],
                                                     "correct": correct, "parsed_answer": str(len(action))}
        obs = f"result {self._turn}: {len(action)} chars <ok>"
        self._messages.append({"role": "tool", "content": obs})
        return obs, 0.0, False, False, {**info, "messages": [dict(m) for m in self._messages], "calls_made": self._turn}


if CHAT_ID not in gym.registry:
    gym.register(CHAT_ID, entry_point=ChatToyEnv)


@pytest.fixture(scope="module")
def policy():
    return load_policy("tiny")


def _agent(policy, max_new_tokens: int = 12, **kwargs) -> PolicyAgent:
    # fp32 decoding ("auto" decodes in bf16 where the CPU multiplies bf16): the sampled log-probs match to 1e-4
    return PolicyAgent(policy, make_engine(policy, precision="fp32"), SamplingParams(max_new_tokens=max_new_tokens,
                                                                                     seed=0), **kwargs)


def _play(policy, agent=None, n_tasks: int = 3, n: int = 2, seed: int = 5):
    agent = agent or _agent(policy)
    env = gym.make(CHAT_ID)
    items = [(i, j, i) for i in range(n_tasks) for j in range(n)]
    episodes = play(agent, EnvPool(env, lambda: gym.make(CHAT_ID)), items, run_seed=seed)
    return agent, items, episodes


# -- the token stream -------------------------------------------------------------------------------------------------
def test_env_delta_does_not_repeat_the_end_token_the_model_wrote(policy):
    tok, chat = policy.tokenizer, policy.prompt_text
    msgs = [{"role": "user", "content": "hi"}]
    ep = TokenEpisode(prompt_ids=tok(chat(msgs), add_special_tokens=False).input_ids, text=chat(msgs))
    ids = tok("call<|im_end|>", add_special_tokens=False).input_ids
    ep.add_model_turn(ids, [-1.0] * len(ids), None, "call", "stop", end_text="<|im_end|>")
    new = msgs + [{"role": "assistant", "content": "call"}, {"role": "tool", "content": "42"}]
    delta = ep.add_env_turn(chat(new), lambda t: tok(t, add_special_tokens=False).input_ids)
    assert delta == "\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n"
    # the stream decodes to exactly the chat the template renders: no drift, no duplicated end token
    assert tok.decode(ep.stream, skip_special_tokens=False) == chat(new)
    assert ep.mask == [True] * len(ids) + [False] * (len(ep.ids) - len(ids))
    assert ep.logprobs[len(ids):] == [0.0] * (len(ep.ids) - len(ids))


def test_a_length_capped_turn_gets_its_end_token_from_the_env(policy):
    tok, chat = policy.tokenizer, policy.prompt_text
    msgs = [{"role": "user", "content": "hi"}]
    ep = TokenEpisode(prompt_ids=tok(chat(msgs), add_special_tokens=False).input_ids, text=chat(msgs))
    ids = tok("cal", add_special_tokens=False).input_ids
    ep.add_model_turn(ids, [-1.0] * len(ids), None, "cal", "length")
    new = msgs + [{"role": "assistant", "content": "cal"}, {"role": "tool", "content": "x"}]
    delta = ep.add_env_turn(chat(new), lambda t: tok(t, add_special_tokens=False).input_ids)
    assert delta.startswith("<|im_end|>\n<|im_start|>tool")
    assert tok.decode(ep.stream, skip_special_tokens=False) == chat(new)


def test_an_env_that_rewrites_earlier_turns_is_refused(policy):
    tok, chat = policy.tokenizer, policy.prompt_text
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}]
    ep = TokenEpisode(prompt_ids=tok(chat(msgs), add_special_tokens=False).input_ids, text=chat(msgs))
    ep.add_model_turn([5], [-1.0], None, "c", "length")
    rewritten = [{"role": "user", "content": "HI"}] + msgs[1:] + [{"role": "assistant", "content": "c"}]
    with pytest.raises(ValueError, match="only appends"):
        ep.add_env_turn(chat(rewritten), lambda t: tok(t, add_special_tokens=False).input_ids)


def test_model_turn_lengths_splits_the_stream_at_env_tokens():
    from agents.grpo.batch import Sample

    s = Sample("g", "p", [1, 2, 3], [7, 7, 0, 0, 0, 7], "", 0.0, token_mask=[True, True, False, False, False, True])
    assert model_turn_lengths([s]) == ([3, 8], [2, 1])


# -- episodes: token-exact, masked ------------------------------------------------------------------------------------
def test_training_logprobs_of_model_tokens_equal_the_sampled_ones(policy):
    agent, items, episodes = _play(policy)
    assert all(len(ep.turns) == 3 for ep in episodes)
    for key in [(u, s) for u, s, _ in items]:
        ep = agent.episodes[key]
        assert ep.turns == 3 and sum(ep.mask) > 0 and not all(ep.mask)
        lp, _ = response_logprobs(policy.model, [ep.prompt_ids], [ep.ids])
        mask = torch.tensor(ep.mask)
        sampled = torch.tensor(ep.logprobs)
        torch.testing.assert_close(lp[0, : len(ep.ids)][mask], sampled[mask], atol=1e-4, rtol=0)
        assert torch.all(sampled[~mask] == 0)


def test_env_tokens_never_enter_the_loss(policy):
    agent, items, episodes = _play(policy)
    samples = episode_samples(agent, items, episodes, lambda u: (f"g{u}", {"prompt": "", "task_id": str(u), "index": u,
                                                                           "metadata": {}, "messages": []}))
    batch = GroupBatch.from_samples(samples)
    batch.advantages = build("advantage", "grpo")(batch)
    batch.old_logprobs = batch.behaviour_logprobs.clone()  # a PPO ratio against the sampler (what epochs > 1 use)
    assert batch.advantages.abs().sum() > 0  # the parity reward varies inside groups
    env_pos = ~batch.response_mask & (torch.arange(batch.response_mask.shape[1]) < torch.tensor(
        [len(r) for r in batch.response_ids])[:, None])
    assert env_pos.any()
    loss_fn = build("loss", "grpo")

    def loss_and_grad(logprobs: torch.Tensor) -> tuple[float, torch.Tensor]:
        x = logprobs.clone().requires_grad_(True)
        loss, _ = loss_fn(batch, x)
        loss.backward()
        return float(loss.detach()), x.grad

    base = batch.behaviour_logprobs.clone()
    l0, g0 = loss_and_grad(base)
    perturbed = base + env_pos.float() * torch.randn_like(base) * 3.0  # every env token's log-prob changes
    l1, g1 = loss_and_grad(perturbed)
    assert l1 == pytest.approx(l0, abs=1e-7) and torch.equal(g0, g1)
    assert torch.all(g0[env_pos] == 0)
    one = base.clone()
    row, col = torch.nonzero(batch.response_mask & (batch.advantages.view(-1, 1) != 0))[0].tolist()
    one[row, col] += 0.5  # one model token
    l2, g2 = loss_and_grad(one)
    assert l2 != pytest.approx(l0, abs=1e-7) and not torch.equal(g2, g0)


def test_an_episode_past_its_token_limit_gets_an_empty_turn(policy):
    agent = _agent(policy, max_new_tokens=8, max_episode_tokens=80)
    agent, items, episodes = _play(policy, agent=agent, n_tasks=1, n=1)
    ep = agent.episodes[(0, 0)]
    assert ep.overflow and ep.finish_reasons[-1] == "length" and len(ep.stream) + 8 > 80


# -- one rollout loop -------------------------------------------------------------------------------------------------
def test_harness_and_trainer_loop_play_identical_episodes(policy, tmp_path):
    agent, items, episodes = _play(policy, n_tasks=3, n=2, seed=11)
    res = evaluate(_agent(policy), CHAT_ID, n_samples=2, limit=3, seed=11, out=tmp_path / "r.json", progress=False)
    by_key = {(r["task_index"], r["sample_index"]): r for r in res.records}
    for (u, s, _), ep in zip(items, episodes):
        assert by_key[(u, s)]["turns"] == ep.turns


def test_trainer_step_on_a_multiturn_env(tmp_path):
    cfg = load_recipe("grpo", ["model=tiny", f"env={CHAT_ID!r}".replace("'", '"'), "steps=2", "prompts_per_step=2",
                               "max_new_tokens=8", "eval_size=2", "eval_every=0", "progress=false", "plot=false",
                               "train_layers=-1", "lr=1e-3", f'out_dir="{tmp_path}"', "tool_use_warn_below=0"])
    cfg.eval_env_kwargs = {}
    tr = Trainer(cfg)
    records = tr.run(resume=False)
    train = [r for r in records if r["kind"] == "train"]
    assert len(train) == 2
    for r in train:
        assert r["turns_per_episode"] == 3 and r["calls_per_episode"] == 2 and r["tool_use_rate"] == 1.0
        assert 0 < r["env_token_frac"] < 1
        assert np.isfinite(r["loss"])
    evals = [r for r in records if r["kind"] == "eval"]
    assert len(evals) == 2 and evals[-1]["eval_turns_per_episode"] == 3


def test_trainer_on_tooluse_env(tmp_path):
    cfg = load_recipe("grpo", ["model=tiny", 'env="rlvr/ToolUse-v0"', "steps=1", "prompts_per_step=2",
                               "max_new_tokens=6", "eval_size=1", "progress=false", "plot=false",
                               f'out_dir="{tmp_path}"', "env_kwargs.tools_in_prompt=false"])
    # ToolUse's held-out tasks: another generator seed; the schemas stay out of the prompt (a character-level
    # tokenizer would make them 5k tokens)
    cfg.eval_env_kwargs = {"seed": 1}
    with pytest.warns(RuntimeWarning, match="tool-use rate"):  # a random tiny model never calls a tool
        records = Trainer(cfg).run(resume=False)
    train = [r for r in records if r["kind"] == "train"][0]
    assert train["tool_use_rate"] == 0.0 and train["tool_use_warning"] == 1


# -- collapse guards --------------------------------------------------------------------------------------------------
def test_tool_use_monitor_warns_once_per_fall():
    m = ToolUseMonitor(0.2)
    with pytest.warns(RuntimeWarning):
        assert m.update(1, 0.1)
    assert not m.update(2, 0.05)  # still below: no repeat
    assert not m.update(3, 0.5)
    with pytest.warns(RuntimeWarning):
        assert m.update(4, 0.0)
    assert not ToolUseMonitor(0.0).update(1, 0.0)
    with pytest.raises(ValueError):
        ToolUseMonitor(1.5)


def test_episode_stats():
    from agents.grpo.batch import Sample

    def s(calls, invalid, turns, mask):
        return Sample("g", "", [1], [0] * len(mask), "", 0.0, token_mask=mask,
                      info={"calls": calls, "invalid_calls": invalid, "turns": ["x"] * turns})

    stats = episode_stats([s(0, 0, 1, [True, True]), s(4, 1, 3, [True, False, False, True])])
    assert stats["calls_per_episode"] == 2.0 and stats["tool_use_rate"] == 0.5
    assert stats["invalid_call_rate"] == 0.25 and stats["turns_per_episode"] == 2.0
    assert stats["env_token_frac"] == pytest.approx(0.25)
    assert "plan_recall" not in stats and "precision_solved" not in stats  # no env with a gold plan


def test_episode_stats_plan_precision_and_recall():
    from agents.grpo.batch import Sample

    def s(calls, plan, hits, correct):
        return Sample("g", "", [1], [0], "", float(correct), correct=correct, token_mask=[True],
                      info={"calls": calls, "plan_length": plan, "plan_calls_hit": hits, "turns": ["x"]})

    # solved minimally (precision 1), solved verbosely (2 of 6 calls needed: 1/3), failed after 1 of 4 plan calls
    stats = episode_stats([s(2, 2, 2, True), s(6, 2, 2, True), s(5, 4, 1, False)])
    assert stats["precision_solved"] == pytest.approx((1 + 1 / 3) / 2)
    assert stats["plan_recall"] == pytest.approx((1 + 1 + 0.25) / 3)
    assert "precision_solved" not in episode_stats([s(5, 4, 1, False)])  # nothing solved: no precision to report


def test_a_template_that_rewrites_history_plays_on_for_eval_but_is_refused_for_training(policy):
    from types import SimpleNamespace

    forgetful = SimpleNamespace(model=policy.model, tokenizer=policy.tokenizer, name="forgetful",
                                prompt_text=lambda messages: policy.prompt_text(messages[-1:]))
    agent = PolicyAgent(forgetful, make_engine(policy, precision="fp32"), SamplingParams(max_new_tokens=6, seed=0))
    with pytest.warns(RuntimeWarning, match="only appends"):
        agent, items, episodes = _play(policy, agent=agent, n_tasks=1, n=2)
    assert all(len(ep.turns) == 3 for ep in episodes)  # evaluation goes on
    assert all(agent.episodes[(u, s)].drifted and agent.episodes[(u, s)].turns == 3 for u, s, _ in items)
    with pytest.raises(RuntimeError, match="not token-exact"):
        episode_samples(agent, items, episodes, lambda u: ("g", {"prompt": "", "task_id": "0", "index": 0,
                                                                 "metadata": {}, "messages": []}))


# -- SFT warm start on oracle trajectories ------------------------------------------------------------------------------
def test_sft_on_tooluse_oracle_trajectories_masks_env_tokens_and_lowers_the_loss(tmp_path):
    from agents.grpo.sft import demonstrations, masked_nll, sft

    policy = load_policy("tiny", seed=3)
    env = gym.make("rlvr/ToolUse-v0", tools_in_prompt=False)
    episodes, stats = demonstrations(policy, env, 6)
    assert stats["episodes"] == 6 and stats["env_tokens"] > 0 and stats["turns_mean"] >= 2
    tok = policy.tokenizer
    for ep in episodes:
        # the stream is the chat as the template renders it: the oracle's turns as model tokens, the env's as ids
        text = tok.decode(ep.stream, skip_special_tokens=False)
        assert text.count("<|im_start|>tool") == ep.turns - 1 and text.endswith("<|im_end|>")
        model_text = tok.decode([t for t, m in zip(ep.ids, ep.mask) if m], skip_special_tokens=False)
        assert "<tool_call>" in model_text and "<|im_start|>" not in model_text  # no env token marked as the model's
    with torch.no_grad():
        before = float(masked_nll(policy.model, episodes))
    losses = sft(policy, episodes, epochs=3, lr=3e-3, batch_size=3)
    with torch.no_grad():
        after = float(masked_nll(policy.model, episodes))
    assert len(losses) == 6 and after < before - 0.5
    with pytest.raises(ValueError, match="no demonstrations"):
        sft(policy, [])


def test_sft_cli_writes_a_loadable_model(tmp_path):
    from agents.grpo.sft import main

    out = tmp_path / "sft"
    assert main(["--env", "rlvr/ToolUse-v0", "--env-kwargs", '{"tools_in_prompt": false}', "--model", "tiny",
                 "--tasks", "3", "--epochs", "1", "--lr", "1e-3", "--out", str(out)]) == 0
    report = __import__("json").loads((out / "sft.json").read_text())
    assert report["stats"]["episodes"] == 3 and len(report["losses"]) == 1
    reloaded = load_policy(str(out))
    assert reloaded.n_params == load_policy("tiny").n_params
    with pytest.raises(SystemExit, match="not empty"):
        main(["--env", "rlvr/ToolUse-v0", "--model", "tiny", "--tasks", "1", "--out", str(out)])


def test_multiturn_cost_benchmark_reports_a_worker_that_died_instead_of_waiting():
    import importlib
    import sys
    from pathlib import Path

    # imported by name (not from a file spec): the spawned worker re-imports the module to find its target
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    try:
        mod = importlib.import_module("multiturn_cost")
        with pytest.raises(RuntimeError, match="single-turn worker exited with code 1"):
            mod.measure("single", "/nonexistent/model-dir", 1)  # load_policy fails in the worker
    finally:
        sys.path.pop(0)
