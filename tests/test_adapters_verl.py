"""verl as a client: ``rlvr export --format verl`` read by verl's own ``RLHFDataset``, and ``compute_score`` loaded
by verl's own ``load_reward_manager`` (``reward.custom_reward_function``) and run by its naive reward manager on
token ids (CPU; no Ray workers, no model)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("verl", reason="verl does not import here: it needs omegaconf, whose grammar needs the ANTLR 4.9 "
                    "runtime while math-verify needs 4.13; make test runs this file in .venv-verl (Makefile)")
pytest.importorskip("pyarrow")

import numpy as np  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from rlvr_envs.cli import main  # noqa: E402
from rlvr_envs.integrations.verl import compute_score  # noqa: E402

ENV = "rlvr/Countdown-v0"


@pytest.fixture
def exported(tmp_path):
    out = tmp_path / "train.parquet"
    assert main(["export", "--format", "verl", "--env", ENV, "--n", "6", "--start", "10", "--out", str(out),
                 "--env-kwargs", json.dumps({"max_numbers": 3})]) == 0
    return out


@pytest.fixture
def tokenizer():
    from agents.policy.models import tiny_tokenizer

    return tiny_tokenizer()


def _gold_and_wrong(rows):
    import gymnasium as gym

    env = gym.make(ENV, max_numbers=3).unwrapped
    golds = [env.gold_response(env.source.task(env.source.index_of(r["extra_info"]["task_id"]))) for r in rows]
    return golds, ["<answer>1 + 1</answer>"] * len(rows)


def test_export_writes_verls_columns(exported):
    rows = pq.read_table(exported).to_pylist()
    assert len(rows) == 6
    for i, row in enumerate(rows):
        assert set(row) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
        assert row["data_source"] == ENV and row["ability"] == "math"
        assert row["prompt"][-1]["role"] == "user" and "<answer>" in row["prompt"][-1]["content"]
        assert row["reward_model"]["style"] == "rule" and row["reward_model"]["ground_truth"]
        info = row["extra_info"]
        assert info["index"] == 10 + i and info["task_id"] == f"countdown-{10 + i}" and info["env_id"] == ENV
        assert json.loads(info["env_kwargs"]) == {"max_numbers": 3} and info["split"] == "train"


def test_export_refuses_a_multi_turn_env_and_bad_arguments(tmp_path, capsys):
    out = tmp_path / "t.parquet"
    assert main(["export", "--format", "verl", "--env", "rlvr/Arithmetic-v0", "--n", "2", "--out", str(out)]) == 0
    assert "wrote 2 rlvr/Arithmetic-v0 tasks" in capsys.readouterr().out and pq.read_table(out).num_rows == 2
    out.unlink()
    assert main(["export", "--format", "verl", "--env", "rlvr/ToolUse-v0", "--n", "2", "--out", str(out)]) == 2
    assert "multi-turn" in capsys.readouterr().err and not out.exists()
    assert main(["export", "--format", "verl", "--env", ENV, "--n", "0", "--out", str(out)]) == 2
    with pytest.raises(SystemExit):
        main(["export", "--format", "verl", "--env", ENV, "--n", "2", "--out", str(out), "--env-kwargs", "[1]"])
    with pytest.raises(SystemExit):
        main(["export", "--format", "nope", "--env", ENV, "--n", "2", "--out", str(out)])


def test_verls_rlhf_dataset_reads_the_export(exported, tokenizer, tmp_path):
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    config = OmegaConf.create({"max_prompt_length": 1024, "filter_overlong_prompts": True,
                               "filter_overlong_prompts_workers": 1, "cache_dir": str(tmp_path / "cache")})
    dataset = RLHFDataset(data_files=[str(exported)], tokenizer=tokenizer, config=config)
    rows = pq.read_table(exported).to_pylist()
    assert len(dataset) == len(rows)
    for item, row in zip(dataset, rows):
        assert item["raw_prompt"] == row["prompt"]
        assert item["data_source"] == ENV and item["index"] == row["extra_info"]["index"]
        assert item["reward_model"]["ground_truth"] == row["reward_model"]["ground_truth"]
    batch = collate_fn([dataset[i] for i in range(3)])
    assert list(batch["data_source"]) == [ENV] * 3
    # verl's overlong filter drops prompts past max_prompt_length (the export's prompts are tokenized with the chat template)
    short = RLHFDataset(data_files=[str(exported)], tokenizer=tokenizer,
                        config=OmegaConf.create({**OmegaConf.to_container(config), "max_prompt_length": 20}))
    assert len(short) == 0


@pytest.mark.parametrize("path", ["pkg://rlvr_envs.integrations.verl", "file"])
def test_verl_loads_compute_score_and_its_reward_manager_scores_token_ids(exported, tokenizer, path):
    import torch
    from omegaconf import OmegaConf
    from verl import DataProto
    from verl.trainer.ppo.reward import load_reward_manager

    import rlvr_envs.integrations.verl as adapter

    if path == "file":
        path = adapter.__file__
    config = OmegaConf.create({"reward": {
        "custom_reward_function": {"path": path, "name": "compute_score", "reward_kwargs": {}},
        "reward_manager": {"name": "naive", "source": "register"}}})
    manager = load_reward_manager(config, tokenizer)
    assert type(manager).__name__ == "NaiveRewardManager"
    rows = pq.read_table(exported).to_pylist()
    golds, wrongs = _gold_and_wrong(rows)

    def score(row, response: str) -> dict:
        prompt_ids = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=True,
                                                   return_dict=False)
        response_ids = tokenizer(response + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
        pad = 8  # right padding of the response, masked out as verl's rollout does
        responses = torch.tensor([response_ids + [tokenizer.pad_token_id] * pad])
        mask = torch.tensor([[1] * (len(prompt_ids) + len(response_ids)) + [0] * pad])
        data = DataProto.from_dict(
            tensors={"prompts": torch.tensor([prompt_ids]), "responses": responses, "attention_mask": mask},
            non_tensors={"data_source": np.array([row["data_source"]], dtype=object),
                         "reward_model": np.array([row["reward_model"]], dtype=object),
                         "extra_info": np.array([dict(row["extra_info"])], dtype=object)})
        return manager.loop.run_until_complete(manager.run_single(data))

    for row, gold, wrong in zip(rows, golds, wrongs):
        right = score(row, gold)
        assert right["reward_score"] == 1.0 and right["reward_extra_info"]["acc"] == 1.0
        bad = score(row, wrong)
        assert bad["reward_score"] == 0.0 and bad["reward_extra_info"]["acc"] == 0.0


def test_compute_score_checks_the_task_and_scores_without_one():
    extra = {"task_id": "arith-3", "env_id": "rlvr/Arithmetic-v0", "env_kwargs": "{}"}
    import gymnasium as gym

    env = gym.make("rlvr/Arithmetic-v0").unwrapped
    task = env.source.task(3)
    assert compute_score("rlvr/Arithmetic-v0", env.gold_response(task), task.answer, extra)["score"] == 1.0
    with pytest.raises(ValueError, match="re-export"):
        compute_score("rlvr/Arithmetic-v0", env.gold_response(task), "123456", extra)
    # a dataset written elsewhere (no task_id): the answer-only verifier against ground_truth
    assert compute_score("rlvr/Arithmetic-v0", "so \\boxed{17}", "17") == \
        {"score": 1.0, "acc": 1.0, "unverifiable": 0.0, "format_ok": 1.0}
    assert compute_score("rlvr/Arithmetic-v0", "so \\boxed{18}", "17")["score"] == 0.0
    with pytest.raises(NotImplementedError, match="multi-turn"):
        compute_score("rlvr/ToolUse-v0", "<answer>1</answer>", "1", {"task_id": "tooluse-0"})
