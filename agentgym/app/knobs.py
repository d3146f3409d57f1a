"""``agentgym config``: every knob of a command's config, and every setting of an env, with its type,
default and one line of help.

Which config a command reads is the command line's business, so the mapping lives here, in the app: the
configs themselves stay in the parts that declare them (``TrainConfig`` in :mod:`agentgym.algorithms.loop.train_config`,
``SFTRunConfig``/``DPORunConfig`` in :mod:`agentgym.algorithms.offline`, ``EvalRunConfig`` in
:mod:`agentgym.app.eval_run`). An env's settings are the fields of its ``config_class`` (types, defaults
and help, as the env declares them: every built-in env has one); a user's env without one is described by
its constructor's keywords (:meth:`agentgym.AgentEnv.constructor_parameters`), with the help its
docstring's ``Args:`` section gives. The same declaration is what ``env_kwargs`` are checked against
before a run (:func:`agentgym.registry.check_env_kwargs`).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
from typing import Any

__all__ = ["COMMAND_CONFIGS", "command_config", "describe_configs", "env_settings", "describe_env"]

#: Each command's root config as ``module:Class``, imported only when asked for.
COMMAND_CONFIGS: dict[str, str] = {
    "train": "agentgym.algorithms.loop.train_config:TrainConfig",
    "sft": "agentgym.algorithms.offline.sft:SFTRunConfig",
    "dpo": "agentgym.algorithms.offline.dpo:DPORunConfig",
    "eval": "agentgym.app.eval_run:EvalRunConfig",
}


def command_config(command: str) -> type:
    """The root config class of ``command`` (``train``, ``sft``, ``dpo`` or ``eval``)."""
    if command not in COMMAND_CONFIGS:
        raise ValueError(f"no config for command {command!r}; choose one of {', '.join(COMMAND_CONFIGS)}")
    module, _, name = COMMAND_CONFIGS[command].partition(":")
    return getattr(importlib.import_module(module), name)


def describe_configs(command: str | None = None) -> str:
    """Every knob of ``command``'s config (``train``, ``sft``, ``dpo`` or ``eval``; None: all of them) as
    plain-text tables, one line per knob: dotted path, type, default, help."""
    from agentgym.config import format_config_table
    names = [command] if command is not None else list(COMMAND_CONFIGS)
    tables = []
    for n in names:
        cls = command_config(n)
        tables.append(format_config_table(cls, title=f"agentgym {n}: {cls.__name__}"))
        if n == "train":
            tables += _other_learners(cls())
    return "\n".join(tables)


def _other_learners(train: Any) -> list[str]:
    """The ``learner:`` section is the chosen algorithm's typed config; the train table lists the default
    algorithm's. For each other registered learner: its settings that the default's lacks or defaults
    otherwise (with ``algo=NAME`` they are the ``learner.*`` keys)."""
    from agentgym.algorithms.catalog import LEARNERS
    from agentgym.config import config_fields, format_config_table
    shown = {(k.path, repr(k.default)) for k in config_fields(train.learner, "learner")}
    tables = []
    for name, learner in sorted(LEARNERS.items()):
        config = learner.config_class()
        new = [k for k in config_fields(config, "learner") if (k.path, repr(k.default)) not in shown]
        if new:
            tables.append(format_config_table(
                config, title=f"agentgym train algo={name}: learner is {type(config).__name__}; beyond the above",
                prefix="learner", keep=lambda k: (k.path, repr(k.default)) not in shown))
    return tables


def _arg_help(cls: type) -> dict[str, str]:
    """``name: help`` from the ``Args:`` sections of the constructor chain's docstrings (class or
    ``__init__``); the first line of each entry, continuation lines joined; the most derived class wins."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        for doc in (klass.__doc__, getattr(vars(klass).get("__init__"), "__doc__", None)):
            if not doc or "Args:" not in doc:
                continue
            section = doc.split("Args:", 1)[1]
            for m in re.finditer(r"^\s{4,}(\w+)(?:\s*\([^)]*\))?:\s*(.+(?:\n\s{8,}(?!\w+:).+)*)", section, re.M):
                out[m.group(1)] = " ".join(m.group(2).split())
    return out


def env_settings(env_id: str) -> list[tuple[str, str, str, str]]:
    """``(name, type, default, help)`` for every setting of a registered env (its config's fields, else its
    constructor's keywords), with the defaults its registration sets."""
    from gymnasium.envs.registration import load_env_creator

    import agentgym
    from agentgym.registry import entry_point_parameters, full_id
    spec = agentgym.spec(env_id) if full_id(env_id) in agentgym.list_envs() else None
    if spec is None:
        raise ValueError(f"no env {env_id!r}; registered: {', '.join(agentgym.list_envs())}")
    creator = load_env_creator(spec.entry_point) if isinstance(spec.entry_point, str) else spec.entry_point
    config_class = getattr(creator, "config_class", None)
    params = {name: p for name, p in entry_point_parameters(creator).items()
              if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and not (config_class and name == "config")}
    helps = {f.name: f.metadata.get("help", "") for f in dataclasses.fields(config_class)} if config_class else {}
    if isinstance(creator, type) and any(name not in helps for name in params):  # keywords outside a config
        helps = {**_arg_help(creator), **helps}
    registered = dict(spec.kwargs or {})
    rows = []
    for name, p in params.items():
        kind = "" if p.annotation is inspect.Parameter.empty else str(p.annotation).replace("typing.", "")
        default = registered.get(name, p.default)
        shown = "(required)" if default is inspect.Parameter.empty else repr(default)
        rows.append((name, kind, shown, helps.get(name, "")))
    return rows


def describe_env(env_id: str) -> str:
    """:func:`env_settings` as a plain-text table, with how to set them."""
    rows = env_settings(env_id)
    widths = [min(cap, max([len(h)] + [len(r[i]) for r in rows])) for i, (h, cap) in
              enumerate((("setting", 24), ("type", 30), ("default", 24)))]
    head = "  ".join(h.ljust(w) for h, w in zip(("setting", "type", "default"), widths)) + "  help"
    lines = [f"agentgym env {env_id}: set as env_kwargs.NAME=VALUE (train, compare), -e NAME=VALUE (eval, play, "
             "serve) or in Python agentgym.make(ID, NAME=VALUE)", head]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r[:3], widths)) + "  " + r[3] for r in rows]
    return "\n".join(line.rstrip() for line in lines) + "\n"
