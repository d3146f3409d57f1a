"""Moved: :class:`TrainConfig`, :class:`EvalConfig` and :func:`torch_dtype` live in
:mod:`agentgym.algorithms.config`, the one module of the training config tree. This name stays only
until ``algorithms/trainer.py`` imports them from there."""

from agentgym.algorithms.config import EvalConfig, TrainConfig, torch_dtype

__all__ = ["TrainConfig", "EvalConfig", "torch_dtype"]
