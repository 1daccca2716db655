"""One process of the training-step benchmark (issue 8's reference workload), run by ``test_bench_fastpath.py``.

Workload: SmolLM2-135M, every parameter trained, 8 sequences of 64 prompt + 192 response tokens (token ids drawn from
a fixed generator), PPO-clip loss (eps 0.2, per-sequence advantages, token mean) against fixed "old" log-probs that
differ from the current ones (so ratios move and some clip), AdamW (lr 1e-6).

- ``naive``: ``model(input_ids).logits`` over all positions, fp32 ``log_softmax`` of the response positions, gather,
  loss, backward, ``torch.optim.AdamW`` with its default (foreach) implementation. What a plain training loop does.
- ``fast``: what ``agents.grpo`` runs: ``response_logprobs`` (length buckets, chunked fused head, no full logits),
  bf16 autocast when ``resolve_precision("auto")`` says the CPU multiplies bf16 (fp32 otherwise), fused AdamW.
- ``compare``: loss and gradient of both on the same weights and batch (no optimizer step): relative loss difference,
  cosine similarity and relative error (L2) of the flattened gradients, against the naive fp32 step. With bf16 the
  same three figures (``autocast_*``) also against the naive step under the same bf16 autocast, which separates
  what bf16 itself costs from what the fast path adds.

- ``interleaved``: naive and fast steps alternate in one process (same weights; each has its own AdamW), so that the
  slow phases of a shared machine hit both alike.

Timing and memory: ``--steps`` timed steps (rounds) after one warm-up; prints one JSON line with every step's wall and
CPU (user + system) time and the process's peak RSS (``naive`` and ``fast`` alone give each path's own peak).
``--profile`` adds one profiled step per path with its time per region and top operators. Run it alone:
``python benchmarks/fastpath_step.py interleaved --steps 3 --profile``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from agents.grpo.logprobs import response_logprobs  # noqa: E402
from agents.policy import load_policy  # noqa: E402
from agents.policy.fastpath import resolve_precision  # noqa: E402

ROWS, PROMPT, RESPONSE = 8, 64, 192


def workload(vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Token ids (B, P+R), per-row advantages (B, 1) and old log-probs (B, R): fixed by a seeded generator."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (ROWS, PROMPT + RESPONSE), generator=g)
    adv = torch.randn(ROWS, 1, generator=g)
    # old = current - N(0, 0.1)-ish shift: filled in from the first forward (see ppo_loss)
    shift = 0.1 * torch.randn(ROWS, RESPONSE, generator=g)
    return ids, adv, shift


def ppo_loss(lp: torch.Tensor, old: torch.Tensor, adv: torch.Tensor) -> torch.Tensor:
    ratio = torch.exp(lp - old)
    return torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2)).mean()


def naive_logprobs(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=ids).logits
    lp = torch.log_softmax(logits[:, PROMPT - 1:-1].float(), -1)
    return lp.gather(-1, ids[:, PROMPT:].unsqueeze(-1)).squeeze(-1)


def fast_logprobs(model: torch.nn.Module, ids: torch.Tensor, bf16: bool) -> torch.Tensor:
    prompts = [row[:PROMPT].tolist() for row in ids]
    responses = [row[PROMPT:].tolist() for row in ids]
    lp, _ = response_logprobs(model, prompts, responses, autocast_bf16=bf16)
    return lp


def profile_step(model: torch.nn.Module, ids: torch.Tensor, old: torch.Tensor, adv: torch.Tensor,
                 optimizer: torch.optim.Optimizer, mode: str, bf16: bool) -> None:
    """One more step under the torch profiler: time per region and the top operators (self CPU time)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    regions = ("1 log-probs (forward)", "2 loss", "3 backward", "4 optimizer")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        with record_function(regions[0]):
            lp = naive_logprobs(model, ids) if mode == "naive" else fast_logprobs(model, ids, bf16)
        with record_function(regions[1]):
            loss = ppo_loss(lp, old, adv)
        with record_function(regions[2]):
            loss.backward()
        with record_function(regions[3]):
            optimizer.step()
        wall = time.perf_counter() - t0
    averages = prof.key_averages()
    print(f"# {mode}: profiled step {wall:.2f} s (profiler overhead included)")
    for event in sorted((e for e in averages if e.key in regions), key=lambda e: e.key):
        print(f"#   {event.key:24s} {event.cpu_time_total / 1e6:6.2f} s")
    print("#   top operators by self CPU time:")
    for event in sorted(averages, key=lambda e: -e.self_cpu_time_total)[:12]:
        if event.key not in regions:
            print(f"#     {event.key:44s} {event.self_cpu_time_total / 1e6:6.2f} s  x{event.count}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["naive", "fast", "compare", "interleaved"])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--profile", action="store_true", help="profile one more step; print where its time goes")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = load_policy("smollm2").model
    model.train()
    for p in model.parameters():
        p.requires_grad_(True)
    bf16 = resolve_precision(args.precision, "cpu") == "bf16"
    ids, adv, shift = workload(model.config.vocab_size)
    with torch.no_grad():
        old = naive_logprobs(model, ids) - shift
    params = [p for p in model.parameters() if p.requires_grad]
    rss_loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if args.mode == "compare":
        out = {"mode": "compare", "bf16": bf16}
        grads = {}
        for name in ("naive", "fast") + (("naive_autocast",) if bf16 else ()):
            model.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=name == "naive_autocast"):
                lp = fast_logprobs(model, ids, bf16) if name == "fast" else naive_logprobs(model, ids)
            loss = ppo_loss(lp, old, adv)
            loss.backward()
            out[f"loss_{name}"] = float(loss.detach())
            grads[name] = torch.cat([p.grad.flatten().double() for p in params])
        for prefix, ref in (("", "naive"), ("autocast_", "naive_autocast")):
            if ref not in grads:
                continue
            out[f"{prefix}loss_rel_diff"] = (abs(out["loss_fast"] - out[f"loss_{ref}"])
                                             / max(1e-12, abs(out[f"loss_{ref}"])))
            out[f"{prefix}grad_cosine"] = float(torch.nn.functional.cosine_similarity(grads[ref], grads["fast"], dim=0))
            out[f"{prefix}grad_rel_err"] = float((grads["fast"] - grads[ref]).norm() / grads[ref].norm())
        print(json.dumps(out), flush=True)
        return
    optimizers = {m: torch.optim.AdamW(params, lr=1e-6, fused=m == "fast") for m in ("naive", "fast")}

    def step(mode: str) -> tuple[float, float]:
        wall, cpu = time.perf_counter(), os.times()
        optimizers[mode].zero_grad(set_to_none=True)
        lp = naive_logprobs(model, ids) if mode == "naive" else fast_logprobs(model, ids, bf16)
        ppo_loss(lp, old, adv).backward()
        optimizers[mode].step()
        end = os.times()
        return time.perf_counter() - wall, (end.user + end.system) - (cpu.user + cpu.system)

    # "interleaved" alternates naive and fast steps (A/B at step granularity, so that a slow phase of a shared
    # machine hits both); a single mode times only itself (its peak RSS is then its own).
    modes = ("naive", "fast") if args.mode == "interleaved" else (args.mode,)
    times: dict[str, list[float]] = {m: [] for m in modes}
    cpu_times: dict[str, list[float]] = {m: [] for m in modes}
    for round_ in range(args.steps + 1):
        for mode in modes:
            wall, cpu = step(mode)
            if round_:  # the first round warms caches and allocator pools
                times[mode].append(wall)
                cpu_times[mode].append(cpu)
    if args.profile:
        for mode in modes:
            profile_step(model, ids, old, adv, optimizers[mode], mode, bf16)
    print(json.dumps({"mode": args.mode, "bf16": bf16, "threads": args.threads, "step_s": times, "cpu_s": cpu_times,
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "rss_after_load_mb": rss_loaded}), flush=True)


if __name__ == "__main__":
    main()
