"""Advantage estimators, losses and learners (installed as ``agentgym.algorithms``)."""

from agentgym.algorithms.advantages import (BatchMeanBaseline, MovingAverageBaseline, NoBaseline, broadcast_to_tokens,
                                            discounted_returns, gae, group_normalize, make_baseline, rebn)
from agentgym.algorithms.batch import Batch, collate
from agentgym.algorithms.learners import (LEARNERS, GRPOLearner, Learner, LearnerConfig, LoraSettings, PPOLearner,
                                          ReinforceLearner, ValueModel, lr_factor, make_learner)
from agentgym.algorithms.losses import (LossSettings, aggregate, clipped_surrogate, clipped_value_loss, kl_penalty,
                                        ppo_objective, reinforce_surrogate, token_logprobs)
# TRL's GRPOTrainer on agentgym envs; trl itself is imported only when these are used
from agentgym.algorithms.trl_adapter import EnvRollout, episode_reward, make_task_dataset, train_with_trl

__all__ = [
    "discounted_returns", "broadcast_to_tokens", "NoBaseline", "BatchMeanBaseline", "MovingAverageBaseline",
    "make_baseline", "rebn", "gae", "group_normalize",
    "LossSettings", "token_logprobs", "clipped_surrogate", "reinforce_surrogate", "aggregate", "kl_penalty",
    "clipped_value_loss", "ppo_objective",
    "Batch", "collate",
    "LearnerConfig", "LoraSettings", "Learner", "ReinforceLearner", "PPOLearner", "GRPOLearner", "ValueModel",
    "LEARNERS", "make_learner", "lr_factor",
    "EnvRollout", "episode_reward", "make_task_dataset", "train_with_trl",
]
