"""Issue 26: Search-R1's own files and rules through SearchQA-v0.

Facts from the Search-R1 repository (PeterGriffinJin/Search-R1, 2025-10-29 snapshot), as collected in
``docs/search_r1_protocol.md``: parquet rows (``scripts/data_process/nq_search.py``, ``nq.py``,
``nq_rag.py``, ``qa_search_*_merge.py``) whose ``prompt`` column the trainer feeds verbatim; the cut of a
response after the first ``</search>`` else the first ``</answer>`` and the first-match action parse
(``search_r1/llm_agent/generation.py``); an empty query posted as ``""``; a faiss inner-product index
file beside a corpus jsonl, queried with mean pooling, the ``query: `` prefix and 256 tokens
(``search_r1/search/retrieval_server.py``, ``index_builder.py``); ``qa_em.py``'s whole-sequence scoring.

Real components: parquet files written with ``datasets`` (as Search-R1's scripts write them), MiniLM +
faiss, the SmolLM2 tokenizer, the retrieval server on loopback. The reference functions below are
written from the rules, independently of the env's code.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import faiss
import numpy as np
import pytest
from helpers_scripts import load_script

from agentgym.envs.services.retrieval import create_app, get_retriever
from agentgym.envs.services.retrieval.dense import default_model_path
from agentgym.envs.services.retrieval.prebuilt import SearchR1IndexRetriever
from agentgym.envs.searchqa.data import load_search_r1_parquet, save_search_r1_parquet, to_search_r1_rows
from agentgym.envs.searchqa.env import RAG_PROMPT, SEARCH_R1_PROMPT, SearchQAEnv, make_search_r1_prompt
from agentgym.envs.services.retrieval.base import format_passages
from agentgym.envs.searchqa.scoring import score_search_r1, search_r1_cut
from agentgym.http_server import BackgroundServer
from agentgym.policies.models import load_tokenizer
from agentgym.policies.scripted import ScriptedPolicy
from agentgym.rewards import normalize_answer
from agentgym.rollout_config import RolloutConfig
from agentgym.rollout import RolloutEngine

EVALUATE = Path(__file__).resolve().parents[1] / "benchmarks" / "search_r1" / "evaluate.py"

DOCS = [
    ("Ostravel", "Ostravel is the capital of Quenmark. It lies on the river Pell."),
    ("Quenmark", "Quenmark is a small country. Its capital is Ostravel."),
    ("Ilsa Varn", "Ilsa Varn is a painter born in Ostravel in 1950."),
    ("River Pell", "The river Pell is 420 kilometres long and flows through Ostravel."),
    ("Beijing", "Beijing is the capital of China."),
    ("Tova Lint", "Tova Lint wrote the novel The Glass Harbour."),
]
QUESTIONS = [("nq", "what is the capital of quenmark", ["Ostravel"]),
             ("hotpotqa", "where was ilsa varn born", ["Ostravel"]),
             ("nq", "what is the capital of china", ["Beijing"])]


def _contents(title: str, text: str) -> str:
    return f'"{title}"\n{text}'


# Our own wording of the two baseline templates, shaped like nq.py's and nq_rag.py's rows (the
# question after "Question: "; for RAG, " Context: <Doc i(Title: ...) ...> \n" after it).
def direct_prompt(q: str) -> str:
    return f"Answer directly inside <answer> and </answer>. Question: {q}\n"


def rag_prompt(q: str, context: str) -> str:
    return f"Answer with the help of the context, inside <answer> and </answer>. Question: {q} Context: {context} \n"


def search_r1_rows(make_content) -> list[dict]:
    """Rows exactly in Search-R1's schema: extra_info holds only split and index."""
    rows = []
    for i, (source, q, golds) in enumerate(QUESTIONS):
        q = q.strip() + ("" if q.strip().endswith("?") else "?")
        rows.append({"data_source": source, "prompt": [{"role": "user", "content": make_content(q)}],
                     "ability": "fact-reasoning", "reward_model": {"style": "rule", "ground_truth": {"target": golds}},
                     "extra_info": {"split": "test", "index": i}})
    return rows


