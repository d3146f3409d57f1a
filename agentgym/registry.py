"""Registration in Gymnasium's registry under the ``agentgym/`` namespace.

Built-in envs are registered by *string* entry points, so ``import agentgym`` imports no concrete
env (the kernel stays independent of ``agentgym.envs``); the module loads on first ``make``.
A user's env registers exactly the same way.
"""

from __future__ import annotations

import collections.abc as cabc
import dataclasses
import difflib
import inspect
import numbers
import os
import types
import typing
from typing import Any, Callable, Mapping

import gymnasium as gym
import numpy as np

__all__ = ["NAMESPACE", "register", "make", "list_envs", "spec", "full_id", "check_env_kwargs",
           "check_run_env_kwargs", "entry_point_parameters"]

NAMESPACE = "agentgym"
_REGISTER_OPTIONS = {"reward_threshold", "nondeterministic", "max_episode_steps", "order_enforce",
                     "disable_env_checker", "additional_wrappers", "vector_entry_point"}

# id -> entry point of the envs shipped with agentgym
BUILTIN_ENVS: dict[str, str] = {
    "Arithmetic-v0": "agentgym.envs.arithmetic:ArithmeticEnv",
    "SearchQA-v0": "agentgym.envs.searchqa.env:SearchQAEnv",
    "ToolCall-v0": "agentgym.envs.toolcall:ToolCallEnv",
    "CodeExec-v0": "agentgym.envs.codeexec.env:CodeExecEnv",
    "Math-v0": "agentgym.envs.mathrl.env:MathEnv",
    "ReAct-v0": "agentgym.envs.react:ReActEnv",
    "HumanEval-v0": "agentgym.envs.humaneval:HumanEvalEnv",
    "BFCL-v0": "agentgym.envs.bfcl:BFCLEnv",
    "ReasoningGym-v0": "agentgym.envs.reasoninggym:ReasoningGymEnv",
    "OpenEnv-v0": "agentgym.envs.openenv_remote:OpenEnvEnv",
}


def full_id(env_id: str) -> str:
    """``"Foo-v0"`` → ``"agentgym/Foo-v0"``; ids with another namespace are left alone."""
    return env_id if "/" in env_id else f"{NAMESPACE}/{env_id}"


def register(id: str, entry_point: str | Callable[..., gym.Env], **kwargs: Any) -> str:
    """Register an env under ``agentgym/``.

    Keyword arguments named like :func:`gymnasium.register`'s options (``max_episode_steps``,
    ``order_enforce``, …) go there; everything else (and a ``kwargs=`` dict) becomes default
    constructor arguments of the env. Returns the full id. Registering an id again replaces it
    (Gymnasium warns).
    """
    if "/" in id and not id.startswith(NAMESPACE + "/"):
        raise ValueError(f"agentgym.register puts envs in the {NAMESPACE!r} namespace; got {id!r}")
    env_kwargs = dict(kwargs.pop("kwargs", None) or {})
    options = {k: kwargs.pop(k) for k in list(kwargs) if k in _REGISTER_OPTIONS}
    env_kwargs.update(kwargs)
    fid = full_id(id)
    gym.register(id=fid, entry_point=entry_point, kwargs=env_kwargs, **options)
    return fid


def make(id: str, **kwargs: Any) -> gym.Env:
    """:func:`gymnasium.make` with the ``agentgym/`` namespace optional and a helpful error."""
    fid = full_id(id)
    if fid not in gym.registry:
        raise gym.error.NameNotFound(f"no env {fid!r}; registered agentgym envs: {', '.join(list_envs()) or 'none'}")
    check_env_kwargs(fid, kwargs)
    env = gym.make(fid, **kwargs)
    _retry_safe_env_checker(env)
    return env


def _retry_safe_env_checker(env: gym.Env) -> None:
    """Gymnasium 1.4's ``PassiveEnvChecker`` marks its first ``reset`` as checked before that reset runs, so
    when it raises (a bad seed, a task_index out of range) the first ``step`` after a later, good reset fails
    with ``cannot unpack non-iterable NoneType object``. Here a reset that raises before any reset succeeded
    leaves the check to the next one."""
    from gymnasium.wrappers import PassiveEnvChecker
    wrapper = env
    while isinstance(wrapper, gym.Wrapper):
        if isinstance(wrapper, PassiveEnvChecker) and not wrapper.checked_reset:
            checked_reset = type(wrapper).reset.__get__(wrapper)

            def reset(*, seed: Any = None, options: Any = None, _checker: Any = wrapper, _reset: Any = checked_reset):
                try:
                    return _reset(seed=seed, options=options)
                except BaseException:
                    if getattr(_checker, "_previous_data", None) is None:
                        _checker.checked_reset = False  # not checked yet: the next reset runs the check
                    raise
            wrapper.reset = reset  # type: ignore[method-assign]
        wrapper = wrapper.env


