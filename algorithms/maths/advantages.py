"""Advantage estimators: per-token rewards → per-token advantages and returns, one registered
function each, all with one signature (the pattern of veRL's ``core_algos``, not its code)::

    @register_advantage("name", credits=(...), settings=(...))
    def my_estimator(inputs: AdvantageInputs, config) -> advantages | (advantages, returns)

``inputs`` holds the batch's trajectories and ``(B, T)`` token tensors with per-turn views
(:class:`AdvantageInputs`); ``config`` is the learner's typed config, which subclasses the settings
blocks the estimator declares (small dataclasses below; a learner's config sets the values it needs,
e.g. its ``credit``). The math lives in :mod:`.returns`; this module only says how each estimator
combines it.

=========  ==========================  ===================================================
name       credits                     what it is
=========  ==========================  ===================================================
returns    turn, episode               REINFORCE: return minus a batch baseline, or ReBN
group      episode, turn, gigpo        GRPO: returns normalised within the task's group
rloo       episode, turn, gigpo        RLOO: leave-one-out group baseline
gae        token, turn                 PPO: GAE with a critic, whitened over the batch
=========  ==========================  ===================================================
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Mapping, Sequence

import torch

from agentgym.trajectory import Trajectory

from agentgym.algorithms.maths.losses import Settings, masked_whiten
from agentgym.algorithms.parts import Registry
from agentgym.algorithms.maths.returns import (CREDITS, pad_token_lists, broadcast_to_tokens, discounted_returns, episode_returns, gae,
                                         group_normalize, leave_one_out, make_baseline, observation_history_keys,
                                         rebn, turn_gae, turn_group_normalize, turn_rewards)

__all__ = ["ReturnSettings", "BaselineSettings", "GroupSettings", "GAESettings", "AdvantageInputs",
           "AdvantageEstimator", "ADVANTAGES", "register_advantage", "BASELINES"]

BASELINES = ("none", "mean", "ema", "rebn")


# --------------------------------------------------------------------------- the estimators' settings

@dataclass
class ReturnSettings(Settings):
    """Every advantage estimator: ``credit`` — how step rewards reach each turn's tokens (``episode``,
    ``turn``, ``gigpo`` or ``token``; see :mod:`.returns`), ``gamma`` (the per-turn discount; GAE's
    per-token one for ``token``), ``adv_eps`` (added to a std before dividing)."""
    credit: str = field(default="episode", metadata={
        "help": "how step rewards reach each turn's tokens: episode, turn, gigpo or token (see returns.py)"})
    gamma: float = field(default=1.0, metadata={
        "help": "discount in [0, 1]: per turn; per token with credit=token"})
    adv_eps: float = field(default=1e-6, metadata={"help": "added to a std before dividing by it"})

    def __post_init__(self) -> None:
        if self.credit not in CREDITS:
            raise ValueError(f"credit must be one of {CREDITS}, got {self.credit!r}")
        _check_unit("gamma", self.gamma)
        super().__post_init__()


@dataclass
class BaselineSettings(Settings):
    """REINFORCE's batch baseline: ``none``, ``mean``, ``ema`` (``baseline_momentum``) or ``rebn``."""
    baseline: str = field(default="rebn", metadata={
        "help": "REINFORCE's baseline: none, mean (of the batch), ema (moving mean) or rebn (normalised returns)"})
    baseline_momentum: float = field(default=0.9, metadata={"help": "the ema baseline's momentum, in [0, 1)"})

    def __post_init__(self) -> None:
        if self.baseline not in BASELINES:
            raise ValueError(f"baseline must be one of {BASELINES}, got {self.baseline!r}")
        if not 0 <= self.baseline_momentum < 1:
            raise ValueError(f"baseline_momentum must be in [0, 1), got {self.baseline_momentum}")
        super().__post_init__()


@dataclass
class GroupSettings(Settings):
    """Group estimators: ``group_scale`` (False = Dr.GRPO, no std division); ``turn_adv_weight``: GiGPO's
    ω, the weight of the turn-level term under ``credit="gigpo"``."""
    group_scale: bool = field(default=True, metadata={
        "help": "divide group-centred returns by the group's std; false = Dr.GRPO (no division)"})
    turn_adv_weight: float = field(default=1.0, metadata={
        "help": "GiGPO's omega (>= 0): the weight of the turn-level term under credit=gigpo"})

    def __post_init__(self) -> None:
        if not (math.isfinite(self.turn_adv_weight) and self.turn_adv_weight >= 0):
            raise ValueError(f"turn_adv_weight must be a finite number >= 0, got {self.turn_adv_weight}")
        super().__post_init__()


