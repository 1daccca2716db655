"""Every allocation, selection, replay, data-policy and hint component inside the real trainer loop: a run killed
after a checkpoint and resumed in a new trainer writes exactly the records of an uninterrupted run (so every
component's state, RNG included, is restored), and the components' metrics reach the step records."""

from __future__ import annotations

import pytest
from grpo_toys import make_env
from test_grpo_trainer import strip, trainer

MODES_TOY = {"nothink": {"marker": "a", "cap": 3}, "short": {"marker": "b", "cap": 4}, "long": {"marker": "c", "cap": 6}}
CASES = {
    "saturation_skip": ({"prompt_selector": "saturation_skip", "group_transform": "dapo", "loss": "dapo"},
                        {"prompt_selector": {"threshold": 0.5, "candidates": 2}}, {"refill_rounds": 1}),
    "signal_budget": ({"rollout_allocator": "signal_budget"}, {"rollout_allocator": {"budget_per_prompt": 4}}, {}),
    "budget_schedule": ({"rollout_allocator": "budget_schedule"}, {"rollout_allocator": {"start": 2, "end": 6}}, {}),
    "duet": ({"prompt_selector": "duet", "rollout_allocator": "duet", "generation_controller": "duet_abort",
              "group_transform": "duet_reweight"}, {"rollout_allocator": {"n_ref": 4},
                                                    "generation_controller": {"markers": ["t1", "t2"]}},
             {"max_new_tokens": 4}),
    "sagc": ({"rollout_allocator": "sagc"}, {"rollout_allocator": {"g_min": 2, "g_max": 8}}, {}),
    "headroom_drift": ({"replay_buffer": "headroom_drift"}, {"replay_buffer": {"replay": 2, "max_drift": 5.0}}, {}),
    "replay_uniform": ({"replay_buffer": "replay_uniform"}, {"replay_buffer": {"replay": 2}}, {}),
    "data_policy": ({"group_transform": "data_policy"},
                    {"group_transform": {"rules": ["truncated=0.5", "dedupe", "cap_group=3"]}}, {}),
    "hint_scaffold": ({"generation_controller": "hint_scaffold"}, {}, {}),
    "acoer": ({"reward_shaper": "acoer"},
              {"reward_shaper": {"window": 2, "ema": 0.5, "growth": 1.5, "b_min": 1}}, {"max_new_tokens": 4}),
    "qlpo": ({"group_transform": "qlpo"},
             {"rollout_allocator": {"n": 6}, "group_transform": {"group_size": 4, "beta": 0.5}}, {}),
    "dash": ({"advantage": "dash"}, {"advantage": {"eta": 0.3}}, {}),
    "graphpo": ({"advantage": "graphpo"}, {"advantage": {"alpha": 1.0, "lam_eff": 0.1}}, {}),
    "dre": ({"group_transform": "dre"}, {"group_transform": {"max_edits": 2}}, {}),
    "rredcot": ({"advantage": "rredcot"}, {"advantage": {"template": "{answer}", "split": "tokens=1"}}, {}),
    "mc_step": ({"advantage": "mc_step"}, {"advantage": {"split": "tokens=1", "verifier": "match",
                                                         "answer_pattern": r"^\s*(\S+)", "rollouts_per_boundary": 2}},
                {}),
    "garl": ({"loss": "garl"}, {"loss": {"q": 0.75}}, {}),
    "paft": ({"loss": "paft"}, {"loss": {"q": 0.75}}, {}),
    "opsd": ({"loss": "opsd"}, {"loss": {"beta": 0.5}}, {}),
    "dash_opsd": ({"loss": "dash_opsd"}, {"loss": {"gamma": 0.9, "rl_coef": 0.5}}, {}),
    "distil": ({"loss": "distil"}, {}, {}),
    "rlcsd": ({"advantage": "rlcsd"}, {"advantage": {"lam": 0.5}}, {}),
    "pivot_trace": ({"reward_shaper": "pivot_trace"}, {"reward_shaper": {"pseudo_frac": 0.34, "skip_frac": 0.34}}, {}),
    "modes": ({"generation_controller": "mode_caps", "reward_shaper": "mode_reward"},
              {"generation_controller": {"modes": MODES_TOY}, "reward_shaper": {"modes": MODES_TOY}},
              {"max_new_tokens": 6}),
}
METRIC = {"saturation_skip": "prompt_selector.skipped", "signal_budget": "rollout_allocator.group_max",
          "budget_schedule": "rollout_allocator.group_size", "duet": "generation_controller.abort_rate",
          "sagc": "rollout_allocator.lambda", "headroom_drift": "replay_buffer.drift_mean",
          "replay_uniform": "replay_buffer.replayed_groups", "data_policy": "group_transform.truncated_rows",
          "hint_scaffold": "generation_controller.hinted_groups", "acoer": "reward_shaper.alpha",
          "qlpo": "group_transform.kept_len_mean", "dash": "advantage.commit_rows",
          "graphpo": "advantage.step_rows", "dre": "group_transform.edits", "rredcot": "advantage.scoring_sequences",
          "mc_step": "advantage.continuations", "garl": "loss.raw_scale_mean", "paft": "loss.p_hat_mean",
          "opsd": "loss.divergence", "dash_opsd": "loss.teacher_lp_gap",
          "distil": "loss.divergence", "rlcsd": "advantage.signal_abs",
          "pivot_trace": "reward_shaper.labels_used",
          "modes": "generation_controller.share_nothink"}


@pytest.mark.parametrize("name", list(CASES))
def test_component_resumes_exactly_in_the_trainer(name, tmp_path):
    stages, params, extra = CASES[name]
    settings = dict(steps=5, checkpoint_every=2, eval_every=0, eval_size=2, train_pool=6, prompts_per_step=3,
                    stages=stages, params={"rollout_allocator": {"n": 4}, **params}, **extra)
    if "rollout_allocator" in stages:  # its own hyper-parameters only
        settings["params"] = {**params}
    full = trainer(tmp_path / "full", env=make_env(8), **settings).run(resume=False)
    cut = trainer(tmp_path / "cut", env=make_env(8), **settings)
    cut.run(resume=False, stop_after=3)  # dies after step 3; its last checkpoint is step 2
    resumed = trainer(tmp_path / "cut", env=make_env(8), **settings).run(resume=True)
    assert strip(resumed) == strip(full)
    train = [r for r in full if r["kind"] == "train"]
    assert len(train) == 5 and all(METRIC[name] in r for r in train)
