"""``BFCLEnv``: the episode logic of BFCL-v0 (prompt, calls, turns, BFCL's verdict)."""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from agentgym import AgentEnv, EnvConfig, Reward, Transition, shaper
from agentgym.parsing import ToolCall, parse_tool_calls
from agentgym.rewards import InvalidActionPenalty, StepEvent

from .data import check_category, is_multi_turn, load_tasks, tool_spec
from .multi_turn import MultiTurnSession, score_multi_turn
from .oracle import oracle as _oracle
from .scoring import score_single_turn

__all__ = ["BFCLEnv", "BFCLConfig", "bfcl_success", "DEFAULT_TERMS", "ADDED_FUNCTIONS_PROMPT"]

#: what BFCL says when held-out functions come back (``DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC``)
ADDED_FUNCTIONS_PROMPT = "I have updated some more functions you can choose from. What about now?"
_FORMAT = ('To call a function, write <tool_call>{"name": "FUNCTION", "arguments": {"PARAM": VALUE}}</tool_call> '
           "with the arguments as JSON; write several blocks to make several calls at once. If no function fits the "
           "request, or a value the call needs is missing, say so in plain text and call nothing.")
_SINGLE = "Your reply is final: it is judged on the calls it contains."
_MULTI = ("Each call's result comes back in the next message. Keep calling until the user's request is done, then "
          "reply in plain text without any call: that ends your turn, and the user's next request follows.")


@shaper("success", terminal=True)
def bfcl_success(event: StepEvent) -> float:
    """1 when BFCL's checker accepts the episode (single-turn: the answer; multi-turn: every user turn)."""
    return float(bool(event.info.get("success")))


#: the default terms: BFCL's verdict, and -1 per unparseable action (weight 0.1)
DEFAULT_TERMS: tuple[tuple[Any, float], ...] = ((bfcl_success, 1.0), (InvalidActionPenalty(), 0.1))


def _safe(text: str) -> str:
    """Valid UTF-8 (a model's lone surrogates must not reach an observation)."""
    return text.encode("utf-8", "replace").decode("utf-8")


@dataclass
class BFCLConfig(EnvConfig):
    """The settings of ``BFCL-v0``."""
    category: str = field(default="simple_python", metadata={
        "help": "a BFCL category (CATEGORIES), e.g. simple_python, parallel, live_multiple, irrelevance, "
                "multi_turn_base"})
    split: str = field(default="test", metadata={
        "help": "only test: BFCL is an evaluation set (every task of the category, in the package's order)"})
    max_turns: int | None = field(default=None, metadata={
        "help": "null: 2 for single-turn categories (one retry after an unparseable reply); for multi-turn, "
                "enough for every user turn at max_steps_per_turn"})
    max_steps_per_turn: int = field(default=20, metadata={
        "help": "multi-turn: actions within one user turn before the episode is force-quit and failed (BFCL's 20)"})
    max_calls_per_action: int = field(default=64, metadata={
        "help": "more calls in one action make it invalid (BFCL v4's largest ground-truth turn has 34)"})
    tools_in_prompt: bool = field(default=True, metadata={
        "help": "also list the functions in the system prompt (for chat templates without tools=)"})
    underscore_to_dot: bool = field(default=False, metadata={
        "help": "show '.' in function names as '_' (for APIs that reject dots); BFCL's checker maps them back"})

    def __post_init__(self) -> None:
        if self.split != "test":
            raise ValueError(f"split must be 'test' (BFCL is an evaluation set: every task is a test task), "
                             f"got {self.split!r}")
        check_category(self.category)
        if self.max_steps_per_turn < 1 or self.max_calls_per_action < 1:
            raise ValueError("max_steps_per_turn and max_calls_per_action must be >= 1")


