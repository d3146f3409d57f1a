"""SearchQA's baselines for the Search-R1 comparison: ``retrieval="none"`` (answer without retrieval)
and ``retrieval="rag"`` (the top-k passages for the question in the prompt), next to the default
``"agentic"`` (Search-R1's protocol, which must stay exactly as it was); and question files used
without a corpus when a retrieval server or index holds the passages.

Real components: the bundled world, MiniLM + faiss (the env's own cached index), uvicorn on
loopback, the SmolLM2 tokenizer with a scripted policy for token-level rollouts.
"""

from __future__ import annotations

import re

import pytest

from agentgym.app.checking import run_check_env
from agentgym.envs.services.retrieval import create_app
from agentgym.envs.searchqa.data import bundled_dataset
from agentgym.envs.searchqa.env import (ANSWER_ONLY_INVALID, NO_SEARCH_PROMPT, RAG_PROMPT, SEARCH_R1_INVALID,
                                        SearchQAEnv, make_search_r1_prompt)
from agentgym.envs.services.retrieval.base import format_passages
from agentgym.envs.services.retrieval.shared import get_retriever
from agentgym.http_server import BackgroundServer
from agentgym.policies.scripted import ScriptedPolicy
from agentgym.rollout_config import RolloutConfig
from agentgym.rollout import RolloutEngine

from fixtures_llm import cached_tokenizer, one_torch_thread  # noqa: F401  (autouse fixture)

ENV_ID = "agentgym/SearchQA-v0"
BUNDLED_KEY = ("bundled", 0, "small")  # the env's cache key for its default data


class CountingRetriever:
    """A real retriever that records the searches it forwards."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def search(self, queries, topk=3):
        self.calls.append((list(queries), topk))
        return self.inner.search(queries, topk)


@pytest.fixture(scope="module")
def bundled():
    return bundled_dataset(0, "small")


@pytest.fixture(scope="module")
def dense(bundled):
    return get_retriever("dense", bundled[0], BUNDLED_KEY)


@pytest.fixture
def counting(dense):
    return CountingRetriever(dense)


# ----------------------------------------------------------------------------- agentic is unchanged
def test_default_is_agentic_and_identical_to_an_explicit_agentic_env(bundled):
    _, train, _ = bundled
    default, explicit = SearchQAEnv(), SearchQAEnv(retrieval="agentic")
    assert default.retrieval == "agentic" and default.stop_strings == ("</search>",)  # then cut: issue 26
    q = train[2]
    actions = [f"<think>t</think><search>{q['question']}</search>", "no tags", f"<answer>{q['answers'][0]}</answer>"]
    obs_d, _ = default.reset(seed=0, options={"task_index": 2})
    obs_e, _ = explicit.reset(seed=0, options={"task_index": 2})
    assert obs_d == obs_e == [{"role": "user", "content": make_search_r1_prompt(q["question"])}]
    for a in actions:
        out_d, out_e = default.step(a), explicit.step(a)
        assert out_d[:4] == out_e[:4]
    assert out_d[4]["episode_summary"] == out_e[4]["episode_summary"]
    assert default.messages[2]["content"].startswith("\n\n<information>Doc 1(Title: ")
    assert default.messages[4]["content"] == SEARCH_R1_INVALID


# ----------------------------------------------------------------------------- no retrieval
def test_none_prompts_without_retrieval_and_accepts_only_answers(counting, bundled):
    _, train, _ = bundled
    env = SearchQAEnv(retriever=counting, retrieval="none", max_turns=2, forced_answer=False)
    q = train[5]
    obs, _ = env.reset(seed=0, options={"task_index": 5})
    assert obs == [{"role": "user", "content": NO_SEARCH_PROMPT.format(question=q["question"].strip().rstrip("?") + "?")}]
    text = obs[0]["content"]
    assert "<search>" not in text and "<information>" not in text and text.endswith("?\n")
    assert env.stop_strings == ("</answer>",)
    # a search is not an action here: invalid, nothing retrieved
    obs, reward, terminated, truncated, info = env.step(f"<think>t</think><search>{q['question']}</search>")
    assert info["action_type"] == "invalid" and obs == [{"role": "user", "content": ANSWER_ONLY_INVALID}]
    assert not (terminated or truncated) and counting.calls == []
    obs, reward, terminated, truncated, info = env.step(f"<think>t</think><answer>{q['answers'][0]}</answer>")
    assert terminated and reward == 1.0 and info["episode_summary"]["success"]
    assert info["episode_summary"]["searches"] == 0 and not info["episode_summary"]["found_gold"]
    assert counting.calls == []


def test_none_one_generation_ends_truncated_without_an_answer():
    env = SearchQAEnv(retrieval="none", max_turns=1, forced_answer=False)
    env.reset(seed=0, options={"task_index": 0})
    _, reward, terminated, truncated, info = env.step("The answer is Paris.")
    assert truncated and not terminated and reward == 0.0 and not info["episode_summary"]["success"]


def test_none_needs_no_corpus_and_no_retriever(bundled):
    _, train, _ = bundled
    env = SearchQAEnv(retrieval="none", data={"questions": train[:3]}, max_turns=1, forced_answer=False)
    env.reset(seed=0, options={"task_index": 1})
    assert env._retriever is None and env.corpus is None


# ----------------------------------------------------------------------------- one-shot RAG
def test_rag_puts_the_top_k_passages_for_the_question_in_the_prompt(counting, dense, bundled):
    _, train, _ = bundled
    env = SearchQAEnv(retriever=counting, retrieval="rag", topk=3, max_turns=1, forced_answer=False)
    q = train[7]
    obs, _ = env.reset(seed=0, options={"task_index": 7})
    assert counting.calls == [([q["question"]], 3)]          # one retrieval, the question as the query
    passages = format_passages(dense.search([q["question"]], 3)[0])
    shown = q["question"].strip().rstrip("?") + "?"
    assert obs == [{"role": "user", "content": RAG_PROMPT.format(passages=passages.strip(), question=shown)}]
    # the same "Doc i(Title: ...)" format as a Search-R1 search observation, inside one <information> span
    # (the instruction itself names "<information> and </information>": the span is the last one)
    span = re.findall(r"<information>(.*?)</information>", obs[0]["content"], flags=re.DOTALL)[-1]
    assert span.startswith("Doc 1(Title: ") and "Doc 3(Title: " in span and "Doc 4(" not in span
    assert env.stop_strings == ("</answer>",)
    _, reward, terminated, _, info = env.step(f"<answer>{q['answers'][0]}</answer>")
    assert terminated and reward == 1.0
    assert len(counting.calls) == 1                          # answering retrieves nothing more
    golds = q["answers"]
    assert info["episode_summary"]["found_gold"] == any(g.lower() in passages.lower() for g in golds)


def test_rag_search_tags_are_invalid(counting):
    env = SearchQAEnv(retriever=counting, retrieval="rag", max_turns=2, forced_answer=False)
    env.reset(seed=0, options={"task_index": 0})
    obs, _, terminated, truncated, info = env.step("<search>anything</search>")
    assert info["action_type"] == "invalid" and obs[0]["content"] == ANSWER_ONLY_INVALID
    assert len(counting.calls) == 1 and not (terminated or truncated)


def test_rag_finds_gold_for_most_single_hop_questions(dense, bundled):
    # the passages in the prompt are the retriever's: single-hop gold passages are retrieved by the question
    _, train, _ = bundled
    env = SearchQAEnv(retriever=dense, retrieval="rag", max_turns=1, forced_answer=False)
    single = [i for i, q in enumerate(train) if q["type"] == "single_hop"][:40]
    found = 0
    for i in single:
        env.reset(seed=0, options={"task_index": i})
        _, _, _, _, info = env.step("<answer>x</answer>")
        found += info["episode_summary"]["found_gold"]
    assert found / len(single) >= 0.8


@pytest.mark.parametrize("retrieval", ["none", "rag"])
def test_baselines_pass_gymnasium_check_env(retrieval):
    assert run_check_env(ENV_ID, {"retrieval": retrieval}) is None


@pytest.mark.parametrize("retrieval", ["none", "rag"])
def test_baseline_rollouts_are_token_faithful_with_the_prompt_masked(retrieval, bundled):
    """Scripted answers through the real rollout engine: the retrieved passages in a RAG prompt are
    prompt tokens (never trained on); the policy's ids are exactly its answer."""
    _, train, _ = bundled

    def answer(context):
        return f"<think>I know.</think><answer>{context['task']['answers'][0]}</answer>"

    engine = RolloutEngine(ScriptedPolicy(cached_tokenizer(), answer), RolloutConfig(debug_checks=True))
    try:
        batch = engine.collect(ENV_ID, task_indices=range(6),
                               env_kwargs={"retrieval": retrieval, "max_turns": 1, "forced_answer": False})
    finally:
        engine.close()
    assert batch.metrics["success_rate"] == 1.0 and batch.metrics["turns_mean"] == 1.0
    for t in batch.trajectories:
        assert sum(t.loss_mask[:t.prompt_length]) == 0
        assert sum(t.loss_mask) == len(t.token_ids) - t.prompt_length   # only the policy's answer follows
        prompt = cached_tokenizer().decode(t.token_ids[:t.prompt_length])
        assert ("<information>Doc 1(Title: " in prompt) == (retrieval == "rag")


