"""The learners: a registry of names bound to an advantage estimator and a policy objective, and the
built-in ones.

=================  ===================  ==============  ====================================================
learner            advantage            objective       what it is
=================  ===================  ==============  ====================================================
``reinforce``      ``returns``          ``reinforce``   per-turn returns-to-go, batch baseline / ReBN (GEM)
``grpo``           ``group``            ``clip``        group-normalised returns (Shao et al., 2024)
``rloo``           ``rloo``             ``clip``        leave-one-out group baseline (Ahmadian et al., 2024)
``gspo``           ``group``            ``gspo``        sequence-level ratio (Zheng et al., 2025)
``cispo``          ``group``            ``cispo``       clipped detached IS weight × REINFORCE (MiniMax, 2025)
``ppo``            ``gae``              ``clip``        critic + GAE (Schulman et al., 2017)
``dual-clip-ppo``  ``gae``              ``dual-clip``   PPO, loss bounded by ``-c·A`` for ``A < 0`` (Ye et al., 2020)
=================  ===================  ==============  ====================================================

A user module adds parts and learners with
:func:`~agentgym.algorithms.maths.advantages.register_advantage`,
:func:`~agentgym.algorithms.maths.objectives.register_objective` and :func:`register_learner`; ``agentgym
--import mymod train algo=myalgo`` and ``agentgym compare --algos myalgo`` then accept them
(docs/extending.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentgym.algorithms.maths.advantages import (ADVANTAGES, BaselineSettings, GAESettings, GroupSettings,
                                            ReturnSettings)
from agentgym.algorithms.maths.critic import CriticSettings
from agentgym.algorithms.loop.learner import Learner
from agentgym.algorithms.loop.learner_config import UpdateConfig
from agentgym.algorithms.maths.losses import ClipSettings
from agentgym.algorithms.maths.objectives import OBJECTIVES
from agentgym.algorithms.parts import Registry, registry_key

__all__ = ["LEARNERS", "register_learner", "make_learner", "learner_config_class", "learner_needs_groups",
           "ReinforceLearner", "GRPOLearner", "PPOLearner", "ReinforceConfig", "GRPOConfig", "RLOOConfig",
           "GSPOConfig", "CISPOConfig", "PPOConfig", "DualClipPPOConfig"]

#: name -> learner class (:func:`register_learner`); ``agentgym train algo=NAME`` looks names up here
LEARNERS: Registry = Registry("learner")


def register_learner(name: str, learner: type[Learner] | None = None, *, advantage: str | None = None,
                     objective: str | None = None, config: type | None = None,
                     replace: bool = False) -> Any:
    """Register a learner under ``name``: ``agentgym train algo=NAME`` and ``agentgym compare --algos
    NAME`` accept it (load the module with ``agentgym --import MODULE ...``).

    Either compose one from registered parts and its typed config — ``register_learner("rloo",
    advantage="rloo", objective="clip", config=RLOOConfig)`` — or register a :class:`Learner` subclass
    that names its parts and its ``config_class`` (also as a class decorator:
    ``@register_learner("mine")``). The config is a dataclass subclassing
    :class:`~agentgym.algorithms.loop.learner_config.UpdateConfig` and every settings block its parts read
    (checked here); the ``learner:`` section of ``agentgym train algo=NAME`` is checked against it.
    Returns the learner class.
    """
    def add(cls: type[Learner]) -> type[Learner]:
        if not (isinstance(cls, type) and issubclass(cls, Learner)):
            raise TypeError(f"register_learner({name!r}, ...) needs a Learner subclass")
        _check_config(name, cls)
        cls.name = registry_key(name)
        LEARNERS.add(name, cls, replace)
        return cls

    if learner is not None or (advantage is None and objective is None):
        if learner is None:
            return add
        return add(learner)
    if advantage is None or objective is None:
        raise ValueError("register_learner needs both advantage= and objective= (or a Learner subclass)")
    adv_cls = ADVANTAGES.lookup(advantage)
    obj_cls = OBJECTIVES.lookup(objective)
    title = "".join(w.capitalize() for w in registry_key(name).replace("_", "-").split("-"))
    attrs = {"advantage_name": adv_cls.name, "objective_name": obj_cls.name, "config_class": config,
             "__doc__": f"The {registry_key(name)!r} learner: advantage {adv_cls.name!r}, objective {obj_cls.name!r}."}
    cls = type(f"{title}Learner", (Learner,), attrs)
    cls.__module__ = __name__
    return add(cls)


def _check_config(name: str, cls: type[Learner]) -> None:
    """The learner's config is an ``UpdateConfig`` with every settings block its parts read."""
    parts = [ADVANTAGES.lookup(cls.advantage_name), OBJECTIVES.lookup(cls.objective_name)]
    needed = [s for p in parts for s in p.settings] + ([CriticSettings] if parts[0].critic else [])
    config = cls.config_class
    example = ", ".join(dict.fromkeys(s.__name__ for s in needed)) or "UpdateConfig"
    if not (isinstance(config, type) and issubclass(config, UpdateConfig)):
        raise TypeError(f"register_learner({name!r}, ...) needs config=: a dataclass subclassing UpdateConfig and "
                        f"its parts' settings ({example}), e.g. @dataclass class MyConfig(MySettings, GRPOConfig)")
    missing = [s.__name__ for s in needed if not issubclass(config, s)]
    if missing:
        raise TypeError(f"register_learner({name!r}, ...): config {config.__name__} lacks the settings its parts "
                        f"read: {', '.join(dict.fromkeys(missing))}")