@dataclass
class GAESettings(Settings):
    """GAE: ``lam``; ``whiten_advantages`` over the batch (PPO)."""
    lam: float = field(default=1.0, metadata={"help": "GAE's lambda, in [0, 1]"})
    whiten_advantages: bool = field(default=True, metadata={
        "help": "normalise GAE advantages to mean 0, std 1 over the batch (PPO)"})

    def __post_init__(self) -> None:
        _check_unit("lam", self.lam)
        super().__post_init__()


def _check_unit(name: str, value: float) -> None:
    if not 0 <= value <= 1:
        raise ValueError(f"gamma and lam must be in [0, 1], got {name}={value}")


# --------------------------------------------------------------------------- what an estimator sees

@dataclass
class AdvantageInputs:
    """What an advantage estimator sees: the batch's trajectories and its ``(B, T)`` token tensors.

    ``rewards``: each step reward on its turn's last policy token, minus ``kl_coef · KL`` per token when
    the KL is in the reward; ``mask``: the training mask; ``values``: the critic's values at collection
    (``values[:, t]`` = the value of the state in which token ``t`` is chosen; None without a critic);
    ``fill_env``: the ``mask_env_tokens=False`` ablation (environment tokens take the value of the
    turn they follow). ``credit``: the credit choice in force (the config's, checked against the
    estimator's ``credits``); ``state``: the estimator's state across updates (REINFORCE's moving
    baseline), None when it has none. Helpers give per-turn views and map per-turn numbers back to tokens.
    """
    trajectories: Sequence[Trajectory]
    rewards: torch.Tensor
    mask: torch.Tensor
    values: torch.Tensor | None = None
    fill_env: bool = False
    credit: str | None = None
    state: Any = None

    @property
    def group_ids(self) -> list[Any]:
        return [t.group_id for t in self.trajectories]

    def turn_rewards(self) -> list[list[float]]:
        """Per trajectory, each turn's reward (:func:`~agentgym.algorithms.maths.returns.turn_rewards`)."""
        rows = self.rewards.detach().cpu().tolist()
        return [turn_rewards(row[:len(t.token_ids)], t.turn_spans) for t, row in zip(self.trajectories, rows)]

    def turn_values(self) -> list[list[float]]:
        """Per trajectory, the critic's value at each turn's first token."""
        if self.values is None:
            raise ValueError("this estimator needs a critic's values")
        rows = self.values.detach().cpu().tolist()
        return [[row[s] for s, _ in t.turn_spans] for t, row in zip(self.trajectories, rows)]

    def state_keys(self) -> list[list[tuple[int, ...]]]:
        """Per trajectory, each turn's observation history (what two turns must share to share a baseline)."""
        return [observation_history_keys(t.token_ids, t.loss_mask, t.turn_spans) for t in self.trajectories]

    def to_tokens(self, per_turn: Sequence[Sequence[float]]) -> torch.Tensor:
        """``(B, T)``: each turn's number on its policy tokens (and, with ``fill_env``, on the environment
        tokens after it; those between the prompt and the first turn take the first turn's)."""
        rows = []
        for t, values in zip(self.trajectories, per_turn):
            row = broadcast_to_tokens(t.turn_spans, values, len(t.token_ids), fill_env=self.fill_env)
            if self.fill_env and t.turn_spans and len(values):
                first = t.turn_spans[0][0]
                row[t.prompt_length:first] = [float(values[0])] * (first - t.prompt_length)
            rows.append(row)
        return pad_token_lists(rows, self.rewards.shape[1]).to(self.rewards.device)


# --------------------------------------------------------------------------- the registry

