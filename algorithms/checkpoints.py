"""Moved: model specs and loading live in :mod:`agentgym.policies.loading` (one loader for every
command). This module re-exports the names for code written against the old location."""

from agentgym.policies.loading import (export_model, load_tokenizer_for, load_trained_policy,  # noqa: F401
                                       trainer_checkpoint)

__all__ = ["trainer_checkpoint", "load_trained_policy", "load_tokenizer_for", "export_model"]
