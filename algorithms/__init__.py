"""Advantage estimators, objectives, losses and learners (installed as ``agentgym.algorithms``).

A learner = a registered advantage estimator (:mod:`.maths.advantages`) + a registered policy objective
(:mod:`.maths.objectives`) (+ a critic, :mod:`.maths.critic`, when the estimator needs values), trained by
one update loop (:mod:`.loop.learner`); :func:`register_advantage`, :func:`register_objective` and
:func:`register_learner` let a user module (``agentgym --import mymod train algo=...``) add its own
(docs/extending.md).

Grouped by job: :mod:`.maths` (estimators, objectives, loss terms, critic), :mod:`.loop` (the update
and the run), :mod:`.compare` (the comparison harness), :mod:`.offline` (SFT, DPO, the TRL adapter);
at the top, :mod:`.catalog` (the learner registry and the built-in learners) and :mod:`.parts` (the
``Registry`` helper every registered part uses).
"""

from agentgym.algorithms.maths.advantages import (ADVANTAGES, AdvantageEstimator, AdvantageInputs, BaselineSettings,
                                            GAESettings, GroupSettings, ReturnSettings, register_advantage)
from agentgym.algorithms.loop.batch import Batch, collate
from agentgym.algorithms.catalog import (LEARNERS, CISPOConfig, DualClipPPOConfig, GRPOConfig, GRPOLearner, GSPOConfig,
                                         PPOConfig, PPOLearner, ReinforceConfig, ReinforceLearner, RLOOConfig,
                                         learner_config_class, learner_needs_groups, make_learner, register_learner)
# the negative controls (grpo-shuffled) register themselves like any user module would
from agentgym.algorithms.compare.controls import is_negative_control_learner
from agentgym.algorithms.maths.critic import CriticSettings, ValueModel
from agentgym.algorithms.loop.learner import Learner
from agentgym.algorithms.loop.learner_config import UpdateConfig
from agentgym.algorithms.maths.losses import (ClipSettings, LossSettings, LossTermSettings, ValueLossSettings, aggregate, cispo_surrogate, clipped_surrogate, clipped_value_loss,
                                        dual_clip_surrogate, gspo_surrogate, kl_penalty, ppo_objective,
                                        reinforce_surrogate, token_logprobs)
from agentgym.algorithms.maths.objectives import OBJECTIVES, PolicyObjective, register_objective
from agentgym.algorithms.loop.optim import LoraSettings, OptimConfig, lr_factor
from agentgym.algorithms.maths.returns import (BatchMeanBaseline, MovingAverageBaseline, NoBaseline, broadcast_to_tokens,
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
