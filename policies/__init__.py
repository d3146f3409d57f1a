"""LLM policies (installed as ``agentgym.policies``)."""
