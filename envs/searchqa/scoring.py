"""Search-R1's cut rule, action parse and answer scorers (issue 26), used by ``SearchQAEnv``.

Facts from the Search-R1 repository (PeterGriffinJin/Search-R1, 2025-10-29 snapshot), collected in
``docs/search_r1_protocol.md``: ``search_r1/llm_agent/generation.py`` (``_postprocess_responses``,
``postprocess_predictions``) and ``verl/utils/reward_score/qa_em.py`` (``extract_solution``,
``em_check``, ``subem_check``).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Sequence

from agentgym.rewards import StepEvent, exact_match, normalize_answer

if TYPE_CHECKING:
    from agentgym.envs.searchqa.env import SearchQAEnv

__all__ = ["SCORERS", "search_r1_cut", "search_r1_action", "score_search_r1", "SearchR1Score"]

#: ``em``: exact match of the episode's answer (default); ``subem``: a gold answer is a substring of it;
#: ``qa_em`` / ``qa_subem``: Search-R1's ``compute_score_em`` / ``compute_score_subem`` (qa_em.py), which
#: score the whole prompt+response text (see :func:`score_search_r1`).
SCORERS = ("em", "subem", "qa_em", "qa_subem")
_ACTION_RE = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)
_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def search_r1_cut(text: str) -> str:
    """Search-R1's cut of one response (`_postprocess_responses`, generation.py): up to and including
    the first ``</search>`` if there is one anywhere, else the first ``</answer>``, else all of it."""
    for tag in ("</search>", "</answer>"):
        at = text.find(tag)
        if at >= 0:
            return text[:at + len(tag)]
    return text


def search_r1_action(text: str) -> tuple[str | None, str, tuple[int, int]]:
    """Search-R1's action parse (`postprocess_predictions`) of a *cut* response: the first match of
    ``<(search|answer)>(.*?)</\1>`` (dot matches newline), content stripped; ``(None, "", (-1, -1))``
    when nothing matches (an invalid action)."""
    m = _ACTION_RE.search(text)
    return (None, "", (-1, -1)) if m is None else (m.group(1), m.group(2).strip(), m.span())


def _subem(answer: str, golds: Sequence[str]) -> bool:
    # Search-R1 subem_check: the normalised gold is a substring of the normalised prediction
    pred = normalize_answer(answer)
    return any(normalize_answer(g) in pred for g in golds)


def score_search_r1(scorer: str, answer: str | None, sequence: str, golds: str | Sequence[str]) -> float:
    """One episode's score. ``em``/``subem`` judge ``answer`` (the answer the episode ended with).
    ``qa_em``/``qa_subem`` reproduce Search-R1's ``qa_em.py``: the last ``<answer>…</answer>`` of the
    whole ``sequence`` (prompt + responses + observations) is judged, and fewer than two matches
    score 0. Search-R1's own prompt holds two matches (``<answer> and </answer>`` and
    ``<answer> Beijing </answer>``), so a trajectory that never answers is judged on "Beijing".
    ``golds`` may be one string, as Search-R1's ``em_check`` accepts (not its characters)."""
    golds = [golds] if isinstance(golds, str) else list(golds)
    if scorer in ("em", "subem"):
        if answer is None:
            return 0.0
        return float(exact_match(answer, golds)) if scorer == "em" else float(_subem(answer, golds))
    if scorer not in ("qa_em", "qa_subem"):
        raise ValueError(f"scorer must be one of {SCORERS}, got {scorer!r}")
    matches = _ANSWER_RE.findall(sequence)
    if len(matches) <= 1:
        return 0.0
    last = matches[-1].strip()
    return float(exact_match(last, golds)) if scorer == "qa_em" else float(_subem(last, golds))


class SearchR1Score:
    """The terminal answer term ``exact_match`` of SearchQA, under the env's ``scorer``."""

    name = "exact_match"

    def __init__(self, env: SearchQAEnv):
        self.env = env

    def __call__(self, event: StepEvent) -> float:
        return self.env.score(event.final_answer, event.action) if event.done else 0.0
