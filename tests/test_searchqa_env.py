"""SearchQA-v0: Search-R1's rollout rules (golden tests), reward terms, the chat protocol, retrieval
quality on the bundled world, episodes end to end (in-process and over a real HTTP retrieval server)
and observation masking.

Rule citations ("Search-R1: ...") refer to ``docs/search_r1_protocol.md`` (Search-R1 repository,
PeterGriffinJin/Search-R1, 2025-10-29 snapshot; arXiv 2503.09516 and the follow-up arXiv 2505.15117).

Real components throughout: the bundled world, MiniLM + faiss (one index per process, shared through
``get_retriever``'s cache), bm25s, uvicorn on loopback, the SmolLM2 tokenizer. Retrieval that must be
observed (was a search executed?) goes through :class:`CountingRetriever`, a real retriever that
counts the calls it forwards.
"""

from __future__ import annotations

import json
import re
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentgym.app.checking import check_invalid_step, run_check_env
from agentgym.envs.services.retrieval import Hit, create_app, get_retriever
from agentgym.envs.searchqa.data import bundled_dataset
from agentgym.envs.searchqa.env import (SEARCH_R1_INVALID, SEARCH_R1_PROMPT, MaskRetrievedTokens, SearchQAEnv,
                                        make_search_r1_prompt)
from agentgym.envs.searchqa.rewards import DEFAULT_WEIGHTS, SearchR1FormatReward, search_r1_format_valid
from agentgym.envs.services.retrieval.base import format_passages
from agentgym.http_server import BackgroundServer
from agentgym.policies.models import load_tokenizer
from agentgym.policies.scripted import ScriptedPolicy
from agentgym.rewards import Reward, exact_match, normalize_answer, token_f1
from agentgym.rollout_config import RolloutConfig
from agentgym.rollout import RolloutEngine
from agentgym.trajectory import check_trajectory

ENV_ID = "agentgym/SearchQA-v0"
BUNDLED_KEY = ("bundled", 0, "small")  # the env's cache key for its default data (world_seed 0, "small")

# Search-R1 `make_prefix`, template "base": the exact text of docs/search_r1_protocol.md, typo
# "as your want" included, written out here independently of the env's constant.
REFERENCE_PREFIX = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you get "
    "new information. After reasoning, if you find you lack some knowledge, you can call a search engine by "
    "<search> query </search> and it will return the top searched results between <information> and "
    "</information>. You can search as many times as your want. If you find no further external knowledge "
    "needed, you can directly provide the answer inside <answer> and </answer>, without detailed illustrations. "
    "For example, <answer> Beijing </answer>. Question: "
)
# Search-R1 `execute_predictions`: the invalid-action observation (starts and ends with a newline).
REFERENCE_INVALID = (
    "\nMy previous action is invalid. If I want to search, I should put the query between <search> and "
    "</search>. If I want to give the final answer, I should put the answer between <answer> and </answer>. "
    "Let me try again.\n"
)
FORCED_OBS = "\n\n<information></information>\n\n"


class CountingRetriever:
    """A real retriever (passed as ``retriever=``) that records every ``search`` it forwards."""

    def __init__(self, inner):
        self.inner = inner
        self.calls: list[tuple[list[str], int]] = []
        self.last_hits: list[Hit] = []

    def search(self, queries, topk=3):
        self.calls.append((list(queries), topk))
        results = self.inner.search(queries, topk)
        self.last_hits = results[0]
        return results


# ----------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def bundled():
    return bundled_dataset(0, "small")


@pytest.fixture(scope="module")
def dense(bundled):
    """The env's own default retriever: get_retriever caches it per process under the env's key."""
    corpus, _, _ = bundled
    return get_retriever("dense", corpus, BUNDLED_KEY)


@pytest.fixture(scope="module")
def bm25(bundled):
    return get_retriever("bm25", bundled[0], BUNDLED_KEY)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


@pytest.fixture
def counting(dense):
    return CountingRetriever(dense)


@pytest.fixture(scope="module")
def contents_by_id(bundled):
    return {d["id"]: d["contents"] for d in bundled[0]}


@pytest.fixture(scope="module")
def city_task(bundled, dense):
    """A single-hop train question with one one-word gold answer (a city) whose gold passage the
    question itself retrieves in the top 3: the fixed point of the reward-term tests."""
    _, train, _ = bundled
    for q in train:
        if q["id"].split("@")[0] in ("person_born_in", "company_hq", "band_origin") and len(q["answers"]) == 1 \
                and len(normalize_answer(q["answers"][0]).split()) == 1:
            hits = dense.search([q["question"]], 3)[0]
            if any(h.doc_id in q["gold_doc_ids"] for h in hits):
                return q
    raise AssertionError("no single-hop city question retrieves its gold passage")


def step_all(env, actions):
    """Step ``actions``; returns the list of (obs, reward, terminated, truncated, info)."""
    out = []
    for a in actions:
        out.append(env.step(a))
    return out


def info_span(text: str) -> str:
    m = re.search(r"<information>(.*?)</information>", text, flags=re.DOTALL)
    assert m is not None, text
    return m.group(1)


