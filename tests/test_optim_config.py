"""One optimizer config for RL, SFT and DPO (``algorithms/loop/optim.py``), reached as ``optim.*`` in
``agentgym train``, ``sft`` and ``dpo``: the shared keys mean the same thing everywhere, each command's
own defaults come from its run config, SFT/DPO's former ``optim.warmup`` still works with a deprecation
warning, and the loss settings are read off the learner's config blocks rather than mirrored."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentgym.algorithms import GRPOConfig, LossSettings, OptimConfig, PPOConfig, make_learner
from agentgym.algorithms.loop.train_config import TrainConfig
from agentgym.algorithms.maths.losses import LossTermSettings, ValueLossSettings
from agentgym.algorithms.offline.dpo import DPORunConfig
from agentgym.algorithms.offline.sft import SFTRunConfig, TrainerOptimConfig, trl_training_kwargs
from agentgym.config import ConfigError, load_config
from agentgym.policies.transformers_policy import TransformersPolicy

from fixtures_llm import cached_tokenizer, one_torch_thread  # noqa: F401  (autouse fixture)


def test_rl_sft_and_dpo_share_one_optimizer_config():
    sft, dpo, train = SFTRunConfig().optim, DPORunConfig().optim, TrainConfig().optim
    for cfg in (train, sft, dpo):
        assert isinstance(cfg, OptimConfig)
    assert not isinstance(PPOConfig(), OptimConfig)     # the optimizer is not a learner setting
    # the same key, the same check, in every command
    with pytest.raises(ValueError, match="lr must be a finite number"):
        OptimConfig(lr=-1.0)
    for command in (TrainConfig, SFTRunConfig, DPORunConfig):
        with pytest.raises(ConfigError, match="lr must be a finite number"):
            load_config(command, None, ["optim.lr=-1"])
        assert load_config(command, None, ["optim.lr=3e-4"]).optim.lr == 3e-4
    with pytest.raises(ValueError, match="warmup_ratio must be in"):
        TrainerOptimConfig(warmup_ratio=2.0)
    # each section keeps its documented defaults
    assert (sft.lr, sft.schedule, sft.epochs) == (2e-5, "cosine", 2.0)
    assert (dpo.lr, dpo.schedule, dpo.epochs) == (1e-6, "cosine", 1.0)
    assert (train.lr, train.schedule) == (1e-5, "constant") and OptimConfig().lr == 1e-6
    # a file or override that sets one key keeps the command's other defaults
    assert load_config(SFTRunConfig, None, ["optim.lr=1e-4"]).optim.schedule == "cosine"


def test_lora_is_one_top_level_key_in_every_command():
    for command in (TrainConfig, SFTRunConfig, DPORunConfig):
        cfg = load_config(command, None, ["lora={r: 4, target_modules: [q_proj]}"])
        assert cfg.lora.r == 4 and cfg.lora.target_modules == ("q_proj",), command.__name__
        assert load_config(command, None, ["optim.gradient_checkpointing=true"]).optim.gradient_checkpointing


def test_warmup_keys_reach_transformers(tmp_path: Path):
    steps = load_config(SFTRunConfig, None, ["optim.warmup_steps=3", "optim.schedule=linear"]).optim
    kwargs = trl_training_kwargs(steps, tmp_path, 0, None, "fp32")
    assert kwargs["warmup_steps"] == 3 and kwargs["lr_scheduler_type"] == "linear"
    ratio = load_config(SFTRunConfig, None, ["optim.warmup_ratio=0.1", "optim.schedule=constant"]).optim
    kwargs = trl_training_kwargs(ratio, tmp_path, 0, None, "fp32")
    # transformers reads a float in [0, 1) as a ratio; its plain "constant" would ignore the warmup
    assert kwargs["warmup_steps"] == 0.1 and kwargs["lr_scheduler_type"] == "constant_with_warmup"
    plain = trl_training_kwargs(TrainerOptimConfig(schedule="constant"), tmp_path, 0, None, "fp32")
    assert plain["lr_scheduler_type"] == "constant" and (plain["adam_beta1"], plain["adam_beta2"]) == (0.9, 0.999)


def test_the_former_warmup_key_still_works_with_a_warning():
    with pytest.warns(DeprecationWarning, match="optim.warmup is deprecated"):
        ratio = load_config(SFTRunConfig, None, ["optim.warmup=0.1"]).optim
    assert (ratio.warmup_ratio, ratio.warmup_steps, ratio.warmup) == (0.1, None, None)
    with pytest.warns(DeprecationWarning):
        steps = TrainerOptimConfig(warmup=5)
    assert (steps.warmup_steps, steps.warmup_ratio) == (5, 0.0)


def test_loss_settings_are_read_off_the_config_not_mirrored():
    # the defaults are written once, in the settings block that declares each knob
    assert PPOConfig().value_coef == ValueLossSettings().value_coef == LossSettings().value_coef
    assert GRPOConfig().kl_estimator == LossTermSettings().kl_estimator == LossSettings().kl_estimator
    policy = TransformersPolicy.tiny_random(cached_tokenizer(), seed=0)
    learner = make_learner("ppo", policy, PPOConfig(value_coef=0.25, entropy_coef=0.01, kl_coef=0.1,
                                                    kl_in="reward", clip_eps=0.3))
    from agentgym.algorithms import collate
    from agentgym.trajectory import Trajectory
    traj = Trajectory([1, 2, 3, 4], [0, 0, 1, 1], [0.0] * 4, 2, [(2, 4)], ["a"], ["stop"], [1.0], [{}], [])
    s = learner._loss_settings(collate([traj]))
    assert (s.value_coef, s.entropy_coef, s.clip_eps, s.max_len) == (0.25, 0.01, 0.3, 2.0)
    assert s.kl_coef == 0.0          # the KL is in the reward, not the loss
    grpo = make_learner("grpo", policy, GRPOConfig(kl_coef=0.1))
    s = grpo._loss_settings(collate([traj]))
    assert s.kl_coef == 0.1 and s.value_coef == ValueLossSettings().value_coef   # no critic: the block's default
