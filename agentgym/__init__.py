"""agentgym — Gymnasium environments and RL learners for LLM agents.

The kernel: env base class and spaces, registry, reward shapers, tools and action parsers.
Concrete parts live in ``agentgym.envs``, ``agentgym.policies`` and ``agentgym.algorithms``; the
application (command line, reports, run directories, evaluation, statistics, env checks) in the
``app/`` subpackage (``agentgym.app.cli``, ``agentgym.stats``, ...), reached only by those paths:
no compatibility aliases before 1.0, a name lives in the one module that defines it.
"""

from agentgym import parsing, rewards
from agentgym.core import AgentEnv, EnvConfig, Transition
from agentgym.registry import NAMESPACE, list_envs, make, register, spec
from agentgym.rewards import Reward, StepEvent, shaper
from agentgym.spaces import MessageList, UnicodeText
from agentgym.tools import Tool, ToolResult, ToolSet, tool
from agentgym.wrappers import FullHistory
from agentgym.registry import _register_builtins

__version__ = "0.1.0"

__all__ = [
    "AgentEnv", "EnvConfig", "Transition", "NAMESPACE", "register", "make", "list_envs", "spec",
    "Reward", "StepEvent", "shaper", "rewards", "parsing",
    "UnicodeText", "MessageList", "Tool", "ToolResult", "ToolSet", "tool", "FullHistory",
]

_register_builtins()