# ============================================================================= the prompt
@pytest.mark.parametrize("question, shown", [
    ("Who founded Vewe Systems?", "Who founded Vewe Systems?"),
    ("  Who founded Vewe Systems  \n", "Who founded Vewe Systems?"),  # stripped, then "?" appended
    ("who founded vewe systems", "who founded vewe systems?"),
    ("Is it 3? ", "Is it 3?"),                                        # already ends with "?" after stripping
    ("What? Really", "What? Really?"),
])
def test_prompt_is_search_r1_make_prefix_byte_for_byte(question, shown):
    # Search-R1 make_prefix: question stripped, "?" appended when missing, one newline after it.
    prompt = make_search_r1_prompt(question)
    assert prompt == REFERENCE_PREFIX + shown + "\n"
    assert prompt.endswith("?\n") and not prompt.endswith("\n\n")
    assert "as your want" in prompt
    assert SEARCH_R1_PROMPT.format(question=shown) == prompt


def test_reset_observation_is_one_user_message_holding_the_prompt(bundled):
    # Search-R1: the prompt is one user message (the chat template is the formatter's business).
    env = SearchQAEnv()
    _, train, _ = bundled
    obs, info = env.reset(seed=0, options={"task_index": 3})
    assert obs == [{"role": "user", "content": REFERENCE_PREFIX + train[3]["question"].strip().rstrip("?") + "?\n"}]
    assert env.observation_style == "continuation"
    # Search-R1 generates on and cuts after the first </search>, else the first </answer>: only </search>
    # can stop generation without changing the text; the rest is cut by the rollout (cut_after) and step()
    assert env.stop_strings == ("</search>",) and env.cut_after == ("</search>", "</answer>")
    # POMDP: gold answers and gold passages are privileged, never in the observation.
    assert info["privileged"]["task"]["answers"] == train[3]["answers"]
    assert "gold_doc_ids" not in json.dumps(obs)


# ============================================================================= action parsing
@pytest.mark.parametrize("action, kind, value", [
    # Search-R1 postprocess_predictions: the FIRST complete <(search|answer)>(.*?)</\1> decides.
    ("<answer>a</answer><search>q</search>", "answer", "a"),
    ("<search>q</search><answer>a</answer>", "search", "q"),
    ("<think>x</think><search>unclosed <answer>x</answer>", "answer", "x"),   # unclosed search is no match
    ("<answer>unclosed <search>q</search>", "search", "q"),
    ("<think>hmm</think>\n<search>  padded query \n</search>", "search", "padded query"),  # content stripped
    ("<search>two\nlines</search>", "search", "two\nlines"),                  # DOTALL
    ("<search>q<answer>a</answer></search>", "search", "q<answer>a</answer>"),
    # Search-R1 postprocess_predictions: the first match is the action, so the FIRST answer ends the episode
    # (its reward, qa_em, re-reads the whole sequence: scorer="qa_em", tests/test_search_r1_files.py)
    ("<answer>first</answer> then <answer> second </answer>", "answer", "first"),
    # the cut: a </search> anywhere keeps the text up to it, so an answer nested in a search is the query
    ("<search>q <answer>a</answer> r</search>", "search", "q <answer>a</answer> r"),
    # no match → invalid action
    ("no tags at all", "invalid", None),
    ("<search>q</answer>", "invalid", None),
    ("<SEARCH>q</SEARCH>", "invalid", None),                                   # case-sensitive, as the regex
    ("<search>q", "invalid", None),
    ("", "invalid", None),
])
def test_first_complete_tag_decides(counting, action, kind, value):
    env = SearchQAEnv(retriever=counting)
    env.reset(seed=0, options={"task_index": 0})
    obs, reward, terminated, truncated, info = env.step(action)
    assert info["action_type"] == kind
    if kind == "answer":
        assert terminated and not truncated and obs == [] and info["answer"] == value
        assert counting.calls == []
    elif kind == "search":
        assert not (terminated or truncated)
        assert info["query"] == value and info["search_executed"]
        assert counting.calls == [([value], 3)]
    else:
        assert not (terminated or truncated) and counting.calls == []
        assert obs == [{"role": "user", "content": REFERENCE_INVALID}]


_TAGS = ("search", "answer", "think", "information")
_NOISE = st.one_of(st.sampled_from([" ", "\n", "q", "x y", "</", "<", ">", "<search", "answer>", "\u00e9"]),
                   st.text(max_size=4))
_SEGMENT = st.one_of(
    st.builds(lambda t, c: f"<{t}>{c}</{t}>", st.sampled_from(_TAGS), _NOISE),        # a complete tag
    st.builds(lambda t, c: f"<{t}>{c}", st.sampled_from(_TAGS), _NOISE),              # an unclosed one
    st.builds(lambda t: f"</{t}>", st.sampled_from(_TAGS)),                            # a stray closing
    _NOISE,
)
ACTIONS = st.lists(_SEGMENT, max_size=6).map("".join)


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ACTIONS)
def test_action_rule_matches_the_reference_regex(bm25, action):
    # Search-R1: the response is cut after the first </search> if any, else after the first </answer>
    # (_postprocess_responses); action = first match of <(search|answer)>(.*?)</\1> (DOTALL) in the cut
    # text, content stripped; an answer action's content is the episode's answer.
    env = SearchQAEnv(retriever=bm25)
    env.reset(seed=0, options={"task_index": 0})
    obs, reward, terminated, truncated, info = env.step(action)
    cut = (action.split("</search>")[0] + "</search>" if "</search>" in action
           else action.split("</answer>")[0] + "</answer>" if "</answer>" in action else action)
    m = re.search(r"<(search|answer)>(.*?)</\1>", cut, flags=re.DOTALL)
    if m is None:
        assert info["action_type"] == "invalid" and obs[0]["content"] == REFERENCE_INVALID
    elif m.group(1) == "search":
        assert info["action_type"] == "search" and info["query"] == m.group(2).strip() and not terminated
        assert obs[0]["content"].startswith("\n\n<information>") and obs[0]["content"].endswith("</information>\n\n")
    else:
        assert info["action_type"] == "answer" and terminated
        assert info["answer"] == m.group(2).strip()