def write_parquet(rows: list[dict], path: Path) -> Path:
    import datasets   # Search-R1's scripts write their parquets with datasets' to_parquet
    datasets.Dataset.from_list(rows).to_parquet(str(path))
    return path


# ----------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("search_r1_files")
    corpus = d / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "contents": _contents(t, x)}) + "\n"
                              for i, (t, x) in enumerate(DOCS)), encoding="utf-8")
    ctx = "".join(f"Doc {i}(Title: \"{t}\") {x}\n" for i, (t, x) in enumerate(DOCS[:2], start=1))
    return {
        "dir": d, "corpus": corpus,
        "search": write_parquet(search_r1_rows(lambda q: SEARCH_R1_PROMPT.format(question=q)), d / "search.parquet"),
        "direct": write_parquet(search_r1_rows(direct_prompt), d / "direct.parquet"),
        "rag": write_parquet(search_r1_rows(lambda q: rag_prompt(q, ctx)), d / "rag.parquet"),
        "ours": save_search_r1_parquet(to_search_r1_rows(
            [{"question": q, "answers": a} for _, q, a in QUESTIONS], "nq", "test", make_search_r1_prompt),
            d / "ours.parquet"),
    }


@pytest.fixture(scope="module")
def dense(files):
    from agentgym.envs.searchqa.data import load_corpus_jsonl
    return get_retriever("dense", load_corpus_jsonl(files["corpus"]), ("issue26", str(files["corpus"])))