def make_learner(name: str, policy: Any, config: Any = None, *, optim: Any = None, lora: Any = None,
                 separate_sampler: bool = False, fsdp: bool = False, precision: Any = None) -> Learner:
    """A registered learner (:data:`LEARNERS`) for a trainable policy (``.model``, ``.tokenizer``).

    ``config``: the learner's typed config (``GRPOConfig(...)`` for ``grpo``; None: its defaults);
    ``optim``: the :class:`~agentgym.algorithms.loop.optim.OptimConfig` (None: its defaults); ``lora``: a
    :class:`~agentgym.algorithms.loop.optim.LoraSettings` adapter (None: full fine-tuning).
    ``separate_sampler``: another engine samples the rollouts (see ``UpdateConfig.old_logprobs``).
    ``precision``: see :func:`~agentgym.precision.learner_precision`.
    """
    cls = LEARNERS.lookup(name)
    return cls(policy, config, optim=optim, lora=lora, separate_sampler=separate_sampler, fsdp=fsdp,
               precision=precision)


def learner_config_class(name: str) -> type[UpdateConfig]:
    """The typed config of the registered learner ``name`` (what its ``learner:`` section is checked
    against); for a learner trained outside the trainer (:data:`EXTERNAL_CONFIGS`), the config whose
    settings it takes."""
    if name in EXTERNAL_CONFIGS:
        return EXTERNAL_CONFIGS[name]
    return LEARNERS.lookup(name).config_class


def learner_estimator(name: str) -> type | None:
    """The advantage estimator class of the registered learner ``name`` (None: no such learner or estimator)."""
    cls = LEARNERS.get(str(name).lower())
    return ADVANTAGES.get(cls.advantage_name) if cls is not None else None


def learner_needs_groups(name: str) -> bool:
    """Whether the learner ``name`` compares trajectories within groups (so needs ``group_size > 1``)."""
    adv = learner_estimator(name)
    return bool(adv is not None and adv.needs_groups)


# --------------------------------------------------------------------------- the built-in learners' configs

@dataclass
class ReinforceConfig(BaselineSettings, ReturnSettings, UpdateConfig):
    """REINFORCE: UpdateConfig + ReturnSettings (credit ``turn``: each turn's return-to-go) + BaselineSettings."""
    algorithm_defaults = {"credit": "turn"}