def test_invalid_action_message_and_penalty():
    # Search-R1: the exact invalid-action text; our invalid term fires (raw -1) but weighs 0 by default.
    assert SEARCH_R1_INVALID == REFERENCE_INVALID
    assert SEARCH_R1_INVALID.startswith("\n") and SEARCH_R1_INVALID.endswith("Let me try again.\n")
    env = SearchQAEnv()
    env.reset(seed=0, options={"task_index": 0})
    obs, reward, terminated, truncated, info = env.step("I think the answer is 42.")
    assert obs[0]["content"] == REFERENCE_INVALID and obs[0]["role"] == "user"
    assert info["raw_reward_terms"]["invalid"] == -1.0 and info["reward_terms"]["invalid"] == 0.0
    assert reward == 0.0 and check_invalid_step(obs, info) is None
    weighted = SearchQAEnv(reward={"invalid": 0.5})
    weighted.reset(seed=0, options={"task_index": 0})
    assert weighted.step("still no tags")[1] == pytest.approx(-0.5)


# ============================================================================= observations
def test_format_passages_golden():
    # Search-R1 _passages2string: "Doc {i}(Title: {title}) {text}\n", i from 1; title = the first line
    # of contents verbatim (quotes and spaces kept), text = the remaining lines joined by "\n".
    hits = [Hit("7", '"Alpha Beta"\nFirst line.\nSecond line.', 0.9),
            Hit("8", "Untitled passage only", 0.5),
            Hit("9", ' "Spaced" \nText here.', 0.1)]
    assert format_passages(hits) == ('Doc 1(Title: "Alpha Beta") First line.\nSecond line.\n'
                                     "Doc 2(Title: Untitled passage only) \n"
                                     'Doc 3(Title:  "Spaced" ) Text here.\n')
    assert format_passages([]) == ""


def test_search_observation_format_and_default_topk(counting, contents_by_id, bundled):
    # Search-R1: "\n\n<information>" + passages.strip() + "</information>\n\n", top-k 3 by default.
    env = SearchQAEnv(retriever=counting)
    env.reset(seed=0, options={"task_index": 0})
    query = bundled[1][0]["question"]
    obs, reward, terminated, truncated, info = env.step(f"<think>look it up</think><search>{query}</search>")
    assert counting.calls == [([query], 3)]
    ids = [h.doc_id for h in counting.last_hits]
    assert info["retrieved_ids"] == ids and len(ids) == 3
    passages = ""
    for i, doc_id in enumerate(ids, start=1):
        lines = contents_by_id[doc_id].split("\n")  # built from the corpus itself, not from the hits
        assert lines[0].startswith('"') and lines[0].endswith('"')
        passages += f"Doc {i}(Title: {lines[0]}) " + "\n".join(lines[1:]) + "\n"
    expected = "\n\n<information>" + passages.strip() + "</information>\n\n"
    assert obs == [{"role": "user", "content": expected}]
    assert re.findall(r"Doc (\d)\(Title: \"", expected) == ["1", "2", "3"]
    assert info["retrieved_text"] == passages


def test_topk_is_configurable(dense):
    counting = CountingRetriever(dense)
    env = SearchQAEnv(retriever=counting, topk=5)
    env.reset(seed=0, options={"task_index": 0})
    obs, *_ = env.step("<search>river</search>")
    assert counting.calls == [(["river"], 5)]
    assert re.findall(r"Doc (\d)\(Title: ", obs[0]["content"]) == ["1", "2", "3", "4", "5"]


def test_max_turns_then_forced_answer_turn_does_not_search(counting):
    # Search-R1: max_turns (4) turns, then one more generation in which a search is not executed;
    # the episode then ends (truncated: no answer was given).
    env = SearchQAEnv(retriever=counting)
    assert env.max_turns == 5
    env.reset(seed=0, options={"task_index": 0})
    for k in range(4):
        obs, reward, terminated, truncated, info = env.step(f"<think>t</think><search>query {k}</search>")
        assert info["search_executed"] and not (terminated or truncated)
        assert obs[0]["content"].startswith("\n\n<information>Doc 1(Title: ")
    assert len(counting.calls) == 4
    obs, reward, terminated, truncated, info = env.step("<think>t</think><search>one more</search>")
    assert info["action_type"] == "search" and info["search_executed"] is False
    assert len(counting.calls) == 4, "the forced-answer turn must not call the retriever"
    assert obs == [{"role": "user", "content": FORCED_OBS}] and info["retrieved_text"] == ""
    assert truncated and not terminated
    summary = info["episode_summary"]
    assert summary["turns"] == 5 and summary["truncated"] and not summary["success"]
    with pytest.raises(RuntimeError):
        env.step("<answer>too late</answer>")


