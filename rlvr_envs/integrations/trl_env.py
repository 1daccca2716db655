"""TRL as a client, multi-turn: environment classes for ``trl.GRPOTrainer(environment_factory=...)``.

TRL (>= 1.0, with transformers >= 5.2) builds one instance of the factory per rollout, calls ``reset(**row)`` with the
dataset row before generation, exposes the instance's public methods as tools (the chat template renders their
schemas; TRL parses the model's tool calls and calls the methods), and passes the instances to the reward functions
as ``environments``. ``environment_factory(env_id)`` returns such a class for one of our envs:

- single-turn envs (Arithmetic, Countdown, MATH, GSM8K, BFCL, reasoning-gym, ...): no tools; the model's final
  message is the response the env's verifier scores;
- ``rlvr/ToolUse-v0``: one method per sandbox tool (``find_customers(name=..., city=...)``, ``place_order(...)``, ...),
  each call run by the env exactly as a ``<tool_call>`` in the model's text would be (schema validation, call caps,
  precision penalty);
- search envs (``rlvr/MultiHopSynth-v0``, ``rlvr/HotpotQA-v0``): one ``search(query)`` method over the env's
  retriever; the final message answers with ``<answer>...</answer>``.

The env owns the task and the verdict: ``reset`` resets it to the row's ``task_id`` (or ``index``) and
``environment_reward`` (the reward function to pass to TRL) steps it with each rollout's final assistant message::

    from rlvr_envs.integrations.trl_env import environment_dataset, environment_factory, environment_reward
    trainer = GRPOTrainer(model=..., environment_factory=environment_factory("rlvr/ToolUse-v0"),
                          reward_funcs=environment_reward, train_dataset=environment_dataset("rlvr/ToolUse-v0", 256),
                          args=GRPOConfig(...), processing_class=tokenizer)  # a chat template with tool calling

A rollout that ends without a final answer (its last message still calls tools, or a search episode's last message
has no ``<answer>``) earns 0. Rows need ``task_id`` or ``index`` so that the rollouts of one GRPO group share a
task; ``environment_dataset`` builds them (chat prompts, ``task_id``).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from rlvr_envs.integrations.trl import (
    FINGERPRINT_COLUMN,
    KWARGS_COLUMN,
    canonical_env_kwargs,
    check_env_fingerprints,
    completion_text,
)

# Prompt for the search family under TRL: the tool call goes through the chat template, not <search> tags.
SEARCH_TEMPLATE = (
    "Answer the question. Call the search tool to look things up (up to {max_searches} times); the top passages come "
    "back as the tool's result. When you know the answer, reply with it as a short phrase between <answer> and "
    "</answer>.\n\nQuestion: {question}"
)
# kwargs each family needs under TRL (the caller's env_kwargs win): tools reach the model through the chat template
FAMILY_KWARGS: dict[str, dict[str, Any]] = {
    "single-turn": {},
    "tool-use": {"tools_in_prompt": False},
    "search": {"prompt_template": SEARCH_TEMPLATE},
}
_JSON_TYPES: dict[str, type] = {"string": str, "integer": int, "number": float, "boolean": bool, "array": list,
                                "object": dict}


def _make_env(env_id: str, env_kwargs: Mapping[str, Any]) -> Any:
    import gymnasium as gym

    import rlvr_envs  # noqa: F401  (registers the rlvr/ ids)

    return gym.make(env_id, **dict(env_kwargs))


def env_family(env: Any) -> str:
    """``"single-turn"``, ``"tool-use"`` or ``"search"`` for a made env (wrappers allowed)."""
    from rlvr_envs.core import TextEnv
    from rlvr_envs.search.env import SearchEnv
    from rlvr_envs.tools.base import ToolEnv
    from rlvr_envs.tools.env import ToolUseEnv

    inner = env.unwrapped
    if isinstance(inner, ToolUseEnv):
        return "tool-use"
    if isinstance(inner, SearchEnv):
        return "search"
    if isinstance(inner, ToolEnv):
        raise NotImplementedError(f"{type(inner).__name__}: only rlvr/ToolUse-v0's tools are exposed as methods")
    if isinstance(inner, TextEnv) or hasattr(inner, "score"):
        return "single-turn"
    raise NotImplementedError(f"{type(inner).__name__} is not a text env (observations must be prompts)")


class RlvrEnvironment:
    """One rollout's episode in an rlvr env. TRL exposes every public method but ``reset`` as a tool, so helpers here
    are private; ``reward``, ``info`` and ``done`` are properties (not tools)."""

    env_id: ClassVar[str] = ""
    env_kwargs: ClassVar[dict[str, Any]] = {}
    env_url: ClassVar[str | None] = None  # an `rlvr serve` server that plays the episodes (None: in-process)
    kwargs_text: ClassVar[str] = "{}"  # canonical_env_kwargs of env_kwargs, what a row's fingerprint must match
    family: ClassVar[str] = "single-turn"

    def __init__(self) -> None:
        if not self.env_id:
            raise TypeError("use environment_factory(env_id) to get an environment class for an env")
        if self.env_url is None:
            self._env = _make_env(self.env_id, self.env_kwargs)
        else:
            from rlvr_envs.remote import RemoteEnv

            self._env = RemoteEnv(self.env_url, self.env_id, env_kwargs=self.env_kwargs)
        self._done = True
        self._reward: float | None = None
        self._info: dict[str, Any] = {}

    def __del__(self) -> None:
        # TRL makes one instance per rollout and never closes it (a public close() would become a tool): release the
        # env, and a served env's session, when the instance goes
        env = self.__dict__.get("_env")
        if env is not None:
            try:
                env.close()
            except Exception:  # interpreter shutdown, a server already gone: nothing left to release
                pass

    # -- the TRL contract ------------------------------------------------------------------------------------------
    def reset(self, **row: Any) -> str | None:
        """Start the episode of the row's task (``task_id`` or ``index``). The prompt comes from the row, so nothing
        is appended to it (None)."""
        if row.get("task_id") is not None:
            options: dict[str, Any] = {"task_id": str(row["task_id"])}
        elif row.get("index") is not None:
            options = {"index": int(row["index"])}
        else:
            raise ValueError(f"{self.env_id}: each dataset row needs a 'task_id' or 'index' column so that the rollouts "
                             f"of a group share one task (columns: {sorted(row)}); build the dataset with "
                             f"rlvr_envs.integrations.trl_env.environment_dataset")
        if row.get(FINGERPRINT_COLUMN) is not None:  # the row's task was built with these kwargs (task ids do not say)
            check_env_fingerprints(self.env_id, self.kwargs_text, [row[FINGERPRINT_COLUMN]], [row.get(KWARGS_COLUMN)])
        _, info = self._env.reset(options=options)
        self._done, self._reward, self._info = False, None, info
        return None

    # -- results ---------------------------------------------------------------------------------------------------
    @property
    def reward(self) -> float | None:
        """The episode's reward once it has ended (None while it is open)."""
        return self._reward

    @property
    def info(self) -> dict[str, Any]:
        """The env's last ``info`` (the verdict, ``correct``, call counts, ...)."""
        return self._info

    @property
    def done(self) -> bool:
        return self._done

    def _step(self, action: str) -> str:
        if self._done:
            raise RuntimeError(f"{self.env_id}: the episode has ended; no more actions are taken")
        obs, reward, terminated, truncated, info = self._env.step(action)
        self._info = info
        if terminated or truncated:
            self._done, self._reward = True, float(reward)
        return obs

    def _finish(self, final_text: str | None) -> float:
        """Score the rollout's final message (None: the rollout ended without one) and return the episode's reward."""
        if not self._done:
            if final_text is None:
                self._done, self._reward = True, 0.0
                self._info = {**self._info, "correct": False, "error": "the rollout ended without a final answer"}
            else:
                self._step(final_text)
                if not self._done:  # a search turn without <answer>, a text-form tool call: no answer was given
                    self._done, self._reward = True, 0.0
                    self._info = {**self._info, "correct": False,
                                  "error": "the final message did not end the episode (no answer)"}
        return float(self._reward or 0.0)


