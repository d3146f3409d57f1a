"""Advantage estimators, losses and learners (installed as ``agentgym.algorithms``)."""