def test_forced_answer_turn_accepts_the_answer(counting, bundled):
    task = bundled[1][0]
    env = SearchQAEnv(retriever=counting)
    env.reset(seed=0, options={"task_index": 0})
    step_all(env, [f"<search>{task['question']}</search>"] * 4)
    obs, reward, terminated, truncated, info = env.step(f"<answer>{task['answers'][0]}</answer>")
    assert terminated and not truncated and reward == 1.0 and info["episode_summary"]["success"]


def test_without_forced_answer_the_episode_ends_after_max_turns(counting):
    env = SearchQAEnv(retriever=counting, max_turns=2, forced_answer=False)
    env.reset(seed=0, options={"task_index": 0})
    results = step_all(env, ["<search>a</search>", "<search>b</search>"])
    assert [r[3] for r in results] == [False, True] and all(r[4]["search_executed"] for r in results)
    assert len(counting.calls) == 2


def test_invalid_actions_use_turns_too(counting):
    env = SearchQAEnv(retriever=counting)
    env.reset(seed=0, options={"task_index": 0})
    results = step_all(env, ["nothing"] * 5)
    assert [r[3] for r in results] == [False] * 4 + [True]
    assert results[-1][4]["episode_summary"]["invalid_actions"] == 5 and counting.calls == []


# ============================================================================= exact match
@pytest.mark.parametrize("prediction, golds, em", [
    # Search-R1 normalize_answer: lowercase → drop string.punctuation → articles → collapse whitespace.
    ("PARIS", ["paris"], 1.0),
    ("The Eiffel Tower", ["eiffel tower"], 1.0),
    ("an apple", ["Apple"], 1.0),
    ("A  Tale of\tTwo\nCities ", ["tale of two cities"], 1.0),
    ("U.S.A.", ["usa"], 1.0),
    ("Eiffel-Tower", ["eiffel tower"], 0.0),      # the hyphen is removed, not turned into a space
    ("Eiffel-Tower", ["EiffelTower"], 1.0),
    ("the,cat", ["cat"], 0.0),                    # punctuation goes first: "thecat" keeps its article
    ("theater", ["ater"], 0.0),                   # articles only at word boundaries
    ("Anna", ["nna"], 0.0),
    ("Paris’", ["paris"], 0.0),                   # ’ is not in string.punctuation
    ("1,072 km", ["1072 km"], 1.0),
    ("Rome", ["Paris", "Rome", "Berlin"], 1.0),   # any of several golds
    ("Madrid", ["Paris", "Rome"], 0.0),
    ("", [""], 1.0),
    (None, ["x"], 0.0),                           # no answer
])
def test_exact_match_goldens(prediction, golds, em):
    assert exact_match(prediction, golds) == em


def test_normalize_answer_goldens():
    assert normalize_answer("  The  Quick, brown FOX!  ") == "quick brown fox"
    assert normalize_answer("A.B.C.") == "abc"
    assert normalize_answer("an a the") == ""


def test_env_reward_is_exact_match_of_the_answer_that_ended_the_episode():
    # The default scorer "em": EM of the episode's answer (Search-R1's action: the first <answer> of the
    # cut response) against any gold answer. Search-R1's whole-sequence qa_em is scorer="qa_em".
    env = SearchQAEnv()
    task = {"question": "Which tower?", "answers": ["The Eiffel Tower", "Tour Eiffel"]}
    for action, em in [("<answer>  the EIFFEL tower!! </answer>", 1.0),
                       ("<answer>wrong</answer> on second thought <answer>tour eiffel</answer>", 0.0),
                       ("<answer>tour eiffel</answer> on second thought <answer>wrong</answer>", 1.0),
                       ("<answer>Eiffel</answer>", 0.0)]:
        env.reset(seed=0, options={"task": task})
        *_, terminated, _, info = env.step(action)
        assert terminated and info["reward_terms"]["exact_match"] == em
        assert info["episode_summary"]["success"] == bool(em)


# ============================================================================= reward terms
def test_default_reward_is_search_r1_exact_match_only(city_task):
    # Search-R1: the reward is EM alone, on the last step; other terms are reported with weight 0.
    env = SearchQAEnv()
    assert env.reward.weights == DEFAULT_WEIGHTS
    assert {k for k, w in DEFAULT_WEIGHTS.items() if w} == {"exact_match"} and DEFAULT_WEIGHTS["exact_match"] == 1.0
    env.reset(seed=0, options={"task": city_task})
    (_, r1, _, _, i1), (_, r2, t2, _, i2) = step_all(env, [
        f"<think>t</think><search>{city_task['question']}</search>",
        f"<think>t</think><answer>{city_task['answers'][0]}</answer>"])
    assert r1 == 0.0 and set(i1["reward_terms"].values()) == {0.0}
    assert i1["raw_reward_terms"]["search_cost"] == -1.0 and i1["raw_reward_terms"]["useful_search"] == 1.0
    assert t2 and r2 == 1.0 == i2["reward_terms"]["exact_match"]
    assert {k: v for k, v in i2["reward_terms"].items() if v} == {"exact_match": 1.0}
    assert i2["raw_reward_terms"]["f1"] == 1.0 and i2["raw_reward_terms"]["search_r1_format"] == 1.0
    # a wrong answer: reward == EM == 0 although F1 is partial
    env.reset(seed=0, options={"task": city_task})
    *_, info = env.step(f"<answer>{city_task['answers'][0]} city</answer>")
    assert info["reward_terms"]["exact_match"] == 0.0 == sum(info["reward_terms"].values())
    assert info["raw_reward_terms"]["f1"] == pytest.approx(2 / 3)


