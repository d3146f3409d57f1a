"""``ReActEnv``: the env, its search / lookup / calculator tools and its system prompt (see the package
docstring for the rules)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from agentgym import AgentEnv, EnvConfig, Reward, Tool, ToolSet, Transition
from agentgym.parsing import parse_react
from agentgym.rewards import ExactMatch, InvalidActionPenalty
from agentgym.envs.calculator import calculator
from agentgym.envs.searchqa.data import bundled_dataset, bundled_questions, split_title
from agentgym.splits import check_split
from agentgym.envs.services.retrieval.base import format_passages
from agentgym.envs.services.retrieval.shared import get_retriever

from .oracle import hop_chain, solve
from .rewards import DEFAULT_WEIGHTS, TOOL_ACTION_TYPES, ThoughtQuality, ToolEfficiency, ToolOveruse, WrongAnswer
from .text import OBS, plain_input, tool_name

__all__ = ["ReActEnv", "ReActConfig", "REACT_SYSTEM_PROMPT"]

REACT_SYSTEM_PROMPT = """\
You answer questions about a fictional world by reasoning and using tools, one step per reply.
Each reply starts with a line "Thought: ..." saying what you know and what you need next, followed by either
Action: <tool name>
Action Input: <one line of input>
or, once you know the answer,
Final Answer: <the answer in a few words>
After an Action, stop: the result comes back to you as "Observation: ...". Never write an Observation yourself.

Tools:
- search: searches an encyclopedia of the world and returns the top passages. Input: a query; an entity's name works best.
- lookup: returns the next sentence containing a keyword in the passages of your last search; repeat it to see the next match. Input: the keyword.
- calculator: evaluates arithmetic exactly. Input: an expression such as (2011 - 1987) * 2.

You cannot know this world from memory: search for every fact you need. A question may need several facts, one search each. Use few tool calls, and write a new thought at every step.

