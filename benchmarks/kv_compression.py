"""KV-cache compression (SnapKV-style prompt eviction, ``agents.policy.kv_compression``) vs the dense cache in the
``hf`` engine: memory saved, log-prob agreement with dense, task accuracy.

Part ``agreement`` (long contexts): for each context length (default 1k, 2k, 4k tokens), ``--prompts`` prompts of
exactly that many tokens: GSM8K train problems with worked solutions as few-shot context, then a test question
(``RLVR_DATA_DIR``; without it, solved Arithmetic examples). Greedy decoding of ``--new-tokens`` tokens, dense and
with the default policy (``mixed`` below) at each budget below the context. Reported per (context, budget):

- KV bytes of the prompt part of the cache per row, dense vs kept (the engine's ``kv_compression_stats``), and the
  whole cache at the end of decoding;
- log-prob agreement: a teacher-forced *dense* forward over prompt + the compressed decode's tokens gives each
  token's dense log-prob; mean and max ``|dense - compressed|``, and the fraction of positions where the dense
  argmax is the compressed decode's token;
- greedy agreement with dense decoding: fraction of identical continuations, first divergence position.

Part ``policies`` (which positions to keep): the dense greedy continuation of each long prompt is teacher-forced
through the compressed cache of each policy at the same budget, so every policy is scored on the same tokens (no
compounding divergence): mean ``|log p_compressed - log p_dense|`` of those tokens and mean KL(dense || compressed)
over their positions. Policies: ``snapkv`` (recent part = the 32-query observation window, pool 5, as in SnapKV),
``recent`` (sinks + the most recent positions only, StreamingLLM), ``mixed`` (the engine's default: half the budget
recent, the rest voted, no pooling).

Part ``accuracy``: ``--tasks`` rlvr/Arithmetic-v0 tasks, each prompt ~``--accuracy-context`` tokens of solved
arithmetic examples (another seed's tasks, as earlier chat turns) before the question, greedy; accuracy dense vs
each budget, paired per task, and how many responses are identical. (Arithmetic needs only the question, which
sits in the recent window: this checks that compression does not break the model, not long-range recall.)

fp32 decoding, one thread. Each part is meant to finish in under ~8 minutes on a shared 2-core machine; results are
merged into ``--out`` part by part.

    python benchmarks/kv_compression.py [--parts agreement,policies,accuracy] [--model smollm2]
        [--out benchmarks/results/kv_compression.json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
STARTED = time.perf_counter()


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')} +{time.perf_counter() - STARTED:6.1f}s] {message}", flush=True)


def arithmetic_examples(count: int, seed_base: int) -> list[str]:
    from rlvr_envs.tasks.arithmetic import ArithmeticSource, gold_response

    source = ArithmeticSource(seed_base=seed_base)
    return [f"Question: {task.question}\nAnswer: {gold_response(task)}\n\n"
            for task in (source.task(i) for i in range(count))]


def long_context_prompts(tokenizer: Any, length: int, count: int) -> tuple[list[list[int]], str]:
    """``count`` token-id prompts of exactly ``length`` tokens: few-shot solved problems (cut at the front to fit),
    then a question and ``Answer:``. GSM8K when its data is available, else Arithmetic."""
    try:
        from rlvr_envs.tasks.gsm8k import load_tasks

        shots = load_tasks("train")
        questions = load_tasks("test")
        source = "gsm8k"
        shot_text = [f"Question: {t.question}\nAnswer: {t.metadata['solution']}\n\n" for t in shots]
        tails = [f"Question: {t.question}\nAnswer:" for t in questions]
    except Exception:  # no data set: a procedural stand-in
        source = "arithmetic"
        shot_text = arithmetic_examples(2000, seed_base=7)
        tails = [f"Question: {ex.split(chr(10))[0].removeprefix('Question: ')}\nAnswer:"
                 for ex in arithmetic_examples(count, seed_base=11)]
    prompts = []
    for j in range(count):
        tail = tokenizer(tails[j], add_special_tokens=False)["input_ids"]
        context: list[int] = []
        k = j * 97  # each prompt its own run of examples
        while len(context) + len(tail) < length:
            context += tokenizer(shot_text[k % len(shot_text)], add_special_tokens=False)["input_ids"]
            k += 1
        prompts.append(context[len(context) + len(tail) - length:] + tail)
    return prompts, source


def dense_teacher_forced(model: Any, prompt: list[int], response: list[int]) -> tuple[list[float], list[int]]:
    """Dense log-probs (T = 1) of ``response`` after ``prompt`` and the dense argmax at each response position."""
    import torch

    ids = torch.tensor([prompt + response])
    logits = model(input_ids=ids, logits_to_keep=len(response) + 1).logits[0, :-1].float()
    logp = torch.log_softmax(logits, -1)
    return logp.gather(-1, torch.tensor(response)[:, None]).squeeze(-1).tolist(), logits.argmax(-1).tolist()


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token (the shorter length when one is a prefix of the other); None if equal."""
    for k, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return k
    return None if len(a) == len(b) else min(len(a), len(b))


