"""What a learner saves and hands on: its checkpoint state and the policy's weights (a mixin of
:class:`~agentgym.algorithms.loop.learner.Learner`, kept apart so that the learner's file is its update loop).

Under FSDP these calls are collectives (every rank makes them): weights, a sharded critic and the
optimizer state are gathered in full (:class:`~agentgym.algorithms.loop.parallel.Parallel`), so a
checkpoint does not depend on the number of processes that wrote it.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
from torch import nn

from agentgym.policy import weight_name_mismatch

from agentgym.algorithms.loop.optim import is_peft

__all__ = ["LearnerState"]


class LearnerState:
    """Checkpoint state and weights of a learner (needs ``model``, ``parallel``, ``optimizer``,
    ``scheduler``, ``advantage``, ``_critic``, ``_rng``, ``step`` and ``name``)."""

    def policy_weights(self) -> nn.Module | list[tuple[str, torch.Tensor]]:
        """What a separate sampler loads after an update (``policy.sync_weights``): the trained module
        itself, or with LoRA the base weights with the adapter merged in, under the base model's names
        (an inference engine then needs no LoRA support and samples exactly the trained policy)."""
        if self.fsdp:   # collective: every rank syncs its own sampler after the same update
            return list(self.full_model_state().items())
        if not is_peft(self.model):
            return self.model
        self.model.merge_adapter()
        try:
            base = self.model.get_base_model()
            return [(k.replace(".base_layer", ""), v.detach().clone()) for k, v in base.state_dict().items()
                    if "lora_" not in k]
        finally:
            self.model.unmerge_adapter()

    def full_model_state(self) -> dict[str, torch.Tensor]:
        """The trained policy's full (unsharded) weights. Under FSDP every rank must call this (it
        gathers the shards); otherwise it is the module's state dict."""
        return self.parallel.full_model_state(self.model)

    def load_full_model_state(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Load full (unsharded) policy weights, e.g. from a checkpoint; under FSDP into each rank's
        shards (every rank calls it with the same weights). A tied ``lm_head.weight`` may be absent; any
        other missing or unexpected name is refused (RuntimeError) before anything is loaded."""
        missing, unexpected = weight_name_mismatch(self.model.state_dict(), weights)
        if missing or unexpected:
            raise RuntimeError(f"missing {missing[:3]}, unexpected {unexpected[:3]}")
        self.parallel.load_full_model_state(self.model, dict(weights), strict=False)

    def state_dict(self) -> dict[str, Any]:
        """Optimizer, scheduler, RNG, advantage and critic state for a checkpoint. Under FSDP every rank
        must call it: the optimizer state and a sharded critic are gathered in full (collectives), so a
        checkpoint does not depend on the number of processes that wrote it."""
        state = {"name": self.name, "step": self.step,
                 "optimizer": self.parallel.optimizer_state(self._optimized_modules(), self.optimizer),
                 "scheduler": self.scheduler.state_dict(), "rng": self._rng.get_state(),
                 "advantage": self.advantage.state_dict()}
        if self._critic is not None:
            if self.critic is not None:
                state["critic"] = {k: v.detach().cpu().clone()
                                   for k, v in self.parallel.full_model_state(self.critic).items()}
            else:
                state["critic"] = self._critic.state_dict()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("name", self.name) != self.name:
            raise ValueError(f"state of a {state['name']!r} learner cannot load into {self.name!r}")
        self.step = int(state["step"])
        # the critic first: under FSDP the optimizer state is mapped through the modules' parameters
        if self.critic is not None:
            self.parallel.load_full_model_state(self.critic, dict(state["critic"]))
        elif self._critic is not None:
            self._critic.load_state_dict(state["critic"])
        self.parallel.load_optimizer_state(self._optimized_modules(), self.optimizer, state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self._rng.set_state(state["rng"])
        # "baseline": REINFORCE checkpoints written before the learners were split into parts
        self.advantage.load_state_dict(state.get("advantage", state.get("baseline", {})))

    def _optimized_modules(self) -> nn.Module:
        """Every module whose parameters the optimizer updates, under one root (FSDP's state-dict helpers
        map optimizer state to parameter names through it)."""
        mods = nn.ModuleDict({"policy": self.model})
        if self._critic is not None:
            mods["critic"] = self._critic.module
        return mods