Example:
Question: In which city was the founder of Brelvo Works born?
Thought: I need to know who founded Brelvo Works.
Action: search
Action Input: Brelvo Works
Observation: Doc 1(Title: "Brelvo Works") Brelvo Works is a glassmaking company founded in 1961 by Tamsin Oru. ...
Thought: Brelvo Works was founded by Tamsin Oru. Now I need the city where Tamsin Oru was born.
Action: search
Action Input: Tamsin Oru
Observation: Doc 1(Title: "Tamsin Oru") Tamsin Oru is a chemist born in Karvessa in 1930. ...
Thought: Tamsin Oru was born in Karvessa, so that is the answer.
Final Answer: Karvessa"""

_STEP_HINT = ("Write one step: a line 'Thought: ...', then either the lines 'Action: <tool>' and "
              "'Action Input: <input>' (tools: search, lookup, calculator) or a line 'Final Answer: <answer>'.")
_QUESTION_TYPES = ("single_hop", "multi_hop", "no_search")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


@dataclass
class ReActConfig(EnvConfig):
    """The settings of ``ReAct-v0``."""
    split: str = field(default="train", metadata={
        "help": "train, validation or test questions of the bundled world (disjoint by subject entity)"})
    retriever: Any = field(default="dense", metadata={
        "help": "dense (in-process, shared with SearchQA-v0), bm25, a retrieval-server URL, an index directory, "
                "or an object with search(queries, topk)"})
    topk: int = field(default=3, metadata={"help": "passages per search"})
    question_types: Sequence[str] = field(default=("multi_hop", "single_hop"), metadata={
        "help": "which bundled question types to ask (multi_hop, single_hop, no_search)"})
    single_hop_fraction: float = field(default=0.25, metadata={
        "help": "share of single-hop questions among the tasks, in [0, 1) (all multi-hop ones are kept)"})
    few_tool_calls: int = field(default=3, metadata={"help": "threshold of the tool_efficiency term"})
    many_tool_calls: int = field(default=5, metadata={"help": "threshold of the tool_overuse term"})
    world_seed: int = field(default=0, metadata={"help": "the bundled world's seed (as SearchQA-v0)"})
    world_size: str | int = field(default="small", metadata={"help": "the bundled world's size (as SearchQA-v0)"})
    extra_tools: ToolSet | None = field(default=None, metadata={
        "help": "more tools beside search, lookup and calculator (a ToolSet, e.g. ToolSet.from_mcp(...)), listed in "
                "the system prompt; Action Input is a JSON object of arguments; the caller closes them"})

    def __post_init__(self) -> None:
        check_split(self.split)
        if self.topk < 1:
            raise ValueError(f"topk must be >= 1, got {self.topk}")
        unknown = set(self.question_types) - set(_QUESTION_TYPES)
        if unknown or not self.question_types:
            raise ValueError(f"question_types must be a non-empty subset of {_QUESTION_TYPES}, "
                             f"got {self.question_types!r}")
        if not 0.0 <= self.single_hop_fraction < 1.0:
            raise ValueError(f"single_hop_fraction must be in [0, 1), got {self.single_hop_fraction}")
        if not 0 <= self.few_tool_calls <= self.many_tool_calls:
            raise ValueError("need 0 <= few_tool_calls <= many_tool_calls")


class ReActEnv(AgentEnv):
    """Multi-hop question answering in the ReAct format with search, lookup and calculator tools; settings:
    :class:`ReActConfig` (reward weights: ``DEFAULT_WEIGHTS``)."""

    stop_strings = ("\nObservation:",)
    observation_style = "chat"
    tool_action_types = TOOL_ACTION_TYPES
    config_class = ReActConfig

    def __init__(self, config: ReActConfig | None = None, **settings: Any):
        c = self.config = self.config_class.build(config, settings)
        split, topk, world_seed, world_size, extra_tools = c.split, c.topk, c.world_seed, c.world_size, c.extra_tools
        few_tool_calls, many_tool_calls, retriever = c.few_tool_calls, c.many_tool_calls, c.retriever
        self.split, self.topk = split, int(topk)
        self.few_tool_calls, self.many_tool_calls = int(few_tool_calls), int(many_tool_calls)
        self.world_seed, self.world_size = world_seed, world_size
        self.corpus = bundled_dataset(seed=world_seed, size=world_size)[0]
        questions = bundled_questions(split, seed=world_seed, size=world_size)
        self.questions = self._select(questions, tuple(c.question_types), c.single_hop_fraction)
        if not self.questions:
            raise ValueError("no questions match question_types / single_hop_fraction")
        self.num_tasks = len(self.questions)
        # The key SearchQAEnv uses for its bundled corpus: both envs share one index per process.
        self._corpus_key = ("bundled", world_seed, world_size)
        self._retriever_spec = retriever
        self._retriever: Any = None
        self.tools = ToolSet([
            Tool("search", "Search the encyclopedia; returns the top passages.",
                 {"properties": {"query": {"type": "string", "minLength": 1}}, "required": ["query"],
                  "additionalProperties": False}, self._search_text),
            Tool("lookup", "The next sentence containing a keyword in the passages of the last search.",
                 {"properties": {"keyword": {"type": "string", "minLength": 1}}, "required": ["keyword"],
                  "additionalProperties": False}, self._lookup),
            Tool.from_function(calculator),
        ], timeout_s=None)  # in-process tools; the calculator bounds its own work
        self.extra_tools = extra_tools
        self._extra_names = {n.lower(): n for n in (extra_tools.names if extra_tools is not None else ())}
        clash = set(self._extra_names) & {"search", "lookup", "calculator", "finish"}
        if clash:
            raise ValueError(f"extra_tools must not reuse ReAct's tool names: {sorted(clash)}")
        listed = "".join(f"\n- {t.name}: {t.description} Action Input: a JSON object of arguments "
                         f"{json.dumps(t.parameters)}" for t in (extra_tools.tools.values() if extra_tools else ()))
        # the extra tools go at the end of the prompt's tool list, which the paragraph "You cannot know" follows
        self.system_prompt = REACT_SYSTEM_PROMPT.replace("\n\nYou cannot know", listed + "\n\nYou cannot know", 1)
        self._page: list[tuple[str, str]] = []  # (title, sentence) of the last search's passages
        self._lookup_state: tuple[str, int] | None = None  # (keyword, results shown)
        self._last_hits: list[Any] = []
        super().__init__(reward=c.reward, max_turns=c.max_turns, max_action_chars=c.max_action_chars,
                         render_mode=c.render_mode, group_reward=c.group_reward)

    @staticmethod
    def _select(rows: list[dict], types: tuple[str, ...], single_hop_fraction: float) -> list[dict]:
        """All multi-hop and no-search rows asked for, plus single-hop rows up to their share."""
        chosen = [r for r in rows if r["type"] in types and r["type"] != "single_hop"]
        singles = [r for r in rows if r["type"] == "single_hop"] if "single_hop" in types else []
        if chosen and singles:
            singles = singles[:round(len(chosen) * single_hop_fraction / (1.0 - single_hop_fraction))]
        keep = {id(r) for r in chosen + singles}
        return [r for r in rows if id(r) in keep]  # dataset order (already shuffled by the generator)

    # -- retrieval and tools
    @property
    def retriever(self) -> Any:
        if self._retriever is None:
            self._retriever = get_retriever(self._retriever_spec, self.corpus, self._corpus_key)
        return self._retriever

    def _search_text(self, query: str) -> str:
        hits = self.retriever.search([query], topk=self.topk)[0]
        self._last_hits = list(hits)
        self._page = []
        for h in hits:
            title, text = split_title(h.contents)
            self._page += [(title, s) for s in _SENTENCE_END.split(text.strip()) if s.strip()]
        self._lookup_state = None  # a new page: lookups start over (as in the ReAct paper)
        return format_passages(hits).strip() or "No results."

    def _lookup(self, keyword: str) -> str:
        if not self._page:
            return "There is nothing to look up yet: search first."
        key = keyword.strip().lower()
        matches = [(t, s) for t, s in self._page if key in s.lower()]
        if not matches:
            self._lookup_state = None
            return f"No sentence in the last search results contains {keyword.strip()!r}."
        shown = self._lookup_state[1] if self._lookup_state and self._lookup_state[0] == key else 0
        if shown >= len(matches):
            return "No more results."
        self._lookup_state = (key, shown + 1)
        title, sentence = matches[shown]
        return f"(Result {shown + 1} / {len(matches)}) [{title}] {sentence}"

    # -- AgentEnv API
    def get_task(self, index: int) -> dict[str, Any]:
        task = dict(self.questions[index])
        task["hop_chain"] = hop_chain(task, self.world_seed, self.world_size)
        return task

    def initial_messages(self, task: Mapping[str, Any]) -> list[dict[str, str]]:
        return [{"role": "system", "content": self.system_prompt},
                {"role": "user", "content": f"Question: {task['question']}"}]

    def default_reward(self) -> Reward:
        terms = [ExactMatch(name="correct"), WrongAnswer(), ToolEfficiency(self.few_tool_calls),
                 ToolOveruse(self.many_tool_calls), ThoughtQuality(), InvalidActionPenalty(name="format_error")]
        return Reward([(t, DEFAULT_WEIGHTS[t.name]) for t in terms])

    def on_reset(self, task: Mapping[str, Any]) -> None:
        self._page, self._lookup_state, self._last_hits = [], None, []

    def _observe(self, text: str) -> list[dict[str, str]]:
        return [{"role": "user", "content": OBS + text}]

    def _format_error(self, why: str, parsed: Any) -> Transition:
        return self.invalid(f"{OBS}Invalid step: {why}. {_STEP_HINT}", parsed=parsed)

    def transition(self, action: str) -> Transition:
        step = parse_react(action)
        info: dict[str, Any] = {"thought": step.thought}
        if step.final_answer is not None:
            return Transition([], "answer", parsed=step, terminated=True, answer=step.final_answer, info=info)
        if step.error is not None:
            return self._format_error(step.error, step)
        name = tool_name(step.action or "")
        arg = plain_input(step.action_input)
        if name == "finish":  # the paper's Finish[answer]
            if not arg:
                return self._format_error("'Action: Finish' needs the answer as its Action Input", step)
            return Transition([], "answer", parsed=step, terminated=True, answer=arg, info=info)
        if name in self._extra_names:
            return self._extra_tool(self._extra_names[name], step, info)
        if name not in self.tools:
            names = ", ".join(["search", "lookup", *self._extra_names.values()]) + " and calculator"
            return self._format_error(f"unknown tool {step.action.strip()[:80]!r}; the tools are {names}", step)
        if not arg:
            return self._format_error(f"'{name}' needs a non-empty Action Input", step)
        argument = {"search": "query", "lookup": "keyword", "calculator": "expression"}[name]
        result = self.tools.call(name, {argument: arg})
        info.update(tool=name, tool_input=arg, tool_ok=result.ok)
        if name == "search":
            info.update(query=arg, retrieved_ids=[h.doc_id for h in self._last_hits] if result.ok else [],
                        retrieved_text=result.content)
        action_type = name if name in ("search", "lookup") else "tool_call"
        return Transition(self._observe(result.content), action_type, parsed=step, info=info)

    def _extra_tool(self, name: str, step: Any, info: dict[str, Any]) -> Transition:
        """A call to one of ``extra_tools``: the Action Input is a JSON object of arguments, or the value of a
        tool's only argument (parsed as JSON when that argument is not a string)."""
        assert self.extra_tools is not None
        text = (step.action_input or "").strip()
        try:
            arguments = {} if not text else json.loads(text) if text.startswith("{") else None
        except (ValueError, RecursionError):
            arguments = None
        props = self.extra_tools[name].parameters.get("properties", {})
        if not isinstance(arguments, dict) and len(props) == 1:
            (key, prop), = props.items()
            value: Any = plain_input(text)
            if prop.get("type") != "string":
                try:
                    value = json.loads(value)
                except (ValueError, RecursionError):
                    pass
            arguments = {key: value}
        if not isinstance(arguments, dict):
            return self._format_error(f"'{name}' takes a JSON object of arguments as its Action Input", step)
        result = self.extra_tools.call(name, arguments)
        info.update(tool=name, tool_input=text, tool_ok=result.ok)
        return Transition(self._observe(result.content), "tool_call", parsed=step, info=info)

    def episode_metrics(self) -> dict[str, Any]:
        counts = {t: sum(r.action_type == t for r in self._history) for t in TOOL_ACTION_TYPES}
        gold = [str(d) for d in self.task.get("gold_doc_ids", [])]
        retrieved = {d for r in self._history for d in r.info.get("retrieved_ids", [])}
        calculator = sum(r.info.get("tool") == "calculator" for r in self._history)
        return {"searches": counts["search"], "lookups": counts["lookup"], "calculator_calls": calculator,
                "question_type": self.task.get("type"), "hops": self.task.get("hops"),
                "gold_recall": (sum(d in retrieved for d in gold) / len(gold)) if gold else None}

    def close(self) -> None:
        self.tools.close()

    # -- reference policy
    @staticmethod
    def oracle(context: Mapping[str, Any]) -> str:
        """Scripted reference that solves bundled tasks with real tool use; see :func:`.oracle.solve`."""
        return solve(context)