class ToolUseEnvironment(RlvrEnvironment):
    """``rlvr/ToolUse-v0``: each sandbox tool is a method (generated from its JSON schema in ``environment_factory``)."""

    family: ClassVar[str] = "tool-use"

    def _call_tool(self, name: str, arguments: Mapping[str, Any]) -> str:
        args = {k: v for k, v in arguments.items() if v is not None}  # an omitted optional argument arrives as None
        self._step("<tool_call>\n" + json.dumps({"name": name, "arguments": args}, ensure_ascii=False) + "\n</tool_call>")
        content = self._info["messages"][-1]["content"]  # the tool message the env appended
        if self._done:
            content += f"\n(the episode has ended: {self._info.get('error') or 'cap reached'})"
        return content


class SearchEnvironment(RlvrEnvironment):
    """Search envs: ``search(query)`` runs one search turn of the env."""

    family: ClassVar[str] = "search"

    def search(self, query: str) -> str:
        """Search the corpus; returns the top passages with their titles.

        Args:
            query: the search query
        """
        return self._step("<tool_call>" + json.dumps({"name": "search", "arguments": {"query": str(query)}},
                                                     ensure_ascii=False) + "</tool_call>")


def _tool_method(name: str, description: str, parameters: Mapping[str, Any]) -> Callable[..., str]:
    """A method named ``name`` whose signature, type hints and Google-style docstring are the tool's JSON schema
    (what ``transformers.utils.get_json_schema`` reads to render it for the chat template)."""
    properties: Mapping[str, Any] = parameters.get("properties", {})
    required = set(parameters.get("required", ()))

    def method(self: ToolUseEnvironment, **kwargs: Any) -> str:
        return self._call_tool(name, kwargs)

    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    annotations: dict[str, Any] = {}
    lines = []
    for arg, spec in properties.items():
        hint: Any = _JSON_TYPES.get(spec.get("type", "string"), str)
        if arg not in required:
            hint = hint | None
        params.append(inspect.Parameter(arg, inspect.Parameter.KEYWORD_ONLY, annotation=hint,
                                        default=inspect.Parameter.empty if arg in required else None))
        annotations[arg] = hint
        text = " ".join(str(spec.get("description") or f"the {arg.replace('_', ' ')}").split())
        if "enum" in spec:
            text += f" (choices: {json.dumps(spec['enum'])})"
        lines.append(f"    {arg}: {text}")
    annotations["return"] = str
    method.__signature__ = inspect.Signature(params, return_annotation=str)  # type: ignore[attr-defined]
    method.__annotations__ = annotations
    method.__name__ = method.__qualname__ = name
    method.__doc__ = " ".join(description.split()) + ("\n\nArgs:\n" + "\n".join(lines) if lines else "")
    return method


