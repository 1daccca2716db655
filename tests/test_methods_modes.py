"""NoThink/Short/Long modes in GRPO (agents/methods/modes.py): the mode_caps controller's phased generation and cut,
the mode_reward shaper, the mode table's one source, metrics, and both inside the real toy trainer."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from grpo_toys import ToyEngine, make_env, make_tokenizer
from test_grpo_trainer import strip, trainer

from agents.grpo.batch import GroupBatch, Sample
from agents.grpo.config import from_dict
from agents.grpo.registry import build
from agents.methods.modes import ModeCaps, run_table
from agents.policy.engine import SamplingParams
from rlvr_envs.modes import ModesWrapper, ModeTable

# Toy words as markers; caps in tokens of the toy (word-level) tokenizer, EOS included (as max_new_tokens counts it).
TOY = {"nothink": {"marker": "a", "cap": 3}, "short": {"marker": "b", "cap": 4}, "long": {"marker": "c", "cap": 6}}


def _lp(position: int, token: int) -> float:
    """The scripted engine's log-prob of ``token`` at response position ``position``: encodes both."""
    return -(position + 1) / 100 - token / 1000


class ScriptedEngine:
    """Emits a fixed word script per (prompt, sample); continues token-id prefixes of its own rollouts. Log-probs and
    entropies encode (position, token), so any misalignment after joining or cutting shows."""

    def __init__(self, scripts: dict[str, list[list[str]]]):
        self.tokenizer = make_tokenizer()
        self.eos = self.tokenizer.eos_token_id
        self.scripts = {p: [self.tokenizer.convert_tokens_to_ids(s) for s in samples] for p, samples in scripts.items()}
        self.calls: list[tuple[int, int]] = []  # (rollouts, max_new_tokens) per call

    def _emit(self, prompt_ids, script, start, sampling, seed=None):
        ids = script[start:start + sampling.max_new_tokens]
        if self.eos in ids:
            ids = ids[: ids.index(self.eos) + 1]
        finish = "stop" if ids and ids[-1] == self.eos else "length"
        text = self.tokenizer.decode(list(script[:start]) + list(ids), skip_special_tokens=True)
        return SimpleNamespace(prompt_ids=list(prompt_ids), response_ids=list(ids), text=text,
                               logprobs=[_lp(start + t, x) for t, x in enumerate(ids)],
                               entropies=[float(x) + (start + t) / 100 for t, x in enumerate(ids)],
                               finish_reason=finish, seed=seed)

    def generate(self, prompts, n, sampling, *, seeds=None):
        out = []
        for i, prompt in enumerate(prompts):
            if isinstance(prompt, str):
                ids = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
                for j in range(n):
                    out.append(self._emit(ids, self.scripts[prompt][j], 0, sampling, seed=1000 * i + j))
            else:  # a continuation: find the script this prefix belongs to
                assert n == 1 and seeds is not None
                for p, samples in self.scripts.items():
                    pids = self.tokenizer(p, add_special_tokens=False)["input_ids"]
                    for script in samples:
                        m = len(prompt) - len(pids)
                        if list(prompt) == pids + script[:m]:
                            ro = self._emit(prompt, script, m, sampling)
                            ro.text = self.tokenizer.decode(ro.response_ids, skip_special_tokens=True)
                            out.append(ro)
                            break
                    else:
                        continue
                    break
                else:
                    raise AssertionError(f"unknown prefix {prompt}")
        self.calls.append((len(out), sampling.max_new_tokens))
        return out


SCRIPTS = {"p0": [
    ["a", "t0", "<eos>"],                 # NoThink, stops by itself exactly at its cap (3)
    ["a", "t0", "e", "f", "g", "h"],      # NoThink running on: stopped at 3 tokens
    ["b", "d", "t0", "e", "f", "g"],      # Short: continued to 4
    ["c", "d", "e", "f", "g", "h", "d"],  # Long: continued to 6 (= the length limit)
    ["t0", "d", "<eos>"],                 # unmarked, short: stops by itself
    ["t0", "d", "e", "f", "g", "h"],      # unmarked: scored as Long, runs to 6
]}


def controller(**kw) -> ModeCaps:
    c = build("generation_controller", "mode_caps", {"modes": TOY, **kw})
    c.tokenizer = make_tokenizer()
    return c


