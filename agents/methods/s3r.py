"""S3R self-sparse speculative rollouts (seed 003). Stage: GenerationController (``s3r``).

The rollouts of a step are decoded by the ``hf`` engine with S3R (``agents.policy.s3r``): drafts from sparse
attention (sinks + recent window + top-k keys) with the policy's own weights, verified by one dense forward per round,
accepted with the speculative-sampling rule. The samples are exact draws from the dense policy, so the trainer sees
the same distribution of rollouts as without the controller; what changes is the wall-clock per token. A KV budget
(``kv_budget_tokens``) caps how many sequences decode together (the paper's KV-aware scheduler).

Per step it reports ``acceptance_rate`` (accepted / drafted tokens), ``tokens_per_row_round`` (tokens a sequence gets
per verify forward) and the draft / verify seconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agents.grpo.comparisons import Comparison, declare
from agents.grpo.registry import Component, register
from agents.policy.engine import HFEngine, engine_options
from agents.policy.s3r import S3RConfig, S3RStats


@register("s3r", stage="generation_controller")
class S3RGeneration(Component):
    def __init__(self, k: int = 4, sinks: int = 4, window: int = 64, topk: int = 64,
                 kv_budget_tokens: int | None = None, compact_fraction: float = 0.25):
        self.config = S3RConfig(k=int(k), sinks=int(sinks), window=int(window), topk=int(topk),
                                kv_budget_tokens=None if kv_budget_tokens is None else int(kv_budget_tokens),
                                compact_fraction=float(compact_fraction))
        self.step_stats = S3RStats()  # since the last metrics()
        self.drafted = self.accepted = 0  # over the run (checkpointed)

    def sampling(self, sampling: Any, step: int) -> Any:
        return sampling

    def generate(self, engine: Any, prompts: Sequence[str], n: int, sampling: Any) -> list[Any]:
        if not isinstance(engine, HFEngine):
            raise TypeError(f"generation controller s3r decodes with the hf engine, got {type(engine).__name__} "
                            f"(vLLM has its own speculative decoding)")
        # the trainer's engine, switched to S3R for this call only: it keeps its weights' derived copies and the
        # trainer's sync_weights calls
        with engine_options(engine, speculative=self.config, speculative_stats=S3RStats()):
            rollouts = engine.generate(prompts, n, sampling)
            stats = engine.speculative_stats
        for key, value in stats.__dict__.items():
            setattr(self.step_stats, key, getattr(self.step_stats, key) + value if key != "peak_rows"
                    else max(self.step_stats.peak_rows, value))
        self.drafted += stats.drafted
        self.accepted += stats.accepted
        return rollouts

    def metrics(self) -> dict[str, float]:
        s = self.step_stats.to_dict()
        self.step_stats = S3RStats()
        return {"acceptance_rate": s["acceptance_rate"], "tokens_per_row_round": s["tokens_per_row_round"],
                "draft_s": s["draft_s"], "verify_s": s["verify_s"], "peak_rows": float(s["peak_rows"]),
                "acceptance_rate_run": self.accepted / self.drafted if self.drafted else 0.0}

    def state_dict(self) -> dict[str, Any]:
        return {"drafted": self.drafted, "accepted": self.accepted}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.drafted, self.accepted = int(state["drafted"]), int(state["accepted"])


declare(Comparison(
    method="s3r", baseline="grpo", metric="wall_to_target", direction="lower",
    known_result=(
        "micro lane, seeds 0-2 (2026-12-05, recipe k=4, 4 sinks + 16 recent + top 8 keys): wall to start+0.10 377 vs "
        "GRPO 367 s, diff +10.7 [95% -126, +148]: not reproduced. Drafts were accepted 94.5% of the time (4.8 tokens "
        "per dense verify) and accuracy did not move (final mean@4 0.460 vs 0.470), but generation took 1.43x longer "
        "(340 vs 240 s per run: 178 s drafting + 84 s verifying). A draft step cost about what a dense step does (4 "
        "draft forwards per 4.8 tokens took 178 s; dense decoding, one forward per token, 240 s with prefill): the "
        "emulated sparse attention reads every key to rank them, and at these contexts (at most ~230 keys) linear "
        "products, not attention, bound a step"),
    claim="self-sparse speculative rollouts (sparse drafts with the same weights, dense verify, exact samples) raise "
          "RL training throughput 1.35-1.39x (read: seconds of generation + update until held-out accuracy reaches "
          "start + 0.10; the samples are exact draws from the dense policy, so accuracy should not move)"))
