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
:func:`~agentgym.algorithms.advantages.register_advantage`,
:func:`~agentgym.algorithms.objectives.register_objective` and :func:`register_learner`; ``agentgym
--import mymod train algo=myalgo`` and ``agentgym compare --algos myalgo`` then accept them
(docs/extending.md).
"""

from __future__ import annotations

from typing import Any

from agentgym.algorithms.advantages import ADVANTAGES
from agentgym.algorithms.config import compose_config, composed_config
from agentgym.algorithms.critic import Critic
from agentgym.algorithms.learner import Learner
from agentgym.algorithms.objectives import OBJECTIVES
from agentgym.algorithms.registry import Registry, registry_key

__all__ = ["LEARNERS", "register_learner", "make_learner", "learner_needs_groups", "ReinforceLearner",
           "GRPOLearner", "PPOLearner", "ReinforceConfig", "GRPOConfig", "RLOOConfig", "GSPOConfig", "CISPOConfig",
           "PPOConfig", "DualClipPPOConfig"]

#: name -> learner class (:func:`register_learner`); ``agentgym train algo=NAME`` looks names up here
LEARNERS: Registry = Registry("learner")


def register_learner(name: str, learner: type[Learner] | None = None, *, advantage: str | None = None,
                     objective: str | None = None, config: type | None = None,
                     replace: bool = False) -> Any:
    """Register a learner under ``name``: ``agentgym train algo=NAME`` and ``agentgym compare --algos
    NAME`` accept it (load the module with ``agentgym --import MODULE ...``).

    Either compose one from registered parts — ``register_learner("rloo", advantage="rloo",
    objective="clip")``; its typed config is ``config`` or, by default, :func:`compose_config` of the
    parts (plus :class:`CriticSettings` when the estimator needs a critic) — or register a
    :class:`Learner` subclass (also as a class decorator: ``@register_learner("mine")``).
    Returns the learner class.
    """
    def add(cls: type[Learner]) -> type[Learner]:
        if not (isinstance(cls, type) and issubclass(cls, Learner)):
            raise TypeError(f"register_learner({name!r}, ...) needs a Learner subclass")
        cls.name = registry_key(name)
        if cls.config_class is None:
            cls.config_class = composed_config(cls.__name__, cls.advantage_name, cls.objective_name)
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


def make_learner(name: str, policy: Any, config: Any = None, *, separate_sampler: bool = False,
                 fsdp: bool = False, precision: Any = None) -> Learner:
    """A registered learner (:data:`LEARNERS`) for a trainable policy (``.model``, ``.tokenizer``).

    ``config``: a :class:`~agentgym.algorithms.config.LearnerConfig` (the flat user-facing one), the
    learner's typed config, or None for its defaults. ``separate_sampler``: another engine samples the rollouts (see
    ``UpdateConfig.old_logprobs``). ``precision``: see :func:`~agentgym.precision.learner_precision`.
    """
    cls = LEARNERS.lookup(name)
    return cls(policy, config, separate_sampler=separate_sampler, fsdp=fsdp, precision=precision)


def learner_estimator(name: str) -> type | None:
    """The advantage estimator class of the registered learner ``name`` (None: no such learner or estimator)."""
    cls = LEARNERS.get(str(name).lower())
    return ADVANTAGES.get(cls.advantage_name) if cls is not None else None


def learner_needs_groups(name: str) -> bool:
    """Whether the learner ``name`` compares trajectories within groups (so needs ``group_size > 1``)."""
    adv = learner_estimator(name)
    return bool(adv is not None and adv.needs_groups)


# --------------------------------------------------------------------------- the built-in learners

ReinforceConfig = compose_config("ReinforceConfig", ADVANTAGES["returns"], OBJECTIVES["reinforce"],
                                 doc="REINFORCE: UpdateConfig + ReturnSettings (credit turn) + BaselineSettings.")
GRPOConfig = compose_config("GRPOConfig", ADVANTAGES["group"], OBJECTIVES["clip"],
                            doc="GRPO: UpdateConfig + ReturnSettings (credit episode) + GroupSettings + ClipSettings.")
RLOOConfig = compose_config("RLOOConfig", ADVANTAGES["rloo"], OBJECTIVES["clip"],
                            doc="RLOO: like GRPOConfig (``group_scale`` is not read).")
GSPOConfig = compose_config("GSPOConfig", ADVANTAGES["group"], OBJECTIVES["gspo"],
                            doc="GSPO: GRPOConfig's settings; clip 3e-4 / 4e-4, seq-mean-token-mean.")
CISPOConfig = compose_config("CISPOConfig", ADVANTAGES["group"], OBJECTIVES["cispo"],
                             doc="CISPO: GRPOConfig's settings; no lower bound (clip_eps=1), clip_eps_high 0.28.")
PPOConfig = compose_config("PPOConfig", ADVANTAGES["gae"], OBJECTIVES["clip"], Critic,
                           doc="PPO: UpdateConfig + ReturnSettings (credit token) + GAESettings + CriticSettings "
                               "+ ClipSettings.")
DualClipPPOConfig = compose_config("DualClipPPOConfig", ADVANTAGES["gae"], OBJECTIVES["dual-clip"], Critic,
                                   doc="Dual-clip PPO: PPOConfig's settings with dual_clip_c = 3.")
for _config in (ReinforceConfig, GRPOConfig, RLOOConfig, GSPOConfig, CISPOConfig, PPOConfig, DualClipPPOConfig):
    _config.__module__ = __name__   # importable (pickle) where it is defined


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
