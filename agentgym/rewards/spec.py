"""A reward from plain data (config files, ``env_kwargs.reward=...``): :func:`resolve_reward` re-weights an
env's default terms and adds shapers named by import path (:func:`load_shaper`); see :mod:`agentgym.rewards`."""

from __future__ import annotations

import importlib
import math
import numbers
import os
import re
import sys
from typing import Any, Callable, Mapping

from agentgym.rewards.group import _FunctionGroupShaper
from agentgym.rewards.terms import Reward, RewardShaper, _FunctionShaper


_IMPORT_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def _is_import_path(key: Any) -> bool:
    """``"module.path:attr"``: a shaper named by where it lives. Default term names never hold a colon."""
    return isinstance(key, str) and ":" in key


def load_shaper(path: str) -> RewardShaper:
    """The shaper at import path ``"module.path:attr"`` (``attr`` may be dotted: ``"mod:Class.attr"``).

    Lets a config or a command line — plain strings — name a user's shaper without a registry or an
    ``--import``. ``attr`` may be a shaper object (``@shaper``, a :class:`PotentialShaper`, any callable
    with a ``name``), a class (instantiated with no arguments, as the built-ins can be) or a plain
    function ``StepEvent -> float``, which becomes a step-wise shaper named ``attr``. The current
    directory is importable first, as with ``python -m`` and ``agentgym --import``, so ``mypkg/`` next
    to the user works from the ``agentgym`` script too. A typo is a one-line ``ValueError`` /
    ``TypeError`` (the CLI prints those without a traceback).
    """
    if not _IMPORT_PATH.fullmatch(path.strip()):
        hint = (" — this looks like a mapping given as a string: pass a dict in Python; on the command line "
                "-e/--env-kwarg and KEY=VALUE parse it as YAML (env_kwargs.reward='{mypkg.shapers:brevity: 0.2}')"
                if path.lstrip().startswith("{") else "")
        raise ValueError(f"reward shaper {path!r}: expected an import path 'module.path:attr' "
                         f"(e.g. 'mypkg.shapers:brevity'){hint}")
    module_name, _, attr = path.strip().partition(":")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as e:  # one line either way; the cause stays chained for AGENTGYM_DEBUG
        missing = getattr(e, "name", None)
        if isinstance(e, ModuleNotFoundError) and missing and (module_name + ".").startswith(missing + "."):
            raise ValueError(f"reward shaper {path!r}: no module named {missing!r} "
                             f"(not in the current directory {os.getcwd()} nor on the Python path)") from e
        raise ValueError(f"reward shaper {path!r}: importing {module_name!r} failed: {e}") from e
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"reward shaper {path!r}: {getattr(obj, '__name__', module_name)!r} has no attribute "
                             f"{part!r}" + _candidates(obj))
        obj = getattr(obj, part)
    name = attr.rsplit(".", 1)[-1]
    if isinstance(obj, _FunctionGroupShaper):
        raise TypeError(f"reward shaper {path!r} is a group shaper; pass it as group_reward, not reward")
    if isinstance(obj, type):
        try:
            obj = obj()
        except TypeError as e:
            raise TypeError(f"reward shaper {path!r} is a class that cannot be built without arguments ({e}); "
                            f"point at an instance instead (e.g. 'module.path:my_instance')") from None
    if not callable(obj):
        raise TypeError(f"reward shaper {path!r} is not callable (type {type(obj).__name__}): expected an @shaper "
                        f"function, a shaper class, or a function StepEvent -> float")
    own = getattr(obj, "name", None)
    if own is None:   # a plain function: the attribute's name is the term's name
        return _FunctionShaper(obj, name, terminal=False)
    if not isinstance(own, str) or not own:
        raise TypeError(f"reward shaper {path!r} has name {own!r}; a shaper's name must be a non-empty string")
    return obj


def _candidates(where: Any) -> str:
    """``"; shapers there: a, b"`` — what a misspelt attribute probably meant (shaper objects and the
    functions and classes defined in that module), or ``""``."""
    home = getattr(where, "__name__", None)
    names = sorted(n for n, v in getattr(where, "__dict__", {}).items()
                   if not n.startswith("_") and callable(v)
                   and (isinstance(getattr(v, "name", None), str) or getattr(v, "__module__", None) == home))
    return f"; shapers there: {', '.join(names)}" if names else ""


def _weight(key: str, value: Any) -> float:
    """A finite number. A numeric string counts (YAML reads ``1e-3`` as a string: it wants ``1.0e-3``);
    a bool (YAML's ``yes`` / ``on``) is a typo, not a weight."""
    w = None
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        w = float(value)
    elif isinstance(value, str):
        try:
            w = float(value)
        except ValueError:
            pass
    if w is None or not math.isfinite(w):
        raise ValueError(f"reward weight for {key!r} must be a finite number, got {value!r}")
    return w


def resolve_reward(spec: Any, default: Callable[[], Reward]) -> Any:
    """What an env's ``reward=`` argument means, given the env's ``default`` reward (called only if needed).

    * ``None``: the default reward.
    * a mapping ``{name: weight}``: plain names re-weight default terms; ``"module.path:attr"`` keys
      add that shaper (:func:`load_shaper`) as a new term, reported under the shaper's ``name``.
      ``{"mypkg.shapers:brevity": 0.2, "format": 0.5}`` does both.
    * a string ``"module.path:attr"``: that shaper added with weight 1.
    * anything else (a :class:`Reward`, …): used as given.

    Only plain data reaches here from the CLI and config files, so the saved ``config.yaml`` holds the
    strings while the env holds the imported shapers.
    """
    if spec is None:
        return default()
    if isinstance(spec, str):
        if not _is_import_path(spec):
            raise ValueError(f"reward={spec!r}: a string reward names a shaper by import path 'module.path:attr' "
                             f"(e.g. 'mypkg.shapers:brevity'); re-weight default terms with a mapping "
                             f"{{name: weight}}")
        spec = {spec: 1.0}
    if not isinstance(spec, Mapping):
        return spec
    bad = [k for k in spec if not isinstance(k, str)]
    if bad:
        raise ValueError(f"reward mapping keys must be term names or 'module.path:attr' strings, got {bad!r}")
    weights = {k: _weight(k, v) for k, v in spec.items()}
    reward = default()
    plain = {k: w for k, w in weights.items() if not _is_import_path(k)}
    try:
        reward = reward.with_weights(**plain)
    except ValueError as e:   # keep the usual message, and say how a custom shaper is named
        raise ValueError(f"{e} (a custom shaper is named by import path, 'module.path:attr')") from None
    added: dict[str, str] = {}
    for path, w in weights.items():
        if not _is_import_path(path):
            continue
        s = load_shaper(path)
        if s.name in reward.names:
            raise ValueError(f"reward shaper {path!r} is named {s.name!r}, which "
                             + (f"{added[s.name]!r} already uses" if s.name in added else
                                f"a default term already uses (terms are {reward.names})")
                             + "; give the shaper another name")
        added[s.name] = path
        reward = reward.with_terms((s, w))
    return reward