class AdvantageEstimator:
    """A registered estimator, as the learner holds it: ``estimator(inputs) -> (advantages, returns)``,
    ``(B, T)``; the learner multiplies both by the training mask.

    :func:`register_advantage` builds one from a function; a subclass may instead override
    ``__call__``. Class attributes: ``credits`` (the ``credit`` choices supported; None: ``credit`` is
    not read), ``settings`` (the settings blocks it reads: a learner's config subclasses them), ``critic`` (it needs value estimates: the learner then owns a
    critic), ``needs_groups`` (it compares trajectories of a group), ``make_state`` (``config ->``
    the state kept across updates, with ``state_dict`` / ``load_state_dict``; None: stateless).
    """
    name: ClassVar[str] = ""
    settings: ClassVar[tuple[type, ...]] = (ReturnSettings,)
    credits: ClassVar[tuple[str, ...] | None] = ("episode",)
    critic: ClassVar[bool] = False
    needs_groups: ClassVar[bool] = False
    make_state: ClassVar[Callable[[Any], Any] | None] = None

    def __init__(self, config: Any):
        self.config = config
        credit = None
        if self.credits is not None:
            credit = config.credit
            if credit not in self.credits:
                raise ValueError(f"credit={credit!r} is not supported by the {self.name!r} advantage estimator; "
                                 f"choose one of {', '.join(self.credits)}")
        self.credit = credit
        make_state = type(self).make_state
        self.state = make_state(config) if make_state is not None else None

    def __call__(self, inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        return self.state.state_dict() if self.state is not None else {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if self.state is not None:
            self.state.load_state_dict(dict(state))


#: name -> advantage estimator class (:func:`register_advantage`)
ADVANTAGES: Registry = Registry("advantage estimator")


def register_advantage(name: str, estimator: type[AdvantageEstimator] | Callable | None = None, *,
                       credits: tuple[str, ...] | None = None, critic: bool = False, needs_groups: bool = False,
                       settings: tuple[type, ...] = (ReturnSettings,), state: Callable[[Any], Any] | None = None,
                       replace: bool = False) -> Any:
    """Register an advantage estimator under ``name`` (also usable as a decorator).

    ``estimator``: a function ``fn(inputs, config)`` returning advantages (or ``(advantages,
    returns)``) as ``(B, T)`` tensors — see :class:`AdvantageInputs` for per-turn helpers — or an
    :class:`AdvantageEstimator` subclass. For a function the keywords describe it: the ``credit``
    choices it honours (None: it does not read ``credit``), whether it needs a critic's values
    (``inputs.values``) or groups, the settings blocks it reads (a learner's config subclasses them), and
    ``state``: ``config ->`` an object kept across updates and checkpoints (``inputs.state``).
    """
    def wrap(fn: Callable) -> type:
        def call(self: AdvantageEstimator, inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
            out = fn(dataclasses.replace(inputs, credit=self.credit, state=self.state), self.config)
            return out if isinstance(out, tuple) else (out, torch.zeros_like(out))
        return type(f"{fn.__name__}_advantage", (AdvantageEstimator,), {
            "__call__": call, "__doc__": fn.__doc__, "credits": credits, "critic": critic,
            "needs_groups": needs_groups, "settings": tuple(settings),
            "make_state": staticmethod(state) if state is not None else None, "__module__": fn.__module__})
    return ADVANTAGES.decorator(name, estimator, AdvantageEstimator, wrap, replace)


# --------------------------------------------------------------------------- the built-in estimators

def _check_groups(groups: Sequence[Any], name: str) -> None:
    counts: dict[Any, int] = {}
    for g in groups:
        if g is not None:
            counts[g] = counts.get(g, 0) + 1
    if not any(c > 1 for c in counts.values()):
        raise ValueError(f"{name} needs groups of trajectories on the same task: collect with group_size > 1")


def _moving_baseline(config: Any) -> Any:
    """REINFORCE's baseline object (None for ReBN, a normalisation rather than a baseline)."""
    return None if config.baseline == "rebn" else make_baseline(config.baseline, config.baseline_momentum)


@register_advantage("returns", credits=("turn", "episode"), settings=(ReturnSettings, BaselineSettings),
                    state=_moving_baseline)
def returns_advantage(inputs: AdvantageInputs, config: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE's: each turn's target (``turn``: its discounted return-to-go; ``episode``: the
    episode's return) minus a batch baseline (none, batch mean, moving average) or normalised over
    the batch (ReBN, GEM's default). With ``turn`` credit the baseline pools every transition of the
    batch, as GEM; with ``episode`` credit one value per trajectory (a long episode does not weigh more)."""
    rewards = inputs.turn_rewards()
    if inputs.credit == "turn":
        targets = [discounted_returns(r, config.gamma) for r in rewards]
        pool = [g for r in targets for g in r]
    else:
        targets = [episode_returns(r, config.gamma) for r in rewards]
        pool = [r[0] if r else 0.0 for r in targets]
    if inputs.state is None:
        adv_pool = rebn(pool, config.adv_eps)
    else:
        b = inputs.state(pool)
        adv_pool = [g - b for g in pool]
    if inputs.credit == "turn":
        adv, i = [], 0
        for r in targets:
            adv.append(adv_pool[i:i + len(r)])
            i += len(r)
    else:
        adv = [[a] * len(r) for a, r in zip(adv_pool, targets)]
    return inputs.to_tokens(adv), inputs.to_tokens(targets)


def _group_advantage(inputs: AdvantageInputs, config: Any, loo: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO's and RLOO's: returns compared within the group of trajectories on the same task.

    * ``episode``: each trajectory's return against its group (GRPO: ``(G - mean) / (std + eps)``,
      Dr.GRPO without the std: ``group_scale=False``; RLOO: minus the mean of the *other* members),
      on all its turns.
    * ``turn``: each turn's return-to-go against turn-level baselines — the group's turns with the
      same observation history, else the group's turns at the same index
      (:func:`~agentgym.algorithms.maths.returns.turn_group_normalize`).
    * ``gigpo``: GiGPO (Feng et al., 2025, arXiv:2505.10978): the episode advantage plus
      ``turn_adv_weight`` × the turn advantage within groups of equal observation history (0 for a turn
      without a peer).
    """
    groups = inputs.group_ids
    _check_groups(groups, f"the {'rloo' if loo else 'group'!r} advantage estimator (GRPO, RLOO, …)")
    rewards = inputs.turn_rewards()
    rtg = [discounted_returns(r, config.gamma) for r in rewards]

    def turns(index_fallback: bool) -> list[list[float]]:
        return turn_group_normalize(rtg, groups, inputs.state_keys(), scale=config.group_scale, eps=config.adv_eps,
                                    leave_one_out_baseline=loo, index_fallback=index_fallback)
    if inputs.credit == "turn":
        return inputs.to_tokens(turns(index_fallback=True)), inputs.to_tokens(rtg)
    episode = [episode_returns(r, config.gamma) for r in rewards]
    firsts = [e[0] if e else 0.0 for e in episode]
    adv_episode = (leave_one_out(firsts, groups) if loo else
                   group_normalize(firsts, groups, scale=config.group_scale, eps=config.adv_eps))
    adv = [[a] * len(e) for a, e in zip(adv_episode, episode)]
    if inputs.credit == "episode":
        return inputs.to_tokens(adv), inputs.to_tokens(episode)
    w = config.turn_adv_weight   # gigpo
    adv = [[a + w * b for a, b in zip(ea, ta)] for ea, ta in zip(adv, turns(index_fallback=False))]
    return inputs.to_tokens(adv), inputs.to_tokens(rtg)


@register_advantage("group", credits=("episode", "turn", "gigpo"), settings=(ReturnSettings, GroupSettings),
                    needs_groups=True)
def group_advantage(inputs: AdvantageInputs, config: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO's: each return normalised within its group (``group_id``: same task); see :func:`_group_advantage`."""
    return _group_advantage(inputs, config, loo=False)


@register_advantage("rloo", credits=("episode", "turn", "gigpo"), settings=(ReturnSettings, GroupSettings),
                    needs_groups=True)
def leave_one_out_advantage(inputs: AdvantageInputs, config: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO's: each return compared with the mean of the *other* members of its pool (Kool et al., 2019;
    Ahmadian et al., 2024, arXiv:2402.14740) — an unbiased baseline, no std scaling (``group_scale`` is
    not read)."""
    return _group_advantage(inputs, config, loo=True)


@register_advantage("gae", credits=("token", "turn"), settings=(ReturnSettings, GAESettings), critic=True)
def gae_advantage(inputs: AdvantageInputs, config: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's: generalised advantage estimation with a critic; advantages whitened over the batch
    (``whiten_advantages``).

    * ``token`` (default): over the sequence of policy tokens (env tokens skipped), ``gamma`` and
      ``lam`` per token (:func:`~agentgym.algorithms.maths.returns.gae`).
    * ``turn``: one step per turn, the value read at each turn's first token, every token of a turn
      sharing its advantage and return (:func:`~agentgym.algorithms.maths.returns.turn_gae`).
    """
    if inputs.credit == "token":
        adv, ret = gae(inputs.rewards, inputs.values, inputs.mask, config.gamma, config.lam)
    else:
        pairs = [turn_gae(r, v, config.gamma, config.lam) for r, v in zip(inputs.turn_rewards(), inputs.turn_values())]
        adv, ret = inputs.to_tokens([a for a, _ in pairs]), inputs.to_tokens([r for _, r in pairs])
    if config.whiten_advantages:
        adv = masked_whiten(adv, inputs.mask)
    return adv, ret
