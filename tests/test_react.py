"""``agentgym/ReAct-v0`` (envs/react.py): the oracle solves every task with real retrieval (directly
and through the rollout engine with the real tokenizer), each reward term and penalty is produced by
a scripted episode, malformed steps and unknown tools are explained, lookup follows the ReAct
paper's semantics, and Gymnasium's ``check_env`` passes."""

from __future__ import annotations

import re
from typing import Any, Callable, Mapping

import gymnasium as gym
import pytest
from fixtures_llm import single_threaded_math  # noqa: F401  (autouse: one torch/faiss thread)
from gymnasium.utils.env_checker import check_env

import agentgym
from agentgym.app.checking import check_invalid_step
from agentgym.envs.react import DEFAULT_WEIGHTS, REACT_SYSTEM_PROMPT, ReActEnv
from agentgym.policies.models import load_tokenizer
from agentgym.policies.scripted import ScriptedPolicy
from agentgym.rewards import exact_match, normalize_answer
from agentgym.rollout_config import RolloutConfig
from agentgym.rollout import RolloutEngine

ENV_ID = "agentgym/ReAct-v0"
if ENV_ID not in gym.registry:  # until the built-in table lists it; harmless afterwards
    agentgym.register("ReAct-v0", entry_point="agentgym.envs.react:ReActEnv")

TERMS = set(DEFAULT_WEIGHTS)



@pytest.fixture(scope="module")
def test_env() -> ReActEnv:
    env = ReActEnv(split="test")
    yield env
    env.close()


def play(env: ReActEnv, actions: list[str] | Callable[[Mapping[str, Any]], str], *,
         task_index: int = 0, task: Mapping[str, Any] | None = None) -> list[tuple]:
    """Run one episode; ``actions`` is a list (one per step) or a policy ``context -> action``.
    Returns the (obs, reward, terminated, truncated, info) of every step."""
    options = {"task": dict(task)} if task is not None else {"task_index": task_index}
    _, info = env.reset(options=options)
    privileged = info["privileged"]["task"]
    out = []
    for k in range(env.max_turns):
        if callable(actions):
            action = actions({"turn": k, "messages": list(env.messages), "task": privileged})
        else:
            action = actions[k]
        out.append(env.step(action))
        if out[-1][2] or out[-1][3]:
            break
        if not callable(actions) and k == len(actions) - 1:
            break
    return out


def content(step: tuple) -> str:
    return " ".join(m["content"] for m in step[0])


def search(query: str, thought: str | None = None) -> str:
    return f"Thought: {thought or 'search ' + query}\nAction: search\nAction Input: {query}"


def lookup(keyword: str, thought: str) -> str:
    return f"Thought: {thought}\nAction: lookup\nAction Input: {keyword}"


# --------------------------------------------------------------------------- tasks and prompt
def test_tasks_are_mostly_multi_hop_and_hidden_state_stays_hidden(test_env):
    types = [q["type"] for q in test_env.questions]
    assert set(types) == {"multi_hop", "single_hop"}
    assert types.count("multi_hop") == 120 and types.count("single_hop") == 40   # 25 % single-hop
    obs, info = test_env.reset(options={"task_index": 0})
    task = info["privileged"]["task"]
    assert obs == [{"role": "system", "content": REACT_SYSTEM_PROMPT},
                   {"role": "user", "content": f"Question: {task['question']}"}]
    text = " ".join(m["content"] for m in obs)
    assert not any(a in text for a in task["answers"])
    assert [h["entity"] for h in task["hop_chain"]][0] in task["question"]  # the chain starts at the subject
    assert len(task["hop_chain"]) == task["hops"] == 2
    train = ReActEnv(split="train")
    assert not {q["id"] for q in train.questions} & {q["id"] for q in test_env.questions}
    with_no_search = ReActEnv(split="test", question_types=("multi_hop", "no_search"))
    assert {q["type"] for q in with_no_search.questions} == {"multi_hop", "no_search"}
    assert test_env.stop_strings == ("\nObservation:",) and test_env.observation_style == "chat"
    assert test_env.tool_specs() == []  # tools are described in the ReAct prompt, not as JSON tool specs


def test_one_dense_index_serves_searchqa_and_react(test_env):
    searchqa = agentgym.make("SearchQA-v0").unwrapped
    assert test_env.retriever is searchqa.retriever


