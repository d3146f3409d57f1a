"""Adapters at the edge: agentgym envs and tools spoken over other projects' protocols.

- :mod:`agentgym.adapters.openenv_server`: serve any agentgym env over OpenEnv's protocol
  (``agentgym serve``);
- :mod:`agentgym.adapters.mcp`: tools from MCP servers (``ToolSet.from_mcp``);
- :mod:`agentgym.adapters.skyrl`: any agentgym env as a SkyRL-gym ``BaseTextEnv``.

The kernel does not import these modules; each imports its peer library (openenv-core, mcp,
skyrl-gym) only when used. Their failures (connection lost, capacity, timeouts) are
:class:`agentgym.errors.InfraError`.
"""