def check_env_kwargs(id: str, kwargs: dict[str, Any]) -> None:
    """Check constructor arguments against the env's declared settings before Gymnasium builds it, so a
    typo or a wrong type is named in one line (``Math-v0: max_turns must be int or None, got 'abc'``)
    instead of surfacing as an error from deep inside the constructor.

    The settings are :meth:`~agentgym.core.AgentEnv.constructor_parameters`: an env's ``config_class``
    fields, else its constructor's signature (of a string entry point; a class registered as an object
    is checked only when it declares a config, as its ``**kwargs`` may take anything). Names are
    checked (unless a signature takes ``**kwargs`` it does not pass on), and the plain types ``int``,
    ``float``, ``str``, ``bool``, ``None``, ``Sequence[...]``, ``Mapping[...]`` and ``Path`` in the
    annotations; anything else (``Any``, a class, an unresolvable hint) passes. Raises ``TypeError``;
    for an env with a config, the config is then built from the registered and given values, so its
    value checks (ranges, choices) raise their ``ValueError`` here too."""
    fid = full_id(id)
    try:
        entry = gym.spec(fid).entry_point   # a "module:attr" string or the class / callable itself
        creator = gym.envs.registration.load_env_creator(entry) if isinstance(entry, str) else entry
        params = entry_point_parameters(creator)
    except Exception:  # an entry point we cannot inspect: Gymnasium reports what it finds
        return
    if not isinstance(entry, str) and getattr(creator, "config_class", None) is None:
        return  # an object registered without a declared config: its constructor alone judges its arguments
    name = fid.split("/", 1)[-1]
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        known = [k for k, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        for key in kwargs:
            if key not in known:
                close = difflib.get_close_matches(str(key), known, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else f"; it takes: {', '.join(known)}"
                raise TypeError(f"{name}: no argument {key!r}{hint}")
    hints = _type_hints(creator)
    for key, value in kwargs.items():
        if key in hints and not _fits(value, hints[key]):
            raise TypeError(f"{name}: {key} must be {_describe(hints[key])}, got {value!r}"[:300])
    config_class = getattr(creator, "config_class", None)
    if config_class is not None:
        fields = {f.name for f in dataclasses.fields(config_class)}
        given = {**(gym.spec(fid).kwargs or {}), **kwargs}
        try:
            config_class.build(given.get("config"), {k: v for k, v in given.items() if k in fields})
        except (TypeError, ValueError) as e:
            raise (TypeError if isinstance(e, TypeError) else ValueError)(f"{name}: {e}") from None


def entry_point_parameters(creator: Any) -> Mapping[str, inspect.Parameter]:
    """The keywords an entry point takes: an :class:`~agentgym.core.AgentEnv` declares them, through its
    bases' ``**kwargs`` (:meth:`~agentgym.core.AgentEnv.constructor_parameters`); any other callable has
    its signature."""
    from agentgym.core import AgentEnv
    if isinstance(creator, type) and issubclass(creator, AgentEnv):
        return creator.constructor_parameters()
    return inspect.signature(creator).parameters


def _type_hints(creator: Any) -> dict[str, Any]:
    """Annotations of the constructor chain (the most derived class's win) and of the config it declares;
    hints that do not resolve are left out (the check is lenient about what it cannot read)."""
    sources = ([vars(k)["__init__"] for k in reversed(creator.__mro__) if "__init__" in vars(k)]
               if isinstance(creator, type) else [creator])
    if getattr(creator, "config_class", None) is not None:
        sources.append(creator.config_class)
    hints: dict[str, Any] = {}
    for source in sources:
        try:
            hints.update(typing.get_type_hints(source))
        except Exception:
            continue
    hints.pop("return", None)
    return hints


def check_run_env_kwargs(id: str, env_kwargs: Any, eval_env_kwargs: Any = None) -> None:
    """A run's env arguments, before any model loads: the training env's (``env_kwargs``), and the held-out
    eval's (``eval_env_kwargs`` over them), each by :func:`check_env_kwargs`. A slip is a usage error, a
    ``ConfigError`` that names the setting: ``env_kwargs: Math-v0: no argument 'max_turn' ...``."""
    from agentgym.config import ConfigError

    def check(key: str, kwargs: dict[str, Any]) -> None:
        try:
            check_env_kwargs(id, kwargs)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{key}: {e}") from None

    check("env_kwargs", dict(env_kwargs or {}))
    if eval_env_kwargs:
        check("eval.env_kwargs", {**(env_kwargs or {}), **eval_env_kwargs})


def _fits(value: Any, hint: Any) -> bool:
    """Whether ``value`` matches ``hint``; hints this check does not understand match anything."""
    if hint is Any:
        return True
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        return any(_fits(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, (bool, np.bool_))
    if hint is int:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, numbers.Real) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if hint is os.PathLike or (isinstance(hint, type) and issubclass(hint, os.PathLike)):
        return isinstance(value, (str, os.PathLike))
    if origin in (cabc.Sequence, list, tuple):  # any iterable but a string or a mapping (a datasets.Dataset too)
        if isinstance(value, (str, bytes, cabc.Mapping)) or not isinstance(value, cabc.Iterable):
            return False
        args = typing.get_args(hint)
        elem = args[0] if args and (origin is not tuple or (len(args) == 2 and args[1] is Ellipsis)) else Any
        return not isinstance(value, (list, tuple)) or all(_fits(v, elem) for v in value)
    if origin in (cabc.Mapping, dict):  # anything but a plain scalar or list: dict-likes vary
        return not isinstance(value, (str, bytes, numbers.Number, list, tuple))
    return True  # a class or a construct this check leaves to the env


def _describe(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        return " or ".join(_describe(h) for h in typing.get_args(hint))
    if hint is type(None):
        return "None"
    if origin in (cabc.Sequence, list, tuple):
        args = typing.get_args(hint)
        return f"a list of {_describe(args[0])}" if args else "a list"
    if origin in (cabc.Mapping, dict):
        return "a mapping"
    return getattr(hint, "__name__", str(hint))


def list_envs() -> list[str]:
    """All registered ids in the ``agentgym/`` namespace (built-in and user-registered)."""
    return sorted(k for k in gym.registry if k.startswith(NAMESPACE + "/"))


def spec(id: str) -> gym.envs.registration.EnvSpec:
    return gym.spec(full_id(id))


def _register_builtins() -> None:
    for env_id, entry in BUILTIN_ENVS.items():
        if full_id(env_id) not in gym.registry:
            register(env_id, entry)