class Counting:
    """A real retriever that counts the searches it forwards."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def search(self, queries, topk=3):
        self.calls.append(list(queries))
        return self.inner.search(queries, topk)


def env_for(files, which, dense, **kw):
    return SearchQAEnv(data={"questions": str(files[which])}, retriever=kw.pop("retriever", dense), **kw)


# ============================================================================= 1. prompt source
def test_search_r1_rows_get_their_prompt_column_as_is(files, dense):
    rows = load_search_r1_parquet(files["direct"])
    assert [r["schema"] for r in rows] == ["search_r1"] * 3
    assert [r["question"] for r in rows] == ["what is the capital of quenmark?", "where was ilsa varn born?",
                                             "what is the capital of china?"]
    env = env_for(files, "direct", dense, retrieval="none", max_turns=1, forced_answer=False)
    obs, _ = env.reset(options={"task_index": 1})
    assert obs == [{"role": "user", "content": direct_prompt("where was ilsa varn born?")}]
    # the same rows with prompt="template": the built no-search template around the parsed question
    env = env_for(files, "direct", dense, retrieval="none", prompt="template")
    obs, _ = env.reset(options={"task_index": 1})
    assert "where was ilsa varn born?" in obs[0]["content"] and obs[0]["content"] != direct_prompt("where was ilsa varn born?")


def test_rag_rows_keep_their_context_and_retrieve_nothing(files, dense):
    rows = load_search_r1_parquet(files["rag"])
    assert rows[0]["question"] == "what is the capital of quenmark?"  # the context is not glued onto it
    counting = Counting(dense)
    env = env_for(files, "rag", dense, retriever=counting, retrieval="rag", max_turns=1, forced_answer=False)
    obs, _ = env.reset(options={"task_index": 0})
    assert obs == rows[0]["prompt"] and counting.calls == []
    *_, terminated, _, info = env.step("<think>it says so</think><answer>Ostravel</answer>")
    assert terminated and info["episode_summary"]["success"]


def test_agentgym_rows_and_the_bundled_world_keep_the_built_template(files, dense):
    env = env_for(files, "ours", dense, retrieval="rag", max_turns=1, forced_answer=False)
    obs, _ = env.reset(options={"task_index": 0})
    hits = dense.search(["what is the capital of quenmark"], 3)[0]
    assert obs[0]["content"] == RAG_PROMPT.format(passages=format_passages(hits).strip(),
                                                  question="what is the capital of quenmark?")
    env = env_for(files, "search", dense)
    obs, _ = env.reset(options={"task_index": 2})
    assert obs[0]["content"] == make_search_r1_prompt("what is the capital of china")
    with pytest.raises(ValueError, match="every question row to carry a 'prompt'"):
        SearchQAEnv(prompt="parquet", world_size="tiny")
    with pytest.raises(ValueError, match="protocol='search_r1'"):
        SearchQAEnv(protocol="chat", prompt="parquet", world_size="tiny")
    with pytest.raises(ValueError, match="prompt must be one of"):
        SearchQAEnv(prompt="verbatim", world_size="tiny")


def _load_evaluate():
    return load_script(EVALUATE, "sr1_evaluate_issue26")


def test_evaluate_runs_search_r1_made_parquets(files, tmp_path):
    evaluate = _load_evaluate()
    for which, retrieval in (("direct", "none"), ("rag", "rag"), ("search", "agentic")):
        args = evaluate.parse_args(["--model", "oracle", "--questions", str(files[which]), "--retrieval", retrieval,
                                    "--retriever", "dense", "--corpus", str(files["corpus"])])
        rows = load_search_r1_parquet(files[which])
        env = SearchQAEnv(**evaluate.env_kwargs_for(args, rows))
        obs, _ = env.reset(options={"task_index": 0})
        assert obs == rows[0]["prompt"], which
    out = tmp_path / "em.json"
    assert evaluate.main(["--model", "oracle", "--questions", str(files["search"]), "--retriever", "dense",
                          "--corpus", str(files["corpus"]), "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["per_dataset"] == {"nq": {"em": 1.0, "n": 2}, "hotpotqa": {"em": 1.0, "n": 1}}


# ============================================================================= 2. cut rule and parsing
def reference_cut(resp: str) -> str:
    # generation.py _postprocess_responses, restated
    if "</search>" in resp:
        return resp.split("</search>")[0] + "</search>"
    if "</answer>" in resp:
        return resp.split("</answer>")[0] + "</answer>"
    return resp


@pytest.mark.parametrize("text", [
    "<answer>a</answer><answer>b</answer><search>q</search> tail",
    "<search>x <answer>y</answer> z</search><answer>w</answer>",
    "<answer>a</answer> more <answer>b</answer>",
    "no tags", "", "</search></answer>", "<search>q</search></search>",
])
def test_cut_is_search_r1s(text):
    assert search_r1_cut(text) == reference_cut(text)


def test_two_answers_then_a_search(files, dense):
    """Search-R1 keeps the text up to </search>; the first match is the first answer, which ends the
    episode; its qa_em reward reads the LAST answer of the whole sequence (here the gold one)."""
    action = "<think>t</think><answer>Quenmark</answer><answer>Ostravel</answer><search>capital</search>"
    for scorer, em in (("em", 0.0), ("qa_em", 1.0)):
        env = env_for(files, "search", dense, scorer=scorer)
        env.reset(options={"task_index": 0})
        *_, terminated, _, info = env.step(action)
        assert terminated and info["action_type"] == "answer" and info["answer"] == "Quenmark"
        assert info["reward_terms"]["exact_match"] == em and info["episode_summary"]["success"] == bool(em)


def test_an_answer_nested_in_a_search_is_part_of_the_query(files, dense):
    counting = Counting(dense)
    env = env_for(files, "search", dense, retriever=counting)
    env.reset(options={"task_index": 0})
    obs, _, terminated, _, info = env.step("<search>capital <answer>Ostravel</answer> quenmark</search>")
    assert not terminated and info["action_type"] == "search"
    assert info["query"] == "capital <answer>Ostravel</answer> quenmark"
    assert counting.calls == [["capital <answer>Ostravel</answer> quenmark"]]
    assert obs[0]["content"].startswith("\n\n<information>Doc 1(Title: ")


def test_step_on_raw_text_takes_the_first_answer(files, dense):
    env = env_for(files, "search", dense)
    env.reset(options={"task_index": 0})
    *_, info = env.step("<answer>Ostravel</answer> on second thought <answer>Pell</answer> and more text")
    assert info["answer"] == "Ostravel" and info["episode_summary"]["success"]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


def test_rollout_generates_on_and_cuts_tokens_by_search_r1s_rule(files, dense, tokenizer):
    """No stop string but </search>: a scripted reply with an answer, then a search, then a tail keeps
    its tokens up to the </search> (Search-R1 cuts there), and the env sees that text."""
    env_kwargs = {"data": {"questions": str(files["search"])}, "retriever": dense, "scorer": "qa_em"}
    env = SearchQAEnv(**env_kwargs)
    assert env.stop_strings == ("</search>",) and env.cut_after == ("</search>", "</answer>")
    replies = ["<think>t</think><answer>Quenmark</answer><answer>Ostravel</answer><search>capital</search> TAIL",
               "<think>t</think><answer>Ostravel</answer> TAIL <search>never</search>"]
    for reply in replies:
        engine = RolloutEngine(ScriptedPolicy(tokenizer, [reply]), RolloutConfig(debug_checks=True))
        traj = engine.collect(lambda: SearchQAEnv(**env_kwargs), task_indices=[0]).trajectories[0]
        engine.close()
        said = [m["content"] for m in traj.messages if m["role"] == "assistant"]
        assert said == [reference_cut(reply)]
        assert traj.finish_reasons == ["stop"]
        policy_ids = [t for t, m in zip(traj.token_ids, traj.loss_mask) if m]
        assert tokenizer.decode(policy_ids, skip_special_tokens=True) == reference_cut(reply)
    # with the opt-in speed path the first </answer> also stops generation (not Search-R1's rule)
    fast = SearchQAEnv(world_size="tiny", stop_at_answer=True)
    assert fast.stop_strings == ("</search>", "</answer>") and fast.cut_after == ()


# ============================================================================= 3. the empty query
def test_empty_query_is_searched_as_search_r1_does(files, dense):
    expected = format_passages(dense.search([""], 3, search_empty=True)[0])
    assert expected.count("Doc ") == 3
    server = BackgroundServer(create_app(dense), host="127.0.0.1", port=0, start_timeout_s=60)
    url = server.start()
    try:
        for retriever in (dense, url):
            env = env_for(files, "search", dense, retriever=retriever)
            env.reset(options={"task_index": 0})
            obs, *_, info = env.step("<think>t</think><search> </search>")
            assert info["query"] == "" and info["search_executed"]
            assert obs == [{"role": "user", "content": f"\n\n<information>{expected.strip()}</information>\n\n"}]
        assert server.app.state.worker.requests >= 1  # the "" went over HTTP
    finally:
        server.stop()


# ============================================================================= 4. a Search-R1-built index
def build_index_like_search_r1(corpus_rows: list[str], path: Path, max_length: int = 256) -> None:
    """index_builder.py's recipe with MiniLM in place of e5: 'passage: ' prefix, mean pooling over the
    attention mask, L2 norm, faiss.index_factory(dim, 'Flat', inner product), one file."""
    import torch
    from transformers import AutoModel, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(default_model_path())
    model = AutoModel.from_pretrained(default_model_path()).eval()
    with torch.no_grad():
        inputs = tok([f"passage: {c}" for c in corpus_rows], max_length=max_length, padding=True,
                     truncation=True, return_tensors="pt")
        hidden = model(**inputs).last_hidden_state
        mask = inputs["attention_mask"][..., None].float()
        emb = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1).numpy()
    index = faiss.index_factory(emb.shape[1], "Flat", faiss.METRIC_INNER_PRODUCT)
    index.add(np.ascontiguousarray(emb, dtype=np.float32))
    faiss.write_index(index, str(path))


@pytest.fixture(scope="module")
def prebuilt(files):
    path = files["dir"] / "e5_Flat.index"
    build_index_like_search_r1([_contents(t, x) for t, x in DOCS], path)
    return path


def test_prebuilt_index_searches_like_brute_force(files, prebuilt):
    r = SearchR1IndexRetriever(prebuilt, files["corpus"], default_model_path())
    assert r.num_docs == len(DOCS) and r.query_prefix == "query: " and r.max_length == 256
    queries = ["capital of quenmark", "who wrote the glass harbour"]
    hits = r.search(queries, topk=3)
    assert hits[0][0].title == '"Quenmark"' or hits[0][0].title == '"Ostravel"'
    assert hits[1][0].title == '"Tova Lint"'
    index = faiss.read_index(str(prebuilt))
    vectors = index.reconstruct_n(0, index.ntotal)
    q = r.encode_queries(queries)
    assert np.allclose(np.linalg.norm(q, axis=1), 1.0, atol=1e-5)
    scores = q @ vectors.T
    for i in range(2):
        order = np.argsort(-scores[i])[:3]
        assert [h.doc_id for h in hits[i]] == [str(j) for j in order]
        assert [h.score for h in hits[i]] == pytest.approx(scores[i][order].tolist(), abs=1e-5)


def test_env_with_a_prebuilt_index_runs_end_to_end(files, prebuilt):
    spec = {"index": str(prebuilt), "corpus": str(files["corpus"]), "model": default_model_path()}
    env = SearchQAEnv(data={"questions": str(files["search"])}, retriever=spec)
    env.reset(options={"task_index": 0})
    obs, *_ = env.step("<think>t</think><search>capital of quenmark</search>")
    assert "Ostravel" in obs[0]["content"]
    *_, info = env.step("<think>t</think><answer>Ostravel</answer>")
    assert info["episode_summary"]["success"]


def test_prebuilt_index_behind_our_server_answers_like_in_process(files, prebuilt):
    r = SearchR1IndexRetriever(prebuilt, files["corpus"], default_model_path())
    server = BackgroundServer(create_app(r), host="127.0.0.1", port=0, start_timeout_s=60)
    url = server.start()
    try:
        remote = SearchQAEnv(data={"questions": str(files["search"])}, retriever=url)
        local = SearchQAEnv(data={"questions": str(files["search"])}, retriever=r)
        for env in (remote, local):
            env.reset(options={"task_index": 1})
        for action in ("<search>where was ilsa varn born</search>", "<search></search>"):
            assert remote.step(action)[0] == local.step(action)[0]
    finally:
        server.stop()


def test_prebuilt_index_problems_fail_at_construction(files, prebuilt, tmp_path):
    questions = {"questions": str(files["search"])}
    model = default_model_path()

    def make(**spec):
        return SearchQAEnv(data=questions, retriever=spec)

    with pytest.raises(FileNotFoundError, match=r"missing index file .*nope\.index"):
        make(index=str(tmp_path / "nope.index"), corpus=str(files["corpus"]), model=model)
    with pytest.raises(FileNotFoundError, match=r"missing index file .* and corpus file .*nope\.jsonl"):
        make(index=str(tmp_path / "nope.index"), corpus=str(tmp_path / "nope.jsonl"), model=model)
    with pytest.raises(ValueError, match="needs 'corpus'"):
        make(index=str(prebuilt))
    with pytest.raises(ValueError, match="cannot load the query encoder 'no-such-org/no-such-encoder'"):
        make(index=str(prebuilt), corpus=str(files["corpus"]), model="no-such-org/no-such-encoder")
    longer = tmp_path / "longer.jsonl"
    longer.write_text(files["corpus"].read_text() + json.dumps({"id": "x", "contents": '"X"\nx'}) + "\n")
    with pytest.raises(ValueError, match="holds 6 vectors but .* has 7 passages"):
        make(index=str(prebuilt), corpus=str(longer), model=model)
    small = faiss.IndexFlatIP(8)
    small.add(np.eye(8, dtype=np.float32)[: len(DOCS)])
    faiss.write_index(small, str(tmp_path / "dim8.index"))
    with pytest.raises(ValueError, match="dim 8, encoder .* gives dim 384"):
        make(index=str(tmp_path / "dim8.index"), corpus=str(files["corpus"]), model=model)
    # the index file given as a plain path: the error says what else is needed, at construction
    with pytest.raises(FileNotFoundError, match=r"looks like a faiss file built by Search-R1: pass retriever="):
        SearchQAEnv(data=questions, retriever=str(prebuilt))


# ============================================================================= 5. scorers
def reference_qa_em(sequence: str, golds: list[str], sub: bool = False) -> float:
    # qa_em.py compute_score_em / compute_score_subem, restated: last <answer> match, at least two
    matches = re.findall(r"<answer>(.*?)</answer>", sequence, flags=re.DOTALL)
    if len(matches) <= 1:
        return 0.0
    pred = normalize_answer(matches[-1].strip())
    return float(any((normalize_answer(g) in pred) if sub else (normalize_answer(g) == pred) for g in golds))


def test_the_search_r1_prompt_holds_two_answer_matches():
    assert re.findall(r"<answer>(.*?)</answer>", SEARCH_R1_PROMPT, flags=re.DOTALL) == [" and ", " Beijing "]


def test_qa_em_scores_a_trajectory_that_never_answers_on_the_prompts_example(files, dense):
    """Gold "Beijing": two searches, then the forced turn searches again; no <answer> anywhere in
    the responses. qa_em reads the prompt's own example and scores 1; the default em scores 0."""
    actions = ["<think>t</think><search>capital of china</search>"] * 3
    for scorer, expected in (("qa_em", 1.0), ("em", 0.0)):
        env = env_for(files, "search", dense, scorer=scorer, max_turns=2)
        env.reset(options={"task_index": 2})
        for a in actions:
            *_, terminated, truncated, info = env.step(a)
        assert truncated and not terminated
        assert info["reward_terms"]["exact_match"] == expected and info["episode_summary"]["success"] == bool(expected)
        sequence = "".join(m["content"] for m in env.messages)
        assert reference_qa_em(sequence, ["Beijing"]) == 1.0


