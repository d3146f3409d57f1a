"""BFCL-v0's reference policy: replays the ground truth (reads the privileged task).

Single-turn: one action holding every call of the possible answer, each parameter at its first acceptable
value (a parameter whose first option is ``""``, BFCL's "may be omitted", is left out; dict-valued options
are resolved the same way, key by key); relevance tasks get a call-free reply (``irrelevance``) or the first
function called with its required parameters as strings (``live_relevance``, which has no possible answer).
Multi-turn: the ground-truth calls of the current user turn in one action, then, once their results are
back, a plain-text reply that ends the turn.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from .data import is_multi_turn, is_relevance

__all__ = ["oracle", "first_acceptable", "single_turn_calls", "OMIT"]

#: the marker :func:`first_acceptable` returns for "leave this parameter out"
OMIT = object()
_DONE = "Done."
_NO_CALL = "None of the available functions fits this request, so I will not call any."


def first_acceptable(options: Any, required: bool = False, known: bool = True) -> Any:
    """The first acceptable value among BFCL's options for one parameter (:data:`OMIT` for "omit it").

    ``""`` among the options means the parameter may be left out: it is, when it comes first or when the
    function's doc does not declare the parameter (``known=False``: BFCL rejects undeclared parameters);
    a ``required`` parameter takes its first real value instead."""
    values = [o for o in options if not (isinstance(o, str) and o == "")] if isinstance(options, list) else []
    may_omit = not isinstance(options, list) or len(values) < len(options)
    if not values or (may_omit and not required and (not known or options[0] == "")):
        return OMIT
    return _resolve(values[0])


def _resolve(value: Any) -> Any:
    if isinstance(value, dict):  # a dict-valued answer: each key has its own options
        out = {}
        for k, opts in value.items():
            v = first_acceptable(opts) if isinstance(opts, list) else opts
            if v is not OMIT:
                out[k] = v
        return out
    if isinstance(value, list):
        return [_resolve(v) if isinstance(v, dict) else v for v in value]
    return value


def single_turn_calls(task: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The oracle's calls for a single-turn task, as ``{"name", "arguments"}`` dicts."""
    category = task["category"]
    if is_relevance(category):
        if "irrelevance" in category or not task["functions"]:
            return []
        doc = task["functions"][0]
        required = doc.get("parameters", {}).get("required", [])
        return [{"name": doc["name"], "arguments": {p: "1" for p in required}}]
    docs = {d["name"]: d.get("parameters", {}) for d in task["checker_functions"]}
    calls = []
    for group in task["ground_truth"]:
        for name, params in group.items():
            doc = docs.get(name, {})
            required, known = set(doc.get("required", [])), set(doc.get("properties", {}))
            chosen = ((p, first_acceptable(o, p in required, p in known)) for p, o in params.items())
            calls.append({"name": name, "arguments": {p: v for p, v in chosen if v is not OMIT}})
    return calls


def render(calls: list[dict[str, Any]]) -> str:
    """Calls in agentgym's tool-call format, one ``<tool_call>`` block each."""
    return "".join(f"<tool_call>{json.dumps(c, ensure_ascii=False)}</tool_call>" for c in calls)


def _user_turn(messages: list[Mapping[str, Any]]) -> int:
    """Index of the current user turn: one per turn-ending (call-free) assistant reply so far."""
    return sum(m.get("role") == "assistant" and "<tool_call>" not in m.get("content", "") for m in messages)


def oracle(context: Mapping[str, Any]) -> str:
    """The reference reply for ``context`` (``task``: the privileged task; ``messages``: the conversation)."""
    task = context["task"]
    if not is_multi_turn(task["category"]):
        calls = single_turn_calls(task)
        return render(calls) if calls else _NO_CALL
    messages = list(context.get("messages", []))
    if messages and messages[-1].get("role") == "tool":
        return _DONE
    turn = _user_turn(messages)
    calls = task["oracle_calls"][turn] if turn < len(task["oracle_calls"]) else []
    return render(calls) if calls else _DONE
