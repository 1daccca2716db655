"""Run metrics: one JSON object per line (``metrics.jsonl``) and a PNG of the reward / accuracy / length curves."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

# Wall-clock and memory figures differ between two runs of the same seed; everything else must match exactly.
# Wall-clock and memory readings; a component's own (``<stage>.<key>``) are matched on their last segment.
TIMING_KEYS = frozenset({"time_s", "gen_s", "train_s", "eval_s", "peak_rss_mb", "wall_s",
                         "draft_s", "verify_s", "distill_s"})


def without_timing(record: Any) -> Any:
    """``record`` less its wall-clock and memory readings, nested ones included (``rounds``): what two runs that
    computed the same thing agree on."""
    if isinstance(record, dict):
        return {k: without_timing(v) for k, v in record.items()
                if not (isinstance(k, str) and k.rsplit(".", 1)[-1] in TIMING_KEYS)}
    if isinstance(record, list):
        return [without_timing(v) for v in record]
    return record


class MetricsLog:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def read(self) -> list[dict[str, Any]]:
        if not self.path.is_file():
            return []
        out = []
        for line in self.path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # a line torn by a kill mid-write
                continue
        return out

    def truncate_after(self, step: int) -> None:
        """Keep only records up to ``step`` (resume from a checkpoint at that step)."""
        kept = [r for r in self.read() if int(r.get("step", -1)) <= step]
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
        os.replace(tmp, self.path)

    def write(self, record: dict[str, Any]) -> None:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        with open(self.path, "a") as fh:
            fh.write(json.dumps(clean) + "\n")
            fh.flush()


def plot_curves(records: list[dict[str, Any]], path: Path) -> Path | None:
    """Reward, held-out accuracy and response length against step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [r for r in records if r.get("kind") == "train" and r.get("reward_mean") is not None]
    evals = [r for r in records if r.get("kind") == "eval" and r.get("eval_accuracy") is not None]
    if not train and not evals:
        return None
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    axes[0].plot([r["step"] for r in train], [r["reward_mean"] for r in train], label="train base reward")
    if train and any(r.get("shaped_reward_mean") != r.get("reward_mean") for r in train):
        axes[0].plot([r["step"] for r in train], [r["shaped_reward_mean"] for r in train], label="shaped reward")
    axes[0].set_title("reward")
    axes[1].plot([r["step"] for r in evals], [r["eval_accuracy"] for r in evals], marker="o", label="held-out")
    axes[1].plot([r["step"] for r in train], [r["accuracy"] for r in train], alpha=0.5, label="train")
    axes[1].set_title("accuracy")
    axes[2].plot([r["step"] for r in train], [r["response_len_mean"] for r in train])
    axes[2].set_title("response length (tokens)")
    for ax in axes:
        ax.set_xlabel("step")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.subplots_adjust(left=0.05, right=0.99, bottom=0.15, top=0.9, wspace=0.25)
    path = Path(path)
    tmp = path.with_name(path.stem + ".tmp.png")
    fig.savefig(tmp, dpi=90)
    plt.close(fig)
    os.replace(tmp, path)
    return path
