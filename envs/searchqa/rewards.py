"""SearchQA's reward terms beyond the kernel's (exact match, F1, call cost, invalid penalty): whether a
search retrieved a gold answer, and the follow-up paper's format-aware reward. ``DEFAULT_WEIGHTS`` says
which are on by default (only exact match: Search-R1's reward)."""

from __future__ import annotations

from typing import Sequence

from agentgym import shaper
from agentgym.parsing import all_tag_contents, tag_format_errors
from agentgym.rewards import StepEvent, exact_match, normalize_answer
from agentgym.envs.searchqa.scoring import search_r1_cut

__all__ = ["useful_search", "search_r1_format_valid", "SearchR1FormatReward", "DEFAULT_WEIGHTS"]


def _gold_in(text: str, golds: Sequence[str]) -> bool:
    t = normalize_answer(text)
    return any(normalize_answer(g) and f" {normalize_answer(g)} " in f" {t} " for g in golds)


@shaper("useful_search")
def useful_search(event: StepEvent) -> float:
    """1 when this step's search retrieved a passage containing a gold answer."""
    if event.action_type != "search":
        return 0.0
    return float(_gold_in(event.info.get("retrieved_text", ""), event.gold))


def search_r1_format_valid(actions: Sequence[str]) -> bool:
    """Every turn reasons in <think>…</think> first and then takes exactly one action tag; the last
    turn answers; tags are balanced. Approximates Search-R1's `is_valid_sequence` check on the
    response (their state machine think → search|answer, information in between)."""
    if not actions:
        return False
    for k, a in enumerate(actions):
        if tag_format_errors(a, ("think", "search", "answer", "information")):
            return False
        if "<information>" in a:  # the model must not write observations itself
            return False
        head = a.lstrip()
        if not head.startswith("<think>"):
            return False
        n_search, n_answer = len(all_tag_contents(a, "search")), len(all_tag_contents(a, "answer"))
        last = k == len(actions) - 1
        if last and not (n_answer == 1 and n_search == 0):
            return False
        if not last and not (n_search == 1 and n_answer == 0):
            return False
    return True


class SearchR1FormatReward:
    """The follow-up paper's format-aware reward (arXiv 2505.15117), terminal: correct answer 1.0
    (``correct_bad_format`` 0.8 if the format is invalid); wrong answer with valid format 0.2, plus
    ``retrieval_bonus`` if a gold answer appeared inside retrieved information; wrong and invalid 0.1.
    ``retrieval_bonus`` default 0.1 is our choice (the reference does not give its value)."""

    name = "search_r1_format"

    def __init__(self, correct_bad_format: float = 0.8, wrong_good_format: float = 0.2,
                 wrong_bad_format: float = 0.1, retrieval_bonus: float = 0.1):
        self.values = (correct_bad_format, wrong_good_format, wrong_bad_format, retrieval_bonus)

    def __call__(self, event: StepEvent) -> float:
        if not event.done:
            return 0.0
        correct_bad, wrong_good, wrong_bad, bonus = self.values
        # judged on the responses as Search-R1 keeps them (cut after the first </search>, else </answer>)
        actions = [search_r1_cut(r.action) for r in event.history] + [search_r1_cut(event.action)]
        valid = search_r1_format_valid(actions)
        if exact_match(event.final_answer, event.gold):
            return 1.0 if valid else correct_bad
        if not valid:
            return wrong_bad
        retrieved = " ".join(r.info.get("retrieved_text", "") for r in event.history) + event.info.get("retrieved_text", "")
        return wrong_good + (bonus if _gold_in(retrieved, event.gold) else 0.0)


#: Default weights. ``exact_match`` 1 alone reproduces Search-R1's reward; the rest are opt-in:
#: e.g. ``reward={"f1": 0.5}``, ``{"search_cost": 0.05, "useful_search": 0.1}``,
#: or ``{"exact_match": 0, "search_r1_format": 1}`` for the follow-up's format reward.
DEFAULT_WEIGHTS = {"exact_match": 1.0, "f1": 0.0, "search_r1_format": 0.0, "search_cost": 0.0,
                   "useful_search": 0.0, "invalid": 0.0}
