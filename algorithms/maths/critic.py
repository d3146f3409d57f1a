"""The optional critic: a value function owned by the learner, for estimators that need values (GAE).

``critic="head"``: a linear head on the policy's last hidden state (the value loss also trains the
shared body); ``"model"``: a separate copy of the network with its own head (:class:`ValueModel`).
The value loss itself is a shared term (:func:`~agentgym.algorithms.maths.losses.clipped_value_loss`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Mapping

import torch
from torch import nn

from agentgym.algorithms.maths.losses import ValueLossSettings

__all__ = ["CriticSettings", "ValueModel", "Critic"]


@dataclass
class CriticSettings(ValueLossSettings):
    """The critic: ``critic="head"`` (a linear head on the policy's last hidden state, owned by the
    learner) or ``"model"`` (a separate copy of the network with its own head); ``critic_lr`` (None =
    the optimizer's ``lr``), ``critic_warmup_ratio`` (its own warmup share of ``total_steps``; None =
    the actor's; Search-R1: 0.015 against the actor's 0.285); the value loss's ``value_coef`` and
    ``value_clip_eps`` (:class:`~agentgym.algorithms.maths.losses.ValueLossSettings`)."""
    critic: str = field(default="head", metadata={
        "help": "head (a value head on the policy's last hidden state) or model (a separate network copy)"})
    critic_lr: float | None = field(default=None, metadata={"help": "the critic's learning rate; null = optim.lr"})
    critic_warmup_ratio: float | None = field(default=None, metadata={
        "help": "the critic's warmup share of total_steps, in [0, 1]; null = the actor's"})

    def __post_init__(self) -> None:
        if self.critic not in ("head", "model"):
            raise ValueError(f"critic must be one of ('head', 'model'), got {self.critic!r}")
        if self.critic_warmup_ratio is not None and not 0 <= self.critic_warmup_ratio <= 1:
            raise ValueError(f"critic_warmup_ratio must be in [0, 1] or None, got {self.critic_warmup_ratio}")
        super().__post_init__()


class ValueModel(nn.Module):
    """A separate critic: the body of a causal LM (its ``base_model``) and a linear value head."""

    def __init__(self, causal_lm: nn.Module):
        super().__init__()
        self.body = causal_lm.base_model
        self.head = _value_head(causal_lm.config.hidden_size)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                position_ids: torch.Tensor) -> torch.Tensor:
        h = self.body(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                      use_cache=False).last_hidden_state
        return _aligned_values(self.head, h)


def _value_head(hidden: int) -> nn.Linear:
    head = nn.Linear(hidden, 1)
    nn.init.zeros_(head.weight)  # V = 0 at the start: the first advantages are the returns
    nn.init.zeros_(head.bias)
    return head


def _aligned_values(head: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """``V[:, t]`` = value of the state in which token ``t`` is chosen = head(hidden at ``t - 1``)."""
    v = head(hidden.to(head.weight.dtype)).squeeze(-1)
    return torch.cat([v.new_zeros(v.shape[0], 1), v[:, :-1]], dim=1)


class Critic:
    """The optional value function, owned by the learner (never written onto the policy).

    ``critic="head"``: a linear head on the policy's last hidden state (the value loss also trains the
    shared body); ``"model"``: a separate copy of the network with its own head (:class:`ValueModel`).
    Built before LoRA wraps the policy, so a separate critic copies the plain network.
    """
    settings = (CriticSettings,)

    def __init__(self, config: Any, model: nn.Module):
        device = next(model.parameters()).device
        self.model: ValueModel | None = None
        if config.critic == "model":
            self.model = ValueModel(copy.deepcopy(model)).to(device)
            self.model.requires_grad_(True)
            self.head = self.model.head
        else:
            self.head = _value_head(model.config.hidden_size).to(device)

    @property
    def module(self) -> nn.Module:
        return self.model if self.model is not None else self.head

    @property
    def on_policy_hidden(self) -> bool:
        """True when values come from the policy's own forward pass (the head)."""
        return self.model is None

    def parameters(self) -> list[nn.Parameter]:
        return [p for p in self.module.parameters() if p.requires_grad]

    def train(self, mode: bool) -> None:
        if self.model is not None:
            self.model.train(mode)

    def values(self, micro: Any, policy_hidden: torch.Tensor | None) -> torch.Tensor:
        """Values of a micro-batch (the loop's ``Batch``: its ``input_ids``, ``attention_mask``, ``position_ids``)."""
        if self.model is not None:
            return self.model(micro.input_ids, micro.attention_mask, micro.position_ids)
        return _aligned_values(self.head, policy_hidden)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu().clone() for k, v in self.module.state_dict().items()}

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        self.module.load_state_dict(state)
