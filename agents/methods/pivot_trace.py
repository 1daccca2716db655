"""PivotTrace (seed 004): three-way triage of unlabeled prompts by the uncertainty a few rollouts show. Stage:
RewardShaper (``pivot_trace``, stateful: the labels it has spent).

"Pick in the dark": the training prompts are unlabeled until the method decides to pay for a label. Each step, every
group's uncertainty is its pivot density, the mean over its responses of

    u_i = (pivot_i + spikes_i) / L_i

with ``pivot_i`` the matches of ``pivot_pattern`` in the response (metacognitive pivots: "Wait", "But",
"Alternatively", ...), ``spikes_i`` its tokens whose sampling entropy exceeds the response's mean by ``spike_z`` of
its standard deviations, ``L_i`` its length in tokens. The step's groups are ranked by it and triaged:

- the ``pseudo_frac`` least uncertain: **self-consistency pseudo-label**: reward 1 for a response whose parsed answer
  is the group's majority answer, else 0 (no label read);
- the ``skip_frac`` most uncertain: **skip**: every reward 0, so the group has no advantage (no label read);
- the rest: **annotate + RLVR**: the env's verified reward (one label bought per group).

Our reading (each a hyper-parameter):
- the "few rollouts" the uncertainty is measured on are the group's own rollouts, so triage costs no extra generation
  and acts after generation (the paper's selector decides before RLVR; a skipped group here has still been sampled).
  The rollout budget is therefore the same as GRPO's and the comparison reads how fast each learns per rollout.
- "attention dynamics" (the paper's pivot detector) is read as text pivots plus entropy spikes: both are visible in a
  rollout without the model's attention maps. The micro lane's traces have no pivot words; its pivots are the
  entropy spikes (and a lane may set ``pivot_pattern`` to its backtracking marker).
- the majority answer is the most common non-empty parsed answer of the group (ties: the first seen); a group whose
  responses parse to nothing gets reward 0 throughout.
- triage fractions are per step, by rank (round(frac * groups), at least one group annotated when any is left):
  ``labels_used`` is the share of groups that read their label; the default 0.5 / 0.2 spends ~30% of labels, about
  the paper's 29.3%.
- ``pseudo_agreement`` (a metric only, never a reward) reads the gold label to report how often the pseudo-label was
  right.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Any

import torch

from agents.grpo.batch import GroupBatch
from agents.grpo.comparisons import Comparison, declare
from agents.grpo.registry import Component, register

DEFAULT_PIVOTS = r"\b(?:Wait|But|Alternatively|Hmm|However|Actually|Hold on|Let me re(?:check|consider))\b"
TRIAGE = ("pseudo", "annotate", "skip")


def pivot_density(text: str, entropies: torch.Tensor, length: int, pattern: re.Pattern, spike_z: float) -> float:
    """``(pivot matches + entropy spikes) / length`` of one response (0 for an empty one)."""
    if length <= 0:
        return 0.0
    h = entropies[:length].double()
    spikes = int((h > h.mean() + spike_z * h.std(unbiased=False)).sum()) if length > 1 else 0
    return (len(pattern.findall(text)) + spikes) / length


def triage(uncertainty: list[float], pseudo_frac: float, skip_frac: float) -> list[str]:
    """Each group's decision by its rank (least uncertain first; ties by position)."""
    n = len(uncertainty)
    order = sorted(range(n), key=lambda k: (uncertainty[k], k))
    n_pseudo, n_skip = round(pseudo_frac * n), round(skip_frac * n)
    if n and n_pseudo + n_skip >= n:  # leave one group annotated
        n_skip = max(0, n - n_pseudo - 1)
        n_pseudo = min(n_pseudo, n - n_skip - 1) if n > 1 else 0
    out = ["annotate"] * n
    for k in order[:n_pseudo]:
        out[k] = "pseudo"
    for k in order[n - n_skip:] if n_skip else []:
        out[k] = "skip"
    return out


def majority(answers: list[Any]) -> Any:
    known = [a for a in answers if a not in (None, "")]
    return Counter(map(str, known)).most_common(1)[0][0] if known else None