def test_opt_in_weights_change_the_reward_as_computed_by_hand(city_task):
    env = SearchQAEnv(reward={"f1": 0.5, "search_cost": 0.05, "useful_search": 0.1})
    env.reset(seed=0, options={"task": city_task})
    answer = city_task["answers"][0]
    (_, r1, _, _, i1), (_, r2, _, _, i2), (_, r3, t3, _, i3) = step_all(env, [
        f"<think>t</think><search>{city_task['question']}</search>",  # retrieves the gold passage
        "<think>t</think>no action here",                              # invalid (weight 0)
        f"<think>t</think><answer>{answer} city</answer>"])            # partial answer
    # step 1: search cost -1 × 0.05 plus useful search 1 × 0.1
    assert r1 == pytest.approx(-0.05 + 0.1)
    assert i1["reward_terms"] == pytest.approx({**{k: 0.0 for k in DEFAULT_WEIGHTS},
                                                "search_cost": -0.05, "useful_search": 0.1})
    assert r2 == 0.0 and i2["raw_reward_terms"]["invalid"] == -1.0
    # step 3: EM 0; F1 of "<answer> city" vs "<answer>": precision 1/2, recall 1 → 2/3, × 0.5
    f1 = 2 * (1 / 2) * 1 / (1 / 2 + 1)
    assert token_f1(f"{answer} city", city_task["answers"]) == pytest.approx(f1)
    assert t3 and r3 == pytest.approx(0.5 * f1)
    assert i3["episode_summary"]["return"] == pytest.approx(0.05 + 0.5 * f1)
    for info in (i1, i2, i3):  # weighted terms = raw × weight, and they sum to the reward
        assert info["reward_terms"] == pytest.approx({k: v * env.reward.weights[k]
                                                      for k, v in info["raw_reward_terms"].items()})


def test_useless_search_costs_without_bonus(city_task, bm25):
    env = SearchQAEnv(retriever=bm25, reward={"search_cost": 0.05, "useful_search": 0.1})
    env.reset(seed=0, options={"task": city_task})
    *_, info = env.step("<search></search>")  # an empty query is searched; BM25 finds no terms in it
    assert info["raw_reward_terms"]["useful_search"] == 0.0 and info["reward_terms"]["search_cost"] == -0.05
    assert info["retrieved_text"] == "" and info["retrieved_ids"] == []


FORMAT_CASES = {
    # Follow-up paper (arXiv 2505.15117): correct 1.0 (0.8 bad format); wrong 0.2 (+ retrieval bonus
    # when a gold answer appeared inside <information>) with good format, 0.1 with bad format.
    "correct, valid": (["<think>t</think><search>{q}</search>", "<think>t</think><answer>{a}</answer>"], 1.0),
    "correct, valid, no search": (["<think>t</think><answer>{a}</answer>"], 1.0),
    "correct, no think": (["<search>{q}</search>", "<answer>{a}</answer>"], 0.8),
    "correct, an invalid turn": (["<think>t</think>no action", "<think>t</think><answer>{a}</answer>"], 0.8),
    "wrong, valid, gold retrieved": (["<think>t</think><search>{q}</search>",
                                      "<think>t</think><answer>wrong</answer>"], 0.2 + 0.1),
    "wrong, valid, nothing retrieved": (["<think>t</think><answer>wrong</answer>"], 0.2),
    "wrong, invalid": (["<answer>wrong</answer>"], 0.1),
    # (written before the search: text after </search> is cut away, as in Search-R1, and never judged)
    "wrong, wrote information": (["<think>t</think><information>x</information><search>{q}</search>",
                                  "<think>t</think><answer>wrong</answer>"], 0.1),
    "never answered": (["<think>t</think><search>{q}</search>"] * 5, 0.1),
}


@pytest.mark.parametrize("script, expected", list(FORMAT_CASES.values()), ids=list(FORMAT_CASES))
def test_search_r1_format_reward(city_task, script, expected):
    env = SearchQAEnv(reward={"exact_match": 0.0, "search_r1_format": 1.0})
    env.reset(seed=0, options={"task": city_task})
    actions = [s.format(q=city_task["question"], a=city_task["answers"][0]) for s in script]
    results = step_all(env, actions)
    assert results[-1][2] or results[-1][3]
    assert [r[1] for r in results[:-1]] == [0.0] * (len(results) - 1)  # terminal term only
    assert results[-1][1] == pytest.approx(expected)


def test_search_r1_format_reward_values_are_configurable(city_task):
    env = SearchQAEnv(reward=Reward([SearchR1FormatReward(correct_bad_format=0.7, retrieval_bonus=0.25)]))
    env.reset(seed=0, options={"task": city_task})
    results = step_all(env, [f"<think>t</think><search>{city_task['question']}</search>",
                             "<think>t</think><answer>wrong</answer>"])
    assert results[-1][1] == pytest.approx(0.45)
    env.reset(seed=0, options={"task": city_task})
    assert env.step(f"<answer>{city_task['answers'][0]}</answer>")[1] == pytest.approx(0.7)


