"""Reading ReAct text: the parts of a step and of an observation that both the env and its oracle read."""

from __future__ import annotations

import json
import re
from typing import Mapping, Sequence

from agentgym.rewards import normalize_answer

#: the prefix of every observation the env sends
OBS = "Observation: "


def plain_input(text: str | None) -> str:
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


def tool_name(action: str) -> str:
    return action.strip().strip("`'\"[]").strip().lower()


def contains(text: str, phrase: str) -> bool:
    p = normalize_answer(phrase)
    return bool(p) and f" {p} " in f" {normalize_answer(text)} "


def passages_of(observation: str) -> list[str]:
    """The ``Doc i(Title: ...) text`` passages of a search observation."""
    return [p for p in re.split(r"(?=Doc \d+\(Title: )", observation) if p.startswith("Doc ")]


def steps_of(messages: Sequence[Mapping[str, str]]) -> list[tuple[str, str]]:
    """(assistant action, following observation text) pairs of a conversation."""
    out: list[tuple[str, str]] = []
    for m in messages:
        if m.get("role") == "assistant":
            out.append((m.get("content", ""), ""))
        elif out:
            out[-1] = (out[-1][0], out[-1][1] + m.get("content", ""))
    return out