# ----------------------------------------------------------------------------- validation
def test_unknown_retrieval_mode_and_chat_baselines_are_rejected():
    with pytest.raises(ValueError, match="retrieval must be one of"):
        SearchQAEnv(retrieval="oracle")
    with pytest.raises(ValueError, match="baseline of protocol='search_r1'"):
        SearchQAEnv(protocol="chat", retrieval="rag")


def test_questions_without_corpus_need_an_external_retriever(bundled):
    _, train, _ = bundled
    with pytest.raises(ValueError, match="'corpus' may be left out only"):
        SearchQAEnv(data={"questions": train[:2]})                        # in-process dense needs passages
    with pytest.raises(ValueError, match="'corpus' may be left out only"):
        SearchQAEnv(data={"questions": train[:2]}, retriever="bm25", retrieval="rag")


def test_questions_without_corpus_search_a_retrieval_server(dense, bundled):
    """The wiki-18 recipe: a question file and a retrieval server, no corpus in the trainer's process."""
    _, train, _ = bundled
    server = BackgroundServer(create_app(dense), host="127.0.0.1", port=0, start_timeout_s=60)
    url = server.start()
    try:
        local = SearchQAEnv()
        remote = SearchQAEnv(data={"questions": train[:10]}, retriever=url)
        assert remote.corpus is None and remote.retriever.kind == "remote"
        for env in (local, remote):
            env.reset(seed=0, options={"task_index": 4})
        action = f"<search>{train[4]['question']}</search>"
        assert remote.step(action)[0] == local.step(action)[0]
        rag = SearchQAEnv(data={"questions": train[:10]}, retriever=url, retrieval="rag")
        local_rag = SearchQAEnv(retrieval="rag")
        assert rag.reset(seed=0, options={"task_index": 4})[0] == local_rag.reset(seed=0, options={"task_index": 4})[0]
    finally:
        server.stop()
