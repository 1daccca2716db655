"""TRL's GRPOTrainer runs with ``reward_fn`` on a tiny model for two steps (CPU, offline)."""

from __future__ import annotations

import pytest

from rlvr_envs.integrations.trl import completion_text, dataset, reward_fn

ENV = "rlvr/Arithmetic-v0"


def test_reward_fn_scores_with_the_env_verifier():
    data = dataset(ENV, 3, conversational=False)
    import gymnasium as gym

    env = gym.make(ENV).unwrapped
    gold = [env.gold_response(env.source.task(env.source.index_of(t))) for t in data["task_id"]]
    f = reward_fn(ENV)
    assert f(prompts=data["prompt"], completions=gold, task_id=data["task_id"]) == [1.0, 1.0, 1.0]
    wrong = ["\\boxed{-99999}"] * 3
    assert f(prompts=data["prompt"], completions=wrong, task_id=data["task_id"]) == [0.0, 0.0, 0.0]
    conv = [[{"role": "assistant", "content": g}] for g in gold]
    assert f(prompts=data["prompt"], completions=conv, task_id=data["task_id"]) == [1.0, 1.0, 1.0]
    with pytest.raises(KeyError, match="task_id"):
        f(prompts=data["prompt"], completions=gold)
    with pytest.raises(TypeError):
        completion_text(3)


def test_reward_fn_refuses_a_response_that_leaves_a_multi_turn_episode_open():
    env_id, kwargs = "rlvr/MultiHopSynth-v0", {"corpus_size": 40, "num_tasks": 4}
    data = dataset(env_id, 2, conversational=False, env_kwargs=kwargs)
    f = reward_fn(env_id, env_kwargs=kwargs)
    with pytest.raises(NotImplementedError, match=r"rlvr/MultiHopSynth-v0.*multi-turn training is not supported by one-response"):
        f(prompts=data["prompt"], completions=["<search>capital</search>"] * 2, task_id=data["task_id"])


def test_trl_grpo_trainer_two_steps(tmp_path):
    trl = pytest.importorskip("trl")
    from agents.policy.models import load_policy

    policy = load_policy("tiny", seed=0)
    args = trl.GRPOConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4, max_completion_length=8,
        max_steps=2, use_cpu=True, report_to="none", logging_steps=1, save_strategy="no", learning_rate=1e-3,
        bf16=False, seed=0, dataloader_num_workers=0)
    f = reward_fn(ENV)
    seen: list[float] = []

    def counted(prompts, completions, **kw):
        out = f(prompts, completions, **kw)
        seen.extend(out)
        return out

    counted.__name__ = f.__name__
    trainer = trl.GRPOTrainer(model=policy.model, reward_funcs=counted, args=args,
                              train_dataset=dataset(ENV, 16), processing_class=policy.tokenizer)
    result = trainer.train()
    assert result.global_step == 2
    assert len(seen) >= 8 and all(r in (0.0, 1.0) for r in seen)  # our verifier scored TRL's completions
    logged = [h for h in trainer.state.log_history if "reward" in h]
    assert logged, trainer.state.log_history


def test_grpo_vs_trl_benchmark_times_both_sides_on_the_same_workload(tmp_path):
    pytest.importorskip("trl")
    import json
    import statistics

    from benchmarks.grpo_vs_trl import main

    out = tmp_path / "gvt.json"
    result = main(["--model", "tiny", "--steps", "2", "--rounds", "2", "--n", "4", "--max-new-tokens", "6",
                   "--threads", "1", "--out", str(out)])
    assert json.loads(out.read_text())["speedup"] == pytest.approx(result["speedup"])
    for side in ("ours", "trl"):
        blocks = result[side]["blocks"]
        assert len(blocks) == 2  # alternating blocks: ours, TRL, ours, TRL
        for block in blocks:
            assert len(block["step_s"]) == len(block["response_tokens"]) == 2
            assert all(s > 0 for s in block["step_s"])
        # the median leaves out each block's first (warm-up) step
        assert result[side]["median_step_s"] == pytest.approx(statistics.median(b["step_s"][1] for b in blocks))
        assert 0 < result[side]["mean_response_tokens"] <= 4 * 4 * 6  # 4 prompts x 4 rollouts x at most 6 tokens
    for block in result["ours"]["blocks"]:
        assert block["rollouts"] == [4 * 4, 4 * 4]  # --n reached our allocator through the recipe override
        assert all(0 < g < s for g, s in zip(block["generation_s"], block["step_s"]))
    assert result["speedup"] == pytest.approx(result["trl"]["median_step_s"] / result["ours"]["median_step_s"])
    with pytest.raises(SystemExit):
        main(["--model", "tiny", "--steps", "1"])
    with pytest.raises(SystemExit):
        main(["--model", "tiny", "--rounds", "0"])
    with pytest.raises(SystemExit):
        main(["--model", "tiny", "--n", "1"])


def test_reward_fn_with_other_env_kwargs_than_the_dataset_raises_showing_both():
    import gymnasium as gym

    kwargs = {"max_operand": 999, "num_operations": 2}
    data = dataset(ENV, 4, conversational=False, env_kwargs=kwargs)
    assert len(set(data["env_fingerprint"])) == 1 and data["env_fingerprint"][0] != dataset(ENV, 1)["env_fingerprint"][0]
    env = gym.make(ENV, **kwargs).unwrapped
    gold = [env.gold_response(env.source.task(env.source.index_of(t))) for t in data["task_id"]]
    columns = {"task_id": data["task_id"], "env_kwargs": data["env_kwargs"], "env_fingerprint": data["env_fingerprint"]}
    # the same kwargs: every gold answer scores 1 (the check passes rows that match)
    assert reward_fn(ENV, env_kwargs=kwargs)(prompts=data["prompt"], completions=gold, **columns) == [1.0] * 4
    # without them the ids name other tasks: an error naming both kwargs, not gold answers scored 0
    with pytest.raises(ValueError) as raised:
        reward_fn(ENV)(prompts=data["prompt"], completions=gold, **columns)
    message = str(raised.value)
    assert '"max_operand": 999' in message and '"num_operations": 2' in message and "env_kwargs={}" in message
    # a default written out is the same env as the default left out
    explicit_default = reward_fn(ENV, env_kwargs={"max_operand": 50})
    plain = dataset(ENV, 2, conversational=False)
    plain_gold = [gym.make(ENV).unwrapped.gold_response(gym.make(ENV).unwrapped.source.task(i)) for i in range(2)]
    assert explicit_default(prompts=plain["prompt"], completions=plain_gold, task_id=plain["task_id"],
                            env_fingerprint=plain["env_fingerprint"]) == [1.0, 1.0]