def _tool_use_methods(env: Any) -> dict[str, Callable[..., str]]:
    """One method per tool an episode of this env can expose: its services' tools, or all of them with distractors."""
    from rlvr_envs.tools.services import TOOLS

    source = env.unwrapped.source
    names = [n for n, t in TOOLS.items() if source.distractor_tools > 0 or t.service in source.services]
    return {n: _tool_method(n, TOOLS[n].description, TOOLS[n].parameters) for n in names}


def family_kwargs(env_id: str, env_kwargs: Mapping[str, Any] | None) -> tuple[str, dict[str, Any]]:
    """``env_id``'s family and the kwargs it runs with under TRL: the family's defaults under the caller's."""
    probe = _make_env(env_id, env_kwargs or {})
    family = env_family(probe)
    probe.close()
    return family, {**FAMILY_KWARGS[family], **(env_kwargs or {})}


def environment_factory(env_id: str, *, env_url: str | None = None, **env_kwargs: Any) -> type[RlvrEnvironment]:
    """A class for ``GRPOTrainer(environment_factory=...)``: calling it makes one rollout's environment for ``env_id``
    (``gym.make(env_id, **env_kwargs)`` with the family's TRL defaults, ``FAMILY_KWARGS``). With ``env_url`` each
    instance plays its episode on that ``rlvr serve`` server (a ``RemoteEnv`` session with the same kwargs); the
    family and the tool methods are read from a local instance."""
    family, kwargs = family_kwargs(env_id, env_kwargs)
    base: type[RlvrEnvironment] = {"single-turn": RlvrEnvironment, "tool-use": ToolUseEnvironment,
                                   "search": SearchEnvironment}[family]
    namespace: dict[str, Any] = {"env_id": env_id, "env_kwargs": kwargs, "env_url": env_url, "__module__": __name__,
                                 "kwargs_text": canonical_env_kwargs(env_id, kwargs),
                                 "__doc__": f"{env_id} for TRL's environment_factory ({family})."}
    if family == "tool-use":
        namespace.update(_tool_use_methods(_make_env(env_id, kwargs)))
    name = "".join(ch for ch in env_id.split("/")[-1].title() if ch.isalnum()) + "Environment"
    return type(name, (base,), namespace)


def _final_message(completion: Any) -> str | None:
    """The text of a rollout's final assistant message; None when the rollout ended on a tool call or a tool result."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Sequence) and completion and isinstance(completion[-1], Mapping):
        last = completion[-1]
        if last.get("role", "assistant") != "assistant" or last.get("tool_calls"):
            return None
        return completion_text([last])
    raise TypeError(f"completion must be a string or a list of chat messages, got {type(completion).__name__}")


def environment_reward(completions: list[Any], environments: list[RlvrEnvironment] | None = None,
                       **kwargs: Any) -> list[float]:
    """TRL reward function for ``environment_factory`` envs: each rollout's env scores its final message."""
    if environments is None:
        raise ValueError("environment_reward needs TRL's `environments` (pass environment_factory=... to GRPOTrainer)")
    if len(environments) != len(completions):
        raise ValueError(f"{len(completions)} completions but {len(environments)} environments")
    return [env._finish(_final_message(c)) for env, c in zip(environments, completions)]


environment_reward.__name__ = "rlvr_env_reward"


def environment_dataset(env_id: str, n: int, *, start: int = 0, env_kwargs: Mapping[str, Any] | None = None) -> Any:
    """``rlvr_envs.integrations.trl.dataset`` of tasks ``start .. start+n-1`` with the family's TRL kwargs: ``prompt``
    (chat messages, as the env under TRL shows them), ``task_id`` and the kwargs fingerprint ``reset`` checks."""
    from rlvr_envs.integrations.trl import dataset

    return dataset(env_id, n, start=start, env_kwargs=family_kwargs(env_id, env_kwargs)[1])