@pytest.mark.parametrize("actions, valid", [
    (["<think>a</think><search>q</search>", "<think>b</think><answer>x</answer>"], True),
    (["  <think>a</think><answer>x</answer>"], True),
    (["<think>a</think><answer>x</answer>"] * 2, False),                  # answered before the last turn
    (["<think>a</think><search>q</search><search>r</search>", "<think>b</think><answer>x</answer>"], False),
    (["<think>a</think><search>q</search><answer>x</answer>"], False),
    (["<think>a<think>b</think></think><answer>x</answer>"], False),        # nested
    (["<think>a</think><answer>x"], False),                                 # unclosed
    (["<answer>x</answer><think>a</think>"], False),                        # think not first
    ([], False),
])
def test_search_r1_format_valid_goldens(actions, valid):
    assert search_r1_format_valid(actions) is valid


# ============================================================================= chat protocol
def test_chat_protocol_basics():
    env = SearchQAEnv(protocol="chat")
    assert env.observation_style == "chat" and "</tool_call>" in env.stop_strings
    specs = env.tool_specs()
    assert specs and specs[0]["type"] == "function" and specs[0]["function"]["name"] == "search"
    assert specs[0]["function"]["parameters"]["required"] == ["query"]
    assert SearchQAEnv().tool_specs() == []  # the tag protocol has no JSON tools
    obs, _ = env.reset(seed=0, options={"task_index": 4})
    assert [m["role"] for m in obs] == ["system", "user"] and obs[1]["content"] == env.questions[4]["question"]
    # the example call the system prompt shows must itself be a valid call
    example = re.search(r"<tool_call>(.*?)</tool_call>", obs[0]["content"]).group(1)
    assert json.loads(example) == {"name": "search", "arguments": {"query": "..."}}


def test_chat_search_returns_a_tool_message_with_passages(counting, bundled):
    env = SearchQAEnv(protocol="chat", retriever=counting)
    env.reset(seed=0, options={"task_index": 0})
    query = bundled[1][0]["question"]
    call = json.dumps({"name": "search", "arguments": {"query": query}})
    obs, reward, terminated, truncated, info = env.step(f"Let me check.\n<tool_call>\n{call}\n</tool_call>")
    assert info["action_type"] == "search" and info["search_executed"] and info["query"] == query
    assert counting.calls == [([query], 3)]
    assert obs == [{"role": "tool", "name": "search", "content": format_passages(counting.last_hits).strip()}]
    assert obs[0]["content"].startswith('Doc 1(Title: "') and not (terminated or truncated)
    # "arguments" given as a JSON-encoded string is accepted too
    call = json.dumps({"name": "search", "arguments": json.dumps({"query": "river"})})
    assert env.step(f"<tool_call>{call}</tool_call>")[4]["action_type"] == "search"


@pytest.mark.parametrize("action, says", [
    ('<tool_call>{"name": "lookup", "arguments": {"query": "x"}}</tool_call>', "unknown tool 'lookup'"),
    ('<tool_call>{"name": "search", "arguments": {"q": "x"}}</tool_call>', "'query' is a required property"),
    ('<tool_call>{"name": "search", "arguments": {"query": ""}}</tool_call>', "invalid arguments for search"),
    ('<tool_call>{"name": "search", "arguments": {"query": "x"</tool_call>', "invalid JSON"),
    ('<tool_call>{"name": "search", "arguments": {"query": "x"}}', "never closed"),
    ("<tool_call>[1, 2]</tool_call>", "must be a JSON object"),
    ("I will just think about it.", "no <tool_call> or <answer> found"),
])
def test_chat_invalid_calls_become_observations_with_a_penalty(counting, action, says):
    env = SearchQAEnv(protocol="chat", retriever=counting)
    env.reset(seed=0, options={"task_index": 0})
    obs, reward, terminated, truncated, info = env.step(action)
    assert info["action_type"] == "invalid" and not (terminated or truncated)
    assert says in obs[0]["content"] and info["raw_reward_terms"]["invalid"] == -1.0
    assert check_invalid_step(obs, info) is None and counting.calls == []


def test_chat_answer_and_forced_turn(counting, bundled):
    task = bundled[1][0]
    env = SearchQAEnv(protocol="chat", retriever=counting)
    env.reset(seed=0, options={"task_index": 0})
    call = '<tool_call>{"name": "search", "arguments": {"query": "q"}}</tool_call>'
    step_all(env, [call] * 4)
    assert len(counting.calls) == 4
    # on the forced turn an unknown tool is still invalid, and a valid search is not executed
    assert env.step('<tool_call>{"name": "lookup", "arguments": {}}</tool_call>')[4]["action_type"] == "invalid"
    env.reset(seed=0, options={"task_index": 0})
    step_all(env, [call] * 4)
    obs, reward, terminated, truncated, info = env.step(call)
    assert info["action_type"] == "search" and info["search_executed"] is False and truncated
    assert len(counting.calls) == 8
    env.reset(seed=0, options={"task_index": 0})
    *_, terminated, _, info = env.step(f"<answer>{task['answers'][0]}</answer>")
    assert terminated and info["reward_terms"]["exact_match"] == 1.0


# ============================================================================= env checks
@pytest.mark.parametrize("protocol", ["search_r1", "chat"])
def test_check_env_passes(dense, protocol):
    assert run_check_env(ENV_ID, {"protocol": protocol}) is None


