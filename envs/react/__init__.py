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

Written only against the public ``agentgym`` API, as a user's own env would be. Layout: ``env.py`` (the
env and its tools), ``rewards.py`` (the terms), ``oracle.py`` (the scripted reference and ``hop_chain``),
``text.py`` (reading ReAct steps and observations, shared by the env and the oracle).
"""

from agentgym.envs.react.env import REACT_SYSTEM_PROMPT, ReActConfig, ReActEnv
from agentgym.envs.react.oracle import RELATION_PHRASES, hop_chain
from agentgym.envs.react.rewards import (DEFAULT_WEIGHTS, TOOL_ACTION_TYPES, ThoughtQuality, ToolEfficiency,
                                         ToolOveruse, WrongAnswer)

__all__ = ["ReActEnv", "ReActConfig",
           "REACT_SYSTEM_PROMPT", "DEFAULT_WEIGHTS", "TOOL_ACTION_TYPES", "RELATION_PHRASES", "hop_chain",
           "ToolEfficiency", "ToolOveruse", "ThoughtQuality", "WrongAnswer"]