def test_phased_generation_and_cut_golden():
    engine = ScriptedEngine(SCRIPTS)
    out = controller().generate(engine, ["p0"], 6, SamplingParams(max_new_tokens=6, seed=3))
    # levels 3, 4, 6: 6 rollouts x 3 tokens, then Short and the two Long-capped ones +1 (to 4), then Long +2 (to 6)
    assert engine.calls == [(6, 3), (3, 1), (2, 2)]
    assert [ro.text for ro in out] == ["a t0", "a t0 e", "b d t0 e", "c d e f g h", "t0 d", "t0 d e f g h"]
    assert [len(ro.response_ids) for ro in out] == [3, 3, 4, 6, 3, 6]
    assert [ro.finish_reason for ro in out] == ["stop", "length", "length", "length", "stop", "length"]
    assert [ro.meta["mode"] for ro in out] == ["nothink", "nothink", "short", "long", "long", "long"]
    assert [ro.meta["mode_capped"] for ro in out] == [False, True, True, True, False, True]
    for ro in out:  # every kept token with its own log-prob and entropy, in order
        assert ro.logprobs == pytest.approx([_lp(t, x) for t, x in enumerate(ro.response_ids)])
        assert ro.entropies == pytest.approx([x + t / 100 for t, x in enumerate(ro.response_ids)])


def test_format_errors_stop_at_the_first_cap():
    engine = ScriptedEngine(SCRIPTS)
    out = controller(no_marker="error").generate(engine, ["p0"], 6, SamplingParams(max_new_tokens=6, seed=3))
    assert engine.calls == [(6, 3), (2, 1), (1, 2)]  # the unmarked rollout no longer continues
    assert [ro.finish_reason for ro in out][4:] == ["stop", "abort"]
    assert out[5].text == "t0 d e" and out[5].meta["mode"] is None and not out[5].meta["mode_capped"]


def test_a_cut_after_generation_keeps_ids_logprobs_entropies_aligned():
    # A rollout generated past its cap (an engine without the phases): cut to NoThink's 3 tokens
    tok = make_tokenizer()
    ids = tok.convert_tokens_to_ids(["a", "t0", "e", "f", "g"])
    ro = SimpleNamespace(prompt_ids=[3], response_ids=ids, text="a t0 e f g", logprobs=[-0.1, -0.2, -0.3, -0.4, -0.5],
                         entropies=[1.0, 2.0, 3.0, 4.0, 5.0], finish_reason="stop", seed=7)
    cut = controller().cut(ro, tok, limit=6)
    assert (cut.response_ids, cut.text, cut.logprobs, cut.entropies) == (ids[:3], "a t0 e", [-0.1, -0.2, -0.3],
                                                                         [1.0, 2.0, 3.0])
    assert (cut.finish_reason, cut.seed, cut.meta["mode_capped"]) == ("length", 7, True)
    # no entropies (vLLM) and an empty response pass through
    ro.entropies, ro.response_ids, ro.text, ro.logprobs = None, [], "", []
    empty = controller().cut(ro, tok, limit=6)
    assert (empty.response_ids, empty.entropies, empty.finish_reason, empty.meta["mode"]) == ([], None, "stop", "long")


def test_the_env_never_cuts_what_the_controller_capped():
    engine = ScriptedEngine(SCRIPTS)
    out = controller().generate(engine, ["p0"], 6, SamplingParams(max_new_tokens=6, seed=3))
    env = ModesWrapper(make_env(4), modes=TOY, instruction=None)
    for ro in out:
        env.reset(options={"index": 0})
        _, reward, _, _, info = env.step(ro.text)
        assert not info["capped"] and info["mode"] == ro.meta["mode"] and info["response_len"] <= info["cap"]
    # what the env scores is what the controller kept: "b d t0 e" is wrong (d first), "a t0" right
    env.reset(options={"index": 0})
    assert env.step(out[0].text)[1] == 1.0


def batch_of(texts, rewards, correct=None, lengths=None):
    correct = correct if correct is not None else [r > 0 for r in rewards]
    lengths = lengths or [max(1, len(t.split())) for t in texts]
    return GroupBatch.from_samples([Sample("g", "p", [1], [2] * n, t, reward=r, correct=c)
                                    for t, r, c, n in zip(texts, rewards, correct, lengths)])


