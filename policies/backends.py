"""The generation-backend registry: the only place that knows backends by name.

Two tables, both ``name -> "module:Class"`` (a :class:`~agentgym.backend.Backend` subclass,
imported only when it is used, so listing names costs nothing):

* :data:`POLICY_BACKENDS` — what ``backend=`` (``agentgym train backend=…``, ``--backend``) picks: the
  engine that serves a model spec. Its first entry is the fallback that always works.
* :data:`SPEC_BACKENDS` — model specs that name a backend themselves: ``oracle`` (an env's scripted
  reference policy) and ``openai:MODEL@BASE_URL`` (a hosted chat endpoint); a key ending in ``:`` is
  a prefix.

A new backend is one file: a ``Backend`` subclass with ``from_spec`` and its capability flags, and
one call ``register_backend("name", MyBackend)`` in that file (``agentgym --import mypkg.backend``
makes the CLI see it). See ``docs/backends.md``.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Callable, Mapping

__all__ = ["POLICY_BACKENDS", "SPEC_BACKENDS", "WEIGHT_TRANSFERS", "check_weight_transfer", "BackendUnavailable", "register_backend", "backend_names",
           "backend_class", "require_registered", "spec_backend", "names_own_backend", "default_backend",
           "resolve_backend", "check_backend",
           "trainable_backend"]

#: ``backend=`` names -> ``"module:Class"`` (or a Backend subclass); the first is the fallback
POLICY_BACKENDS: dict[str, Any] = {
    "hf": "agentgym.policies.transformers_policy:TransformersPolicy",
    "vllm": "agentgym.policies.vllm_policy:VLLMPolicy",
}

#: model specs that choose their own backend (``"prefix:"`` or an exact spec) -> ``"module:Class"``
SPEC_BACKENDS: dict[str, Any] = {
    "oracle": "agentgym.policies.scripted:ScriptedPolicy",
    "openai:": "agentgym.policies.openai_policy:OpenAIChatPolicy",
}


class BackendUnavailable(ImportError):
    """A generation backend's package is not installed here (the message says how to install it)."""


def register_backend(name: str, backend: Any, *, spec: bool = False) -> None:
    """Make ``backend`` (a Backend subclass or ``"module:Class"``) selectable as ``backend=name``, or,
    with ``spec=True``, as the model spec ``name`` (a prefix when it ends in ``:``)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"a backend name must be a non-empty string, got {name!r}")
    (SPEC_BACKENDS if spec else POLICY_BACKENDS)[name] = backend


def backend_names() -> list[str]:
    """The ``backend=`` names, fallback first."""
    return list(POLICY_BACKENDS)


def _fallback() -> str:
    return next(iter(POLICY_BACKENDS))


def _import(entry: Any, name: str) -> Any:
    if not isinstance(entry, str):
        return entry
    module, _, attr = entry.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except BackendUnavailable:
        raise
    except ImportError as e:
        raise BackendUnavailable(f"the {name} backend cannot be imported here ({e})") from None


def require_registered(name: str) -> None:
    """ValueError naming the registered backends when none is registered as ``backend=name``."""
    if name not in POLICY_BACKENDS:
        raise ValueError(f"unknown backend {name!r}; choose from {', '.join(POLICY_BACKENDS)}")


def backend_class(name: str) -> Any:
    """The class registered as ``backend=name`` (ValueError for an unknown name; BackendUnavailable,
    an ImportError, when its package is missing here)."""
    require_registered(name)
    return _import(POLICY_BACKENDS[name], name)


def _spec_key(spec: str) -> str | None:
    return next((key for key in SPEC_BACKENDS if spec == key or (key.endswith(":") and spec.startswith(key))), None)


def names_own_backend(spec: str) -> bool:
    """Whether a model spec names its backend itself (``oracle``, ``openai:…``); imports nothing."""
    return _spec_key(spec) is not None


def spec_backend(spec: str) -> Any | None:
    """The class a model spec names by itself (``oracle``, ``openai:…``), or None."""
    key = _spec_key(spec)
    return None if key is None else _import(SPEC_BACKENDS[key], key)


def trainable_backend() -> str:
    """The registered backend that samples with the module a learner trains (the learner's loader)."""
    for name in POLICY_BACKENDS:
        try:
            if getattr(backend_class(name), "trains_in_place", False):
                return name
        except ImportError:
            continue
    raise RuntimeError("no registered backend trains in place")


def default_backend() -> str:
    """The first registered backend that prefers this machine and can run here (vLLM on a CUDA
    machine where it is installed), else the fallback (hf)."""
    for name in list(POLICY_BACKENDS)[1:]:
        try:
            cls = backend_class(name)
        except ImportError:
            continue
        if cls.preferred_here() and cls.available() is None:
            return name
    return _fallback()


def resolve_backend(backend: str | None, notice: Callable[[str], None] | None = None) -> str:
    """The backend to use: ``backend`` (None: :func:`default_backend`) when it can be imported here,
    else the fallback (hf) after one line to ``notice`` (default: stderr) saying why."""
    backend = backend or default_backend()
    if backend == _fallback():
        return backend
    try:
        backend_class(backend)
    except BackendUnavailable as e:
        say = notice or (lambda m: print(m, file=sys.stderr))
        say(f"[agentgym] backend {backend!r} unavailable: {e}; using the {_fallback()} backend")
        return _fallback()
    return backend


#: how a learner's weights reach engines in other processes (:class:`~agentgym.policies.ray_pool.RayPolicyPool`'s
#: transports); here, beside the backend names, so a config is checked without importing any engine
WEIGHT_TRANSFERS = ("auto", "object_store", "collective")


def check_weight_transfer(value: str) -> str:
    """``value`` if it names a weight transfer, else a ValueError that lists the choices."""
    if value not in WEIGHT_TRANSFERS:
        raise ValueError(f"weight_transfer must be one of {', '.join(WEIGHT_TRANSFERS)}; got {value!r}")
    return value


def check_backend(backend: str | None, options: Mapping[str, Any] | None = None) -> None:
    """For config validation: ``backend`` is a registered name or None, and, where its class can be
    imported here, ``options`` are ones it takes — so a bad option fails when the config is built, before
    any output directory or model. A load checks its own options once, in
    :func:`~agentgym.policies.loading.load_policy`."""
    if backend is None:
        return
    if backend not in POLICY_BACKENDS:
        raise ValueError(f"backend must be {', '.join(POLICY_BACKENDS)} or null (default), got {backend!r}")
    if options:
        try:
            cls = backend_class(backend)
        except ImportError:
            return   # checked where it loads (or replaced by the fallback, with a notice)
        cls.check_options(dict(options))
