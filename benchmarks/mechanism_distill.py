"""Precondition probe for the distillation methods (OPSD, DASH-OPSD, DistIL; issue 45, build item 5): can the policy
read its privileged context at all? Self-distillation only teaches something when the teacher (the same weights given a
verified solution, or DistIL's feedback) knows more than the student.

    python benchmarks/mechanism_distill.py                          # both models, 64 held-out tasks
    python benchmarks/mechanism_distill.py --model smollm2 --tasks 16

Per model (``micro-countdown``: the opsd recipe on the micro lane; ``smollm2``: on the smollm2 lane), on the
first ``--tasks`` tasks of the held-out env, with the trainer's code paths (``load_policy``, the hf engine, the losses'
``teacher_prompt_ids``, the teacher-forced pass ``agents.grpo.logprobs.response_logprobs``) and the lane's sampling
temperature:

(a) the mean per-token log-prob gap teacher minus student on the student's own samples (the losses' metric
    ``teacher_lp_gap`` before any update), and on each sample's first token;
(b) the same gap on the gold answer's tokens of the verified solution (the ``<answer>`` content of
    ``opsd.reference_solution``, else the gold answer inside it), teacher-forced as a response: does the teacher that
    reads the solution put more probability on its answer than the student does;
(c) accuracy of the privileged teacher generating with the solution (or the feedback) in its context vs the student's,
    sampled at the lane's temperature (``--samples`` per task) and greedy.

DistIL's expert reads feedback on the row's own attempt (verdict, parsed answer, solution): on the student's samples
each row's own; for the gold response and its own generations, the feedback on the task's first student sample.
Precondition (both methods): gold-answer gap > 0 and privileged sampled accuracy > student sampled accuracy.
Writes ``benchmarks/results/mechanism_distill.json`` (one entry per model, merged into the file, with the command).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from agents.grpo.batch import GroupBatch, Sample
from agents.grpo.config import TrainConfig, load_recipe
from agents.grpo.logprobs import response_logprobs
from agents.grpo.registry import build
from agents.methods.opsd import reference_solution

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "mechanism_distill.json"
# model -> the lane that fixes its env and sampling (the smollm2 lane runs the opsd recipe's env, Arithmetic-v0, with
# the lane's 48-token cap: answers take ~12 tokens)
MODELS = {"micro-countdown": "micro", "smollm2": "smollm2"}
METHODS = ("opsd", "distil")  # DASH-OPSD reads OPSD's privileged context: its precondition is OPSD's
ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.S)


# -- the gold answer inside a verified solution ------------------------------------------------------------------------
def answer_span(text: str, answer: str | None) -> tuple[int, int]:
    """Character span of the gold answer in ``text``: the last ``<answer>`` content, else the last ``answer``."""
    tags = list(ANSWER_TAG.finditer(text))
    if tags:
        return tags[-1].span(1)
    if answer not in (None, ""):
        start = text.rfind(str(answer))
        if start >= 0:
            return start, start + len(str(answer))
    raise ValueError(f"no gold answer found in {text!r}")


def span_token_mask(tokenizer: Any, text: str, span: tuple[int, int]) -> tuple[list[int], list[bool]]:
    """``text``'s token ids and, per token, whether it covers a character of ``span`` (offsets of a fast tokenizer)."""
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    lo, hi = span
    mask = [a < hi and b > lo for a, b in enc["offset_mapping"]]
    if not any(mask):
        raise ValueError(f"span {span} of {text!r} covers no token")
    return list(enc["input_ids"]), mask


# -- teacher minus student log-probs -----------------------------------------------------------------------------------
@torch.no_grad()
def response_lp(model: torch.nn.Module, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], *,
                temperature: float = 1.0, pad_id: int = 0, rows_per_pass: int = 32) -> torch.Tensor:
    """``(B, W)`` log-probs of each response after its prompt at ``temperature`` (the trainer's teacher-forced pass;
    rows in order, so a task's samples share their prompt's forward)."""
    width = max(1, max(len(r) for r in responses))
    out = torch.zeros(len(responses), width)
    for s in range(0, len(responses), rows_per_pass):
        part = slice(s, s + rows_per_pass)
        lp, _ = response_logprobs(model, prompts[part], responses[part], temperature=temperature, pad_id=pad_id)
        out[part, : lp.shape[1]] = lp.float()
    return out