def make_config(budget: int, args: argparse.Namespace, kind: str = "mixed") -> Any:
    """``mixed`` (the engine's default shape: half the budget recent, the rest voted), ``snapkv`` (only the
    observation window recent, pooled votes) or ``recent`` (sinks + the most recent positions, StreamingLLM)."""
    from agents.policy.kv_compression import KVCompression

    window = {"mixed": budget // 2, "snapkv": args.observe, "recent": budget - args.sinks}[kind]
    return KVCompression(budget=budget, sinks=args.sinks, window=window, observe=args.observe,
                         pool=5 if kind == "snapkv" else args.pool)


def run_policies(policy: Any, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from agents.policy.engine import HFEngine, SamplingParams, _Row

    dense_engine = HFEngine(policy, precision="fp32")
    model = dense_engine.decode_model()
    kinds = ("snapkv", "recent", "mixed")
    out: dict[str, Any] = {"new_tokens": args.new_tokens, "prompts_per_context": args.prompts, "rows": []}
    for length in args.policy_contexts:
        prompts, out["prompt_source"] = long_context_prompts(policy.tokenizer, length, args.prompts)
        references = dense_engine.generate(prompts, 1, SamplingParams(temperature=0.0, max_new_tokens=args.new_tokens))
        with torch.inference_mode():
            dense_logp = [torch.log_softmax(model(input_ids=torch.tensor([ro.prompt_ids + ro.response_ids]),
                                                  logits_to_keep=ro.n_tokens + 1).logits[0, :-1].float(), -1)
                          for ro in references]
        for budget in args.policy_budgets:
            if budget >= length:
                continue
            for kind in kinds:
                config = make_config(budget, args, kind)
                engine = HFEngine(policy, precision="fp32", kv_compression=config)
                diffs, kls = [], []
                for ro, dense in zip(references, dense_logp):
                    with torch.inference_mode():
                        # the engine's own prefill + compression, then the continuation in one forward over that cache
                        cache, logits, _, last = engine._prefill(model, [ro.prompt_ids], [_Row(0, 0, None)],
                                                                 args.new_tokens)
                        positions = last + 1 + torch.arange(ro.n_tokens - 1)
                        rest = model(input_ids=torch.tensor([ro.response_ids[:-1]]), position_ids=positions[None],
                                     use_cache=True, **{engine.cache_kw: cache}).logits[0]
                        logp = torch.log_softmax(torch.cat([logits, rest]).float(), -1)
                    picked = torch.tensor(ro.response_ids)[:, None]
                    diffs.append(float((logp.gather(-1, picked) - dense.gather(-1, picked)).abs().mean()))
                    kls.append(float((dense.exp() * (dense - logp)).sum(-1).mean()))
                row = {"context": length, "budget": budget, "policy": kind, "kv_config": asdict(config),
                       "logprob_mean_abs_diff": statistics.mean(diffs), "kl_dense_to_compressed": statistics.mean(kls)}
                out["rows"].append(row)
                log(f"policies context {length} budget {budget} {kind}: |dlogp| {row['logprob_mean_abs_diff']:.4f} "
                    f"KL {row['kl_dense_to_compressed']:.4f}")
    return out


def run_agreement(policy: Any, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from agents.policy.engine import HFEngine, SamplingParams

    sampling = SamplingParams(temperature=0.0, max_new_tokens=args.new_tokens)
    dense_engine = HFEngine(policy, precision="fp32", max_batch_size=args.prompts)
    model = dense_engine.decode_model()
    out: dict[str, Any] = {"new_tokens": args.new_tokens, "prompts_per_context": args.prompts, "rows": []}
    for length in args.contexts:
        prompts, source = long_context_prompts(policy.tokenizer, length, args.prompts)
        out["prompt_source"] = source
        t0 = time.perf_counter()
        dense = dense_engine.generate(prompts, 1, sampling)
        dense_s = time.perf_counter() - t0
        log(f"context {length}: dense decode {dense_s:.1f}s, mean {statistics.mean(r.n_tokens for r in dense):.0f} "
            "tokens")
        for budget in args.budgets:
            if budget >= length:
                continue
            config = make_config(budget, args)
            engine = HFEngine(policy, precision="fp32", max_batch_size=args.prompts, kv_compression=config)
            t0 = time.perf_counter()
            compressed = engine.generate(prompts, 1, sampling)
            compressed_s = time.perf_counter() - t0
            stats = engine.kv_compression_stats.to_dict()
            diffs: list[float] = []
            argmax_same = 0
            divergences = []
            with torch.inference_mode():
                for ro, ref in zip(compressed, dense):
                    dense_lp, dense_argmax = dense_teacher_forced(model, ro.prompt_ids, ro.response_ids)
                    diffs += [abs(a - b) for a, b in zip(dense_lp, ro.logprobs)]
                    argmax_same += sum(a == b for a, b in zip(dense_argmax, ro.response_ids))
                    divergences.append(first_divergence(ro.response_ids, ref.response_ids))
            per_position = stats["dense_kv_bytes"] // stats["prompt_positions"]
            row = {
                "context": length, "budget": budget, "kv_config": asdict(config),
                "kept_fraction": stats["kept_positions"] / stats["prompt_positions"],
                "prompt_kv_bytes_per_row_dense": stats["dense_kv_bytes"] // stats["rows"],
                "prompt_kv_bytes_per_row_kept": stats["kept_kv_bytes"] // stats["rows"],
                "prompt_kv_bytes_saved_per_row": stats["saved_kv_bytes"] // stats["rows"],
                # the whole cache after decoding: prompt part + generated tokens, per row
                "final_kv_bytes_per_row_dense": (length + args.new_tokens) * per_position,
                "final_kv_bytes_per_row_kept": (budget + args.new_tokens) * per_position,
                "logprob_mean_abs_diff": statistics.mean(diffs) if diffs else None,
                "logprob_max_abs_diff": max(diffs) if diffs else None,
                "dense_argmax_agreement": argmax_same / len(diffs) if diffs else None,
                "identical_greedy_fraction": sum(d is None for d in divergences) / len(divergences),
                "first_divergence": divergences,
                "tokens_compressed": [r.n_tokens for r in compressed], "tokens_dense": [r.n_tokens for r in dense],
                "decode_s_dense": dense_s, "decode_s_compressed": compressed_s,
            }
            out["rows"].append(row)
            log(f"context {length} budget {budget}: KV/row {row['prompt_kv_bytes_per_row_dense'] / 2**20:.1f} -> "
                f"{row['prompt_kv_bytes_per_row_kept'] / 2**20:.1f} MiB, |dlogp| mean "
                f"{row['logprob_mean_abs_diff']:.4f} max {row['logprob_max_abs_diff']:.3f}, argmax agreement "
                f"{row['dense_argmax_agreement']:.3f}, identical {row['identical_greedy_fraction']:.2f}, first "
                f"divergence {divergences} ({compressed_s:.1f}s)")
    return out


def run_accuracy(policy: Any, args: argparse.Namespace) -> dict[str, Any]:
    from agents.policy.engine import HFEngine, SamplingParams
    from rlvr_envs.tasks.arithmetic import DEFAULT_TEMPLATE, ArithmeticSource, gold_response, score_integer

    tasks = [ArithmeticSource(seed_base=0).task(i) for i in range(args.tasks)]
    # solved examples as earlier chat turns (SmolLM2-135M copies the answer format from turns; from one long user
    # message of examples it mostly boxes the first operand)
    shots = [ArithmeticSource(seed_base=3).task(i) for i in range(400)]
    history: list[dict[str, str]] = []
    tokenizer = policy.tokenizer
    while len(tokenizer(policy.prompt_text(history or [{"role": "user", "content": ""}]),
                        add_special_tokens=False)["input_ids"]) < args.accuracy_context:
        shot = shots[len(history) // 2]
        history += [{"role": "user", "content": DEFAULT_TEMPLATE.format(question=shot.question)},
                    {"role": "assistant", "content": gold_response(shot)}]
    prompts = [policy.prompt_text([*history, {"role": "user", "content": DEFAULT_TEMPLATE.format(question=t.question)}])
               for t in tasks]
    widths = [len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts]
    sampling = SamplingParams(temperature=0.0, max_new_tokens=args.accuracy_new_tokens)
    out: dict[str, Any] = {"tasks": len(tasks), "shots": len(history) // 2, "prompt_tokens_min": min(widths),
                           "prompt_tokens_max": max(widths), "runs": {}}
    responses: dict[str, list[list[int]]] = {}
    correct: dict[str, list[bool]] = {}
    for budget in [None, *args.accuracy_budgets]:
        name = "dense" if budget is None else f"budget_{budget}"
        config = None if budget is None else make_config(budget, args)
        engine = HFEngine(policy, precision="fp32", max_batch_size=args.slots, kv_compression=config)
        t0 = time.perf_counter()
        rollouts = engine.generate(prompts, 1, sampling)
        seconds = time.perf_counter() - t0
        correct[name] = [score_integer(int(t.answer), r.text).correct for t, r in zip(tasks, rollouts)]
        responses[name] = [r.response_ids for r in rollouts]
        run = {"accuracy": sum(correct[name]) / len(tasks), "correct": sum(correct[name]), "seconds": seconds,
               "kv_config": asdict(config) if config else None,
               "kv_stats": engine.kv_compression_stats.to_dict() if engine.kv_compression_stats else None,
               "sample_responses": [r.text for r in rollouts[:4]]}
        if budget is not None:  # paired with dense on the same tasks
            run["identical_to_dense"] = sum(a == b for a, b in zip(responses[name], responses["dense"]))
            run["only_dense_correct"] = sum(d and not c for d, c in zip(correct["dense"], correct[name]))
            run["only_compressed_correct"] = sum(c and not d for d, c in zip(correct["dense"], correct[name]))
        out["runs"][name] = run
        log(f"accuracy {name}: {run['correct']}/{len(tasks)} ({seconds:.1f}s), identical to dense "
            f"{run.get('identical_to_dense')}, samples {run['sample_responses'][:2]}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", default="agreement,policies,accuracy")
    p.add_argument("--model", default="smollm2")
    p.add_argument("--contexts", default="1024,2048,4096")
    p.add_argument("--budgets", default="256,1024")
    p.add_argument("--prompts", type=int, default=2, help="prompts per context length (agreement)")
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--sinks", type=int, default=4)
    p.add_argument("--observe", type=int, default=32, help="observation window (voting queries)")
    p.add_argument("--pool", type=int, default=1, help="vote pooling width of the default (mixed) policy")
    p.add_argument("--policy-contexts", default="1024,2048")
    p.add_argument("--policy-budgets", default="256,512")
    p.add_argument("--tasks", type=int, default=32)
    p.add_argument("--accuracy-context", type=int, default=1024)
    p.add_argument("--accuracy-budgets", default="128")
    p.add_argument("--accuracy-new-tokens", type=int, default=32)
    p.add_argument("--slots", type=int, default=4, help="decode slots in the accuracy part (prefill memory)")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "kv_compression.json"))
    args = p.parse_args(argv)
    args.contexts = [int(x) for x in args.contexts.split(",")]
    args.budgets = [int(x) for x in args.budgets.split(",")]
    args.accuracy_budgets = [int(x) for x in args.accuracy_budgets.split(",") if x]
    args.policy_contexts = [int(x) for x in args.policy_contexts.split(",")]
    args.policy_budgets = [int(x) for x in args.policy_budgets.split(",")]
    parts = [x for x in args.parts.split(",") if x]
    runners = {"agreement": run_agreement, "policies": run_policies, "accuracy": run_accuracy}
    if unknown := set(parts) - set(runners):
        p.error(f"unknown parts {sorted(unknown)}")
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("RLVR_CPU_BF16", "0")
    import torch

    torch.set_num_threads(1)
    from agents.policy import load_policy

    policy = load_policy(args.model)
    log(f"loaded {policy.name}")
    out_path = Path(args.out)
    result = json.loads(out_path.read_text()) if out_path.is_file() else {}
    result["meta"] = {"model": policy.name, "threads": torch.get_num_threads(), "torch": torch.__version__,
                      "platform": platform.platform(), "load_average": os.getloadavg(),
                      "source_sha256": hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:12],
                      "note": "shared 2-core machine; seconds are noisy, bytes and agreement are not"}
    for part in parts:
        t0 = time.perf_counter()
        result[part] = runners[part](policy, args)
        result[part]["args"] = {k: v for k, v in vars(args).items() if k != "out"}
        result[part]["seconds"] = time.perf_counter() - t0
        result[part]["load_average_after"] = os.getloadavg()
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(result, indent=2) + "\n")
        log(f"{part} done in {result[part]['seconds']:.0f}s -> {out_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
