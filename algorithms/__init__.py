"""Advantage estimators, losses and learners (installed as ``agentgym.algorithms``).

A learner = a registered advantage estimator + a registered policy objective (+ a critic when the
estimator needs values); :func:`register_advantage`, :func:`register_objective` and
:func:`register_learner` let a user module (``agentgym --import mymod train algo=...``) add its own.
"""

from agentgym.algorithms.advantages import (BatchMeanBaseline, MovingAverageBaseline, NoBaseline, broadcast_to_tokens,
                                            discounted_returns, episode_returns, gae, group_normalize, leave_one_out,
                                            make_baseline, observation_history_keys, rebn, turn_gae,
                                            turn_group_normalize, turn_rewards)
from agentgym.algorithms.batch import Batch, collate
from agentgym.algorithms.learners import (ADVANTAGES, LEARNERS, OBJECTIVES, AdvantageEstimator, AdvantageInputs,
                                          CISPOConfig, ClipSettings, CriticSettings, DualClipPPOConfig, GAESettings,
                                          GroupSettings, GRPOConfig, GRPOLearner, GSPOConfig, Learner, LearnerConfig,
                                          LoraSettings, OptimConfig, PolicyObjective, PPOConfig, PPOLearner,
                                          ReinforceConfig, ReinforceLearner, ReturnSettings, RLOOConfig,
                                          BaselineSettings, ValueModel, compose_config, lr_factor, make_learner,
                                          register_advantage, register_learner, register_objective, resolve_config)
from agentgym.algorithms.losses import (LossSettings, aggregate, cispo_surrogate, clipped_surrogate, clipped_value_loss,
                                        dual_clip_surrogate, gspo_surrogate, kl_penalty, ppo_objective,
                                        reinforce_surrogate, token_logprobs)
# TRL's GRPOTrainer on agentgym envs; trl itself is imported only when these are used
from agentgym.algorithms.trl_adapter import EnvRollout, episode_reward, make_task_dataset, train_with_trl

__all__ = [
    "discounted_returns", "broadcast_to_tokens", "NoBaseline", "BatchMeanBaseline", "MovingAverageBaseline",
    "make_baseline", "rebn", "gae", "group_normalize", "leave_one_out", "episode_returns", "turn_rewards",
    "observation_history_keys", "turn_group_normalize", "turn_gae",
    "LossSettings", "token_logprobs", "clipped_surrogate", "dual_clip_surrogate", "gspo_surrogate",
    "cispo_surrogate", "reinforce_surrogate", "aggregate", "kl_penalty", "clipped_value_loss", "ppo_objective",
    "Batch", "collate",
    "LearnerConfig", "OptimConfig", "LoraSettings", "ReturnSettings", "BaselineSettings", "GroupSettings",
    "GAESettings", "CriticSettings", "ClipSettings", "ReinforceConfig", "GRPOConfig", "RLOOConfig", "GSPOConfig",
    "CISPOConfig", "PPOConfig", "DualClipPPOConfig", "compose_config", "resolve_config",
    "AdvantageInputs", "AdvantageEstimator", "PolicyObjective", "Learner", "ReinforceLearner", "PPOLearner",
    "GRPOLearner", "ValueModel", "ADVANTAGES", "OBJECTIVES", "LEARNERS", "register_advantage", "register_objective",
    "register_learner", "make_learner", "lr_factor",
    "EnvRollout", "episode_reward", "make_task_dataset", "train_with_trl",
]
