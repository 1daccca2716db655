"""Third-party environments and GRPO components, found through entry points.

A distribution declares them in its ``pyproject.toml``::

    [project.entry-points."rlvr_envs.envs"]
    myenvs = "my_pkg.rlvr:ENVS"            # a list of EnvEntry rows, or a function of no arguments returning one

    [project.entry-points."rlvr_envs.components"]
    mycomponents = "my_pkg.components"     # a module whose import registers components (@register(name, stage=))
                                           # (or a function of no arguments that registers them when called)

``rlvr_envs.envs`` plugins load on ``import rlvr_envs``: their rows join the table (``rlvr list`` shows the
distribution in the ``package`` column) and are registered with Gymnasium like the built-in ones. Keep the module the
entry point names light, with string ``entry_point``s, so the env classes import only at ``gymnasium.make``: it runs
during ``import rlvr_envs``, and a heavy import there slows every user. ``rlvr_envs.components`` plugins load the first
time the GRPO registries are used (``rlvr train``, ``agents.grpo.registry.get``/``names``).

Each entry point loads at most once per process. One that fails (an import error, a bad row, an ID or component name
already taken) is skipped with a ``PluginWarning`` naming its distribution and the error; the rest load normally.
``RLVR_NO_PLUGINS=1`` turns plugin loading off (to rule a plugin out while debugging).
"""

from __future__ import annotations

import contextlib
import inspect
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

ENV_GROUP = "rlvr_envs.envs"
COMPONENT_GROUP = "rlvr_envs.components"
DISABLE_VAR = "RLVR_NO_PLUGINS"


class PluginWarning(RuntimeWarning):
    """A plugin failed to load and was skipped."""


@dataclass(frozen=True)
class Plugin:
    group: str
    name: str  # the entry point's name
    value: str  # "module" or "module:attr"
    distribution: str  # the installed distribution that declares it (what `pip install` named)


# (group, distribution, entry point name) of every entry point tried in this process, loaded or failed.
_tried: set[tuple[str, str, str]] = set()
_loaded: list[Plugin] = []


def disabled() -> bool:
    return os.environ.get(DISABLE_VAR, "") not in ("", "0", "false")


def _distribution_name(ep: Any) -> str:
    dist = getattr(ep, "dist", None)
    name = getattr(dist, "name", None) if dist is not None else None
    return str(name) if name else "unknown distribution"


def new_entry_points(group: str) -> Iterator[tuple[Plugin, Any]]:
    """``(plugin, entry point)`` for each entry point of ``group`` not tried yet in this process."""
    if disabled():
        return
    # importlib.metadata costs ~30 ms to import and ~10 ms to scan; it is imported only here.
    from importlib.metadata import entry_points

    for ep in entry_points(group=group):
        plugin = Plugin(group, ep.name, ep.value, _distribution_name(ep))
        key = (group, plugin.distribution, plugin.name)
        if key in _tried:
            continue
        _tried.add(key)
        yield plugin, ep


@contextlib.contextmanager
def guard(plugin: Plugin) -> Iterator[None]:
    """Run one plugin's loading; any exception becomes a ``PluginWarning`` so one broken plugin breaks nothing else."""
    try:
        yield
    except Exception as exc:
        warnings.warn(f"rlvr-envs plugin from {plugin.distribution!r} ({plugin.group}: {plugin.name} = {plugin.value})"
                      f" failed to load and is skipped: {type(exc).__name__}: {exc}", PluginWarning, stacklevel=3)
    else:
        _loaded.append(plugin)


def call_if_function(obj: Any) -> Any:
    """An entry point may name a function to call (``pkg.mod:register``); a module or a list is used as is."""
    return obj() if inspect.isfunction(obj) or inspect.ismethod(obj) else obj


def loaded_plugins(group: str | None = None) -> list[Plugin]:
    """The plugins that loaded without error, in load order."""
    return [p for p in _loaded if group is None or p.group == group]


def load_env_plugins() -> list[Plugin]:
    """Register the envs of every ``rlvr_envs.envs`` entry point not loaded yet; the plugins this call loaded."""
    from rlvr_envs.registration import add_plugin_entries

    before = len(_loaded)
    for plugin, ep in new_entry_points(ENV_GROUP):
        with guard(plugin):
            rows = call_if_function(ep.load())
            add_plugin_entries(rows, package=plugin.distribution)
    return _loaded[before:]
