"""Training recipes: TOML files naming one component per stage plus hyper-parameters, with ``--set key=value``.

Top-level keys are the run's settings (``TrainConfig``); ``[stages]`` names a component per stage; ``[params.<stage>]``
holds that component's hyper-parameters. ``--set`` takes dotted keys (``model=tiny``, ``stages.advantage=dr_grpo``,
``params.loss.clip_high=0.3``); values parse as TOML (``3``, ``1e-5``, ``true``, ``"x"``, ``[1, 2]``) and fall back to a
plain string.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from agents.grpo.registry import STAGES

RECIPES_DIR = Path(__file__).resolve().parent.parent / "recipes"
LANES_DIR = Path(__file__).resolve().parent.parent / "lanes"
# What a lane fixes: every top-level key it sets replaces the recipe's (tables whole); stages and their params stay
# the recipe's. A lane may not set these: they are the method's.
LANE_FORBIDDEN = frozenset({"stages", "params", "seed"})

DEFAULT_STAGES = {
    "prompt_selector": "random", "rollout_allocator": "fixed", "generation_controller": "none",
    "group_transform": "none", "reward_shaper": "none", "advantage": "grpo", "loss": "grpo",
    "replay_buffer": "none", "aggregator": "none", "orchestrator": "single",
}


@dataclass
class TrainConfig:
    description: str = ""
    lane: str = ""  # the lane this run was put on (agents/lanes/<lane>.toml), "" for a bare recipe
    model: str = "smollm2"  # load_policy name: "smollm2", "tiny", an HF id or a path
    engine: str = "hf"
    env: str = "rlvr/Arithmetic-v0"
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    eval_env_kwargs: dict[str, Any] = field(default_factory=lambda: {"seed_base": 1})  # held-out split
    steps: int = 50
    seed: int = 0
    # Train on the first `train_pool` tasks of the env only (0 = all of them): a finite training set that prompts
    # recur in, as in multi-epoch RLVR on a fixed data set; history-based selectors and replay need recurring prompts.
    train_pool: int = 0
    # Stop once generation + training FLOPs (agents.grpo.flops) reach this many (0 = no budget); the step that crosses
    # it is the last, with the final eval and checkpoint.
    flop_budget: float = 0.0
    prompts_per_step: int = 8
    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    lr: float = 1e-5
    weight_decay: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    max_grad_norm: float = 1.0
    train_layers: int = 2  # train the last N transformer layers (+ final norm); -1 = every parameter
    micro_batch: int = 8  # rows per forward/backward; the loss is normalized by the whole batch
    ppo_epochs: int = 1  # optimizer steps per batch (>1 recomputes old log-probs first)
    refill_rounds: int = 0  # extra generation rounds when a group transform drops groups (DAPO)
    kl_reference: bool = False  # keep a frozen copy of the start policy and store ref log-probs in the batch
    eval_every: int = 10  # 0 = only before and after
    eval_size: int = 64
    # the last eval reads this many held-out tasks (0: eval_size). Intermediate evals stay at eval_size (the curves);
    # the final accuracy a comparison reads comes from the larger set, so eval noise stays small next to seed noise.
    # The last eval record's own eval_* fields still cover the first eval_size tasks, as every other eval's do.
    final_eval_size: int = 0
    # torch intra-op threads for the whole run (0: leave the process's setting). CPU kernels split reductions by
    # thread count, so a run is bit-exact across processes only at a fixed count: lanes pin it (and it is keyed).
    threads: int = 0
    eval_max_new_tokens: int | None = None
    eval_temperature: float = 0.0  # 0 = greedy; a lane may evaluate at its sampling temperature instead
    eval_samples: int = 1  # samples per held-out task (eval_accuracy = mean over them: mean@k)
    checkpoint_every: int = 10
    keep_checkpoints: int = 1
    out_dir: str = "runs/grpo"
    # "auto": bf16 autocast (fp32 master weights) for training and bf16 decoding weights where the hardware multiplies
    # bf16 (AMX / AVX512-BF16 CPUs, bf16 GPUs), fp32 elsewhere; "fp32" / "bf16" force one (agents.policy.fastpath).
    precision: str = "auto"
    logprob_chunk: int = 64
    dtype: str = "float32"
    progress: bool = True
    plot: bool = True  # curves.png at the end of the run
    # multi-turn envs (agents/grpo/multiturn.py): warn when a step's share of episodes with any tool call or search
    # falls below this (0 = never)
    tool_use_warn_below: float = 0.05
    stages: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_STAGES))
    params: dict[str, dict[str, Any]] = field(default_factory=dict)

    def validate(self) -> None:
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**32:
            raise ValueError(f"seed must be an integer in [0, 2**32), got {self.seed!r}")
        unknown = set(self.stages) - set(STAGES)
        if unknown:
            raise ValueError(f"unknown stage(s) {sorted(unknown)} in [stages]; stages: {', '.join(STAGES)}")
        from agents.policy.fastpath import PRECISIONS

        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        unknown = set(self.params) - set(STAGES)
        if unknown:
            raise ValueError(f"unknown stage(s) {sorted(unknown)} in [params]; stages: {', '.join(STAGES)}")
        if self.eval_temperature < 0 or (self.eval_temperature == 0 and self.eval_samples > 1):
            raise ValueError(f"eval_samples={self.eval_samples} at eval_temperature={self.eval_temperature}: greedy "
                             "samples are all the same; use eval_samples=1 or a temperature > 0")
        if not 0.0 <= self.tool_use_warn_below <= 1.0:
            raise ValueError(f"tool_use_warn_below must be in [0, 1], got {self.tool_use_warn_below}")
        if self.flop_budget < 0 or self.train_pool < 0:
            raise ValueError(f"flop_budget and train_pool must be >= 0, got {self.flop_budget}, {self.train_pool}")
        for name, lo in (("steps", 0), ("eval_samples", 1), ("prompts_per_step", 1), ("max_new_tokens", 1), ("micro_batch", 1),
                         ("ppo_epochs", 1), ("eval_size", 0), ("final_eval_size", 0), ("threads", 0), ("checkpoint_every", 0), ("keep_checkpoints", 1)):
            if int(getattr(self, name)) < lo:
                raise ValueError(f"{name} must be >= {lo}, got {getattr(self, name)}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def parse_value(text: str) -> Any:
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_override(data: dict[str, Any], assignment: str) -> None:
    key, sep, value = assignment.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"--set expects key=value, got {assignment!r}")
    parts = key.strip().split(".")
    node = data
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ValueError(f"--set {key}: {p!r} is not a table")
    node[parts[-1]] = parse_value(value.strip())


def resolve_recipe(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.is_file():
        return path
    candidate = RECIPES_DIR / f"{name_or_path.removesuffix('.toml')}.toml"
    if candidate.is_file():
        return candidate
    known = ", ".join(sorted(p.stem for p in RECIPES_DIR.glob("*.toml")))
    raise FileNotFoundError(f"no recipe {name_or_path!r} (not a file; built-in recipes: {known})")


def list_recipes() -> list[str]:
    return sorted(p.stem for p in RECIPES_DIR.glob("*.toml"))


def from_dict(data: dict[str, Any]) -> TrainConfig:
    data = dict(data)
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    unknown = set(data) - known
    if "bf16" in unknown:
        raise ValueError("recipe key 'bf16' was replaced by precision = \"auto\" | \"bf16\" | \"fp32\"")
    if unknown:
        raise ValueError(f"unknown recipe key(s) {sorted(unknown)}; known: {', '.join(sorted(known))}")
    stages = dict(DEFAULT_STAGES)
    stages.update(data.pop("stages", {}) or {})
    cfg = TrainConfig(**data, stages=stages)
    cfg.validate()
    return cfg


def list_lanes() -> list[str]:
    return sorted(p.stem for p in LANES_DIR.glob("*.toml"))


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: not valid TOML: {exc}") from None


def load_lane(name_or_path: str) -> dict[str, Any]:
    """A lane's settings (``agents/lanes/<name>.toml`` or a path)."""
    path = Path(name_or_path)
    if not path.is_file():
        path = LANES_DIR / f"{name_or_path.removesuffix('.toml')}.toml"
    if not path.is_file():
        raise FileNotFoundError(f"no lane {name_or_path!r} (lanes: {', '.join(list_lanes())})")
    data = _read_toml(path)
    bad = sorted(set(data) & LANE_FORBIDDEN)
    if bad:
        raise ValueError(f"{path}: a lane may not set {bad} (those belong to the method's recipe)")
    return data


def apply_lane(recipe: dict[str, Any], lane: str, recipe_name: str) -> dict[str, Any]:
    """The recipe with the lane's settings in place: the lane's keys win, the run goes to ``runs/<lane>/<recipe>``."""
    settings = load_lane(lane)
    out = dict(recipe)
    method = str(recipe.get("description", recipe_name))
    out.update({k: v for k, v in settings.items() if k != "description"})
    out["lane"] = Path(lane).stem
    out["description"] = f"{method} [{settings.get('description', out['lane'])}]"
    out["out_dir"] = f"runs/{out['lane']}/{recipe_name}"
    return out


def load_recipe(name_or_path: str, overrides: list[str] | None = None, *, lane: str | None = None) -> TrainConfig:
    """A recipe, put on ``lane`` if given, then ``overrides`` (``key=value``) on top of both."""
    path = resolve_recipe(name_or_path)
    data = _read_toml(path)
    if lane:
        data = apply_lane(data, lane, path.stem)
    for assignment in overrides or []:
        apply_override(data, assignment)
    return from_dict(data)
