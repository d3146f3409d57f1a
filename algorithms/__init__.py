"""Advantage estimators, objectives, losses and learners (installed as ``agentgym.algorithms``).

A learner = a registered advantage estimator (:mod:`.advantages`) + a registered policy objective
(:mod:`.objectives`) (+ a critic, :mod:`.critic`, when the estimator needs values), trained by one
update loop (:mod:`.learner`); :func:`register_advantage`, :func:`register_objective` and
:func:`register_learner` let a user module (``agentgym --import mymod train algo=...``) add its own
(docs/extending.md). SFT, DPO and the TRL adapter are in :mod:`.offline`.
"""

from agentgym.algorithms.advantages import (ADVANTAGES, AdvantageEstimator, AdvantageInputs, BaselineSettings,
                                            GAESettings, GroupSettings, ReturnSettings, register_advantage)
from agentgym.algorithms.batch import Batch, collate
from agentgym.algorithms.catalog import (LEARNERS, CISPOConfig, DualClipPPOConfig, GRPOConfig, GRPOLearner, GSPOConfig,
                                         PPOConfig, PPOLearner, ReinforceConfig, ReinforceLearner, RLOOConfig,
                                         learner_config_class, learner_needs_groups, make_learner, register_learner)
# the negative controls (grpo-shuffled) register themselves like any user module would
from agentgym.algorithms.controls import is_negative_control_learner
from agentgym.algorithms.critic import CriticSettings, ValueModel
from agentgym.algorithms.learner import Learner
from agentgym.algorithms.learner_config import UpdateConfig
from agentgym.algorithms.losses import (ClipSettings, LossSettings, LossTermSettings, ValueLossSettings, aggregate, cispo_surrogate, clipped_surrogate, clipped_value_loss,
                                        dual_clip_surrogate, gspo_surrogate, kl_penalty, ppo_objective,
                                        reinforce_surrogate, token_logprobs)
from agentgym.algorithms.objectives import OBJECTIVES, PolicyObjective, register_objective
from agentgym.algorithms.optim import LoraSettings, OptimConfig, lr_factor
from agentgym.algorithms.returns import (BatchMeanBaseline, MovingAverageBaseline, NoBaseline, broadcast_to_tokens,
                                         discounted_returns, episode_returns, gae, group_normalize, leave_one_out,
                                         make_baseline, observation_history_keys, rebn, turn_gae, turn_group_normalize,
                                         turn_rewards)
# TRL's GRPOTrainer on agentgym envs; trl itself is imported only when these are used
from agentgym.algorithms.offline.trl_adapter import EnvRollout, episode_reward, make_task_dataset, train_with_trl

__all__ = [
    "discounted_returns", "broadcast_to_tokens", "NoBaseline", "BatchMeanBaseline", "MovingAverageBaseline",
    "make_baseline", "rebn", "gae", "group_normalize", "leave_one_out", "episode_returns", "turn_rewards",
    "observation_history_keys", "turn_group_normalize", "turn_gae",
    "LossSettings", "LossTermSettings", "ValueLossSettings", "token_logprobs", "clipped_surrogate", "dual_clip_surrogate", "gspo_surrogate",
    "cispo_surrogate", "reinforce_surrogate", "aggregate", "kl_penalty", "clipped_value_loss", "ppo_objective",
    "Batch", "collate",
    "UpdateConfig", "OptimConfig", "LoraSettings", "ReturnSettings", "BaselineSettings",
    "GroupSettings", "GAESettings", "CriticSettings", "ClipSettings", "ReinforceConfig", "GRPOConfig", "RLOOConfig",
    "GSPOConfig", "CISPOConfig", "PPOConfig", "DualClipPPOConfig", "learner_config_class",
    "AdvantageInputs", "AdvantageEstimator", "PolicyObjective", "Learner", "ReinforceLearner", "PPOLearner",
    "GRPOLearner", "ValueModel", "ADVANTAGES", "OBJECTIVES", "LEARNERS", "register_advantage", "register_objective",
    "register_learner", "make_learner", "learner_needs_groups", "is_negative_control_learner", "lr_factor",
    "EnvRollout", "episode_reward", "make_task_dataset", "train_with_trl",
]
