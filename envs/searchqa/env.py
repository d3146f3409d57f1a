"""``agentgym/SearchQA-v0``: search-augmented question answering (Search-R1).

Protocol ``search_r1`` (default) reproduces Search-R1's rollout rules; every rule cites its source:
Search-R1 repository (PeterGriffinJin/Search-R1, 2025-10-29 snapshot) and paper (arXiv 2503.09516),
as collected in ``docs/search_r1_protocol.md``. Protocol ``chat`` exposes search as a JSON tool
call in chat turns, for instruct models with tool templates.

Retrieval is in-process by default (dense MiniLM + faiss over the bundled fictional world); a
retrieval server (``agentgym retriever serve``) is used with ``retriever="http://HOST:PORT"``.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

import gymnasium as gym
import numpy as np

from agentgym import AgentEnv, EnvConfig, Reward, Tool, ToolSet, Transition
from agentgym.parsing import TagMatch, first_tag, last_tag_content, parse_tool_calls
from agentgym.rewards import CallCost, InvalidActionPenalty, TokenF1, gold_answers
from agentgym.splits import check_split
from agentgym.envs.services.retrieval.base import format_passages
from agentgym.envs.services.retrieval.shared import get_retriever
from agentgym.envs.searchqa.rewards import DEFAULT_WEIGHTS, SearchR1FormatReward, _gold_in, useful_search
from agentgym.envs.searchqa.scoring import SCORERS, SearchR1Score, score_search_r1, search_r1_action, search_r1_cut

__all__ = ["SearchQAEnv", "SearchQAConfig",
           "SEARCH_R1_PROMPT", "SEARCH_R1_INVALID", "make_search_r1_prompt", "MaskRetrievedTokens",
           "RETRIEVAL_MODES", "NO_SEARCH_PROMPT", "RAG_PROMPT", "ANSWER_ONLY_INVALID", "PROMPT_SOURCES"]

# Search-R1 `make_prefix`, template "base" (scripts/data_process/nq_search.py): exact text, including
# its own typo "as your want". The question follows "Question: " and one newline ends the prompt.
SEARCH_R1_PROMPT = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time "
    "you get new information. After reasoning, if you find you lack some knowledge, you can call a search "
    "engine by <search> query </search> and it will return the top searched results between <information> "
    "and </information>. You can search as many times as your want. If you find no further external knowledge "
    "needed, you can directly provide the answer inside <answer> and </answer>, without detailed illustrations. "
    "For example, <answer> Beijing </answer>. Question: {question}\n"
)

# Search-R1 `execute_predictions` (search_r1/llm_agent/generation.py): the invalid-action observation.
SEARCH_R1_INVALID = (
    "\nMy previous action is invalid. If I want to search, I should put the query between <search> and "
    "</search>. If I want to give the final answer, I should put the answer between <answer> and </answer>. "
    "Let me try again.\n"
)

# Baselines (``retrieval="none"`` / ``"rag"``) for question-only sources (the bundled world, our own
# parquets). Search-R1's own baseline prompts are in its scripts/data_process/nq.py (direct answer) and
# nq_rag.py (RAG, context after the question); their parquets carry them in the `prompt` column, which
# `prompt="auto"` uses as is. These two are ours, worded like the instruction above so that only the
# access to retrieval differs. {passages} is `format_passages`.
NO_SEARCH_PROMPT = (
    "Answer the given question. You can reason inside <think> and </think> first. Then provide the answer "
    "inside <answer> and </answer>, without detailed illustrations. For example, <answer> Beijing </answer>. "
    "Question: {question}\n"
)
RAG_PROMPT = (
    "Answer the given question. The top searched results for it are given between <information> and "
    "</information>; use them if they help. You can reason inside <think> and </think> first. Then provide the "
    "answer inside <answer> and </answer>, without detailed illustrations. For example, <answer> Beijing </answer>.\n"
    "<information>{passages}</information>\nQuestion: {question}\n"
)
# Invalid-action observation of the baselines (no search engine to mention).
ANSWER_ONLY_INVALID = (
    "\nMy previous action is invalid. I should put the final answer between <answer> and </answer>. "
    "Let me try again.\n"
)
#: ``agentic`` = Search-R1 (the policy searches when it decides to); ``none`` = answer without retrieval;
#: ``rag`` = the top-k passages for the question are in the prompt, no search action.
RETRIEVAL_MODES = ("agentic", "none", "rag")
#: Where the first user message comes from: ``auto`` = the parquet's ``prompt`` column for rows written by
#: Search-R1's scripts, else the built template; ``parquet`` = always the column; ``template`` = always built.
PROMPT_SOURCES = ("auto", "parquet", "template")

CHAT_SYSTEM_PROMPT = (
    "You answer questions about a world you do not know; a search engine over an encyclopedia of that world "
    "is available as the tool `search`. Call it by writing\n"
    '<tool_call>{"name": "search", "arguments": {"query": "..."}}</tool_call>\n'
    "and the top results come back as a tool message. Search only when you need knowledge you lack; each "
    "search may cost. When you know the answer, reply with <answer>ANSWER</answer> (a few words, no explanation)."
)


def _question_text(question: str) -> str:
    # Search-R1 `make_prefix`: the question is stripped and gets a trailing '?' if it lacks one.
    q = question.strip()
    return q if q.endswith("?") else q + "?"


def make_search_r1_prompt(question: str) -> str:
    """Search-R1's prompt: the question is stripped and gets a trailing '?' if it lacks one."""
    return SEARCH_R1_PROMPT.format(question=_question_text(question))


