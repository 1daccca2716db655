"""benchmarks/agentic_training.py: its arms build valid runs on the right rewards, and its report pairs the arms."""

import importlib.util
import json
from pathlib import Path

import gymnasium as gym
import pytest

import rlvr_envs  # noqa: F401
from rlvr_envs.tools.env import OracleAgent

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("agentic_training", ROOT / "benchmarks" / "agentic_training.py")
agentic = importlib.util.module_from_spec(spec)
spec.loader.exec_module(agentic)


def _oracle_reward(env_id: str, kwargs: dict, index: int) -> float:
    env = gym.make(env_id, **kwargs).unwrapped
    oracle = OracleAgent(env)
    obs, info = env.reset(options={"index": index})
    while True:
        obs, reward, terminated, truncated, info = env.step(oracle.act([obs], [info])[0])
        if terminated or truncated:
            return reward


@pytest.mark.parametrize("env,reward,oracle", [("tooluse", "precision", 1.0), ("tooluse", "recall", 1.5),
                                               ("multihop", "em", None)])
def test_each_arm_is_a_valid_run_on_its_reward(tmp_path, env, reward, oracle):
    cfg = agentic._cfg(env, "tiny", reward, 3, 5, tmp_path / "run")
    assert cfg.env == agentic.ENVS[env]["id"] and cfg.seed == 3 and cfg.steps == 5
    assert cfg.stages["rollout_allocator"] == "fixed" and cfg.params["rollout_allocator"]["n"] == 4
    assert cfg.eval_env_kwargs == {"seed": 1}  # held-out: another generator seed, the arm's reward kept
    if oracle is not None:
        assert _oracle_reward(cfg.env, cfg.env_kwargs, 0) == pytest.approx(oracle)
        assert _oracle_reward(cfg.env, {**cfg.env_kwargs, **cfg.eval_env_kwargs}, 0) == pytest.approx(oracle)
    with pytest.raises(SystemExit, match="no SFT model"):
        agentic.stage_rl(env, tmp_path, reward, 0, 1)


def test_report_pairs_the_two_tooluse_arms(tmp_path):
    def write(arm, bits, calls):
        run = tmp_path / f"rl-{arm}-s0"
        run.mkdir()
        records = [{"kind": "eval", "step": 0, "eval_accuracy": 0.5, "eval_correct": "0101",
                    "eval_calls_per_episode": 2.0},
                   {"kind": "train", "step": 1, "reward_mean": 0.3, "calls_per_episode": calls},
                   {"kind": "eval", "step": 1, "eval_accuracy": bits.count("1") / 4, "eval_correct": bits,
                    "eval_calls_per_episode": calls, "eval_precision_solved": 0.9}]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))

    write("precision", "1111", 2.0)
    write("recall", "0110", 3.5)
    report = agentic.stage_report("tooluse", tmp_path, 0, tmp_path / "out.json")
    diff = report["precision_minus_recall"]
    assert diff["success"] == pytest.approx(0.5) and diff["calls_per_episode"] == pytest.approx(-1.5)
    lo, hi = diff["interval95"]
    assert lo <= 0.5 <= hi
    assert report["after_sft"]["eval_accuracy"] == 0.5 and report["rl_recall"]["steps_done"] == 1
    assert json.loads((tmp_path / "out.json").read_text())["env"] == "rlvr/ToolUse-v0"
    assert (tmp_path / "out.png").stat().st_size > 1000