# --------------------------------------------------------------------------- oracle
def test_oracle_solves_every_test_task_directly(test_env):
    failures, retried = [], []
    for i in range(test_env.num_tasks):
        steps = play(test_env, ReActEnv.oracle, task_index=i)
        obs, reward, terminated, truncated, info = steps[-1]
        summary = info["episode_summary"]
        if not (summary["success"] and terminated):
            failures.append((i, test_env.task["id"], [m["content"][:200] for m in test_env.messages[2:]]))
            continue
        # real tool use: one search per hop at least, never more than the efficiency budget
        assert summary["hops"] <= summary["searches"] == summary["tool_calls"] <= 3
        assert summary["invalid_actions"] == 0
        assert summary["return"] == pytest.approx(1.25)  # correct + efficient + every thought fresh
        if summary["searches"] > summary["hops"]:
            retried.append(test_env.task["id"])
    assert not failures, failures
    assert len(retried) <= 2, retried  # first queries almost always retrieve the evidence


def mentions(text: str, phrase: str) -> bool:
    return f" {normalize_answer(phrase)} " in f" {normalize_answer(text)} "


def test_first_queries_on_train_find_the_evidence_and_the_oracle_recovers_from_misses():
    """All train tasks in one batched search: the oracle's first query for every hop (entity +
    relation phrase) must retrieve a passage naming the entity and the hop's target. The few misses
    are reported here and must be solved by the oracle's follow-up queries."""
    env = ReActEnv(split="train")
    tasks = [env.get_task(i) for i in range(env.num_tasks)]
    where = [(i, link) for i, t in enumerate(tasks) for link in t["hop_chain"]]
    assert len(where) == sum(t["hops"] for t in tasks)
    hits = env.retriever.search([f"{link['entity']} {link['phrase']}" for _, link in where], topk=env.topk)
    missed = sorted({i for (i, link), found in zip(where, hits)
                     if not any(mentions(h.contents, link["entity"]) and any(mentions(h.contents, a) for a in link["answers"])
                                for h in found)})
    # seed 0 "small": 1 miss in 933 hops (a spouse named only in the second passage of a two-passage
    # biography, ranked 4th); the oracle then adds the person's description ("mountaineer") to the query
    assert len(missed) <= 2, [tasks[i]["id"] for i in missed]
    for i in missed:
        summary = play(env, ReActEnv.oracle, task_index=i)[-1][4]["episode_summary"]
        assert summary["success"] and summary["hops"] < summary["searches"] <= 3, tasks[i]["id"]
    env.close()


def test_oracle_solves_tasks_through_the_rollout_engine():
    engine = RolloutEngine(ScriptedPolicy(load_tokenizer(), ReActEnv.oracle), RolloutConfig(debug_checks=True))
    try:
        batch = engine.collect(ENV_ID, task_indices=list(range(24)), env_kwargs={"split": "test"})
    finally:
        engine.close()
    assert batch.metrics["success_rate"] == 1.0
    assert batch.metrics["invalid_actions_mean"] == 0.0
    for t in batch.trajectories:
        assert t.terminated and t.episode["success"] and 2 <= t.num_turns <= 4
        assert t.total_reward == pytest.approx(1.25)
        assert all(m["content"].startswith("Observation: Doc 1(Title: ") for m in t.messages[3::2])


def test_oracle_answers_no_search_questions_with_the_calculator():
    env = ReActEnv(split="test", question_types=("no_search",))
    arithmetic = [i for i, q in enumerate(env.questions) if re.match(r"What is \d+ (plus|minus|times) \d+\?$", q["question"])]
    assert arithmetic
    for i in range(env.num_tasks):
        steps = play(env, ReActEnv.oracle, task_index=i)
        assert steps[-1][4]["episode_summary"]["success"], env.messages
        if i in arithmetic:
            assert steps[0][4]["action_type"] == "tool_call" and steps[0][4]["tool"] == "calculator"


def test_oracle_fails_when_retrieval_cannot_show_the_evidence(test_env):
    """The oracle learns each hop's target from observations only: with the hop's entity misspelled in
    the privileged chain, its queries find nothing that names it, and it gives up wrongly."""
    task = test_env.get_task(0)
    task["hop_chain"] = [dict(h) for h in task["hop_chain"]]
    task["hop_chain"][0]["entity"] = "Qwzzx Vvrrk"
    steps = play(test_env, ReActEnv.oracle, task=task)
    summary = steps[-1][4]["episode_summary"]
    assert not summary["success"] and summary["searches"] == 2   # both queries tried, then "unknown"
    assert steps[-1][4]["answer"] == "unknown"