def _share_hash(key: str) -> float:
    """A stable number in [0, 1) for ``key`` (not Python's salted ``hash``): which tasks a share picks."""
    return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) / 16**8


# ----------------------------------------------------------------------------- env
@dataclass
class SearchQAConfig(EnvConfig):
    """The settings of ``SearchQA-v0``.

    ``data``: ``None`` is the bundled world (``world_seed``, ``world_size``); a dict has ``questions`` (a
    Search-R1 parquet path or a list of rows) and ``corpus`` (a jsonl path or a list of docs). ``corpus`` may
    be left out when ``retriever`` is a server URL, an index directory or an object (the index already holds
    the passages; loading wiki-18 into every env would cost gigabytes).

    ``retrieval``: ``"agentic"`` is Search-R1 (the policy decides when to search); the baselines of
    ``protocol="search_r1"`` are ``"none"`` (answer without retrieval; ``NO_SEARCH_PROMPT``) and ``"rag"`` (the
    ``topk`` passages for the question are in the prompt; ``RAG_PROMPT``). They accept only ``<answer>``;
    anything else is invalid (``ANSWER_ONLY_INVALID``) until ``max_turns`` (``max_turns=1,
    forced_answer=False`` is one generation, as Search-R1's baselines).

    ``prompt``: ``"auto"`` gives rows written by Search-R1's scripts (``nq_search.py``, ``nq.py``,
    ``nq_rag.py``, the merge scripts) their parquet ``prompt`` messages as they are, as Search-R1's trainer
    feeds them, and the built template to the bundled world, question-only rows and our own parquets;
    ``"parquet"`` always the column (every row must have one); ``"template"`` always the built one. With a
    parquet prompt, ``retrieval="rag"`` retrieves nothing at reset (``nq_rag.py``'s prompt holds the passages).

    ``oracle_two_hop``: the tasks are picked by a hash of their id, so the same ones every run; at ``1`` the
    oracle goes hop by hop on every multi-hop task whose gold passages are in the corpus (the bridge is the
    title of the second hop's passage: the bundled world's tasks, and rows with ``gold_doc_ids`` over a
    Search-R1-format corpus). An SFT set with a small share leaves RL room to learn the second search.
    """
    protocol: str = field(default="search_r1", metadata={
        "help": "search_r1 (tags, continuation style, Search-R1 rules) or chat (a JSON search tool in chat turns)"})
    split: str = field(default="train", metadata={
        "help": "train, validation or test questions of the bundled world (disjoint, deduplicated)"})
    retriever: Any = field(default="dense", metadata={
        "help": "dense (in-process MiniLM + faiss), bm25, http://host:port (a Search-R1-protocol server), an "
                "index directory, or a retriever object"})
    topk: int = field(default=3, metadata={"help": "passages per search (Search-R1: 3)."})
    max_turns: int = field(default=4, metadata={
        "help": "search turns (Search-R1 scripts: 4); with forced_answer one more turn follows"})
    forced_answer: bool = field(default=True, metadata={
        "help": "after max_turns, one more turn in which a search is not executed (Search-R1's do_search=False)"})
    data: Mapping[str, Any] | None = field(default=None, metadata={
        "help": "null: the bundled world; or {questions: parquet path or rows, corpus: jsonl path or docs}"})
    world_seed: int = field(default=0, metadata={"help": "the bundled world's seed"})
    world_size: str | int = field(default="small", metadata={"help": "the bundled world's size (a name or a number)"})
    retrieval: str = field(default="agentic", metadata={
        "help": "agentic (Search-R1), or a search_r1 baseline: none (no retrieval) or rag (passages in the prompt)"})
    prompt: str = field(default="auto", metadata={
        "help": "auto (a Search-R1 parquet's prompt column where its scripts wrote one, else the template), "
                "parquet or template"})
    scorer: str = field(default="em", metadata={
        "help": f"one of {', '.join(SCORERS)} (qa_*: Search-R1's whole-sequence scoring, quirk included)"})
    stop_at_answer: bool = field(default=False, metadata={
        "help": "also stop generating at </answer>: faster, but not Search-R1's rule (the env cuts the reply "
                "after the first </search>, else </answer>)"})
    oracle_two_hop: float = field(default=0.0, metadata={
        "help": "share, in [0, 1], of multi-hop tasks on which oracle() searches hop by hop, not once"})

    def __post_init__(self) -> None:
        if self.protocol not in ("search_r1", "chat"):
            raise ValueError(f"protocol must be 'search_r1' or 'chat', got {self.protocol!r}")
        if self.retrieval not in RETRIEVAL_MODES:
            raise ValueError(f"retrieval must be one of {RETRIEVAL_MODES}, got {self.retrieval!r}")
        if self.retrieval != "agentic" and self.protocol != "search_r1":
            raise ValueError(f"retrieval={self.retrieval!r} is a baseline of protocol='search_r1'")
        check_split(self.split)
        if self.topk < 1:
            raise ValueError(f"topk must be >= 1, got {self.topk}")
        if self.prompt not in PROMPT_SOURCES:
            raise ValueError(f"prompt must be one of {PROMPT_SOURCES}, got {self.prompt!r}")
        if self.prompt == "parquet" and self.protocol != "search_r1":
            raise ValueError("prompt='parquet' applies to protocol='search_r1'")
        if self.scorer not in SCORERS:
            raise ValueError(f"scorer must be one of {SCORERS}, got {self.scorer!r}")
        if isinstance(self.oracle_two_hop, bool) or not isinstance(self.oracle_two_hop, (int, float)) \
                or not 0.0 <= self.oracle_two_hop <= 1.0:
            raise ValueError(f"oracle_two_hop must be a number in [0, 1], got {self.oracle_two_hop!r}")