@pytest.mark.parametrize("answer,golds", [("the city of Beijing", ["Beijing"]), ("Beijing", ["Beijing"]),
                                          ("Peking", ["Beijing"]), ("Ostravel, Quenmark", ["ostravel"])])
def test_scorers_against_the_reference(answer, golds):
    prompt = SEARCH_R1_PROMPT.format(question="q?")
    sequence = prompt + f"<think>t</think><answer>{answer}</answer>"
    em = float(normalize_answer(answer) in {normalize_answer(g) for g in golds})
    sub = float(any(normalize_answer(g) in normalize_answer(answer) for g in golds))
    assert score_search_r1("em", answer, sequence, golds) == em
    assert score_search_r1("subem", answer, sequence, golds) == sub
    assert score_search_r1("qa_em", answer, sequence, golds) == reference_qa_em(sequence, golds) == em
    assert score_search_r1("qa_subem", answer, sequence, golds) == reference_qa_em(sequence, golds, sub=True) == sub
    # without the prompt, one match is too few for qa_em
    assert score_search_r1("qa_em", answer, f"<answer>{answer}</answer>", golds) == 0.0
    with pytest.raises(ValueError, match="scorer must be one of"):
        score_search_r1("f1", answer, sequence, golds)


def test_subem_scorer_through_the_env(files, dense):
    for scorer, expected in (("subem", 1.0), ("em", 0.0), ("qa_subem", 1.0)):
        env = env_for(files, "search", dense, scorer=scorer)
        env.reset(options={"task_index": 0})
        *_, info = env.step("<answer>the city of Ostravel</answer>")
        assert info["reward_terms"]["exact_match"] == expected, scorer


def test_format_reward_judges_the_cut_responses(files, dense):
    """The follow-up's format reward sees what Search-R1 keeps: text after the cut is not part of it."""
    env = env_for(files, "search", dense, reward={"exact_match": 0, "search_r1_format": 1})
    env.reset(options={"task_index": 0})
    *_, info = env.step("<think>t</think><answer>Ostravel</answer> and then <information>junk")
    assert info["reward_terms"]["search_r1_format"] == 1.0