def test_retriever_is_built_once_per_process(dense):
    assert SearchQAEnv().retriever is dense and SearchQAEnv(protocol="chat").retriever is dense


# ============================================================================= retrieval quality
def _recall(retriever, questions, ks=(1, 3, 5)):
    results = retriever.search([q["question"] for q in questions], max(ks))
    return {k: sum(any(h.doc_id in q["gold_doc_ids"] for h in hits[:k]) for q, hits in zip(questions, results))
            / len(questions) for k in ks}


def test_dense_and_bm25_recall_on_the_bundled_world(bundled, dense, bm25, record_property):
    """Querying with the question text, a gold passage is in the top 3 for >= 90% of the single-hop
    questions (train + test) with the default dense retriever (measured at seed 0, "small":
    dense @1 0.948, @3 0.998, @5 1.000; BM25 @1 0.825, @3 0.965, @5 0.983; 520 questions)."""
    _, train, test = bundled
    single = [q for q in train + test if q["type"] == "single_hop"]
    assert len(single) >= 300 and all(q["gold_doc_ids"] for q in single)
    recall = {"dense": _recall(dense, single), "bm25": _recall(bm25, single)}
    for name, r in recall.items():
        line = ", ".join(f"@{k} {v:.3f}" for k, v in r.items())
        print(f"{name} recall over {len(single)} single-hop questions: {line}")
        for k, v in r.items():
            record_property(f"{name}_recall@{k}", round(v, 4))
    assert recall["dense"][3] >= 0.9
    assert recall["bm25"][3] >= 0.9
    for r in recall.values():
        assert r[1] <= r[3] <= r[5]


# ============================================================================= episodes end to end
def test_oracle_rollouts_succeed_with_faithful_continuation_trajectories(tokenizer, bundled):
    _, train, test = bundled
    engine = RolloutEngine(ScriptedPolicy(tokenizer, SearchQAEnv.oracle), RolloutConfig(debug_checks=True))
    try:
        for split, questions, n in (("train", train, 48), ("test", test, 24)):
            assert {q["type"] for q in questions[:n]} == {"single_hop", "multi_hop", "no_search"}
            batch = engine.collect(ENV_ID, task_indices=range(n), env_kwargs={"split": split})
            assert batch.metrics["success_rate"] == 1.0 and batch.metrics["reward_mean"] == 1.0
            assert engine.formatter_for(SearchQAEnv(split=split)).style == "continuation"
            for traj, q in zip(batch.trajectories, questions[:n]):
                assert check_trajectory(traj, tokenizer) == []
                assert traj.terminated and traj.num_turns == (2 if q["needs_search"] else 1)
                assert traj.step_rewards[-1] == 1.0
                # the prompt is the Search-R1 prompt (chat template applied); the observation after a
                # search is appended raw, decodes to exactly the env's text and is masked out of the loss
                assert make_search_r1_prompt(q["question"]) in tokenizer.decode(traj.token_ids[:traj.prompt_length])
                if q["needs_search"]:
                    (s0, e0), (s1, _) = traj.turn_spans
                    obs_text = tokenizer.decode(traj.token_ids[e0:s1])
                    assert obs_text.startswith("\n\n<information>Doc 1(Title: ") and obs_text.endswith(
                        "</information>\n\n")
                    assert obs_text == traj.messages[2]["content"] and set(traj.loss_mask[e0:s1]) == {0}
                    assert set(traj.loss_mask[s0:e0]) == {1}
    finally:
        engine.close()


def test_chat_oracle_rollouts_succeed(tokenizer):
    engine = RolloutEngine(ScriptedPolicy(tokenizer, SearchQAEnv.chat_oracle), RolloutConfig(debug_checks=True))
    try:
        batch = engine.collect(ENV_ID, task_indices=range(16), env_kwargs={"protocol": "chat"})
    finally:
        engine.close()
    assert batch.metrics["success_rate"] == 1.0
    searched = [t for t in batch.trajectories if t.num_turns == 2]
    assert searched and all(t.messages[3]["role"] == "tool" for t in searched)


@pytest.fixture(scope="module")
def retrieval_server(dense):
    server = BackgroundServer(create_app(dense), host="127.0.0.1", port=0, start_timeout_s=60)
    url = server.start()
    try:
        yield url, server
    finally:
        server.stop()


def test_remote_retrieval_gives_identical_observations(retrieval_server, bundled):
    url, server = retrieval_server
    _, train, _ = bundled
    local, remote = SearchQAEnv(), SearchQAEnv(retriever=url)
    assert remote.retriever.kind == "remote"
    for index in (0, 1, 4):
        q = train[index]
        actions = [f"<think>t</think><search>{q['question']}</search>", "no tags",
                   "<search>the river that flows through a city</search>", "<search>   </search>",
                   f"<answer>{q['answers'][0]}</answer>"]
        local.reset(seed=0, options={"task_index": index})
        remote.reset(seed=0, options={"task_index": index})
        for action in actions:
            lo, lr, lt, ltr, li = local.step(action)
            ro, rr, rt, rtr, ri = remote.step(action)
            assert ro == lo and (rr, rt, rtr) == (lr, lt, ltr)
            assert ri.get("retrieved_ids") == li.get("retrieved_ids")
        assert ri["episode_summary"]["success"]
    # the remote env really went over HTTP: three searches per episode (the blank query is posted as "",
    # as Search-R1's client does, and searched). The worker counts a batch just after answering it, so
    # allow it a moment.
    deadline = time.monotonic() + 10
    while server.app.state.worker.requests < 9 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.app.state.worker.requests == 9