def test_mode_reward_golden():
    texts = ["a t0", "b t0", "c t0", "t0", "b x", "", "\x00 a"]
    b = batch_of(texts, [1, 1, 1, 1, 0, 1, 1])
    # weights 1.0, 0.9, 0.75, unmarked -> Long 0.75, 0 x 0.9, empty -> Long, garbage -> Long
    out = build("reward_shaper", "mode_reward", {"modes": TOY})(b)
    torch.testing.assert_close(out, torch.tensor([1.0, 0.9, 0.75, 0.75, 0.0, 0.75, 0.75]))
    strict = build("reward_shaper", "mode_reward", {"modes": TOY, "no_marker": "error"})
    torch.testing.assert_close(strict(b), torch.tensor([1.0, 0.9, 0.75, 0.0, 0.0, 0.0, 0.0]))
    assert strict.metrics() == {"weight_mean": pytest.approx((1.0 + 0.9 + 0.75 + 0.9) / 7)}
    # the shaper pays what the env would: same texts through a paying wrapper
    env = ModesWrapper(make_env(4), modes=TOY, instruction=None)
    paid = []
    for t in texts:
        env.reset(options={"index": 0})
        paid.append(env.step(t)[1])
    assert paid == pytest.approx([1.0, 0.9, 0.75, 0.75, 0.0, 0.0, 0.0])  # the env also scores: "", "\x00 a" wrong


def test_metrics_golden():
    c = controller()
    b = batch_of(["a t0", "a x", "b t0", "c t0 d e", "t0", "z"], [1, 0, 1, 1, 1, 0], lengths=[3, 3, 4, 6, 2, 1])
    c.observe_rollouts(b, 0.0)
    c.rollouts, c.capped = 6, 2
    m = c.metrics()
    assert m == pytest.approx({"share_nothink": 2 / 6, "share_short": 1 / 6, "share_long": 1 / 6,
                               "no_marker_rate": 2 / 6, "acc_nothink": 0.5, "len_nothink": 3.0, "acc_short": 1.0,
                               "len_short": 4.0, "acc_long": 1.0, "len_long": 6.0, "acc_unmarked": 0.5,
                               "len_unmarked": 1.5, "capped_rate": 2 / 6})
    assert c.metrics()["capped_rate"] == 0.0 and "acc_nothink" not in c.metrics()  # reset every step


def cfg(**kw):
    return from_dict({"model": "toy", "out_dir": "/tmp/modes-unused", **kw})


def test_the_mode_table_has_one_source():
    env_kwargs = {"modes": {"nothink": {"cap": 20}}, "pay_weights": False}
    run = cfg(env="rlvr/Modes-v0", env_kwargs=env_kwargs)
    assert run_table(run, None, None, "x").mode("nothink").cap == 20  # read from the env
    assert run_table(run, {"nothink": {"cap": 20}}, "long", "x").mode("nothink").cap == 20  # agreeing is fine
    with pytest.raises(ValueError, match="differ from the env"):
        run_table(run, {"nothink": {"cap": 8}}, None, "x")
    with pytest.raises(ValueError, match="differ from the env"):
        run_table(run, None, "error", "x")
    other = cfg(env="rlvr/Arithmetic-v0", env_kwargs={"modes": {"nothink": {"cap": 20}}})
    assert run_table(other, None, None, "x") == ModeTable.build()  # not a modes env: its kwargs are not modes
    services = SimpleNamespace(cfg=run, tokenizer=make_tokenizer())
    shaper = build("reward_shaper", "mode_reward", {})
    shaper.bind(services)
    assert shaper.table.mode("nothink").cap == 20
    paying = SimpleNamespace(cfg=cfg(env="rlvr/Modes-v0", env_kwargs={}), tokenizer=make_tokenizer())
    with pytest.raises(ValueError, match="pay_weights"):
        build("reward_shaper", "mode_reward", {}).bind(paying)


def test_bad_hyper_parameters_raise_naming_the_key():
    with pytest.raises(ValueError, match="modes.short.cap"):
        build("generation_controller", "mode_caps", {"modes": {"short": {"cap": 0}}})
    with pytest.raises(ValueError, match="no_marker"):
        build("reward_shaper", "mode_reward", {"no_marker": "sometimes"})
    from agents.policy.micro import micro_tokenizer

    c = build("generation_controller", "mode_caps", {"modes": {"nothink": {"cap": 2}}})
    with pytest.raises(ValueError, match="modes.nothink.cap"):  # "/nothink" is 2 micro tokens ("/", "nothink"): no room
        c.bind(SimpleNamespace(cfg=cfg(), tokenizer=micro_tokenizer()))


# -- inside the real toy trainer -----------------------------------------------------------------------------------
STAGES = {"generation_controller": "mode_caps", "reward_shaper": "mode_reward"}
PARAMS = {"rollout_allocator": {"n": 8}, "generation_controller": {"modes": TOY}, "reward_shaper": {"modes": TOY}}


def modes_env():
    return ModesWrapper(make_env(4), modes=TOY, instruction=None, pay_weights=False)