class SearchQAEnv(AgentEnv):
    """Answer questions, searching a corpus when needed; settings: :class:`SearchQAConfig`."""

    metadata = {"render_modes": ["ansi"], "render_fps": 1}
    tool_action_types = ("search",)
    config_class = SearchQAConfig

    def __init__(self, config: SearchQAConfig | None = None, **settings: Any):
        c = self.config = self.config_class.build(config, settings)
        protocol, split, retriever, retrieval, prompt = c.protocol, c.split, c.retriever, c.retrieval, c.prompt
        stop_at_answer = c.stop_at_answer
        self.oracle_two_hop = float(c.oracle_two_hop)
        self.protocol, self.split, self.topk, self.retrieval = protocol, split, c.topk, retrieval
        self.prompt_source, self.scorer = prompt, c.scorer
        self.search_turns, self.forced_answer = int(c.max_turns), bool(c.forced_answer)
        self.observation_style = "continuation" if protocol == "search_r1" else "chat"
        # Search-R1 samples without stop strings, then cuts each response after the first </search>, else
        # after the first </answer> (search_r1_cut). Stopping at </search> gives the same text (the cut would
        # end there too); stopping at </answer> would not (a later </search> wins), so by default the rollout
        # generates on and cuts after the first of `cut_after` present (agentgym.rollout), and step() cuts too.
        self.stop_strings = ("</search>", "</answer>") if protocol != "search_r1" or stop_at_answer else ("</search>",)
        self.cut_after = ("</search>", "</answer>") if protocol == "search_r1" and not stop_at_answer else ()
        if protocol == "chat":
            self.stop_strings = ("</tool_call>", "</answer>")
        elif retrieval != "agentic":
            # the baselines take no search action: the first </answer> ends the response
            self.stop_strings, self.cut_after = ("</answer>",), ()
        self._rag_text = ""  # passages put in this episode's prompt (retrieval="rag")
        in_process = retriever in ("dense", "bm25") and retrieval != "none"
        self.corpus, self.questions, corpus_key = self._load_data(c.data, split, c.world_seed, c.world_size, in_process)
        self.num_tasks = len(self.questions)
        if prompt == "parquet" and not all(q.get("prompt") for q in self.questions):
            raise ValueError("prompt='parquet' needs every question row to carry a 'prompt' (a Search-R1 parquet)")
        self._retriever_spec = retriever
        self._corpus_key = corpus_key
        self._retriever = None
        if not (isinstance(retriever, str) and (retriever in ("dense", "bm25") or retriever.startswith(("http://", "https://")))) \
                and retrieval != "none" and not hasattr(retriever, "search"):
            _ = self.retriever  # an index on disk: a missing file or encoder fails here, not at the first search
        self.tools = ToolSet([Tool("search", "Search the encyclopedia; returns the top passages.",
                                   {"type": "object", "properties": {"query": {"type": "string", "minLength": 1}},
                                    "required": ["query"], "additionalProperties": False}, self._search_text)],
                             timeout_s=None)
        super().__init__(reward=c.reward, max_turns=self.search_turns + (1 if self.forced_answer else 0),
                         max_action_chars=c.max_action_chars, render_mode=c.render_mode, group_reward=c.group_reward)

    # -- data and retrieval
    @staticmethod
    def _load_data(data, split, world_seed, world_size, needs_corpus=True):
        from agentgym.envs.searchqa import data as sdata
        if data is None:
            corpus, _, _ = sdata.bundled_dataset(seed=world_seed, size=world_size)
            questions = sdata.bundled_questions(split, seed=world_seed, size=world_size)
            return corpus, questions, ("bundled", world_seed, world_size)
        questions, corpus = data.get("questions"), data.get("corpus")
        if questions is None or (corpus is None and needs_corpus):
            raise ValueError("data= needs 'questions' (parquet path or rows) and 'corpus' (jsonl path or docs); "
                             "'corpus' may be left out only with a retrieval server URL, an index directory or "
                             "a retriever object")
        key = ("custom", corpus if isinstance(corpus, str) else id(corpus))
        if isinstance(questions, str):
            questions = sdata.load_search_r1_parquet(questions)
        if isinstance(corpus, str):
            corpus = sdata.load_corpus_jsonl(corpus)
        return (None if corpus is None else list(corpus)), list(questions), key

    @property
    def retriever(self) -> Any:
        if self._retriever is None:
            self._retriever = get_retriever(self._retriever_spec, self.corpus, self._corpus_key)
        return self._retriever

    def _search(self, query: str) -> tuple[str, list[Any]]:
        from agentgym.envs.services.retrieval.base import Retriever
        r = self.retriever
        # Search-R1 sends an empty query as it is ("" is posted; its e5 server answers with passages)
        hits = (r.search([query], topk=self.topk, search_empty=self.protocol == "search_r1")[0]
                if isinstance(r, Retriever) else r.search([query], topk=self.topk)[0])
        return format_passages(hits), hits

    # -- scoring
    def _sequence(self, action: str | None = None) -> str:
        """The episode's text as Search-R1's reward manager decodes it: prompt, cut responses, observations."""
        parts = [search_r1_cut(m["content"]) if m["role"] == "assistant" else m["content"] for m in self.messages]
        if action is not None:
            parts.append(search_r1_cut(action))
        return "".join(parts)

    def score(self, answer: str | None, action: str | None = None) -> float:
        """This episode's score under ``scorer``; ``action`` is a last response not yet in ``messages``."""
        golds = [str(g) for g in self.task.get("answers", [])]
        sequence = self._sequence(action) if self.scorer.startswith("qa_") else ""
        return score_search_r1(self.scorer, answer, sequence, golds)

    def episode_success(self) -> bool:
        answer = next((r.info.get("answer") for r in reversed(self._history) if r.info.get("answer") is not None), None)
        return self.score(answer) > 0

    def _search_text(self, query: str) -> str:
        return self._search(query)[0].strip() or "No results."

    # -- AgentEnv API
    def get_task(self, index: int) -> dict[str, Any]:
        task = dict(self.questions[index])
        if isinstance(task.get("answers"), (str, int, float)):   # one answer given bare: one answer, not its letters
            task["answers"] = gold_answers(task["answers"])
        if self.oracle_two_hop > 0 and _share_hash(str(task.get("id", index))) < self.oracle_two_hop:
            bridges = self._bridges(task)
            if bridges:
                task["oracle_bridges"] = bridges   # privileged (info["privileged"]), read by the oracle only
        return task

    def _bridges(self, task: Mapping[str, Any]) -> list[str]:
        """The entities a multi-hop task passes through: the titles of its gold passages after the first
        (the second hop's passage is the bridge entity's own). Empty without gold passages or a corpus."""
        golds = [str(g) for g in task.get("gold_doc_ids") or []]
        if len(golds) < 2 or not self.corpus:
            return []
        if getattr(self, "_titles", None) is None:
            from agentgym.envs.searchqa.data import split_title
            self._titles = {str(d["id"]): split_title(d["contents"])[0] for d in self.corpus}
        return [t for t in (self._titles.get(g, "") for g in golds[1:]) if t]

    def _uses_parquet_prompt(self, task: Mapping[str, Any]) -> bool:
        if self.protocol != "search_r1" or self.prompt_source == "template" or not task.get("prompt"):
            return False
        return self.prompt_source == "parquet" or task.get("schema") != "agentgym"

    def initial_messages(self, task: Mapping[str, Any]) -> list[dict[str, str]]:
        self._rag_text = ""
        if self._uses_parquet_prompt(task):
            # Search-R1's trainer feeds the parquet's chat messages as they are (whatever template made them)
            return [{"role": m["role"], "content": m["content"]} for m in task["prompt"]]
        self._rag_text = ""
        if self.retrieval == "none":
            return [{"role": "user", "content": NO_SEARCH_PROMPT.format(question=_question_text(task["question"]))}]
        if self.retrieval == "rag":
            # one retrieval with the question as the query, the same passage format as a search result
            self._rag_text = self._search(task["question"])[0]
            return [{"role": "user", "content": RAG_PROMPT.format(passages=self._rag_text.strip(),
                                                                   question=_question_text(task["question"]))}]
        if self.protocol == "search_r1":
            return [{"role": "user", "content": make_search_r1_prompt(task["question"])}]
        return [{"role": "system", "content": CHAT_SYSTEM_PROMPT}, {"role": "user", "content": task["question"]}]

    def tool_specs(self) -> list[dict[str, Any]]:
        return self.tools.specs() if self.protocol == "chat" else []

    def default_reward(self) -> Reward:
        terms = [SearchR1Score(self), TokenF1(), SearchR1FormatReward(), CallCost("search", name="search_cost"),
                 useful_search, InvalidActionPenalty()]
        return Reward([(t, DEFAULT_WEIGHTS[t.name]) for t in terms])

    def _forced_turn(self) -> bool:
        return self.forced_answer and self.turn == self.search_turns  # 0-based turn index of this step

    def transition(self, action: str) -> Transition:
        if self.protocol == "chat":
            return self._chat_transition(action)
        if self.retrieval != "agentic":
            tag = first_tag(action, ("answer",))
            if tag is None:
                return self.invalid(ANSWER_ONLY_INVALID)
            return Transition([], "answer", parsed=tag, terminated=True, answer=tag.content)
        # Search-R1: cut the response (first </search>, else first </answer>), then the first match of
        # <(search|answer)>(.*?)</\1> decides (`postprocess_predictions`); an answer ends the episode with
        # that answer's content. (Its reward, `qa_em`, re-reads the whole sequence: scorer="qa_em".)
        kind, content, span = search_r1_action(search_r1_cut(action))
        if kind is None:
            return self.invalid(SEARCH_R1_INVALID)
        tag = TagMatch(kind, content, *span)
        if tag.tag == "answer":
            return Transition([], "answer", parsed=tag, terminated=True, answer=tag.content)
        if self._forced_turn():
            # Final rollout with do_search=False: the search is not executed; the episode ends.
            return Transition([{"role": "user", "content": "\n\n<information></information>\n\n"}], "search",
                              parsed=tag, info={"query": tag.content, "search_executed": False, "retrieved_text": ""})
        passages, hits = self._search(tag.content)
        obs = f"\n\n<information>{passages.strip()}</information>\n\n"
        return Transition([{"role": "user", "content": obs}], "search", parsed=tag,
                          info={"query": tag.content, "search_executed": True, "retrieved_text": passages,
                                "retrieved_ids": [h.doc_id for h in hits]})

    def _chat_transition(self, action: str) -> Transition:
        tag = first_tag(action, ("tool_call", "answer"))
        if tag is None:
            parsed = parse_tool_calls(action)
            why = parsed.errors[0] if parsed.errors else "no <tool_call> or <answer> found"
            return self.invalid(f"Invalid action: {why}. Search with <tool_call>{{\"name\": \"search\", \"arguments\": "
                                "{\"query\": \"...\"}}</tool_call> or answer with <answer>ANSWER</answer>.")
        if tag.tag == "answer":
            return Transition([], "answer", parsed=tag, terminated=True, answer=last_tag_content(action, "answer"))
        parsed = parse_tool_calls(action[tag.start:tag.end])
        if parsed.errors:
            return self.invalid(f"Invalid tool call: {parsed.errors[0]}", parsed=parsed)
        call = parsed.calls[0]
        if call.name != "search" or self.tools["search"].validation_errors(call.arguments):
            # Unknown tool or arguments against the schema: the tool set's error message (nothing runs),
            # on the forced turn too.
            result = self.tools.call(call.name, call.arguments)
            return self.invalid(result.content, parsed=call, role="tool")
        if self._forced_turn():
            return Transition([{"role": "tool", "name": call.name, "content": "No more searches: answer now."}],
                              "search", parsed=call, info={"query": call.arguments["query"], "search_executed": False,
                                                           "retrieved_text": ""})
        result = self.tools.call("search", call.arguments)
        if not result.ok:
            return self.invalid(result.content, parsed=call, role="tool")
        return Transition([result.as_message()], "search", parsed=call,
                          info={"query": call.arguments["query"], "search_executed": True,
                                "retrieved_text": result.content})

    def episode_metrics(self) -> dict[str, Any]:
        searches = [r for r in self._history if r.action_type == "search"]
        golds = [str(g) for g in self.task.get("answers", [])]
        found = any(_gold_in(r.info.get("retrieved_text", ""), golds) for r in searches)
        return {"searches": len(searches), "question_type": self.task.get("type"),
                "needs_search": self.task.get("needs_search"),
                "found_gold": found or (bool(self._rag_text) and _gold_in(self._rag_text, golds))}

    @staticmethod
    def oracle(context: Mapping[str, Any]) -> str:
        """Privileged reference: search the question once when it needs search, then answer gold.

        On a task the env picked for hop-by-hop search (``oracle_two_hop``), the next turns search each
        bridge entity (the first hop's answer) before answering. Uses the Search-R1 tag protocol; for
        ``protocol="chat"`` use :meth:`chat_oracle`."""
        task = context["task"]
        answer, turn = task["answers"][0], context.get("turn", 0)
        if task.get("needs_search", True) and turn == 0:
            return f"<think>I need to look this up.</think><search>{task['question']}</search>"
        bridges = task.get("oracle_bridges") or []
        if 1 <= turn <= len(bridges):
            return f"<think>Now I need to know more about {bridges[turn - 1]}.</think><search>{bridges[turn - 1]}</search>"
        return f"<think>I know the answer now.</think><answer>{answer}</answer>"

    @staticmethod
    def chat_oracle(context: Mapping[str, Any]) -> str:
        """:meth:`oracle` for ``protocol="chat"``: one JSON ``search`` tool call when needed, then gold."""
        task = context["task"]
        turn, bridges = context.get("turn", 0), task.get("oracle_bridges") or []
        if (task.get("needs_search", True) and turn == 0) or 1 <= turn <= len(bridges):
            query = task["question"] if turn == 0 else bridges[turn - 1]
            call = {"name": "search", "arguments": {"query": query}}
            return f"<tool_call>{json.dumps(call, ensure_ascii=False)}</tool_call>"
        return f"<answer>{task['answers'][0]}</answer>"