@dataclass
class GRPOConfig(GroupSettings, ReturnSettings, ClipSettings, UpdateConfig):
    """GRPO: UpdateConfig + ReturnSettings (credit ``episode``) + GroupSettings + ClipSettings (PPO's 0.2)."""


@dataclass
class RLOOConfig(GRPOConfig):
    """RLOO: GRPOConfig's settings (``group_scale`` is not read)."""


@dataclass
class GSPOConfig(GRPOConfig):
    """GSPO: GRPOConfig's settings; the clip bounds a sequence-level ratio, the paper's 3e-4 / 4e-4, and
    token losses are averaged per sequence (seq-mean-token-mean), as in the paper."""
    algorithm_defaults = {"clip_eps": 3e-4, "clip_eps_high": 4e-4, "loss_agg": "seq-mean-token-mean"}


@dataclass
class CISPOConfig(GRPOConfig):
    """CISPO: GRPOConfig's settings; the clip bounds a detached importance weight: no lower bound
    (``clip_eps=1``), ``clip_eps_high`` 0.28."""
    algorithm_defaults = {"clip_eps": 1.0, "clip_eps_high": 0.28}


@dataclass
class PPOConfig(GAESettings, CriticSettings, ReturnSettings, ClipSettings, UpdateConfig):
    """PPO: UpdateConfig + ReturnSettings (credit ``token``) + GAESettings + CriticSettings + ClipSettings."""
    algorithm_defaults = {"credit": "token"}


@dataclass
class DualClipPPOConfig(PPOConfig):
    """Dual-clip PPO: PPOConfig's settings with the dual-clip bound on, ``dual_clip_c`` = 3."""
    algorithm_defaults = {"dual_clip_c": 3.0}


#: learners trained outside the trainer (``agentgym compare --algos trl-grpo``: TRL's GRPOTrainer) -> the
#: config of their ``learner:`` section (TRL's GRPO takes GRPOConfig's ``kl_coef`` and ``micro_batch_size``)
EXTERNAL_CONFIGS: dict[str, type[UpdateConfig]] = {"trl-grpo": GRPOConfig}


@register_learner("reinforce")
class ReinforceLearner(Learner):
    """REINFORCE on transitions: each turn's discounted return-to-go minus a baseline (none, batch
    mean, moving average) or normalised over the batch (ReBN, GEM's default), on that turn's tokens;
    one on-policy optimizer step per batch with ``-A · log p`` (``epochs`` and ``minibatch_size`` do
    not apply; micro-batching does)."""
    advantage_name, objective_name, config_class = "returns", "reinforce", ReinforceConfig


@register_learner("grpo")
class GRPOLearner(Learner):
    """GRPO: each trajectory's return normalised within its group (``group_id``: same task), the same
    advantage on all its policy tokens (``credit="turn"`` / ``"gigpo"``: per-turn credit); clipped ratio
    loss, ``epochs`` inner iterations, KL to the reference in the loss (``kl_coef`` > 0). Dr.GRPO:
    ``group_scale=False`` with ``loss_agg="dr-grpo"`` (TRL's) or ``"seq-mean-token-sum-norm"`` (veRL's)."""
    advantage_name, objective_name, config_class = "group", "clip", GRPOConfig


@register_learner("ppo")
class PPOLearner(Learner):
    """PPO with a learned value function and GAE (token-level by default, ``credit="turn"`` for one step
    per turn); critic: a head on the policy's last hidden state or a separate network
    (``critic="model"``) with its own lr; ``epochs`` passes over shuffled minibatches, clipped policy
    and value losses, advantages whitened over the batch."""
    advantage_name, objective_name, config_class = "gae", "clip", PPOConfig


register_learner("rloo", advantage="rloo", objective="clip", config=RLOOConfig)
register_learner("gspo", advantage="group", objective="gspo", config=GSPOConfig)
register_learner("cispo", advantage="group", objective="cispo", config=CISPOConfig)
register_learner("dual-clip-ppo", advantage="gae", objective="dual-clip", config=DualClipPPOConfig)