def test_trained_tokens_are_the_sampled_ones_at_their_caps(tmp_path):
    t = trainer(tmp_path, engine=ToyEngine, env=modes_env(), eval_env=modes_env(), stages=STAGES, params=PARAMS,
                max_new_tokens=6, temperature=0.7, precision="fp32", eval_size=0)
    t.step = 1
    batch, _ = t.collect()
    mask = batch.response_mask
    trainer_lp = t._no_grad_stats(t.model, batch)[0]
    assert float((trainer_lp - batch.behaviour_logprobs)[mask].abs().max()) < 2e-5  # joined and cut: still aligned
    table = ModeTable.build(TOY)
    for text, n in zip(batch.texts, batch.response_lengths.tolist()):
        mode, _ = table.resolve(text)
        assert n <= mode.cap
    assert max(batch.response_lengths.tolist()) == 6 and min(batch.response_lengths.tolist()) >= 1


def test_runs_and_resumes_exactly_in_the_trainer(tmp_path):
    settings = dict(steps=5, checkpoint_every=2, eval_every=0, eval_size=2, train_pool=6, prompts_per_step=3,
                    max_new_tokens=6, stages=STAGES, params={**PARAMS, "rollout_allocator": {"n": 4}})
    full = trainer(tmp_path / "full", env=modes_env(), eval_env=modes_env(), **settings).run(resume=False)
    cut = trainer(tmp_path / "cut", env=modes_env(), eval_env=modes_env(), **settings)
    cut.run(resume=False, stop_after=3)
    resumed = trainer(tmp_path / "cut", env=modes_env(), eval_env=modes_env(), **settings).run(resume=True)
    assert strip(resumed) == strip(full)
    train = [r for r in full if r["kind"] == "train"]
    assert len(train) == 5
    for r in train:
        shares = [r[f"generation_controller.share_{m}"] for m in ("nothink", "short", "long")]
        assert sum(shares) + r["generation_controller.no_marker_rate"] == pytest.approx(1.0)
        assert 0 <= r["generation_controller.capped_rate"] <= 1 and "reward_shaper.weight_mean" in r
        assert r["shaped_reward_mean"] <= r["reward_mean"] + 1e-9  # weights <= 1 on a flat-paying env


def test_within_a_group_the_briefest_correct_mode_gets_the_largest_advantage():
    # one group: NoThink, Short, Long right, NoThink wrong. Shaped rewards r = [1, 0.9, 0.75, 0]; mean 2.65 / 4 =
    # 0.6625; deviations .3375, .2375, .0875, -.6625; squares sum .616875; unbiased var .616875 / 3 = .205625,
    # std .4534589; A = dev / std = [.744278, .523751, .192960, -1.460989]. Flat GRPO gives the three right +0.5 each.
    b = batch_of(["a t0", "b t0", "c t0", "a t1"], [1, 1, 1, 0])
    b.rewards = build("reward_shaper", "mode_reward", {"modes": TOY})(b)
    adv = build("advantage", "grpo", {})(b)
    torch.testing.assert_close(adv.double(), torch.tensor([0.744278, 0.523751, 0.192960, -1.460989],
                                                          dtype=torch.float64), atol=1e-5, rtol=0)


def test_held_out_eval_decodes_within_the_caps(tmp_path):
    """The trainer's eval goes through ``generate_eval``: every held-out response fits its mode's cap (the long cap,
    6 tokens, is below the eval's 12-token limit), and the eval's rollouts do not enter the training metrics."""
    settings = dict(steps=2, eval_every=1, eval_size=4, eval_max_new_tokens=12, train_pool=6, prompts_per_step=2,
                    max_new_tokens=6, stages=STAGES, params={**PARAMS, "rollout_allocator": {"n": 4}})
    t = trainer(tmp_path / "run", env=modes_env(), eval_env=modes_env(), **settings)
    seen = []
    inner = t.engine.generate

    def recording(prompts, n, sampling, **kw):
        out = inner(prompts, n, sampling, **kw)
        seen.append((sampling.max_new_tokens, [len(ro.response_ids) for ro in out]))
        return out

    t.engine.generate = recording
    records = t.run(resume=False)
    evals = [r for r in records if r["kind"] == "eval"]
    assert len(evals) == 3 and all(r["eval_len_mean"] <= 6 for r in evals)
    # the eval's first phase: its 4 prompts decoded to the smallest cap (3), not to the eval's 12-token limit
    assert any(limit == 3 and len(lens) == 4 for limit, lens in seen)
    assert not any(limit > 6 for limit, _ in seen)
    train = [r for r in records if r["kind"] == "train"]
    assert all(0 <= r["generation_controller.capped_rate"] <= 1 for r in train)