def token_gaps(model: torch.nn.Module, student_prompts: Sequence[Sequence[int]],
               teacher_prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], *,
               temperature: float = 1.0, pad_id: int = 0, teacher_model: torch.nn.Module | None = None,
               student_lp: torch.Tensor | None = None) -> torch.Tensor:
    """``(B, W)`` log pi_teacher(y_t) - log pi_student(y_t) per response token, 0 past a row's end: the losses'
    ``teacher_lp_gap`` before any update. ``teacher_model``: other weights reading the teacher prompts (None: the
    same); ``student_lp``: the student side if already computed (two methods share it)."""
    kw = {"temperature": temperature, "pad_id": pad_id}
    if student_lp is None:
        student_lp = response_lp(model, student_prompts, responses, **kw)
    teacher_lp = response_lp(model if teacher_model is None else teacher_model, teacher_prompts, responses, **kw)
    return teacher_lp - student_lp


def gap_summary(gap: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Mean gap over the masked tokens, and over each row's first masked token (rows with none are left out)."""
    mask = mask.bool()
    rows = mask.any(1)
    first = mask.float().argmax(1)
    firsts = gap[torch.arange(len(gap)), first][rows]
    return {"gap_mean": float(gap[mask].mean()), "gap_first_token": float(firsts.mean()),
            "tokens": int(mask.sum()), "rows": int(rows.sum())}


def lengths_mask(responses: Sequence[Sequence[int]], width: int) -> torch.Tensor:
    lens = torch.tensor([len(r) for r in responses])
    return torch.arange(width)[None, :] < lens[:, None]


# -- tasks, rollouts, verdicts -----------------------------------------------------------------------------------------
def probe_config(model: str, recipe: str = "opsd") -> TrainConfig:
    """``recipe`` on the lane that trains ``model`` (``MODELS``)."""
    if model not in MODELS:
        raise ValueError(f"model must be one of {sorted(MODELS)}, got {model!r}")
    cfg = load_recipe(recipe, lane=MODELS[model])
    if cfg.model != model:
        raise ValueError(f"the {recipe} recipe on lane {MODELS[model]!r} trains {cfg.model!r}, not {model!r}")
    return cfg


def held_out_tasks(cfg: TrainConfig, n: int) -> tuple[Any, list[dict[str, Any]]]:
    """The eval env and its first ``n`` tasks' infos, with the answer and metadata the trainer adds."""
    import gymnasium as gym

    import rlvr_envs  # noqa: F401  (registers rlvr/ ids)

    env = gym.make(cfg.env, **{**cfg.env_kwargs, **cfg.eval_env_kwargs})
    infos = []
    for i in range(min(n, len(env.unwrapped.source))):
        _, info = env.reset(options={"index": i})
        task = env.unwrapped.task
        infos.append({**info, "answer": task.answer, "metadata": dict(task.metadata or {})})
    return env, infos


def score(env: Any, info: dict[str, Any], text: str) -> tuple[bool, Any]:
    from rlvr_envs.core import step_single_turn

    env.reset(options={"task_id": info["task_id"]})
    reward, verdict = step_single_turn(env, text)
    return bool(verdict.get("correct", reward > 0)), verdict.get("parsed_answer")


def row_sample(info: dict[str, Any], prompt_ids: list[int], response_ids: list[int], text: str, correct: bool,
               parsed: Any) -> Sample:
    """One row as the trainer stores it (the fields the losses' privileged contexts read)."""
    keep = {k: info[k] for k in ("task_id", "answer", "metadata", "messages")}
    return Sample(group_id=info["task_id"], prompt="", prompt_ids=list(prompt_ids), response_ids=list(response_ids),
                  text=text, reward=float(correct), correct=correct, info={**keep, "parsed_answer": parsed})


def teacher_prompt_ids(method: str, policy: Any, batch: GroupBatch) -> list[list[int]]:
    """The loss's own privileged prompt for every row of ``batch``."""
    loss = build("loss", method, {})
    loss.bind(SimpleNamespace(tokenizer=policy.tokenizer, prompt_text=policy.prompt_text))
    return loss.teacher_prompt_ids(batch, list(range(len(batch))))


def generate_scored(engine: Any, env: Any, infos: list[dict[str, Any]], prompts: list[Any], n: int,
                    sampling: Any, task_of: list[int]) -> list[bool]:
    """``n`` rollouts per prompt, each scored against its task (``task_of[i]``: prompt i's task)."""
    rollouts = engine.generate(prompts, n, sampling)
    return [score(env, infos[task_of[j // n]], ro.text)[0] for j, ro in enumerate(rollouts)]


def per_task(correct: list[bool], task_of_row: list[int], n_tasks: int) -> list[int]:
    counts = [0] * n_tasks
    for c, t in zip(correct, task_of_row):
        counts[t] += int(c)
    return counts


# -- the probe ---------------------------------------------------------------------------------------------------------
def student_batch(engine: Any, env: Any, infos: list[dict[str, Any]], prompts: list[str], samples: int,
                  sampling: Any) -> GroupBatch:
    """The student's own samples, ``samples`` per task (task-major), scored, as the trainer's rows."""
    rows = []
    for j, ro in enumerate(engine.generate(prompts, samples, sampling)):
        ok, parsed = score(env, infos[j // samples], ro.text)
        rows.append(row_sample(infos[j // samples], ro.prompt_ids, ro.response_ids, ro.text, ok, parsed))
    return GroupBatch.from_samples(rows, temperature=sampling.temperature or 1.0)


def gold_batch(tokenizer: Any, infos: list[dict[str, Any]], students: GroupBatch, samples: int
               ) -> tuple[GroupBatch, torch.Tensor]:
    """The verified solution of each task as a response, and its gold-answer token mask ``(N, W)``. Each row carries
    the task's first student sample's verdict and parsed answer: what DistIL's feedback on it reads."""
    rows, masks = [], []
    for t, info in enumerate(infos):
        text = reference_solution(info)
        ids, mask = span_token_mask(tokenizer, text, answer_span(text, info.get("answer")))
        first = t * samples
        rows.append(row_sample(info, students.prompt_ids[first], ids, text, bool(students.correct[first]),
                               students.infos[first]["parsed_answer"]))
        masks.append(mask)
    batch = GroupBatch.from_samples(rows, temperature=students.temperature)
    width = batch.response_mask.shape[1]
    return batch, torch.tensor([m + [False] * (width - len(m)) for m in masks])


def accuracies(engine: Any, env: Any, infos: list[dict[str, Any]], prompts: list[Any], n: int, sampling: Any,
               task_of: list[int], greedy: Any) -> dict[str, Any]:
    """Sampled accuracy of ``prompts`` (``n`` each, prompt i for task ``task_of[i]``), per-task correct counts and,
    with ``greedy`` sampling params, the greedy accuracy of each task's first prompt."""
    correct = generate_scored(engine, env, infos, prompts, n, sampling, task_of)
    rows_task = [task_of[j // n] for j in range(len(correct))]
    out: dict[str, Any] = {"accuracy": float(np.mean(correct)), "per_task_correct": per_task(correct, rows_task,
                                                                                            len(infos))}
    if greedy is not None:
        first = [task_of.index(t) for t in range(len(infos))]
        out["greedy_accuracy"] = float(np.mean(generate_scored(engine, env, infos, [prompts[i] for i in first], 1,
                                                               greedy, list(range(len(infos))))))
    return out


def method_probe(method: str, policy: Any, students: GroupBatch, gold: GroupBatch, answer_mask: torch.Tensor,
                 student_lp: torch.Tensor, gold_lp: torch.Tensor, pad_id: int
                 ) -> tuple[dict[str, Any], list[list[int]], list[list[int]]]:
    """(a) and (b) for one method's privileged context: the gaps on the student's samples and on the gold answer;
    with the privileged prompts of the student rows and of the gold rows."""
    temp = students.temperature
    t_student = teacher_prompt_ids(method, policy, students)
    t_gold = teacher_prompt_ids(method, policy, gold)
    gap_s = token_gaps(policy.model, students.prompt_ids, t_student, students.response_ids, temperature=temp,
                       pad_id=pad_id, student_lp=student_lp)
    gap_g = token_gaps(policy.model, gold.prompt_ids, t_gold, gold.response_ids, temperature=temp, pad_id=pad_id,
                       student_lp=gold_lp)
    res = {"student_samples": gap_summary(gap_s, lengths_mask(students.response_ids, gap_s.shape[1])),
           "gold_response": gap_summary(gap_g, lengths_mask(gold.response_ids, gap_g.shape[1])),
           "gold_answer": gap_summary(gap_g, answer_mask[:, : gap_g.shape[1]]),
           "privileged_prompt_tokens_mean": float(np.mean([len(p) for p in t_gold]))}
    return res, t_student, t_gold


def probe(model: str, n_tasks: int = 64, samples: int = 2, seed: int = 0, greedy: bool = True) -> dict[str, Any]:
    """Everything the module docstring lists, for one model."""
    from agents.policy.engine import SamplingParams, make_engine
    from agents.policy.models import load_policy

    t0, c0 = time.perf_counter(), time.process_time()
    cfg = probe_config(model)
    policy = load_policy(cfg.model, dtype=cfg.dtype, seed=cfg.seed)
    # fp32 decoding: "auto" would pick bf16 on some CPUs, and the figures should not depend on the machine
    engine = make_engine(policy, backend="hf", precision="fp32")
    pad_id = int(getattr(policy.tokenizer, "pad_token_id", None) or 0)
    env, infos = held_out_tasks(cfg, n_tasks)
    n = len(infos)
    sampling = SamplingParams(temperature=cfg.temperature, top_p=cfg.top_p, max_new_tokens=cfg.max_new_tokens,
                              seed=seed)
    greedy_sp = SamplingParams(temperature=0.0, max_new_tokens=cfg.max_new_tokens) if greedy else None
    prompts = [policy.prompt_text(info["messages"]) for info in infos]
    students = student_batch(engine, env, infos, prompts, samples, sampling)
    gold, answer_mask = gold_batch(policy.tokenizer, infos, students, samples)
    task_of_row = [j // samples for j in range(len(students))]
    out: dict[str, Any] = {"model": model, "weights_hash": policy.weights_hash, "env": cfg.env,
                           "env_kwargs": {**cfg.env_kwargs, **cfg.eval_env_kwargs}, "tasks": n,
                           "samples_per_task": samples, "temperature": cfg.temperature,
                           "max_new_tokens": cfg.max_new_tokens, "seed": seed,
                           "student_len_mean": float(students.response_lengths.float().mean())}
    out["student"] = {"accuracy": float(students.correct.float().mean()),
                      "per_task_correct": per_task(students.correct.tolist(), task_of_row, n)}
    if greedy_sp is not None:
        out["student"]["greedy_accuracy"] = accuracies(engine, env, infos, prompts, 1, greedy_sp, list(range(n)),
                                                       None)["accuracy"]
    t_gap = time.perf_counter()
    kw = {"temperature": cfg.temperature, "pad_id": pad_id}
    student_lp = response_lp(policy.model, students.prompt_ids, students.response_ids, **kw)
    gold_lp = response_lp(policy.model, gold.prompt_ids, gold.response_ids, **kw)
    gaps = {m: method_probe(m, policy, students, gold, answer_mask, student_lp, gold_lp, pad_id) for m in METHODS}
    out["gap_passes_s"] = round(time.perf_counter() - t_gap, 1)
    for method, (res, t_student, t_gold) in gaps.items():
        # (c): OPSD's privileged prompt per task (k samples); DistIL's per student row (one each: its own feedback)
        acc = (accuracies(engine, env, infos, t_gold, samples, sampling, list(range(n)), greedy_sp)
               if method == "opsd" else accuracies(engine, env, infos, t_student, 1, sampling, task_of_row, greedy_sp))
        res.update({f"privileged_{k}" if k != "per_task_correct" else k: v for k, v in acc.items()})
        res["precondition_met"] = bool(res["gold_answer"]["gap_mean"] > 0
                                       and res["privileged_accuracy"] > out["student"]["accuracy"])
        out[method] = res
    # wall time depends on what else runs on the machine; CPU time is this process's own
    out["wall_s"], out["cpu_s"] = round(time.perf_counter() - t0, 1), round(time.process_time() - c0, 1)
    return out


def report(res: dict[str, Any]) -> str:
    lines = [f"{res['model']}: {res['tasks']} tasks x {res['samples_per_task']}, T = {res['temperature']}, "
             f"student accuracy {res['student']['accuracy']:.3f} (greedy {res['student'].get('greedy_accuracy', '-')})"]
    for m in METHODS:
        r = res[m]
        lines.append(f"  {m:7s} gap student samples {r['student_samples']['gap_mean']:+.3f} (first token "
                     f"{r['student_samples']['gap_first_token']:+.3f}), gold response "
                     f"{r['gold_response']['gap_mean']:+.3f}, gold answer {r['gold_answer']['gap_mean']:+.3f}; "
                     f"privileged accuracy {r['privileged_accuracy']:.3f} (greedy "
                     f"{r.get('privileged_greedy_accuracy', '-')}); precondition "
                     f"{'met' if r['precondition_met'] else 'NOT met'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--tasks", type=int, default=64, help="held-out tasks (the eval env's first N)")
    p.add_argument("--samples", type=int, default=2, help="sampled responses per task, student and OPSD teacher")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-greedy", action="store_true", help="skip the greedy accuracies")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    torch.set_num_threads(1)  # as the lanes pin it: kernels split reductions by thread count
    command = "python benchmarks/mechanism_distill.py " + " ".join(argv if argv is not None else sys.argv[1:])
    data = json.loads(args.out.read_text()) if args.out.is_file() else {}
    data.setdefault("description", __doc__.strip().splitlines()[0])
    data["precondition"] = ("gold-answer teacher_lp_gap > 0 and privileged sampled accuracy > student sampled "
                            "accuracy (DASH-OPSD shares OPSD's)")
    models = data.setdefault("models", {})
    for model in args.model:
        res = probe(model, args.tasks, args.samples, args.seed, greedy=not args.no_greedy)
        res["command"] = command.strip()
        models[model] = res
        print(report(res), flush=True)
    data["precondition_met"] = {m: {k: r[k]["precondition_met"] for k in METHODS} for m, r in models.items()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
