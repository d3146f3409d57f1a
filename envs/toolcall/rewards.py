"""How ToolCall-v0 judges an episode: the final database (:func:`goal_met`), the answer text
(:func:`answer_ok`), and the reward shapers (pure functions of the step event)."""

from __future__ import annotations

import re
from typing import Any, Mapping

from agentgym import shaper
from agentgym.rewards import StepEvent, TurnLimitPenalty

from .store import StoreData


def goal_met(goal: Mapping[str, Any], data: StoreData, effects: Mapping[str, Any]) -> bool:
    """The final database is exactly the initial one plus the goal's orders and cancellations.

    New orders that were created and then cancelled again are ignored (their stock went back);
    every other difference — a missing or extra order, another status change, stock that does not
    add up — fails the task.
    """
    if effects["status_changes"] != {int(o): "cancelled" for o in goal.get("cancelled", [])}:
        return False
    active = [o for o in effects["new_orders"] if o["status"] != "cancelled"]
    if any(o["status"] != "placed" for o in active):
        return False
    wanted = list(goal.get("new_orders", []))
    if len(active) != len(wanted):
        return False
    remaining = list(active)
    for w in sorted(wanted, key=lambda w: w.get("location") is None):  # exact locations first
        hit = next((o for o in remaining if o["customer_id"] == w["customer_id"] and o["product_id"] == w["product_id"]
                    and o["quantity"] == w["quantity"] and w.get("location") in (None, o["location"])), None)
        if hit is None:
            return False
        remaining.remove(hit)
    expected = {(pid, loc): q for pid, loc, q in data.inventory}
    for o in active:
        expected[(o["product_id"], o["location"])] -= o["quantity"]
    old = {o[0]: o for o in data.orders}
    for oid in effects["status_changes"]:
        _, _, pid, q, loc, status, _ = old[oid]
        if status == "placed":
            expected[(pid, loc)] += q
    return expected == effects["stock"]


# --------------------------------------------------------------------------- answer checks
def answer_numbers(text: str) -> list[float]:
    """Numbers written in ``text`` (``1,234`` and ``24,99`` are read as 1234 and 24.99)."""
    text = re.sub(r"(?<=\d),(?=\d{3}\b)", "", text)
    return [float(m.replace(",", ".")) for m in re.findall(r"(?<![\w.])\d+(?:[.,]\d+)?", text)]


def _mentions(text: str, phrase: str) -> bool:
    return re.search(r"(?<![a-z0-9])" + re.escape(phrase.lower()) + r"(?![a-z0-9])", text.lower()) is not None


def answer_ok(check: Mapping[str, Any] | None, answer: str, effects: Mapping[str, Any], goal: Mapping[str, Any]) -> bool:
    """Whether the answer states what the request asked for (``check`` kinds: number, order_id, text)."""
    if check is None or check.get("kind") == "none":
        return bool(answer.strip())
    kind = check["kind"]
    if kind == "number":
        return any(abs(x - float(check["value"])) < 0.005 for x in answer_numbers(answer))
    if kind == "order_id":  # the id of the order that fulfils the goal must be quoted
        ids = [o["order_id"] for o in effects["new_orders"] if o["status"] == "placed"
               and any(o["customer_id"] == w["customer_id"] and o["product_id"] == w["product_id"]
                       for w in goal.get("new_orders", []))]
        return any(float(i) in answer_numbers(answer) for i in ids)
    if kind == "text":  # one of ``values`` and none of ``exclude`` is mentioned
        return (any(_mentions(answer, v) for v in check["values"])
                and not any(_mentions(answer, v) for v in check.get("exclude", [])))
    raise ValueError(f"unknown answer check kind {kind!r}")


def tool_f1(called: set[str] | frozenset[str], target: set[str] | frozenset[str]) -> float:
    """F1 of the called tool names against the target set (both empty: 1)."""
    if not called and not target:
        return 1.0
    hits = len(set(called) & set(target))
    if hits == 0:
        return 0.0
    p, r = hits / len(called), hits / len(target)
    return 2 * p * r / (p + r)


def _steps(event: StepEvent) -> list[tuple[str, Mapping[str, Any]]]:
    return [(r.action_type, r.info) for r in event.history] + [(event.action_type, event.info)]


@shaper("task_completion", terminal=True)
def task_completion(event: StepEvent) -> float:
    """1 if the episode ended with an answer and the database and answer checks pass."""
    return float(event.action_type == "answer" and bool(event.info.get("success")))


@shaper("tool_accuracy", terminal=True)
def tool_accuracy(event: StepEvent) -> float:
    """F1 of the tools called (by name, attempts included) against the task's target tools.

    Calling nothing on a no-tool task counts only when the episode ends with an answer: stalling
    until the turn limit is not a correct tool decision."""
    called = {str(i.get("tool")) for t, i in _steps(event) if t == "tool_call"}
    target = set(event.task.get("target_tools", ()))
    if not called and not target and event.action_type != "answer":
        return 0.0
    return tool_f1(called, target)


@shaper("efficiency", terminal=True)
def efficiency(event: StepEvent) -> float:
    """Optimal turns / turns taken, paid only for a completed task (a fast wrong answer earns nothing)."""
    if not (event.action_type == "answer" and event.info.get("success")):
        return 0.0
    return min(1.0, float(event.task.get("optimal_steps", 1)) / (event.turn + 1))


@shaper("timing", terminal=True)
def timing(event: StepEvent) -> float:
    """Share of well-timed decisions (calls while a needed tool is outstanding, answers once none is)."""
    marks = [bool(i["timely"]) for _, i in _steps(event) if "timely" in i]
    return sum(marks) / len(marks) if marks else 0.0


@shaper("format", terminal=True)
def format_compliance(event: StepEvent) -> float:
    """Share of turns holding exactly one well-formed action (one valid tool call or one answer)."""
    steps = _steps(event)
    return sum(bool(i.get("well_formed")) for _, i in steps) / len(steps)


@shaper("wrong_tool")
def wrong_tool(event: StepEvent) -> float:
    """-1 for a call to a tool outside the task's target set (unknown tools included)."""
    return -1.0 if event.action_type == "tool_call" and not event.info.get("in_target") else 0.0


@shaper("redundant_call")
def redundant_call(event: StepEvent) -> float:
    """-1 for a call identical (name and arguments) to an earlier successful one; retries after errors are free."""
    return -1.0 if event.info.get("redundant") else 0.0


@shaper("format_error")
def format_error(event: StepEvent) -> float:
    """-1 for an action that could not be parsed or a call whose arguments violate the tool's schema."""
    return -1.0 if event.action_type == "invalid" or event.info.get("tool_error") == "invalid_arguments" else 0.0


#: the seed design's defaults: (shaper, weight); penalties return -1, so weights stay positive
DEFAULT_TERMS: tuple[tuple[Any, float], ...] = (
    (task_completion, 0.4), (tool_accuracy, 0.25), (efficiency, 0.15), (timing, 0.10), (format_compliance, 0.10),
    (wrong_tool, 0.3), (redundant_call, 0.2), (format_error, 0.1), (TurnLimitPenalty(name="timeout"), 0.5),
)
