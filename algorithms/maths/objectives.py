"""Policy objectives: the per-token policy-gradient term of the loss, one registered function each,
all with one signature (the pattern of veRL's ``core_algos`` policy losses, not its code)::

    @register_objective("name", settings=(...), on_policy_only=False)
    def my_objective(logp, old_logp, advantages, mask, config) -> loss | (loss, ratio, clipped)

All tensors are ``(B, T)``; ``mask`` marks the trained tokens that have sampling-time log-probs (what
a sequence-level ratio averages over); ``config`` is the learner's typed config, which subclasses the
settings blocks the objective declares (checked when a learner is registered); the values of those
settings for one algorithm are its config's defaults (``GSPOConfig``'s clip range, …). The shared
loss (:func:`~agentgym.algorithms.maths.losses.ppo_objective`) aggregates the term and adds entropy, KL and
value terms; the surrogate math is in :mod:`.losses`.

==========  =========================================================================
name        what it is
==========  =========================================================================
clip        PPO's clipped ratio; clip-higher (``clip_eps_high``), dual-clip (``dual_clip_c``)
dual-clip   the same; its learner (``dual-clip-ppo``) has the dual-clip bound on by default (c = 3)
reinforce   ``-A · log p``, on-policy only
gspo        GSPO's sequence-level, length-normalised ratio
cispo       CISPO's clipped, detached importance weight on ``-A · log p``
==========  =========================================================================
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar

import torch

from agentgym.algorithms.maths.losses import ClipSettings, cispo_surrogate, gspo_surrogate, ppo_clip_term, reinforce_surrogate
from agentgym.algorithms.parts import Registry

__all__ = ["PolicyObjective", "OBJECTIVES", "register_objective", "ClipObjective",
           "DualClipObjective", "ReinforceObjective", "GSPOObjective", "CISPOObjective"]


class PolicyObjective:
    """A registered objective, as the learner holds it: ``objective(logp, old_logp, advantages,
    ratio_mask) -> (loss, ratio, clipped)``, all ``(B, T)`` (a
    :data:`~agentgym.algorithms.maths.losses.PolicyTerm`).

    :func:`register_objective` builds one from a function; a subclass may instead override
    ``__call__``. ``settings``: the settings blocks it reads (a learner's config must subclass them);
    ``on_policy_only``: the term has no importance ratio, so the learner makes one step per batch.
    """
    name: ClassVar[str] = ""
    settings: ClassVar[tuple[type, ...]] = ()
    on_policy_only: ClassVar[bool] = False

    def __init__(self, config: Any):
        self.config = config

    def __call__(self, logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                 ratio_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        raise NotImplementedError


#: name -> policy objective class (:func:`register_objective`)
OBJECTIVES: Registry = Registry("objective", "the policy-gradient surrogate of the loss")


def register_objective(name: str, objective: type[PolicyObjective] | Callable | None = None, *,
                       on_policy_only: bool = False, settings: tuple[type, ...] = (), replace: bool = False,
                       title: str | None = None) -> Any:
    """Register a policy objective under ``name`` (also usable as a decorator).

    ``objective``: a function ``fn(logp, old_logp, advantages, mask, config)`` returning the per-token
    loss (or ``(loss, ratio, clipped)``), or a :class:`PolicyObjective` subclass. ``on_policy_only``:
    the term has no importance ratio (one step per batch). ``settings``: the settings blocks (dataclasses)
    it reads off the learner's config. ``title``: the class name the function
    gets (default ``<function>_objective``).
    """
    def wrap(fn: Callable) -> type:
        def call(self: PolicyObjective, logp, old_logp, advantages, ratio_mask):
            out = fn(logp, old_logp, advantages, ratio_mask, self.config)
            if isinstance(out, tuple):
                return out
            return out, torch.exp(logp - old_logp).detach(), torch.zeros_like(logp)
        return type(title or f"{fn.__name__}_objective", (PolicyObjective,), {
            "__call__": call, "__doc__": fn.__doc__, "on_policy_only": on_policy_only,
            "settings": tuple(settings), "__module__": fn.__module__})
    return OBJECTIVES.decorator(name, objective, PolicyObjective, wrap, replace)


# --------------------------------------------------------------------------- the built-in objectives

def clip(logp, old_logp, advantages, mask, config):
    """PPO's clipped ratio (Schulman et al., 2017), clip-higher with ``clip_eps_high`` (DAPO), dual-clip
    with ``dual_clip_c`` (Ye et al., 2020, arXiv:1912.09729)."""
    return ppo_clip_term(logp, old_logp, advantages, config)


def reinforce(logp, old_logp, advantages, mask, config):
    """``-A · log p`` (Williams, 1992): on-policy only."""
    return reinforce_surrogate(logp, advantages), torch.exp(logp - old_logp), torch.zeros_like(logp)


def gspo(logp, old_logp, advantages, mask, config):
    """GSPO's sequence-level, length-normalised ratio with sequence clipping (Zheng et al., 2025,
    arXiv:2507.18071; :func:`~agentgym.algorithms.maths.losses.gspo_surrogate`). In a multi-turn episode the
    sequence is the trajectory's policy tokens. ``GSPOConfig`` defaults to the paper's clip range
    3e-4 / 4e-4 and its sequence-mean aggregation."""
    return gspo_surrogate(logp, old_logp, advantages, mask, config.clip_eps, config.clip_eps_high)


def cispo(logp, old_logp, advantages, mask, config):
    """CISPO (MiniMax-M1, arXiv:2506.13585; :func:`~agentgym.algorithms.maths.losses.cispo_surrogate`): the
    clipped importance weight, detached, times ``-A log p``. ``CISPOConfig`` defaults: no lower bound
    (``clip_eps=1``), ``clip_eps_high=0.28``."""
    return cispo_surrogate(logp, old_logp, advantages, config.clip_eps, config.clip_eps_high)


register_objective("clip", clip, settings=(ClipSettings,), title="ClipObjective")
register_objective("dual-clip", clip, settings=(ClipSettings,), title="DualClipObjective")
register_objective("reinforce", reinforce, on_policy_only=True, title="ReinforceObjective")
register_objective("gspo", gspo, settings=(ClipSettings,), title="GSPOObjective")
register_objective("cispo", cispo, settings=(ClipSettings,), title="CISPOObjective")

#: The built-in objectives' classes (``type(learner.objective)``), e.g. to subclass one.
ClipObjective = OBJECTIVES["clip"]
DualClipObjective = OBJECTIVES["dual-clip"]
ReinforceObjective = OBJECTIVES["reinforce"]
GSPOObjective = OBJECTIVES["gspo"]
CISPOObjective = OBJECTIVES["cispo"]
