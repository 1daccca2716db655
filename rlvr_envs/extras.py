"""Optional dependencies: what ``pip install 'rlvr-envs[EXTRA]'`` provides, and one clear error when it is missing.

``pip install rlvr-envs`` gives the environments, verifiers and harness with light dependencies. Heavy imports sit
inside the functions that need them and go through ``require``, so a missing extra fails where it is first needed
with the extra to install, e.g. ``rlvr/HotpotQA-v0 needs the [search] extra: pip install 'rlvr-envs[search]'``.
Keep ``EXTRAS`` in step with ``[project.optional-dependencies]`` in pyproject.toml.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

# extra -> the import names it provides (distribution names differ: faiss-cpu -> faiss, POT -> ot).
EXTRAS: dict[str, tuple[str, ...]] = {
    "agents": ("torch", "transformers", "accelerate", "safetensors", "gguf", "scipy", "matplotlib"),
    "search": ("bm25s", "faiss", "torch", "transformers"),
    "bisim": ("ot", "scipy", "faiss", "torch"),
    "plots": ("matplotlib",),
    "hub": ("datasets",),
    "trl": ("trl", "datasets"),
    "vllm": ("vllm",),
    "ray": ("ray",),
    "serve": ("openenv", "fastapi", "uvicorn", "websockets"),
}


class MissingExtraError(ImportError):
    """A module that an optional extra provides is not importable."""

    def __init__(self, message: str, *, extra: str, module: str):
        super().__init__(message, name=module)
        self.extra = extra


def install_hint(extra: str) -> str:
    return f"pip install 'rlvr-envs[{extra}]'"


def _message(what: str, extra: str, modules: list[str], cause: str = "", context: str = "") -> str:
    names = ", ".join(repr(m) for m in modules)
    detail = f" ({context + ': ' if context else ''}{names} not importable{': ' + cause if cause else ''})"
    return f"{what} needs the [{extra}] extra: {install_hint(extra)}{detail}"


def require(module: str, extra: str, what: str) -> ModuleType:
    """Import ``module`` or raise ``MissingExtraError`` naming ``extra`` and ``what`` needed it.

    ``what`` is what the user asked for (an env ID, a retriever, a command), so the message says why it is needed.
    """
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}; extras: {', '.join(EXTRAS)}")
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(_message(what, extra, [module], str(exc)), extra=extra, module=module) from exc


def missing(extra: str, modules: tuple[str, ...] | None = None) -> list[str]:
    """The import names of ``extra`` (or just ``modules`` of it) that cannot be found, without importing any."""
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}; extras: {', '.join(EXTRAS)}")
    absent = []
    for module in EXTRAS[extra] if modules is None else modules:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a parent package that fails to import, or a None entry in sys.modules
            found = False
        if not found:
            absent.append(module)
    return absent


def require_extra(extra: str, what: str, modules: tuple[str, ...] | None = None, *, context: str = "") -> None:
    """Fail early, before any work, when a module of ``extra`` (or of ``modules``, the part ``what`` uses) is missing.

    A cheap check: nothing is imported, so heavy modules still load only where they are used. ``context`` says which
    option of ``what`` needs them (``retriever='dense'``)."""
    absent = missing(extra, modules)
    if absent:
        raise MissingExtraError(_message(what, extra, absent, context=context), extra=extra, module=absent[0])