# --------------------------------------------------------------------------- reward terms
def zero_but(**nonzero: float) -> dict[str, float]:
    return {t: nonzero.get(t, 0.0) for t in TERMS}


def test_correct_efficient_answer_earns_correct_efficiency_and_thought_terms(test_env):
    steps = play(test_env, ReActEnv.oracle, task_index=1)
    for *_, info in steps[:-1]:
        assert info["reward_terms"] == zero_but() and info["action_type"] == "search"
    assert steps[-1][4]["reward_terms"] == zero_but(correct=1.0, tool_efficiency=0.2, thought_quality=0.05)


def test_wrong_answer_is_penalised_and_earns_no_efficiency_bonus(test_env):
    (step,) = play(test_env, ["Thought: I will guess.\nFinal Answer: Paris"])
    assert step[2] and step[4]["answer"] == "Paris"
    assert step[4]["reward_terms"] == zero_but(wrong_answer=-0.5, thought_quality=0.05)
    assert step[1] == pytest.approx(-0.45)


def test_no_answer_before_the_turn_limit_counts_as_wrong_and_overuse_is_penalised(test_env):
    env = ReActEnv(split="test", max_turns=7)
    queries = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta"]
    steps = play(env, [search(q) for q in queries])
    assert [s[3] for s in steps] == [False] * 6 + [True]
    assert steps[-1][4]["reward_terms"] == zero_but(wrong_answer=-0.5, tool_overuse=-0.1, thought_quality=0.05)
    assert steps[-1][4]["episode_summary"]["tool_calls"] == 7


def test_tool_call_thresholds(test_env):
    """≤ 3 calls: bonus; 4–5: neither term; ≥ 6: overuse penalty (also with a correct answer)."""
    task = test_env.get_task(1)
    answer = f"Thought: I know it now.\nFinal Answer: {task['answers'][0]}"
    for n, expected in [(3, zero_but(correct=1.0, tool_efficiency=0.2, thought_quality=0.05)),
                        (4, zero_but(correct=1.0, thought_quality=0.05)),
                        (5, zero_but(correct=1.0, thought_quality=0.05)),
                        (6, zero_but(correct=1.0, tool_overuse=-0.1, thought_quality=0.05))]:
        calls = [f"Thought: step {k}\nAction: calculator\nAction Input: {k} + 1" for k in range(n)]
        steps = play(test_env, calls + [answer], task_index=1)
        assert steps[-1][4]["reward_terms"] == pytest.approx(expected), n
        assert steps[-1][4]["episode_summary"]["tool_calls"] == n


def test_thought_quality_is_the_share_of_fresh_non_empty_thoughts(test_env):
    task = test_env.get_task(1)
    steps = play(test_env, [
        "Action: calculator\nAction Input: 1 + 1",                           # no thought
        "Thought: Let me compute.\nAction: calculator\nAction Input: 2 + 2",   # fresh
        "Thought:   let me COMPUTE \nAction: calculator\nAction Input: 3 + 3",  # a copy (normalised)
        f"Thought:\nFinal Answer: {task['answers'][0]}",                       # empty
    ], task_index=1)
    assert steps[-1][4]["reward_terms"]["thought_quality"] == pytest.approx(0.05 * 1 / 4)
    assert all(s[4]["reward_terms"]["thought_quality"] == 0 for s in steps[:-1])  # terminal only


def test_format_errors_get_a_hint_and_a_penalty(test_env):
    malformed = {
        "just some text": "expected 'Action:'",
        "Thought: hmm\nAction: search": "without 'Action Input:'",
        "Thought: hmm\nAction Input: foo": "'Action Input:' without 'Action:'",
        "Thought: hmm\nFinal Answer:": "'Final Answer:' is empty",
        "Thought: hmm\nAction:\nAction Input: x": "names no tool",
        "Thought: hmm\nAction: search\nAction Input:   ": "'search' needs a non-empty Action Input",
        "Thought: hmm\nAction: lookup\nAction Input: \"\"": "'lookup' needs a non-empty Action Input",
        "Thought: hmm\nAction: Finish\nAction Input:": "needs the answer",
        "Thought: hmm\nAction: google\nAction Input: weather": "unknown tool 'google'",
        "Thought: hmm\nAction: python\nAction Input: print(1)": "the tools are search, lookup and calculator",
    }
    for action, why in malformed.items():
        test_env.reset(options={"task_index": 0})
        obs, reward, terminated, truncated, info = test_env.step(action)
        assert info["action_type"] == "invalid" and not terminated, action
        text = obs[0]["content"]
        assert obs[0]["role"] == "user" and text.startswith("Observation: Invalid step") and why in text, text
        assert "Final Answer:" in text and "Action Input:" in text  # the hint shows how to write a step
        assert info["reward_terms"] == zero_but(format_error=-0.1) and reward == pytest.approx(-0.1)
        assert check_invalid_step(obs, info) is None
    summary = play(test_env, ["gibberish", "Thought: ok\nFinal Answer: x"])[-1][4]["episode_summary"]
    assert summary["invalid_actions"] == 1 and summary["tool_calls"] == 0