# ============================================================================= observation masking
def _search_episode(env, queries, task_index=0, seed=None):
    obs, _ = env.reset(seed=seed, options={"task_index": task_index})
    return obs, [env.step(f"<search>{q}</search>")[0] for q in queries]


QUERIES = ["Who founded Vewe Systems?", "How long is the Siltoshi River?", "a jazz band"]


def test_mask_half_of_the_retrieved_words(dense):
    base_prompt, base = _search_episode(SearchQAEnv(), QUERIES)
    prompt, masked = _search_episode(MaskRetrievedTokens(SearchQAEnv(), fraction=0.5, seed=0), QUERIES)
    assert prompt == base_prompt  # the task prompt (which mentions <information>) is untouched
    n_words = n_masked = 0
    for b, m in zip(base, masked):
        b_text, m_text = b[0]["content"], m[0]["content"]
        assert m_text.startswith("\n\n<information>") and m_text.endswith("</information>\n\n")
        b_words, m_words = info_span(b_text).split(), info_span(m_text).split()
        assert len(m_words) == len(b_words)
        assert all(mw in ("[MASK]", bw) for bw, mw in zip(b_words, m_words))
        n_words += len(b_words)
        n_masked += sum(mw == "[MASK]" != bw for bw, mw in zip(b_words, m_words))
    assert n_words > 200 and 0.4 <= n_masked / n_words <= 0.6
    # seeded: the same seed masks the same words; another seed masks others
    assert _search_episode(MaskRetrievedTokens(SearchQAEnv(), 0.5, seed=0), QUERIES)[1] == masked
    assert _search_episode(MaskRetrievedTokens(SearchQAEnv(), 0.5, seed=1), QUERIES)[1] != masked
    # reset(seed=...) reseeds: an episode replays whatever the wrapper did before
    wrapper = MaskRetrievedTokens(SearchQAEnv(), 0.5, seed=123)
    _search_episode(wrapper, QUERIES[:1])
    assert _search_episode(wrapper, QUERIES, seed=7)[1] == _search_episode(
        MaskRetrievedTokens(SearchQAEnv(), 0.5), QUERIES, seed=7)[1]


def test_mask_fraction_zero_and_one(dense):
    _, base = _search_episode(SearchQAEnv(), QUERIES)
    assert _search_episode(MaskRetrievedTokens(SearchQAEnv(), 0.0, seed=0), QUERIES)[1] == base
    _, full = _search_episode(MaskRetrievedTokens(SearchQAEnv(), 1.0, seed=0), QUERIES)
    for b, f in zip(base, full):
        span = info_span(f[0]["content"])
        assert set(span.split()) == {"[MASK]"} and len(span.split()) == len(info_span(b[0]["content"]).split())
        assert span.count("\n") == info_span(b[0]["content"]).count("\n")  # layout kept
    # non-retrieval observations pass through: the invalid-action message is not masked
    wrapper = MaskRetrievedTokens(SearchQAEnv(), 1.0, seed=0)
    wrapper.reset(seed=0, options={"task_index": 0})
    assert wrapper.step("no tags")[0][0]["content"] == REFERENCE_INVALID
    # chat protocol: the search tool message is masked
    chat = MaskRetrievedTokens(SearchQAEnv(protocol="chat"), 1.0, seed=0)
    chat.reset(seed=0, options={"task_index": 0})
    obs = chat.step('<tool_call>{"name": "search", "arguments": {"query": "river"}}</tool_call>')[0]
    assert set(obs[0]["content"].split()) == {"[MASK]"}
    with pytest.raises(ValueError):
        MaskRetrievedTokens(SearchQAEnv(), 1.5)


def test_masking_leaves_the_loss_mask_alone(tokenizer):
    # The loss mask always excludes env tokens; masking is about what the policy *sees*.
    def collect(make_env):
        engine = RolloutEngine(ScriptedPolicy(tokenizer, SearchQAEnv.oracle), RolloutConfig(debug_checks=True))
        try:
            return engine.collect(make_env, task_indices=range(8), seed=3).trajectories
        finally:
            engine.close()

    def policy_ids(t):
        return [i for i, keep in zip(t.token_ids, t.loss_mask) if keep]

    plain = collect(lambda: SearchQAEnv())
    masked = collect(lambda: MaskRetrievedTokens(SearchQAEnv(), fraction=0.5, seed=0))
    searched = [m for m in masked if m.num_turns == 2]
    assert searched and all("[MASK]" in m.messages[2]["content"] for m in searched)
    for p, m in zip(plain, masked):
        assert m.episode["success"] and p.episode["success"]
        assert m.actions == p.actions and m.prompt_length == p.prompt_length
        assert (m.token_ids != p.token_ids) == (m.num_turns == 2)  # only the observations differ
        assert policy_ids(m) == policy_ids(p) and m.num_policy_tokens == p.num_policy_tokens
        for (s, e) in m.turn_spans:
            assert set(m.loss_mask[s:e]) == {1}
        assert sum(m.loss_mask) == sum(e - s for s, e in m.turn_spans)
