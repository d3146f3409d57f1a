"""Concrete agentgym environments (installed as ``agentgym.envs``)."""