class MaskRetrievedTokens(gym.ObservationWrapper):
    """Seed-002 observation masking: replace a ``fraction`` of the retrieved words in each search
    observation with ``[MASK]``, seeded by ``reset(seed=...)``. This hides information from the
    *observation*; it is separate from the loss mask (which always excludes env tokens)."""

    def __init__(self, env: gym.Env, fraction: float, mask_token: str = "[MASK]", seed: int | None = None):
        super().__init__(env)
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"fraction must be in [0, 1], got {fraction}")
        self.fraction, self.mask_token = fraction, mask_token
        self._rng = np.random.default_rng(seed)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        # The reset observation is the task prompt, never retrieved text (and Search-R1's prompt itself
        # mentions "<information> and </information>"): it passes through unmasked.
        return self.env.reset(seed=seed, options=options)

    def _mask(self, text: str) -> str:
        # A word is a run of non-whitespace; the whitespace between words (newlines between passages)
        # is kept, so the observation's layout survives masking.
        return re.sub(r"\S+", lambda m: self.mask_token if self._rng.random() < self.fraction else m.group(0), text)

    def observation(self, obs: list[dict[str, str]]) -> list[dict[str, str]]:
        out = []
        for m in obs:
            c = m["content"]
            if "<information>" in c:
                c = re.sub(r"(<information>)(.*?)(</information>)",
                           lambda g: g.group(1) + self._mask(g.group(2)) + g.group(3), c, flags=re.DOTALL)
            elif m.get("role") == "tool" and m.get("name") == "search":
                c = self._mask(c)
            out.append({**m, "content": c})
        return out