def test_reward_weights_are_configurable():
    env = agentgym.make("ReAct-v0", split="test", reward={"wrong_answer": 0.3, "format_error": 0.0})
    env.reset(options={"task_index": 0})
    *_, info = env.step("nonsense")
    assert info["reward_terms"]["format_error"] == 0.0 and info["raw_reward_terms"]["format_error"] == -1.0
    *_, info = env.step("Thought: guess\nFinal Answer: nobody")
    assert info["reward_terms"]["wrong_answer"] == pytest.approx(-0.3)
    tight = ReActEnv(split="test", few_tool_calls=0, many_tool_calls=0)
    steps = play(tight, ["Thought: first\nAction: calculator\nAction Input: 1+1",
                         f"Thought: second\nFinal Answer: {tight.get_task(0)['answers'][0]}"])
    assert steps[-1][4]["reward_terms"] == zero_but(correct=1.0, tool_overuse=-0.1, thought_quality=0.05)


# --------------------------------------------------------------------------- parsing leniency and tools
def test_accepted_step_forms(test_env):
    task = test_env.get_task(0)
    entity = task["hop_chain"][0]["entity"]
    test_env.reset(options={"task_index": 0})
    plain = test_env.step(search(entity))
    for variant in (f"Thought: t1\nAction: Search\nAction Input: \"{entity}\"",          # case, quotes
                    f'Thought: t2\nAction: search\nAction Input: {{"query": "{entity}"}}',  # JSON input
                    f"Thought: t3\nAction: Search[{entity}]",                          # the paper's compact form
                    f"Thought: t4\nAction: search\nAction Input: {entity}\nObservation: invented text"):
        obs, _, _, _, info = test_env.step(variant)
        assert info["action_type"] == "search" and info["query"] == entity, variant
        assert obs == plain[0] and info["retrieved_ids"] == plain[4]["retrieved_ids"]
    obs, reward, terminated, _, info = test_env.step(f"Thought: done\nAction: Finish[{task['answers'][0]}]")
    assert terminated and info["action_type"] == "answer" and info["reward_terms"]["correct"] == 1.0


def test_search_observation_and_retrieval_info(test_env):
    task = test_env.get_task(0)
    test_env.reset(options={"task_index": 0})
    obs, reward, terminated, truncated, info = test_env.step(search(task["hop_chain"][0]["entity"]))
    assert obs[0]["role"] == "user" and obs[0]["content"].startswith("Observation: Doc 1(Title: ")
    assert obs[0]["content"].count("(Title: ") == test_env.topk == len(info["retrieved_ids"]) == 3
    assert task["gold_doc_ids"][0] in info["retrieved_ids"]
    assert info["tool"] == "search" and info["tool_ok"] and info["query"] == task["hop_chain"][0]["entity"]
    assert info["retrieved_text"] == obs[0]["content"].removeprefix("Observation: ")


def test_calculator_tool(test_env):
    test_env.reset(options={"task_index": 0})
    obs, _, _, _, info = test_env.step("Thought: age\nAction: calculator\nAction Input: (2011 - 1987) * 2")
    assert obs == [{"role": "user", "content": "Observation: 48"}]
    assert info["action_type"] == "tool_call" and info["tool"] == "calculator" and info["tool_ok"]
    obs, reward, _, _, info = test_env.step("Thought: oops\nAction: calculator\nAction Input: 1 / 0")
    assert info["action_type"] == "tool_call" and not info["tool_ok"] and "division by zero" in obs[0]["content"]
    assert reward == 0.0  # a tool's own error is an observation, not a format error


# --------------------------------------------------------------------------- lookup
def sentences_with(observation: str, keyword: str) -> list[str]:
    """Reference: the sentences of the observation's passages (titles excluded) containing keyword."""
    out = []
    for passage in re.split(r"(?=Doc \d+\(Title: )", observation.removeprefix("Observation: ")):
        m = re.match(r'Doc \d+\(Title: "(.*?)"\) (.*)', passage.strip(), flags=re.DOTALL)
        if m:
            out += [(m.group(1), s) for s in re.split(r"(?<=[.!?])\s+", m.group(2).strip())
                    if keyword.lower() in s.lower()]
    return out


