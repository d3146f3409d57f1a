"""ReAct-v0's scripted reference policy (:func:`solve`) and the per-hop facts it works from (:func:`hop_chain`)."""

from __future__ import annotations

import functools
import re
from typing import Any, Mapping, Sequence

from agentgym.parsing import parse_react

from .text import OBS, contains, passages_of, plain_input, steps_of, tool_name

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
    from agentgym.envs.searchqa.world import ENTITY_RELATIONS
    from agentgym.envs.searchqa.render import value_answers
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


def solve(context: Mapping[str, Any]) -> str:
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
    steps = steps_of(context.get("messages", []))
    chain = task.get("hop_chain") or []
    if not chain:
        return _oracle_without_chain(task, steps)
    hop, tried, found = 0, [], None
    for action, observation in steps:
        parsed = parse_react(action)
        if tool_name(parsed.action or "") != "search" or hop >= len(chain):
            continue
        found = _evidence(observation, chain[hop])
        if found is not None:
            hop, tried = hop + 1, []
        else:
            tried.append(plain_input(parsed.action_input))
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
    for passage in passages_of(observation):
        if contains(passage, link["entity"]):
            for answer in link["answers"]:
                if contains(passage, answer):
                    return answer
    return None


def _description(entity: str, observations: Sequence[str]) -> str | None:
    """The noun after "is a/an" in an earlier passage about ``entity`` (e.g. "mountaineer")."""
    for observation in observations:
        for passage in passages_of(observation):
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
        result = steps[-1][1].removeprefix(OBS).strip()
        return f"Thought: The calculator says {result}.\nFinal Answer: {result}"
    if task.get("needs_search", True) and not steps:
        return f"Thought: I need to look this up.\nAction: search\nAction Input: {question}"
    return f"Thought: I can answer this now.\nFinal Answer: {answers[0]}"
