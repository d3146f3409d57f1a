"""ToolCall-v0's reference policy: replays the gold plan (reads the privileged task)."""

from __future__ import annotations

import json
from typing import Any, Mapping

from .tools import TRANSIENT_MARKER


def oracle(context: Mapping[str, Any]) -> str:
    """Replays the gold plan from the privileged task, one call per turn, reading the tool results in
    ``context["messages"]``: a transient error is retried with the same call, and the final answer
    quotes the order number that ``create_order`` returned."""
    task = context["task"]
    results = [m for m in context.get("messages", []) if m.get("role") == "tool"]
    done = sum(TRANSIENT_MARKER not in m.get("content", "") for m in results)
    plan = task["plan"]
    if done < len(plan):
        step = plan[done]
        return "<tool_call>" + json.dumps({"name": step["name"], "arguments": step["arguments"]}) + "</tool_call>"
    answer = str(task["oracle_answer"])
    if "{order_id}" in answer:
        order_id = "?"
        for m in reversed(results):
            if m.get("name") == "create_order" and not m.get("content", "").startswith("Error"):
                try:
                    order_id = str(json.loads(m["content"])["order_id"])
                except (ValueError, KeyError, TypeError):
                    continue
                break
        answer = answer.replace("{order_id}", order_id)
    return f"<answer>{answer}</answer>"
