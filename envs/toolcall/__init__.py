"""``agentgym/ToolCall-v0``: a retail-support agent calling tools against a per-episode SQLite store.

Each episode builds a small shop in an in-memory SQLite database from the task's seed (products with
categories and prices, stock per store, customers, orders) and puts a user request in front of the
agent. The agent calls tools in the Hermes/Qwen format, one per turn,
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, and ends the episode with
``<answer>...</answer>`` (its reply to the user). Success is checked on the **final database
state** (the right order exists, the right order is cancelled, nothing else changed) and, where the
request asks for a fact, on the answer text.

Why these pieces:

* Task families cover the decisions a tool-using agent must learn: answering without tools when the
  system prompt already holds the fact (over-calling costs), single lookups, multi-tool chains that
  change the database, out-of-stock situations that must be noticed and handled, and injected
  transient failures (the first call to one tool fails with a retryable error) that reward a retry.
  Every task carries its target tool set, the gold plan and the optimal number of turns, so rewards
  and metrics are computed, not judged.
* Reward terms follow the seed design (weights configurable): terminal ``task_completion`` 0.4,
  ``tool_accuracy`` 0.25 (F1 of called vs target tool names), ``efficiency`` 0.15 (optimal turns /
  turns, paid only on success so that a quick wrong answer earns nothing), ``timing`` 0.10 (share of
  well-timed decisions: a tool call while a needed tool is still outstanding, an answer only once all
  are done, never a call and an answer in one message), ``format`` 0.10 (share of well-formed turns);
  step-wise penalties ``wrong_tool`` 0.3, ``redundant_call`` 0.2 (a call identical to an earlier
  successful one), ``format_error`` 0.1 (unparseable action or schema violation), ``timeout`` 0.5
  (turn limit). A perfect episode returns exactly 1.0.
* Shapers are pure functions of the :class:`~agentgym.rewards.StepEvent`: the env writes what they
  need into each step's ``info`` (tool, whether it was a target tool, redundancy, timing, and at the
  answer the database and answer checks), so re-weighting or adding terms needs no env access.

Written only against the public ``agentgym`` API, as a user's own env would be.

The package, one concern a module: :mod:`.store` (the shop's generated content), :mod:`.tools`
(schemas, tool errors and the SQLite backend), :mod:`.tasks` (families and their gold plans), :mod:`.rewards` (database and
answer checks, the shapers), :mod:`.env` (:class:`ToolCallEnv`) and :mod:`.oracle` (the reference
policy). Every public name is importable from ``agentgym.envs.toolcall``.
"""

from .env import ToolCallConfig, ToolCallEnv
from .oracle import oracle
from .rewards import (DEFAULT_TERMS, answer_numbers, answer_ok, efficiency, format_compliance, format_error, goal_met,
                      redundant_call, task_completion, timing, tool_accuracy, tool_f1, wrong_tool)
from .store import ADJECTIVES, CATALOG, CATEGORIES, CITIES, FIRST_NAMES, LAST_NAMES, ORDER_STATUSES, StoreData, generate_store
from .tasks import FAMILIES
from .tools import (TOOL_NAMES, TOOL_SCHEMAS, TRANSIENT_MARKER, InsufficientStock, InvalidRequest, NotFound, RetailStore,
                    ServiceUnavailable, StoreError)

__all__ = [
    "ToolCallEnv", "ToolCallConfig", "RetailStore", "StoreData", "generate_store", "FAMILIES", "TRANSIENT_MARKER",
    "tool_f1", "answer_numbers",
    # also public (importable here, as before the package split)
    "oracle", "DEFAULT_TERMS", "answer_ok", "goal_met", "task_completion", "tool_accuracy", "efficiency", "timing",
    "format_compliance", "wrong_tool", "redundant_call", "format_error", "ADJECTIVES", "CATALOG", "CATEGORIES",
    "CITIES", "FIRST_NAMES", "LAST_NAMES", "ORDER_STATUSES", "TOOL_NAMES", "TOOL_SCHEMAS", "StoreError", "NotFound",
    "InsufficientStock", "InvalidRequest", "ServiceUnavailable",
]