class BFCLEnv(AgentEnv):
    """Tool calling on the Berkeley Function Calling Leaderboard v4 (the ``bfcl-eval`` package's data);
    settings: :class:`BFCLConfig`; reward terms ``success`` and ``invalid``.

    ``info`` of the final step: ``success`` and ``error_type`` (BFCL's); ``info["privileged"]["verdict"]``
    holds BFCL's full verdict, whose messages name the possible answers (never shown to the policy).
    """

    stop_strings = ()
    tool_action_types = ("tool_call",)
    config_class = BFCLConfig

    def __init__(self, config: BFCLConfig | None = None, **settings: Any):
        c = self.config = self.config_class.build(config, settings)
        self.category, self.split = c.category, c.split
        self.multi_turn = is_multi_turn(self.category)
        self.max_steps_per_turn, self.max_calls_per_action = int(c.max_steps_per_turn), int(c.max_calls_per_action)
        self.tools_in_prompt, self.underscore_to_dot = bool(c.tools_in_prompt), bool(c.underscore_to_dot)
        self._tasks = load_tasks(self.category)
        self.num_tasks = len(self._tasks)
        max_turns = c.max_turns
        if max_turns is None:
            longest = max(len(t["question"]) for t in self._tasks)
            max_turns = longest * (self.max_steps_per_turn + 1) if self.multi_turn else 2
        self._functions: list[dict[str, Any]] = []
        self._session: MultiTurnSession | None = None
        self._turns: list[list[list[str]]] = []
        self._steps_in_turn = 0
        self._verdict: dict[str, Any] = {}
        super().__init__(reward=c.reward, max_turns=max_turns, max_action_chars=c.max_action_chars,
                         render_mode=c.render_mode, group_reward=c.group_reward)

    # ------------------------------------------------------------------ tasks and prompt
    def default_reward(self) -> Reward:
        return Reward(list(DEFAULT_TERMS))

    def get_task(self, index: int) -> dict[str, Any]:
        return copy.deepcopy(self._tasks[int(index)])

    def _shown_name(self, name: str) -> str:
        return re.sub(r"\.", "_", name) if self.underscore_to_dot else name

    def _specs(self, docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        specs = [tool_spec(d) for d in docs]
        for s in specs:
            s["function"]["name"] = self._shown_name(s["function"]["name"])
        return specs

    def _listing(self, docs: list[dict[str, Any]]) -> str:
        return "\n".join(json.dumps(s["function"], ensure_ascii=False) for s in self._specs(docs))

    def initial_messages(self, task: Mapping[str, Any]) -> list[dict[str, str]]:
        """A system message (the call format, and the functions unless ``tools_in_prompt=False``; a leading
        system message of the task is appended to it), then the first user turn's messages."""
        system = f"{_FORMAT} {_MULTI if is_multi_turn(task['category']) else _SINGLE}"
        if self.tools_in_prompt:
            system += f"\n\nFunctions (JSON, one per line):\n{self._listing(list(task['functions']))}"
        first = [dict(m) for m in task["question"][0]]
        while first and first[0].get("role") == "system":
            system += "\n\n" + str(first.pop(0)["content"])
        return [{"role": "system", "content": system}, *first]

    def tool_specs(self) -> list[dict[str, Any]]:
        """The functions of the current episode (for chat templates with ``tools=``); none before a reset."""
        return self._specs(self._functions)

    def on_reset(self, task: Mapping[str, Any]) -> None:
        missing = {"id", "category", "question", "functions"} - set(task)
        if missing or task.get("category") != self.category:
            raise ValueError(f"a BFCL task of category {self.category!r} needs the keys {sorted(missing) or '...'}; "
                             "take tasks from get_task()")
        self._functions = list(task["functions"])
        self._verdict, self._turns, self._steps_in_turn = {}, [[]], 0
        if self._session is not None:
            self._session.close()
        self._session = MultiTurnSession(task) if self.multi_turn else None

    # ------------------------------------------------------------------ one action
    def _calls(self, action: str) -> tuple[list[ToolCall], Transition | None]:
        parsed = parse_tool_calls(action)
        if parsed.errors:
            return [], self.invalid(_safe(f"Invalid tool call: {parsed.errors[0][:300]}. Write each call as "
                                          '<tool_call>{"name": "FUNCTION", "arguments": {...}}</tool_call> with valid JSON.'))
        if len(parsed.calls) > self.max_calls_per_action:
            return [], self.invalid(f"Too many calls: {len(parsed.calls)} in one reply; the limit is "
                                    f"{self.max_calls_per_action}.")
        names = {self._shown_name(d["name"]): d["name"] for d in self._functions}
        if self.underscore_to_dot and not self.multi_turn:
            return list(parsed.calls), None  # BFCL's checker compares the shown ("_") names itself
        return [ToolCall(names.get(c.name, c.name), c.arguments) for c in parsed.calls], None

    def transition(self, action: str) -> Transition:
        calls, invalid = self._calls(action)
        if self.multi_turn:
            return self._multi_turn_step(calls, invalid)
        if invalid is not None:
            return invalid
        self._verdict = score_single_turn(self.task, calls, self.underscore_to_dot)
        return self._final("tool_call" if calls else "answer", calls, [])

    def _final(self, action_type: str, parsed: Any, messages: list[dict[str, str]]) -> Transition:
        if self._session is not None:  # the episode is over: its API instances are no longer needed
            self._session.close()
            self._session = None
        ok = bool(self._verdict.get("valid"))
        info = {"success": ok, "error_type": self._verdict.get("error_type", ""),
                "privileged": {"verdict": self._verdict}}
        return Transition(messages, action_type, parsed=parsed, terminated=True, info=info)

    # ------------------------------------------------------------------ multi-turn
    def _multi_turn_step(self, calls: list[ToolCall], invalid: Transition | None) -> Transition:
        self._steps_in_turn += 1
        over = self._steps_in_turn > self.max_steps_per_turn
        if invalid is not None and not over:
            return invalid
        if over:  # BFCL's force quit: the entry fails
            self._verdict = {"valid": False, "error_type": "multi_turn:force_terminated",
                             "error_message": f"more than {self.max_steps_per_turn} steps in user turn {len(self._turns) - 1}"}
            return self._final("invalid" if invalid else "tool_call", calls, (invalid.messages if invalid else []) + [
                {"role": "user", "content": f"Stopped: more than {self.max_steps_per_turn} replies in one turn."}])
        if calls:
            return self._run_calls(calls)
        return self._end_turn()

    def _run_calls(self, calls: list[ToolCall]) -> Transition:
        assert self._session is not None
        executed, messages = [], []
        for call in calls:
            text, error = self._session.prepare(call.name, call.arguments)
            result = error if text is None else self._session.execute([text])[0]
            if text is not None:
                executed.append(text)
            messages.append({"role": "tool", "name": _safe(call.name[:200]), "content": _safe(str(result))})
        if executed:
            self._turns[-1].append(executed)
        return Transition(messages, "tool_call", parsed=calls, info={"executed": len(executed)})

    def _end_turn(self) -> Transition:
        """A call-free reply ends the user turn: the next turn's messages come, or BFCL judges the episode."""
        question = self.task["question"]
        if len(self._turns) >= len(question):
            self._verdict = score_multi_turn(self.task, self._turns)
            return self._final("reply", None, [])
        turn = len(self._turns)
        self._turns.append([])
        self._steps_in_turn = 0
        messages = [dict(m) for m in question[turn]]
        added = list(self.task.get("missed_function", {}).get(str(turn), []))
        if added:  # miss_func: the held-out functions come back here, with BFCL's words
            self._functions.extend(added)
            messages = [{"role": "user", "content": f"{self._listing(added)}\n{ADDED_FUNCTIONS_PROMPT}"}]
        return Transition(messages, "reply", info={"user_turn": turn})

    # ------------------------------------------------------------------ episode end
    def episode_success(self) -> bool:
        return bool(self._verdict.get("valid"))

    def episode_metrics(self) -> dict[str, Any]:
        metrics = {"category": self.category, "bfcl_id": self.task.get("id"),
                   "error_type": self._verdict.get("error_type", "") if self._verdict else "not_finished"}
        if self.multi_turn:
            metrics["user_turns_done"] = len(self._turns) - (0 if self._verdict else 1)
        return metrics

    #: the reference policy (replays the ground truth; see :mod:`.oracle`)
    oracle = staticmethod(_oracle)

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None
