"""``agentgym/ReAct-v0``: Thought / Action / Observation loops (ReAct, Yao et al. 2023) over the
SearchQA world.

Each reply of the agent is one ReAct step: a ``Thought:`` line, then either ``Action:`` +
``Action Input:`` lines or a ``Final Answer:`` line. The env answers an action with a user message
``Observation: ...``. Tools:

* ``search`` — the top-``topk`` passages of the SearchQA corpus through the shared retriever
  interface (default: the in-process dense retriever, cached under the *same* key as
  ``SearchQA-v0``'s bundled corpus, so one index serves both envs in a process).
* ``lookup`` — the next sentence containing a keyword in the passages of the last search, as in the
  ReAct paper's Wikipedia env: the passages of the last search, in rank order, are the "page";
  repeating the same keyword advances through its matches (``(Result i / n) ...``), a new keyword
  or a new search starts over, and after the last match the answer is ``No more results.``
* ``calculator`` — exact arithmetic (``agentgym.envs.calculator``). ``Action: Finish`` with the
  answer as input (the paper's ``Finish[answer]``) is accepted as a final answer.

Tasks are the bundled world's multi-hop questions plus a share of single-hop ones
(``single_hop_fraction``); ``question_types`` can add the no-search questions.

**Observation style: chat.** Observations are user messages, which instruct models handle with
their own chat template; the assistant text is kept token-for-token, so a reply cut at the stop
string ``"\\nObservation:"`` (which keeps a model from inventing observations) ends with that
label, and the next user message begins with it again. A continuation-style formatter would show the
label twice, so the env declares ``observation_style = "chat"``.

**Reward terms** (weights configurable with ``reward={name: weight}``):

===================  ======  ===============================================================
term                 weight  raw value
===================  ======  ===============================================================
``correct``          1.0     terminal: 1 if the final answer matches a gold answer (exact match
                             after Search-R1 normalisation)
``wrong_answer``     0.5     terminal: −1 if the episode ends without a correct final answer —
                             a wrong answer or none (turn limit), so stalling never beats answering
``tool_efficiency``  0.2     terminal: 1 if the episode ends with a correct final answer after at
                             most ``few_tool_calls`` (3) tool calls (only on success, so a quick
                             guess earns nothing)
``tool_overuse``     0.1     terminal: −1 if the episode made more than ``many_tool_calls`` (5)
                             tool calls
``thought_quality``  0.05    terminal: share of the episode's steps whose ``Thought:`` is non-empty
                             and not a copy of an earlier step's thought, both after Search-R1
                             answer normalisation (so "The." is empty and "Let me see" copies
                             "let me see!")
                             — terminal and a share, so padding an episode with steps earns nothing
``format_error``     0.1     step: −1 for a malformed step, an unknown tool or an empty input; the
                             observation says what was wrong and how to write a step
===================  ======  ===============================================================

Tool calls are steps of action type ``search``, ``lookup`` or ``tool_call`` (the calculator);
malformed steps are not tool calls.

Privileged task data (``info["privileged"]["task"]``): the SearchQA question row plus
``hop_chain`` — per hop the entity, relation, a query phrase for the relation and the surface forms
of the hop's target — which :meth:`ReActEnv.oracle` uses.

Written only against the public ``agentgym`` API, as a user's own env would be.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any, Mapping, Sequence

from agentgym import AgentEnv, Reward, Tool, ToolSet, Transition
from agentgym.parsing import parse_react
from agentgym.rewards import ExactMatch, InvalidActionPenalty, StepEvent, exact_match, normalize_answer
from agentgym.envs.calculator import calculator
from agentgym.envs.searchqa.data import bundled_dataset, split_title
from agentgym.envs.retrieval.base import format_passages
from agentgym.envs.retrieval.shared import get_retriever

__all__ = ["ReActEnv", "REACT_SYSTEM_PROMPT", "DEFAULT_WEIGHTS", "TOOL_ACTION_TYPES", "RELATION_PHRASES", "hop_chain",
           "ToolEfficiency", "ToolOveruse", "ThoughtQuality", "WrongAnswer"]

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

#: Action types that count as tool calls (for the efficiency terms and the episode summary).
TOOL_ACTION_TYPES: tuple[str, ...] = ("search", "lookup", "tool_call")

#: Default weights of the reward terms (see the module docstring for each rule).
DEFAULT_WEIGHTS: dict[str, float] = {"correct": 1.0, "wrong_answer": 0.5, "tool_efficiency": 0.2,
                                     "tool_overuse": 0.1, "thought_quality": 0.05, "format_error": 0.1}

#: How a reader of a question would phrase each world relation in a query (used by the oracle).
RELATION_PHRASES: dict[str, str] = {
    "birth_year": "born", "born_in": "born in", "profession": "profession", "studied_at": "studied at",
    "worked_for": "worked for", "married_to": "married to", "member_of": "member of the band",
    "country": "country", "population": "population", "founded_year": "founded", "on_river": "lies on river",
    "capital": "capital", "language": "official language", "currency": "currency",
    "established_year": "independent state established", "highest_mountain": "highest mountain",
    "length_km": "length", "source": "river rises on mountain", "height_m": "height metres",
    "first_climbed_by": "first climbed by", "first_ascent_year": "first climbed in year",
    "founder": "founded by", "headquarters": "headquartered in", "industry": "industry company",
    "city": "located in city", "genre": "genre of music", "formed_year": "band formed in year",
    "origin": "band formed in city",
}

_OBS = "Observation: "
_STEP_HINT = ("Write one step: a line 'Thought: ...', then either the lines 'Action: <tool>' and "
              "'Action Input: <input>' (tools: search, lookup, calculator) or a line 'Final Answer: <answer>'.")
_QUESTION_TYPES = ("single_hop", "multi_hop", "no_search")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


# ----------------------------------------------------------------------------- reward terms
def _tool_calls(event: StepEvent) -> int:
    return sum(r.action_type in TOOL_ACTION_TYPES for r in event.history) + (event.action_type in TOOL_ACTION_TYPES)


class WrongAnswer:
    """Terminal: −1 when the episode ends without a correct final answer (wrong or missing)."""
    name = "wrong_answer"

    def __call__(self, event: StepEvent) -> float:
        return -1.0 if event.done and not exact_match(event.final_answer, event.gold) else 0.0


class ToolEfficiency:
    """Terminal: 1 when the episode ends with a correct final answer after at most ``limit`` tool
    calls. Paid only on success, so a quick guess earns nothing over a careful wrong answer."""
    name = "tool_efficiency"

    def __init__(self, limit: int = 3):
        self.limit = limit

    def __call__(self, event: StepEvent) -> float:
        return float(event.done and _tool_calls(event) <= self.limit and exact_match(event.final_answer, event.gold))


class ToolOveruse:
    """Terminal: −1 when the episode made more than ``limit`` tool calls."""
    name = "tool_overuse"

    def __init__(self, limit: int = 5):
        self.limit = limit

    def __call__(self, event: StepEvent) -> float:
        return -1.0 if event.done and _tool_calls(event) > self.limit else 0.0


def _thought(action: str) -> str:
    return normalize_answer(parse_react(action).thought or "")


class ThoughtQuality:
    """Terminal: share of steps with a non-empty Thought that repeats no earlier step's Thought
    (compared after Search-R1 normalisation). A share, not a per-step bonus, so it cannot be farmed
    by taking more steps."""
    name = "thought_quality"

    def __call__(self, event: StepEvent) -> float:
        if not event.done:
            return 0.0
        seen: set[str] = set()
        good = 0
        actions = [r.action for r in event.history] + [event.action]
        for a in actions:
            t = _thought(a)
            good += bool(t) and t not in seen
            seen.add(t)
        return good / len(actions)


# ----------------------------------------------------------------------------- world facts for the oracle
@functools.lru_cache(maxsize=4)
def _world(seed: int, size: str | int) -> Any:
    from agentgym.envs.searchqa.world import build_world
    return build_world(seed, size)


@functools.lru_cache(maxsize=1)
def _templates() -> dict[str, Any]:
    from agentgym.envs.searchqa.questions import MULTI_HOP_TEMPLATES, SINGLE_HOP_TEMPLATES
    return {t.name: t for t in SINGLE_HOP_TEMPLATES + MULTI_HOP_TEMPLATES}


def hop_chain(question: Mapping[str, Any], world_seed: int, world_size: str | int) -> list[dict[str, Any]]:
    """Per hop of a bundled world question: ``entity`` (name), ``relation``, ``phrase`` (how to ask
    for the relation) and ``answers`` (surface forms of the hop's target; the last hop's are the
    question's answers). Empty when the question does not come from the world's templates."""
    from agentgym.envs.searchqa.world import ENTITY_RELATIONS, value_answers
    template_name, _, subject = str(question.get("id", "")).partition("@")
    template = _templates().get(template_name)
    world = _world(world_seed, world_size)
    if template is None or subject not in world.entities:
        return []
    chain, node = [], subject
    for i, relation in enumerate(template.path):
        values = list(world.statements(node, relation))
        if len(values) != 1:
            return []
        value = values[0]
        last = i == len(template.path) - 1
        if last:
            answers = [str(a) for a in question["answers"]]
        elif relation in ENTITY_RELATIONS:
            answers = [world.name(value)]
        else:
            answers = value_answers(relation, value)
        chain.append({"entity": world.name(node), "relation": relation,
                      "phrase": RELATION_PHRASES.get(relation, relation.replace("_", " ")), "answers": answers})
        node = value
    return chain


# ----------------------------------------------------------------------------- helpers
def _plain_input(text: str | None) -> str:
    """The first line of an Action Input, unquoted; a one-value JSON object (``{"query": "x"}``,
    as LangChain-style agents write) gives its value."""
    text = (text or "").strip()
    if text.startswith("{"):
        try:
            obj = json.loads(text)
        except (ValueError, RecursionError):
            obj = None
        if isinstance(obj, dict) and len(obj) == 1:
            text = str(next(iter(obj.values()))).strip()
    text = text.split("\n", 1)[0].strip() if text else ""
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'`":
        text = text[1:-1].strip()
    return text


def _tool_name(action: str) -> str:
    return action.strip().strip("`'\"[]").strip().lower()


def _contains(text: str, phrase: str) -> bool:
    p = normalize_answer(phrase)
    return bool(p) and f" {p} " in f" {normalize_answer(text)} "


def _passages_of(observation: str) -> list[str]:
    """The ``Doc i(Title: ...) text`` passages of a search observation."""
    return [p for p in re.split(r"(?=Doc \d+\(Title: )", observation) if p.startswith("Doc ")]


def _steps(messages: Sequence[Mapping[str, str]]) -> list[tuple[str, str]]:
    """(assistant action, following observation text) pairs of a conversation."""
    out: list[tuple[str, str]] = []
    for m in messages:
        if m.get("role") == "assistant":
            out.append((m.get("content", ""), ""))
        elif out:
            out[-1] = (out[-1][0], out[-1][1] + m.get("content", ""))
    return out


# ----------------------------------------------------------------------------- env
class ReActEnv(AgentEnv):
    """Multi-hop question answering in the ReAct format with search, lookup and calculator tools.

    Args:
        split: ``"train"`` or ``"test"`` questions of the bundled world (disjoint by subject entity).
        retriever: ``"dense"`` (default, in-process, shared with ``SearchQA-v0``), ``"bm25"``, a
            retrieval-server URL, an index directory, or an object with ``search(queries, topk)``.
        topk: passages per search.
        question_types: which bundled question types to ask (``multi_hop``, ``single_hop``,
            ``no_search``).
        single_hop_fraction: the share of single-hop questions among the tasks (all multi-hop
            questions are kept; single-hop ones are added in dataset order up to this share).
        few_tool_calls / many_tool_calls: thresholds of ``tool_efficiency`` / ``tool_overuse``.
        world_seed, world_size: the bundled world (as ``SearchQA-v0``).
        max_turns: steps before the episode is truncated.
        reward: a custom :class:`~agentgym.Reward` or new weights for ``DEFAULT_WEIGHTS``' terms.
    """

    stop_strings = ("\nObservation:",)
    observation_style = "chat"
    tool_action_types = TOOL_ACTION_TYPES

    def __init__(self, split: str = "train", retriever: Any = "dense", topk: int = 3,
                 question_types: Sequence[str] = ("multi_hop", "single_hop"), single_hop_fraction: float = 0.25,
                 few_tool_calls: int = 3, many_tool_calls: int = 5, world_seed: int = 0,
                 world_size: str | int = "small", max_turns: int = 8,
                 reward: Reward | Mapping[str, float] | None = None, render_mode: str | None = None,
                 group_reward: Any = None):
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        if topk < 1:
            raise ValueError(f"topk must be >= 1, got {topk}")
        unknown = set(question_types) - set(_QUESTION_TYPES)
        if unknown or not question_types:
            raise ValueError(f"question_types must be a non-empty subset of {_QUESTION_TYPES}, got {question_types!r}")
        if not 0.0 <= single_hop_fraction < 1.0:
            raise ValueError(f"single_hop_fraction must be in [0, 1), got {single_hop_fraction}")
        if not 0 <= few_tool_calls <= many_tool_calls:
            raise ValueError("need 0 <= few_tool_calls <= many_tool_calls")
        self.split, self.topk = split, int(topk)
        self.few_tool_calls, self.many_tool_calls = int(few_tool_calls), int(many_tool_calls)
        self.world_seed, self.world_size = world_seed, world_size
        self.corpus, train, test = bundled_dataset(seed=world_seed, size=world_size)
        self.questions = self._select(train if split == "train" else test, tuple(question_types), single_hop_fraction)
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
        self._page: list[tuple[str, str]] = []  # (title, sentence) of the last search's passages
        self._lookup_state: tuple[str, int] | None = None  # (keyword, results shown)
        self._last_hits: list[Any] = []
        super().__init__(reward=reward, max_turns=max_turns, render_mode=render_mode, group_reward=group_reward)

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
        return [{"role": "system", "content": REACT_SYSTEM_PROMPT},
                {"role": "user", "content": f"Question: {task['question']}"}]

    def default_reward(self) -> Reward:
        terms = [ExactMatch(name="correct"), WrongAnswer(), ToolEfficiency(self.few_tool_calls),
                 ToolOveruse(self.many_tool_calls), ThoughtQuality(), InvalidActionPenalty(name="format_error")]
        return Reward([(t, DEFAULT_WEIGHTS[t.name]) for t in terms])

    def on_reset(self, task: Mapping[str, Any]) -> None:
        self._page, self._lookup_state, self._last_hits = [], None, []

    def _observe(self, text: str) -> list[dict[str, str]]:
        return [{"role": "user", "content": _OBS + text}]

    def _format_error(self, why: str, parsed: Any) -> Transition:
        return self.invalid(f"{_OBS}Invalid step: {why}. {_STEP_HINT}", parsed=parsed)

    def transition(self, action: str) -> Transition:
        step = parse_react(action)
        info: dict[str, Any] = {"thought": step.thought}
        if step.final_answer is not None:
            return Transition([], "answer", parsed=step, terminated=True, answer=step.final_answer, info=info)
        if step.error is not None:
            return self._format_error(step.error, step)
        name = _tool_name(step.action or "")
        arg = _plain_input(step.action_input)
        if name == "finish":  # the paper's Finish[answer]
            if not arg:
                return self._format_error("'Action: Finish' needs the answer as its Action Input", step)
            return Transition([], "answer", parsed=step, terminated=True, answer=arg, info=info)
        if name not in self.tools:
            return self._format_error(f"unknown tool {step.action.strip()[:80]!r}; the tools are search, lookup "
                                      "and calculator", step)
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

    def episode_metrics(self) -> dict[str, Any]:
        counts = {t: sum(r.action_type == t for r in self._history) for t in TOOL_ACTION_TYPES}
        gold = [str(d) for d in self.task.get("gold_doc_ids", [])]
        retrieved = {d for r in self._history for d in r.info.get("retrieved_ids", [])}
        return {"searches": counts["search"], "lookups": counts["lookup"], "calculator_calls": counts["tool_call"],
                "question_type": self.task.get("type"), "hops": self.task.get("hops"),
                "gold_recall": (sum(d in retrieved for d in gold) / len(gold)) if gold else None}

    def close(self) -> None:
        self.tools.close()

    # -- reference policy
    @staticmethod
    def oracle(context: Mapping[str, Any]) -> str:
        """Scripted reference that solves bundled tasks with real tool use.

        From the privileged ``hop_chain`` it knows which entity and relation each hop asks about,
        but it learns every hop's target only from observations: a hop counts as done when one
        retrieved passage names both the hop's entity and its target. Queries per hop, in order:
        the entity with the relation's phrase; that plus the entity's description from an earlier
        passage ("X is a mountaineer ..."); the bare entity name. If all fail it answers "unknown",
        which fails the task (so a retrieval miss shows up as a failure). The final answer is the
        gold surface form that the evidence passage contains.
        """
        task = context.get("task", {})
        steps = _steps(context.get("messages", []))
        chain = task.get("hop_chain") or []
        if not chain:
            return _oracle_without_chain(task, steps)
        hop, tried, found = 0, [], None
        for action, observation in steps:
            parsed = parse_react(action)
            if _tool_name(parsed.action or "") != "search" or hop >= len(chain):
                continue
            found = _evidence(observation, chain[hop])
            if found is not None:
                hop, tried = hop + 1, []
            else:
                tried.append(_plain_input(parsed.action_input))
        if hop == len(chain):
            return (f"Thought: The passage about {chain[-1]['entity']} states its '{chain[-1]['phrase']}' fact: "
                    f"{found}. That answers the question.\nFinal Answer: {found}")
        link = chain[hop]
        description = _description(link["entity"], [obs for _, obs in steps])
        candidates = [f"{link['entity']} {link['phrase']}", link["entity"]]
        if description:
            candidates.insert(1, f"{link['entity']} {link['phrase']} {description}")
        query = next((q for q in candidates if q not in tried), None)
        if query is None:
            return "Thought: I could not find the passage I need.\nFinal Answer: unknown"
        fact = f"{link['entity']}'s '{link['phrase']}' fact"
        if tried:
            thought = f"The results do not state {fact} yet, so I search more specifically for {query!r}."
        elif hop == 0:
            thought = f"I need {fact}, so I search for {query!r}."
        else:
            thought = (f"The passage links {chain[hop - 1]['entity']} to {link['entity']}. Now I need {fact}, "
                       f"so I search for {query!r}.")
        return f"Thought: {thought}\nAction: search\nAction Input: {query}"


def _evidence(observation: str, link: Mapping[str, Any]) -> str | None:
    """The first surface form of ``link``'s target that a passage naming ``link``'s entity contains."""
    for passage in _passages_of(observation):
        if _contains(passage, link["entity"]):
            for answer in link["answers"]:
                if _contains(passage, answer):
                    return answer
    return None


def _description(entity: str, observations: Sequence[str]) -> str | None:
    """The noun after "is a/an" in an earlier passage about ``entity`` (e.g. "mountaineer")."""
    for observation in observations:
        for passage in _passages_of(observation):
            if f'(Title: "{entity}")' in passage or f"(Title: {entity})" in passage:
                m = re.search(r"\bis an? ([\w-]+)", passage)
                if m:
                    return m.group(1)
    return None


_ARITHMETIC = re.compile(r"^What is (\d+) (plus|minus|times) (\d+)\?$")


def _oracle_without_chain(task: Mapping[str, Any], steps: Sequence[tuple[str, str]]) -> str:
    """No-search and custom tasks: arithmetic through the calculator, else search once and answer."""
    question = str(task.get("question", ""))
    answers = [str(a) for a in task.get("answers", [])] or ["unknown"]
    m = _ARITHMETIC.match(question.strip())
    if m:
        if not steps:
            op = {"plus": "+", "minus": "-", "times": "*"}[m.group(2)]
            return (f"Thought: This is arithmetic; the calculator gives it exactly.\nAction: calculator\n"
                    f"Action Input: {m.group(1)} {op} {m.group(3)}")
        result = steps[-1][1].removeprefix(_OBS).strip()
        return f"Thought: The calculator says {result}.\nFinal Answer: {result}"
    if task.get("needs_search", True) and not steps:
        return f"Thought: I need to look this up.\nAction: search\nAction Input: {question}"
    return f"Thought: I can answer this now.\nFinal Answer: {answers[0]}"
