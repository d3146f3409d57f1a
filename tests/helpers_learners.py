"""Typed learner configs for tests that run one set of settings through several learners."""

from __future__ import annotations

import dataclasses
from typing import Any

from agentgym.algorithms import LEARNERS, OptimConfig, learner_config_class, make_learner


def algo_config(name: str, **settings: Any) -> Any:
    """``name``'s typed learner config (``GRPOConfig`` for ``grpo``, …) with those of ``settings`` it
    declares: a test that runs REINFORCE, GRPO and PPO on one set of settings passes ``baseline`` (read by
    REINFORCE only) to all three. A setting no built-in learner declares is a typo: refused."""
    known = {f.name for learner in LEARNERS.values() for f in dataclasses.fields(learner.config_class)}
    typos = sorted(set(settings) - known)
    if typos:
        raise TypeError(f"no learner has the settings {typos}")
    cls = learner_config_class(name)
    own = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in settings.items() if k in own})


def make(name: str, policy: Any, settings: dict[str, Any] | None = None, **kwargs: Any) -> Any:
    """``make_learner`` from one flat dict of test settings: its optimizer keys (``lr``, ``warmup_ratio``,
    …) go to :class:`OptimConfig`, ``lora`` to the adapter, the rest to :func:`algo_config`."""
    settings = dict(settings or {})
    optim_keys = {f.name for f in dataclasses.fields(OptimConfig)}
    optim = OptimConfig(**{k: settings.pop(k) for k in list(settings) if k in optim_keys})
    lora = settings.pop("lora", None)
    return make_learner(name, policy, algo_config(name, **settings), optim=optim, lora=lora, **kwargs)