@register("pivot_trace", stage="reward_shaper")
class PivotTrace(Component):
    def __init__(self, pseudo_frac: float = 0.5, skip_frac: float = 0.2, spike_z: float = 2.0,
                 pivot_pattern: str = DEFAULT_PIVOTS):
        for key, value in (("pseudo_frac", pseudo_frac), ("skip_frac", skip_frac)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
                raise ValueError(f"pivot_trace: {key} must be in [0, 1], got {value!r}")
        if pseudo_frac + skip_frac > 1:
            raise ValueError(f"pivot_trace: pseudo_frac + skip_frac must be <= 1, got {pseudo_frac + skip_frac}")
        if not math.isfinite(spike_z):
            raise ValueError(f"pivot_trace: spike_z must be finite, got {spike_z!r}")
        try:
            self.pattern = re.compile(pivot_pattern)
        except re.error as exc:
            raise ValueError(f"pivot_trace: pivot_pattern {pivot_pattern!r} is not a regular expression: {exc}") from None
        self.pseudo_frac, self.skip_frac, self.spike_z = float(pseudo_frac), float(skip_frac), float(spike_z)
        self.counts = {t: 0 for t in TRIAGE}  # groups per decision, over the run
        self._step: dict[str, float] = {}

    def __call__(self, batch: GroupBatch) -> torch.Tensor:
        lengths = batch.response_lengths.tolist()
        density = [pivot_density(batch.texts[i], batch.entropies[i], int(lengths[i]), self.pattern, self.spike_z)
                   for i in range(len(batch))]
        groups = list(dict.fromkeys(batch.group_ids))
        members = {g: [i for i, gid in enumerate(batch.group_ids) if gid == g] for g in groups}
        uncertainty = [sum(density[i] for i in members[g]) / len(members[g]) for g in groups]
        decisions = triage(uncertainty, self.pseudo_frac, self.skip_frac)
        rewards = batch.rewards.double().clone()
        agree = pseudo_rows = 0
        for g, decision in zip(groups, decisions):
            rows = members[g]
            self.counts[decision] += 1
            if decision == "skip":
                rewards[rows] = 0.0
            elif decision == "pseudo":
                vote = majority([batch.infos[i].get("parsed_answer") for i in rows])
                for i in rows:
                    parsed = batch.infos[i].get("parsed_answer")
                    rewards[i] = float(vote is not None and parsed not in (None, "") and str(parsed) == vote)
                    agree += int(bool(rewards[i] > 0) == bool(batch.correct[i]))
                    pseudo_rows += 1
        total = sum(self.counts.values())
        self._step = {"labels_used": self.counts["annotate"] / max(1, total),
                      "step_labels": decisions.count("annotate") / max(1, len(groups)),
                      "uncertainty_mean": sum(uncertainty) / max(1, len(uncertainty))}
        if pseudo_rows:
            self._step["pseudo_agreement"] = agree / pseudo_rows
        return rewards.float()

    def metrics(self) -> dict[str, float]:
        out, self._step = self._step, {}
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"counts": dict(self.counts)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.counts = {t: int(state["counts"].get(t, 0)) for t in TRIAGE}


declare(Comparison(
    method="pivot_trace", baseline="grpo", metric="rollouts_to_target", direction="lower",
    known_result=(
        "micro lane at HEAD keys, seeds 0-4 (2026-12-07): PivotTrace reached start + 0.10 on 1 of 5 seeds (seed 0, "
        "10,240 rollouts; 4 censored at 15,360) while GRPO did after 5,120-7,680: 14,336 vs 6,656 rollouts, diff "
        "+7,680 [95% t +5,432, +9,928]: not reproduced; final mean@4 on 1,000 tasks 0.343 vs 0.434. Earlier, seeds "
        "0-2 (2026-12-04): it read 31.25% of the labels (paper 29.3%) and never reached the target, not reproduced. Final mean@4 0.315 vs 0.470; its self-consistency pseudo-labels "
        "agreed with the gold answer 0.45-0.61 of the time at the last step"),
    claim="PivotTrace surpasses the fully supervised model with only 29.3% of the labels and 2.75x faster convergence "
          "(read: rollouts until held-out accuracy first gains 0.10, lower than GRPO with every label; labels used "
          "are in the runs' reward_shaper.labels_used)"))
