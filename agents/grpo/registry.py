"""Stage registries of the GRPO core.

Each stage of the training step is a registry of named components (``@register("grpo", stage="advantage")``). A
recipe names one component per stage; the trainer builds them with the recipe's hyper-parameters and calls them in a
fixed order. Duplicate names in a stage are rejected (as verl's ``core_algos`` registries do) so two methods can never
silently shadow each other; other distributions add components through the ``rlvr_envs.components`` entry point
(``rlvr_envs/plugins.py``), loaded with the built-ins. Every component gets the whole ``GroupBatch`` and carries its own state in
``state_dict()`` / ``load_state_dict()`` so a checkpoint restores it exactly.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

# Stage key -> the role's name in the design notes. The order is the order the trainer walks them.
STAGES: dict[str, str] = {
    "prompt_selector": "PromptSelector",
    "rollout_allocator": "RolloutAllocator",
    "generation_controller": "GenerationController",
    "group_transform": "GroupTransform",
    "reward_shaper": "RewardShaper",
    "advantage": "AdvantageEstimator",
    "loss": "Loss",
    "replay_buffer": "ReplayBuffer",
    "aggregator": "Aggregator",
    "orchestrator": "Orchestrator",
}

_REGISTRY: dict[str, dict[str, type[Component]]] = {stage: {} for stage in STAGES}

C = TypeVar("C", bound="type[Component]")


class RegistryError(KeyError):
    """A duplicate or unknown component name."""

    def __str__(self) -> str:  # KeyError quotes its message; this one is meant to be read
        return str(self.args[0])


class Component:
    """Base of every stage component. Hyper-parameters are keyword arguments of ``__init__``.

    ``observe(batch)`` is called with the finished batch of every step (history for stateful components),
    ``observe_rollouts(batch, wall_s)`` after every generation call, ``metrics()`` when the step is logged.
    ``state_dict`` returns plain data (numbers, lists, dicts, numpy RNG states) that ``load_state_dict`` restores.
    """

    stage: str = ""
    name: str = ""

    def observe(self, batch: Any) -> None:
        """Called once per step with the final batch; stateless components ignore it."""

    def observe_rollouts(self, batch: Any, wall_s: float) -> None:
        """Called after every generation call with the rollouts it produced (before any group transform drops
        groups) and its wall-clock seconds: what allocators learn pass rates, lengths and stragglers from."""

    def bind(self, services: Any) -> None:
        """Called once by the trainer before training. ``services.logprobs(batch, rows)`` gives the current policy's
        log-probs ``(len(rows), W)`` without gradients (counted in the run's FLOPs); ``services.generate(prompts, n,
        max_new_tokens=, temperature=, seed=)`` samples extra rollouts from text or token-id prompts (continuations
        from a prefix; counted in FLOPs and ``extra_tokens``); ``services.context_logprobs(batch, prompt_ids, rows)``
        gives the rows' response log-probs under other prompts (a hint, feedback), without gradients;
        ``services.prompt_text(messages)`` renders chat messages with the policy's template; ``services.tokenizer`` is
        the policy's tokenizer; ``services.cfg`` is the run's config. Components that need none of them ignore it.
        A Loss with ``teacher_prompt_ids(batch, rows)`` is called with ``context=`` the rows' statistics under those
        prompts as well (``agents.grpo.distill.ContextStats``: the teacher's token log-probs and divergences)."""

    def metrics(self) -> dict[str, float]:
        """Numbers for this step's train record (written as ``<stage>.<key>``); read after ``observe``."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            raise ValueError(f"{self.stage}/{self.name}: stateless component got state {sorted(state)}")

    def describe(self) -> dict[str, Any]:
        return {"stage": self.stage, "name": self.name}


class SeededComponent(Component):
    """A component with its own numpy generator (never the global state), saved in its state."""

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)

    def state_dict(self) -> dict[str, Any]:
        return {"rng": copy.deepcopy(self.rng.bit_generator.state)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.bit_generator.state = state["rng"]


def register(name: str, *, stage: str) -> Callable[[C], C]:
    """Class decorator adding a component to a stage registry; a second component under the same name is an error."""
    if stage not in _REGISTRY:
        raise RegistryError(f"unknown stage {stage!r}; stages: {', '.join(STAGES)}")

    def wrap(cls: C) -> C:
        table = _REGISTRY[stage]
        if name in table:
            other = table[name]
            raise RegistryError(
                f"{stage}: name {name!r} is already registered by {other.__module__}.{other.__qualname__}; "
                f"cannot register {cls.__module__}.{cls.__qualname__}")
        cls.stage, cls.name = stage, name
        table[name] = cls
        return cls

    return wrap


def unregister(name: str, *, stage: str) -> None:
    """Remove a component (tests only)."""
    _REGISTRY[stage].pop(name, None)


def get(stage: str, name: str) -> type[Component]:
    load_builtin()
    if stage not in _REGISTRY:
        raise RegistryError(f"unknown stage {stage!r}; stages: {', '.join(STAGES)}")
    try:
        return _REGISTRY[stage][name]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY[stage])) or "(none)"
        raise RegistryError(f"{stage}: no component named {name!r}; registered: {known}") from None


def build(stage: str, name: str, params: dict[str, Any] | None = None) -> Component:
    cls = get(stage, name)
    try:
        return cls(**(params or {}))
    except TypeError as exc:
        raise TypeError(f"{stage}/{name}: bad hyper-parameters {sorted(params or {})}: {exc}") from None


def names(stage: str | None = None) -> dict[str, list[str]]:
    """Registered names per stage (what ``rlvr train --list`` prints)."""
    load_builtin()
    stages = [stage] if stage else list(STAGES)
    return {s: sorted(_REGISTRY[s]) for s in stages}


def package_of(stage: str, name: str) -> str:
    """The distribution that registered a component: ``rlvr-envs`` for the built-ins, else the plugin's."""
    return _PLUGIN_PACKAGES.get((stage, name), "rlvr-envs")


_loaded = False
_PLUGIN_PACKAGES: dict[tuple[str, str], str] = {}  # (stage, name) -> distribution, for components from plugins


def load_builtin() -> None:
    """Import the baselines and every method file so their decorators run (each module registers itself once),
    then the component plugins."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    import importlib
    import pkgutil

    import agents.grpo.baselines  # noqa: F401
    import agents.methods

    for mod in pkgutil.iter_modules(agents.methods.__path__):
        importlib.import_module(f"agents.methods.{mod.name}")
    load_plugins()


def load_plugins() -> None:
    """Import every ``rlvr_envs.components`` entry point not loaded yet; a broken one warns and is skipped (a name
    clash with a registered component is a ``RegistryError`` inside it, so it is skipped the same way)."""
    from rlvr_envs.plugins import COMPONENT_GROUP, call_if_function, guard, new_entry_points

    for plugin, ep in new_entry_points(COMPONENT_GROUP):
        before = {(stage, name) for stage, table in _REGISTRY.items() for name in table}
        with guard(plugin):
            call_if_function(ep.load())  # the import runs the plugin's @register decorators
        for key in {(stage, name) for stage, table in _REGISTRY.items() for name in table} - before:
            _PLUGIN_PACKAGES[key] = plugin.distribution