@pytest.fixture
def long_env() -> ReActEnv:
    """Room for many lookups before the turn limit."""
    env = ReActEnv(split="test", max_turns=20)
    yield env
    env.close()


def test_lookup_steps_through_matching_sentences_of_the_last_search(long_env):
    test_env = long_env
    task = test_env.get_task(0)
    country = task["hop_chain"][1]["entity"]   # a country: several sentences of its passages name it
    test_env.reset(options={"task_index": 0})
    obs, *_ = test_env.step(search(country))
    page = obs[0]["content"]
    expected = sentences_with(page, country)
    assert len(expected) >= 3
    seen = []
    for k, (title, sentence) in enumerate(expected):
        obs, reward, _, _, info = test_env.step(lookup(country.upper(), f"look {k}"))  # case-insensitive
        assert obs[0]["content"] == f"Observation: (Result {k + 1} / {len(expected)}) [{title}] {sentence}"
        assert info["action_type"] == "lookup" and reward == 0.0
        seen.append(sentence)
    obs, *_ = test_env.step(lookup(country, "look past the end"))
    assert obs[0]["content"] == "Observation: No more results."
    # another keyword starts over; coming back to the first one starts over too
    other = sentences_with(page, "population")
    obs, *_ = test_env.step(lookup("population", "population?"))
    assert obs[0]["content"] == f"Observation: (Result 1 / {len(other)}) [{other[0][0]}] {other[0][1]}"
    obs, *_ = test_env.step(lookup(country, "again from the top"))
    assert obs[0]["content"].startswith(f"Observation: (Result 1 / {len(expected)}) ")


def test_lookup_before_search_missing_keyword_and_new_search_reset(long_env):
    test_env = long_env
    task = test_env.get_task(0)
    test_env.reset(options={"task_index": 0})
    obs, reward, _, _, info = test_env.step(lookup("capital", "nothing yet"))
    assert obs[0]["content"] == "Observation: There is nothing to look up yet: search first."
    assert info["action_type"] == "lookup" and reward == 0.0
    obs, *_ = test_env.step(search(task["hop_chain"][1]["entity"]))
    first = sentences_with(obs[0]["content"], "capital")
    assert first
    test_env.step(lookup("capital", "first match"))
    obs, *_ = test_env.step(lookup("zzqqxx", "absent"))
    assert obs[0]["content"] == "Observation: No sentence in the last search results contains 'zzqqxx'."
    obs, *_ = test_env.step(search(task["hop_chain"][0]["entity"]))
    fresh = sentences_with(obs[0]["content"], "river")
    obs, *_ = test_env.step(lookup("river", "on the new page"))
    assert obs[0]["content"] == f"Observation: (Result 1 / {len(fresh)}) [{fresh[0][0]}] {fresh[0][1]}"
    test_env.reset(options={"task_index": 0})   # a new episode forgets the page
    obs, *_ = test_env.step(lookup("river", "after reset"))
    assert "search first" in obs[0]["content"]


# --------------------------------------------------------------------------- gymnasium contract
def test_check_env_and_registration():
    env = gym.make(ENV_ID)
    assert isinstance(env.unwrapped, ReActEnv) and env.unwrapped.split == "train"
    check_env(env.unwrapped)
    check_env(gym.make(ENV_ID, render_mode="ansi").unwrapped)
    assert agentgym.spec("ReAct-v0").entry_point == "agentgym.envs.react:ReActEnv"
    with pytest.raises(ValueError):
        ReActEnv(split="dev")
    with pytest.raises(ValueError):
        ReActEnv(question_types=("trivia",))
    with pytest.raises(ValueError):
        ReActEnv(few_tool_calls=6, many_tool_calls=5)


def test_episode_summary_reports_tools_and_gold_recall(test_env):
    steps = play(test_env, ReActEnv.oracle, task_index=0)
    summary = steps[-1][4]["episode_summary"]
    assert summary["searches"] == 2 and summary["lookups"] == 0 and summary["calculator_calls"] == 0
    assert summary["question_type"] == "multi_hop" and summary["hops"] == 2 and summary["gold_recall"] == 1.0
    assert exact_match(steps[-1][4]["answer"], test_env.task["answers"])
