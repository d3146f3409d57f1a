"""``agentgym/BFCL-v0``: tool calling on the Berkeley Function Calling Leaderboard v4, scored by BFCL's own rules.

Tasks, function docs and possible answers come from the ``bfcl-eval`` package's shipped data (offline);
``category=`` picks one BFCL category (default ``simple_python``). Single-turn categories: the model answers a
request with zero or more ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks, and BFCL's AST
checker judges the calls against the possible answers (types, optional parameters, any of several accepted
values, order-free parallel calls); in the irrelevance categories calling nothing is the success. Multi-turn
categories: BFCL's stateful API classes (file system, trading bot, travel booking, ...) are the tools, the
user's turns come one after another, each ends with a call-free reply, and BFCL's multi-turn checker (state
and execution results after every turn) judges the whole episode at its end.

One concern a module: :mod:`.data` (categories, tasks, tool specs), :mod:`.scoring` (BFCL's AST checker, loaded
without its model registry), :mod:`.multi_turn` (live API instances, BFCL's verdict), :mod:`.oracle` (the
reference policy) and :mod:`.env` (:class:`BFCLEnv`).
"""

from .data import CATEGORIES, MULTI_TURN, SINGLE_TURN, UNSUPPORTED, load_tasks
from .env import DEFAULT_TERMS, BFCLConfig, BFCLEnv, bfcl_success
from .oracle import oracle
from .scoring import score_single_turn
from .multi_turn import score_multi_turn

__all__ = ["BFCLEnv", "BFCLConfig", "CATEGORIES", "SINGLE_TURN", "MULTI_TURN", "UNSUPPORTED", "load_tasks", "oracle",
           "score_single_turn", "score_multi_turn", "bfcl_success", "DEFAULT_TERMS"]
