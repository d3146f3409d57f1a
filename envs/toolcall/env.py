"""``ToolCallEnv``: the episode logic of ToolCall-v0 (prompt, one tool call per turn, the answer, metrics)."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from agentgym import AgentEnv, EnvConfig, Reward, ToolSet, Transition
from agentgym.parsing import first_tag, parse_tool_calls

from .oracle import oracle as _oracle
from .rewards import DEFAULT_TERMS, answer_ok, goal_met, tool_f1
from .store import StoreData, generate_store
from .tasks import _RESULT_MATCHED, FAMILIES, shop_facts, split_task
from agentgym.splits import check_split
from .tools import RetailStore, StoreError


def _safe(text: str) -> str:
    """Text that is valid UTF-8 (a model's lone surrogates must not reach an observation)."""
    return text.encode("utf-8", "replace").decode("utf-8")


def _canonical(value: Any) -> str:
    """A key for "the same call": JSON with sorted keys (``repr`` for pathologically deep arguments)."""
    try:
        return json.dumps(value, sort_keys=True, ensure_ascii=True, default=str)
    except (RecursionError, ValueError):
        return repr(value)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    if isinstance(a, str) and isinstance(b, str):
        return a.strip().casefold() == b.strip().casefold()
    return a == b


def _describe_tools(tools: ToolSet) -> str:
    """One line per tool: ``name(arg: type, opt?: type): description`` (for templates without tools=)."""
    lines = []
    for t in tools.tools.values():
        required = set(t.parameters.get("required", []))
        args = []
        for key, prop in t.parameters.get("properties", {}).items():
            kind = prop.get("type", "string")
            kind = next(k for k in ([kind] if isinstance(kind, str) else kind) if k != "null")
            if "enum" in prop:
                kind = "|".join(str(v) for v in prop["enum"] if v is not None)
            args.append(f"{key}{'' if key in required else '?'}: {kind}")
        lines.append(f"- {t.name}({', '.join(args)}): {t.description}")
    return "\n".join(lines)


@dataclass
class ToolCallConfig(EnvConfig):
    """The settings of ``ToolCall-v0``."""
    split: str = field(default="train", metadata={
        "help": "train, validation or test: disjoint procedural task streams (no task in two splits or twice in one)"})
    families: Sequence[str] | None = field(default=None, metadata={
        "help": "task families to draw from; null: all of FAMILIES, at their shares"})
    transient_rate: float = field(default=0.2, metadata={
        "help": "share of tool-using tasks whose first call to one plan tool fails with a retryable error, in [0, 1]"})
    max_turns: int = field(default=10, metadata={"help": "turns before the episode is truncated (the timeout penalty)"})
    tools_in_prompt: bool = field(default=True, metadata={
        "help": "also list the tools in the system prompt (for chat templates without tools= support)"})
    extra_tools: ToolSet | None = field(default=None, metadata={
        "help": "more tools beside the shop's (a ToolSet, e.g. ToolSet.from_mcp(...)), never in a task's plan; "
                "the caller closes them"})

    def __post_init__(self) -> None:
        check_split(self.split)
        families = list(FAMILIES) if self.families is None else list(self.families)
        unknown = set(families) - set(FAMILIES)
        if unknown or not families:
            raise ValueError(f"families must be a non-empty subset of {sorted(FAMILIES)}; unknown: {sorted(unknown)}")
        if not 0.0 <= self.transient_rate <= 1.0:
            raise ValueError(f"transient_rate must be in [0, 1], got {self.transient_rate}")


class ToolCallEnv(AgentEnv):
    """Retail customer support with seven tools over a per-episode SQLite store; settings:
    :class:`ToolCallConfig`.

    ``info`` of a tool step: ``tool``, ``tool_ok``, ``tool_error``, ``transient``, ``in_target``,
    ``redundant``, ``args_ok``, ``timely``, ``well_formed``; of the answer step: ``db_ok``,
    ``answer_ok``, ``success``. The task (``info["privileged"]["task"]``) holds the gold plan, target
    tools, optimal turns and the goal: privileged, never shown to the policy.
    """

    stop_strings = ("</tool_call>", "</answer>")
    num_tasks = None
    tool_action_types = ("tool_call",)
    config_class = ToolCallConfig

    def __init__(self, config: ToolCallConfig | None = None, **settings: Any):
        c = self.config = self.config_class.build(config, settings)
        self.split, self.transient_rate = c.split, float(c.transient_rate)
        self.tools_in_prompt = bool(c.tools_in_prompt)
        self.families = list(FAMILIES) if c.families is None else list(c.families)
        extra_tools = c.extra_tools
        self.store = RetailStore()
        self.tools = ToolSet(self.store.tools(), timeout_s=None)  # SQLite calls are fast: no worker thread
        self.extra_tools = extra_tools
        clash = set(self.tools.names) & set(extra_tools.names if extra_tools is not None else ())
        if clash:
            raise ValueError(f"extra_tools must not reuse the shop's tool names: {sorted(clash)}")
        self._calls: list[dict[str, Any]] = []
        self._success = False
        super().__init__(reward=c.reward, max_turns=c.max_turns, max_action_chars=c.max_action_chars,
                         render_mode=c.render_mode, group_reward=c.group_reward)

    # ------------------------------------------------------------------ tasks
    def default_reward(self) -> Reward:
        return Reward(list(DEFAULT_TERMS))

    def get_task(self, index: int) -> dict[str, Any]:
        return split_task(self.split, self.families, self.transient_rate, index)

    def initial_messages(self, task: Mapping[str, Any]) -> list[dict[str, str]]:
        return [{"role": "system", "content": self.system_prompt(generate_store(int(task["db_seed"])))},
                {"role": "user", "content": str(task["request"])}]

    def system_prompt(self, data: StoreData) -> str:
        """The agent's instructions and the shop's public facts (what no-tool tasks are answered from)."""
        extra = f"\n{_describe_tools(self.extra_tools)}" if self.extra_tools is not None else ""
        listing = _describe_tools(self.tools) + extra
        tools = f"Tools:\n{listing}\n\n" if self.tools_in_prompt else ""
        return (
            "You are the customer-support agent of an online shop. Use the shop's tools to look things up or to "
            "change orders; answer directly when no tool is needed, since every call costs time.\n"
            "Call one tool per turn, exactly like this:\n"
            '<tool_call>{"name": "search_product", "arguments": {"query": "travel kettle"}}</tool_call>\n'
            "Its result comes back in the next message. When you are done, write your reply to the user inside "
            "<answer>...</answer>; this ends the conversation. State the facts asked for in the answer (prices in "
            "EUR, quantities, order numbers, store names, order status).\n\n"
            f"{tools}"
            f"{shop_facts(data)}"
        )

    def tool_specs(self) -> list[dict[str, Any]]:
        return self.tools.specs() + (self.extra_tools.specs() if self.extra_tools is not None else [])

    def on_reset(self, task: Mapping[str, Any]) -> None:
        missing = {"db_seed", "request", "plan", "goal", "target_tools", "optimal_steps"} - set(task)
        if missing:
            raise ValueError(f"a ToolCall task needs the keys {sorted(missing)}; take tasks from get_task()")
        self.store.load(generate_store(int(task["db_seed"])), fail_first=task.get("transient_tool"))
        self._calls = []
        self._success = False

    # ------------------------------------------------------------------ one turn
    def transition(self, action: str) -> Transition:
        blocks = action.count("<tool_call>") + action.count("<answer>")
        tag = first_tag(action, ("tool_call", "answer"))
        if tag is None:
            parsed = parse_tool_calls(action)  # an unclosed <tool_call> gets its own message
            why = parsed.errors[0] if parsed.errors else "no <tool_call> or <answer> found"
            return self.invalid(_safe(f"Invalid action: {why}. Call one tool as <tool_call>{{\"name\": ..., "
                                      "\"arguments\": {...}}</tool_call> or reply with <answer>...</answer>."),
                                well_formed=False)
        if tag.tag == "answer":
            return self._answer(action, tag.content, blocks)
        parsed = parse_tool_calls(action[tag.start:tag.end])
        if parsed.errors:
            return self.invalid(_safe(f"Invalid tool call: {parsed.errors[0]}. Write <tool_call>{{\"name\": \"TOOL\", "
                                      "\"arguments\": {...}}</tool_call> with valid JSON."),
                                parsed=parsed, well_formed=False)
        return self._tool_call(action, parsed.calls[0], blocks)

    def _outstanding(self) -> set[str]:
        return set(self.task["target_tools"]) - {c["name"] for c in self._calls if c["ok"]}

    def _tool_call(self, action: str, call: Any, blocks: int) -> Transition:
        outstanding = self._outstanding()
        self.store.transient_fired = False
        tools = self.extra_tools if self.extra_tools is not None and call.name in self.extra_tools else self.tools
        result = tools.call(call.name, call.arguments)
        key = _canonical([call.name, call.arguments])
        valid = result.error not in ("unknown_tool", "invalid_arguments")
        record = {"name": _safe(call.name), "arguments": call.arguments, "key": key, "ok": result.ok,
                  "transient": self.store.transient_fired, "in_target": call.name in self.task["target_tools"],
                  "args_ok": valid and self._args_ok(call.name, call.arguments)}
        redundant = any(c["key"] == key and c["ok"] for c in self._calls)
        self._calls.append(record)
        messages = [{"role": "tool", "name": record["name"], "content": _safe(result.content)}]
        if blocks > 1:
            messages.append({"role": "user", "content": "Only your first tool call was used. Write one tool call or "
                                                        "one answer per turn, and answer after seeing the results."})
        info = {"tool": record["name"], "tool_ok": result.ok, "tool_error": result.error,
                "transient": record["transient"], "in_target": record["in_target"], "redundant": redundant,
                "args_ok": record["args_ok"], "timely": bool(outstanding) and "<answer>" not in action,
                "well_formed": blocks == 1 and result.error != "invalid_arguments"}
        return Transition(messages, "tool_call", parsed=call, info=info)

    def _answer(self, action: str, answer: str, blocks: int) -> Transition:
        if not answer:
            return self.invalid("Invalid action: the <answer> is empty. Write your reply to the user inside "
                                "<answer>...</answer>.", well_formed=False)
        effects = self.store.effects()
        assert self.store.data is not None
        db_ok = goal_met(self.task["goal"], self.store.data, effects)
        text_ok = answer_ok(self.task.get("answer_check"), answer, effects, self.task["goal"])
        self._success = bool(db_ok and text_ok)
        info = {"db_ok": db_ok, "answer_ok": text_ok, "success": self._success, "well_formed": blocks == 1,
                "timely": not self._outstanding() and "<tool_call>" not in action}
        return Transition([], "answer", parsed=answer, terminated=True, answer=answer, info=info)

    # ------------------------------------------------------------------ gold-plan matching
    def _step_matches(self, step: Mapping[str, Any], name: str, args: Mapping[str, Any]) -> bool:
        if step["name"] != name:
            return False
        if name in _RESULT_MATCHED:  # a lookup is right when its results contain the wanted record
            try:
                found = (self.store.search_ids(args["query"], args.get("category")) if name == "search_product"
                         else self.store.customer_ids(args["query"]))
            except (StoreError, sqlite3.Error, UnicodeError, KeyError):
                return False
            return step["target_id"] in found
        for key, gold in step["arguments"].items():
            if key in step.get("loose", ()):
                continue
            if args.get(key) is None and key in step.get("optional", ()):
                continue
            if not _same(args.get(key), gold):
                return False
        return True

    def _args_ok(self, name: str, args: Mapping[str, Any]) -> bool:
        return any(self._step_matches(s, name, args) for s in self.task["plan"])

    # ------------------------------------------------------------------ episode end
    def episode_success(self) -> bool:
        return self._success

    def episode_metrics(self) -> dict[str, Any]:
        target = set(self.task["target_tools"])
        calls = self._calls
        on_target = [c for c in calls if c["in_target"]]
        if on_target:
            arg_acc = sum(c["args_ok"] for c in on_target) / len(on_target)
        else:
            arg_acc = 0.0 if target else 1.0
        plan, k = self.task["plan"], 0
        for c in calls:  # the gold plan must appear, in order, among the successful calls
            if k < len(plan) and c["ok"] and self._step_matches(plan[k], c["name"], c["arguments"]):
                k += 1
        plan_success = k == len(plan) and all(c["in_target"] for c in calls)
        return {
            "family": self.task.get("family"),
            "tool_selection_accuracy": tool_f1({c["name"] for c in calls}, target),
            "argument_accuracy": arg_acc,
            "plan_success": plan_success,
            "step_efficiency": min(1.0, self.task["optimal_steps"] / max(1, self.turn)),
            "end_to_end_success": self._success,
            "optimal_steps": self.task["optimal_steps"],
            "transient_injected": self.task.get("transient_tool") is not None,
            "transient_recovered": any(c["transient"] for c in calls) and self._success,
        }

    #: the reference policy (replays the gold plan; see :mod:`.oracle`)
    oracle = staticmethod(_oracle)

    def close(self) -> None:
        self.store.close()
        self.tools.close()
