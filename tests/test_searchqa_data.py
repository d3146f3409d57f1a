"""SearchQA data: generated world, questions, corpus / parquet / FlashRAG formats."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections import Counter, defaultdict

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings, strategies as st

from agentgym.envs.searchqa import (
    DatasetFormatError, build_world, bundled_dataset, load_corpus_jsonl, load_search_r1_parquet,
    make_questions, prepare_flashrag, save_corpus_jsonl, save_search_r1_parquet, split_title,
    to_search_r1_rows,
)
from agentgym.rewards import normalize_answer

QUESTION_KEYS = {"id", "question", "answers", "type", "needs_search", "gold_doc_ids", "hops"}


def stand_in_prompt(question: str) -> str:
    """Test stand-in for the env's prompt: an instruction that itself contains 'Question: '."""
    return f"Instruction (Question: this line is an example). Question: {question}\n"


@pytest.fixture(scope="module")
def small():
    world = build_world(0, "small")
    train = make_questions(world, 1000, seed=0, split="train")
    test = make_questions(world, 300, seed=0, split="test")
    return world, world.corpus(), train, test


def _by_id(corpus):
    return {d["id"]: d["contents"] for d in corpus}


# ----------------------------------------------------------------------------- world
def test_same_seed_same_world_and_questions():
    a, b = build_world(7, "tiny"), build_world(7, "tiny")
    assert a.corpus() == b.corpus()
    assert make_questions(a, 60, seed=3, split="train") == make_questions(b, 60, seed=3, split="train")
    assert make_questions(a, 30, seed=3, split="test") == make_questions(b, 30, seed=3, split="test")


def test_different_seeds_differ():
    a, b = build_world(1, "tiny"), build_world(2, "tiny")
    assert a.corpus() != b.corpus()
    titles_a = {split_title(d["contents"])[0] for d in a.corpus()}
    titles_b = {split_title(d["contents"])[0] for d in b.corpus()}
    assert len(titles_a & titles_b) < 0.1 * len(titles_a)
    # A different sampling seed on the same world draws a different sample.
    qa = make_questions(a, 60, seed=0, split="train")
    qb = make_questions(a, 60, seed=1, split="train")
    assert [q["id"] for q in qa] != [q["id"] for q in qb]


def test_sizes_and_build_time():
    t0 = time.perf_counter()
    world = build_world(123, "small")
    corpus = world.corpus()
    make_questions(world, 1000, seed=0, split="train")
    make_questions(world, 300, seed=0, split="test")
    assert time.perf_counter() - t0 < 2.0
    assert 300 <= len(corpus) <= 600
    assert len(build_world(0, "tiny").corpus()) < len(corpus)
    assert len(build_world(0, 300).corpus()) > len(corpus)   # an int size = number of people
    kinds = Counter(e.kind for e in world.entities.values())
    assert set(kinds) == {"person", "country", "city", "river", "mountain", "company", "university", "band"}
    with pytest.raises(ValueError, match="unknown world size"):
        build_world(0, "huge")
    with pytest.raises(ValueError):
        build_world(0, 2)


def test_corpus_rows_have_search_r1_shape(small):
    world, corpus, _, _ = small
    assert [d["id"] for d in corpus] == [str(i) for i in range(len(corpus))]
    for d in corpus:
        assert set(d) == {"id", "contents"} and isinstance(d["id"], str)
        first, _, text = d["contents"].partition("\n")
        assert first.startswith('"') and first.endswith('"') and len(first) > 2
        assert text and "\n" not in text
    # Several passages for some entities (long articles are split), all sharing the title.
    per_entity = Counter(p.entity_id for p in world.passages())
    assert max(per_entity.values()) >= 2
    for p in world.passages():
        assert split_title(p.contents) == (p.title, p.text)


def test_invented_names_are_unique_and_invented(small):
    world, corpus, _, _ = small
    names = [e.name for e in world.entities.values()]
    assert len({normalize_answer(n) for n in names}) == len(names)
    # A title names exactly one entity (an entity may have several passages).
    owner = {}
    for p in world.passages():
        assert owner.setdefault(p.title, p.entity_id) == p.entity_id
    people = [e.name for e in world.entities.values() if e.kind == "person"]
    assert all(re.fullmatch(r"[A-Z][a-z]+ [A-Z][a-z]+", n) for n in people)
    real = {"paris", "london", "tokyo", "berlin", "rome", "cairo", "nile", "amazon", "everest", "lima"}
    words = {w.lower() for n in names for w in n.split()}
    assert not words & real


def test_every_stated_fact_has_one_value(small):
    """The corpus never states a (subject, relation) two ways, so no passage contradicts a gold answer."""
    world = small[0]
    stated = defaultdict(set)
    for p in world.passages():
        for subj, rel, val in p.facts:
            stated[(subj, rel)].add(val)
    assert stated and all(len(v) == 1 for v in stated.values())


def test_corpus_text_is_consistent_about_people(small):
    """Independent of the generator's bookkeeping: parse the text and check births and marriages."""
    world, corpus, train, test = small
    name = r"([A-Z][a-z]+ [A-Z][a-z]+)"
    patterns = [re.compile(rf"{name} is an? [a-z ]+ born in ([A-Z][a-z]+) in (\d{{4}})\."),
                re.compile(rf"{name} \(born (\d{{4}})\) is an? [a-z ]+ from ([A-Z][a-z]+)\."),
                re.compile(rf"{name}, born in (\d{{4}}) in ([A-Z][a-z]+), is an?")]
    births = defaultdict(set)
    for d in corpus:
        for i, pat in enumerate(patterns):
            for m in pat.finditer(d["contents"]):
                who, a, b = m.groups()
                births[who].add((a, b) if i == 0 else (b, a))
    people = [e.name for e in world.entities.values() if e.kind == "person"]
    assert set(births) == set(people)
    assert all(len(v) == 1 for v in births.values())
    spouses = defaultdict(set)
    for d in corpus:
        for m in re.finditer(rf"{name} is married to {name}\.", d["contents"]):
            spouses[m.group(1)].add(m.group(2))
    assert spouses and all(len(v) == 1 for v in spouses.values())
    assert all(next(iter(spouses[next(iter(v))])) == who for who, v in spouses.items())
    checked = 0
    for q in train + test:
        m = re.fullmatch(rf"In which city was {name} born\?", q["question"])
        if m:
            assert q["answers"] == [next(iter(births[m.group(1)]))[0]]
            checked += 1
        m = re.fullmatch(rf"In what year was {name} born\?", q["question"])
        if m:
            assert q["answers"] == [next(iter(births[m.group(1)]))[1]]
            checked += 1
    assert checked >= 20


# ----------------------------------------------------------------------------- questions
def test_question_rows_schema_and_mix(small):
    _, corpus, train, test = small
    ids = _by_id(corpus)
    for rows, n in ((train, 1000), (test, 300)):
        assert len(rows) == n
        counts = Counter(q["type"] for q in rows)
        assert counts == {"single_hop": 0.4 * n, "multi_hop": 0.4 * n, "no_search": 0.2 * n}
        assert len({q["id"] for q in rows}) == n
        assert len({q["question"] for q in rows}) == n
        for q in rows:
            assert set(q) == QUESTION_KEYS
            assert q["answers"] and all(isinstance(a, str) and normalize_answer(a) for a in q["answers"])
            assert q["hops"] == {"no_search": 0, "single_hop": 1, "multi_hop": 2}[q["type"]]
            assert q["needs_search"] == (q["type"] != "no_search")
            assert len(q["gold_doc_ids"]) == q["hops"] and all(g in ids for g in q["gold_doc_ids"])
    # Multi-hop questions draw on many templates, not just the most frequent one.
    assert len({q["id"].split("@")[0] for q in train if q["type"] == "multi_hop"}) >= 15


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_gold_passages_support_the_answer(seed):
    world = build_world(seed, "tiny")
    contents = _by_id(world.corpus())
    rows = make_questions(world, 200, seed=seed, split="train") + make_questions(world, 60, seed=seed, split="test")
    for q in rows:
        if q["type"] == "single_hop":
            (gold,) = q["gold_doc_ids"]
            title, text = split_title(contents[gold])
            assert title in q["question"]
            assert q["answers"][0] in text
        elif q["type"] == "multi_hop":
            first, second = q["gold_doc_ids"]
            assert first != second
            t1, x1 = split_title(contents[first])
            bridge, x2 = split_title(contents[second])
            assert t1 in q["question"] and bridge not in q["question"]
            assert bridge in x1                            # hop 1 leads to the bridge entity
            assert q["answers"][0] in x2                   # hop 2 states the answer
            assert normalize_answer(q["answers"][0]) not in normalize_answer(contents[first])


def _solve(question: str) -> str:
    """An independent solver for every no-search pattern."""
    days = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
    months = ["January", "February", "March", "April", "May", "June", "July", "August", "September",
              "October", "November", "December"]
    rules = [
        (r"What is (\d+) plus (\d+)\?", lambda a, b: str(int(a) + int(b))),
        (r"What is (\d+) minus (\d+)\?", lambda a, b: str(int(a) - int(b))),
        (r"What is (\d+) times (\d+)\?", lambda a, b: str(int(a) * int(b))),
        (r"Which number is larger, (\d+) or (\d+)\?", lambda a, b: str(max(int(a), int(b)))),
        (r"Which word comes first alphabetically, '(\w+)' or '(\w+)'\?", lambda a, b: sorted([a, b])[0]),
        (r"How many letters are in the word '(\w+)'\?", lambda w: str(len(w))),
        (r"What is the word '(\w+)' spelled backwards\?", lambda w: "".join(reversed(w))),
        (r"What is the word '(\w+)' written in capital letters\?", lambda w: w.upper()),
        (r"Which day of the week comes after (\w+)\?", lambda d: days[(days.index(d) + 1) % 7]),
        (r"Which month comes after (\w+)\?", lambda m: months[(months.index(m) + 1) % 12]),
    ]
    for pattern, fn in rules:
        m = re.fullmatch(pattern, question)
        if m:
            return fn(*m.groups())
    raise AssertionError(f"unrecognised no-search question: {question!r}")


def test_no_search_answers_are_computable(small):
    _, _, train, test = small
    rows = [q for q in train + test if q["type"] == "no_search"]
    assert len({q["id"].split("@")[0] for q in rows}) >= 8
    for q in rows:
        assert q["gold_doc_ids"] == [] and q["needs_search"] is False
        assert _solve(q["question"]) in q["answers"]


def test_train_and_test_are_disjoint(small):
    world, _, train, test = small
    assert not {q["id"] for q in train} & {q["id"] for q in test}
    assert not {q["question"] for q in train} & {q["question"] for q in test}
    subjects = lambda rows: {q["id"].split("@")[1] for q in rows if q["needs_search"]}  # noqa: E731
    assert not subjects(train) & subjects(test)
    # Disjointness does not depend on the sampling seed.
    other = make_questions(world, 300, seed=99, split="test")
    assert not subjects(train) & subjects(other)
    assert not {q["question"] for q in train} & {q["question"] for q in other}


def test_make_questions_arguments(small):
    world = small[0]
    only = make_questions(world, 25, seed=0, split="train", mix={"no_search": 1.0})
    assert [q["type"] for q in only] == ["no_search"] * 25
    counts = Counter(q["type"] for q in make_questions(world, 7, seed=0, split="test"))
    assert sum(counts.values()) == 7
    with pytest.raises(ValueError, match="available"):
        make_questions(world, 20000, seed=0, split="test")
    with pytest.raises(ValueError, match="unknown question types"):
        make_questions(world, 10, mix={"trivia": 1.0})
    with pytest.raises(ValueError, match="split"):
        make_questions(world, 10, split="dev")
    assert len(make_questions(world, 10, seed=0, split="validation")) == 10  # the third held-out split


def test_bundled_dataset_is_cached_and_copied():
    corpus, train, test = bundled_dataset()
    assert 300 <= len(corpus) <= 600 and len(train) == 1000 and len(test) == 300
    train[0]["answers"].append("tampered")
    corpus.clear()
    t0 = time.perf_counter()
    corpus2, train2, _ = bundled_dataset()
    assert time.perf_counter() - t0 < 0.5
    assert "tampered" not in train2[0]["answers"] and len(corpus2) > 0
    assert bundled_dataset(seed=1)[0] != corpus2


# ----------------------------------------------------------------------------- corpus files
def test_corpus_jsonl_round_trip(tmp_path, small):
    corpus = small[1]
    path = save_corpus_jsonl(corpus, tmp_path / "sub" / "corpus.jsonl")
    assert load_corpus_jsonl(path) == corpus
    first = json.loads(path.read_text(encoding="utf-8").splitlines()[0])
    assert set(first) == {"id", "contents"}


def test_corpus_jsonl_errors(tmp_path):
    p = tmp_path / "c.jsonl"
    p.write_text('{"id": 0, "contents": "\\"A\\"\\nx"}\n\n{"id": "1", "contents": \n', encoding="utf-8")
    with pytest.raises(DatasetFormatError, match=r"c\.jsonl:3: not valid JSON"):
        load_corpus_jsonl(p)
    p.write_text('{"id": 0, "contents": "\\"A\\"\\nx"}\n{"id": "1"}\n', encoding="utf-8")
    with pytest.raises(DatasetFormatError, match=r":2: .*contents"):
        load_corpus_jsonl(p)
    p.write_text('{"id": 0, "contents": "\\"A\\"\\nx"}\n', encoding="utf-8")
    assert load_corpus_jsonl(p) == [{"id": "0", "contents": '"A"\nx'}]
    with pytest.raises(FileNotFoundError):
        load_corpus_jsonl(tmp_path / "missing.jsonl")
    with pytest.raises(FileNotFoundError, match="is a directory, not a .jsonl file"):
        load_corpus_jsonl(tmp_path)


def test_split_title():
    assert split_title('"Paris"\nParis is a city.\nSecond line.') == ("Paris", "Paris is a city.\nSecond line.")
    assert split_title('"Paris"\nText', strip_quotes=False) == ('"Paris"', "Text")
    assert split_title("No quotes\nText") == ("No quotes", "Text")
    assert split_title('"He said "hi""\nT') == ('He said "hi"', "T")
    assert split_title('"Only title"') == ("Only title", "")


@settings(max_examples=60, deadline=None)
@given(title=st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\r"), min_size=1)
       .filter(lambda t: t == t.strip()),
       text=st.text(st.characters(blacklist_categories=("Cs",))))
def test_split_title_inverts_contents(title, text):
    assert split_title(f'"{title}"\n{text}') == (title, text)


# ----------------------------------------------------------------------------- parquet
def test_search_r1_parquet_round_trip(tmp_path, small):
    _, _, train, _ = small
    rows = to_search_r1_rows(train[:80], data_source="searchqa", split="train", make_prompt=stand_in_prompt)
    r = rows[3]
    assert set(r) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    assert r["prompt"] == [{"role": "user", "content": stand_in_prompt(train[3]["question"])}]
    assert r["ability"] == "fact-reasoning"
    assert r["reward_model"] == {"style": "rule", "ground_truth": {"target": train[3]["answers"]}}
    assert r["extra_info"]["split"] == "train" and r["extra_info"]["index"] == 3
    path = save_search_r1_parquet(rows, tmp_path / "train.parquet")
    back = load_search_r1_parquet(path)
    # rows keep the file's prompt; "agentgym" marks rows we wrote (SearchQAEnv(prompt="auto") rebuilds theirs)
    assert back == [{**q, "data_source": "searchqa", "schema": "agentgym",
                     "prompt": [{"role": "user", "content": stand_in_prompt(q["question"])}]} for q in train[:80]]
    import pandas as pd   # verl reads these files through pandas / datasets
    df = pd.read_parquet(path)
    assert list(df["prompt"][0][0].keys()) == ["role", "content"]


def test_foreign_search_r1_parquet(tmp_path):
    """A file shaped like Search-R1's own: only split/index in extra_info, question inside the prompt."""
    rows = [{"data_source": src, "prompt": [{"role": "user", "content": stand_in_prompt(q)}],
             "ability": "fact-reasoning",
             "reward_model": {"style": "rule", "ground_truth": {"target": golds}},
             "extra_info": {"split": "train", "index": i}}
            for i, (src, q, golds) in enumerate([("nq", "who wrote hamlet?", ["Shakespeare", "W. Shakespeare"]),
                                                 ("hotpotqa", "which is older, x or y?", ["x"])])]
    path = tmp_path / "foreign.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    back = load_search_r1_parquet(path)
    assert [q["question"] for q in back] == ["who wrote hamlet?", "which is older, x or y?"]
    assert back[0]["answers"] == ["Shakespeare", "W. Shakespeare"]
    assert [q["type"] for q in back] == ["single_hop", "multi_hop"] and [q["hops"] for q in back] == [1, 2]
    assert back[1]["id"] == "hotpotqa-train-1" and back[1]["data_source"] == "hotpotqa"
    assert all(q["needs_search"] and q["gold_doc_ids"] == [] for q in back)
    pq.write_table(pa.table({"question": ["q"]}), tmp_path / "bad.parquet")
    with pytest.raises(DatasetFormatError, match="missing columns"):
        load_search_r1_parquet(tmp_path / "bad.parquet")



@pytest.mark.parametrize("change, message", [
    ({"reward_model": {"style": "rule", "ground_truth": {"target": []}}}, "non-empty list of answers"),
    ({"reward_model": {"style": "rule", "ground_truth": {"target": None}}}, "non-empty list of answers"),
    ({"reward_model": {"style": "rule", "ground_truth": {"target": ["", " "]}}}, "non-empty list of answers"),
    ({"reward_model": {"style": "rule"}}, "no reward_model.ground_truth.target"),
    ({"extra_info": "train-0"}, "'extra_info' must be a struct"),
    ({"extra_info": {"split": "train", "index": 0, "hops": -1}}, "hops must be a whole number >= 0"),
    ({"extra_info": {"split": "train", "index": 0, "hops": 1.5}}, "hops must be a whole number >= 0"),
    ({"prompt": [{"role": "user"}]}, "'prompt' must be a list of"),
])
def test_a_search_r1_parquet_row_that_cannot_be_scored_is_a_format_error_naming_the_row(tmp_path, change, message):
    good = {"data_source": "nq", "prompt": [{"role": "user", "content": stand_in_prompt("who wrote hamlet?")}],
            "reward_model": {"style": "rule", "ground_truth": {"target": ["Shakespeare"]}},
            "extra_info": {"split": "train", "index": 0}}
    path = tmp_path / "rows.parquet"
    rows = [good, {**good, **change}]
    try:
        pq.write_table(pa.Table.from_pylist(rows), path)
    except pa.ArrowInvalid:      # a column's type changes (a struct beside a string): a file of the bad row alone
        rows = rows[1:]
        pq.write_table(pa.Table.from_pylist(rows), path)
    with pytest.raises(DatasetFormatError, match=rf"rows.parquet: row {len(rows) - 1}\b.*{re.escape(message)}"):
        load_search_r1_parquet(path)
    one = {**good, "reward_model": {"style": "rule", "ground_truth": {"target": "1984"}}}
    pq.write_table(pa.Table.from_pylist([one]), path)
    assert [q["answers"] for q in load_search_r1_parquet(path)] == [["1984"]]   # one answer, as text


# ----------------------------------------------------------------------------- FlashRAG
def _write_jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def _flashrag_dir(root):
    for ds, split, n in [("nq", "train", 3), ("nq", "test", 2), ("hotpotqa", "train", 2),
                         ("hotpotqa", "dev", 2), ("bamboogle", "test", 1), ("popqa", "train", 2)]:
        _write_jsonl(root / ds / f"{split}.jsonl",
                     [{"id": f"{split}_{i}", "question": f"{ds} {split} question {i}?",
                       "golden_answers": [f"{ds}-{split}-{i}", "alias"]} for i in range(n)])
    return root


def test_prepare_flashrag(tmp_path):
    src = _flashrag_dir(tmp_path / "flashrag")
    out = prepare_flashrag(src, tmp_path / "out", datasets=("nq", "hotpotqa", "bamboogle", "popqa"),
                           make_prompt=stand_in_prompt)
    assert set(out) == {"train", "test"}
    train = load_search_r1_parquet(out["train"])
    test = load_search_r1_parquet(out["test"])
    assert [q["question"] for q in train] == [f"nq train question {i}?" for i in range(3)] + \
        [f"hotpotqa train question {i}?" for i in range(2)]
    # Evaluation split preference: test > dev > train.
    assert [(q["data_source"], q["answers"][0]) for q in test] == [
        ("nq", "nq-test-0"), ("nq", "nq-test-1"), ("hotpotqa", "hotpotqa-dev-0"), ("hotpotqa", "hotpotqa-dev-1"),
        ("bamboogle", "bamboogle-test-0"), ("popqa", "popqa-train-0"), ("popqa", "popqa-train-1")]
    assert test[0]["answers"] == ["nq-test-0", "alias"] and test[0]["id"] == "test_0"
    assert [q["type"] for q in test][2:5] == ["multi_hop"] * 3
    raw = pq.read_table(out["test"]).to_pylist()
    assert [r["extra_info"]["index"] for r in raw] == list(range(7))
    assert {r["extra_info"]["split"] for r in raw} == {"test"}
    assert raw[0]["prompt"][0]["content"] == stand_in_prompt("nq test question 0?")
    # A list of files works too; only the test file is written when no train datasets are asked for.
    files = [src / "nq" / "test.jsonl", src / "bamboogle" / "test.jsonl"]
    out2 = prepare_flashrag(files, tmp_path / "out2", datasets=("nq", "bamboogle"), train_datasets=(),
                            make_prompt=stand_in_prompt, limit=1)
    assert set(out2) == {"test"} and not (tmp_path / "out2" / "train.parquet").exists()
    assert len(load_search_r1_parquet(out2["test"])) == 2


def test_retriever_prep_command(tmp_path):
    """The CLI as a user types it: spaces after the commas are fine; an empty name is a usage error."""
    src = _flashrag_dir(tmp_path / "flashrag")
    cli = [sys.executable, "-m", "agentgym.app.cli", "retriever", "prep", str(src)]
    r = subprocess.run([*cli, "--out", str(tmp_path / "out"), "--datasets", "nq, bamboogle", "--limit", "1"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-800:]
    assert [q["data_source"] for q in load_search_r1_parquet(tmp_path / "out" / "test.parquet")] == ["nq", "bamboogle"]
    assert len(load_search_r1_parquet(tmp_path / "out" / "train.parquet")) == 2  # nq + hotpotqa, 1 row each
    r = subprocess.run([*cli, "--out", str(tmp_path / "out"), "--datasets", "nq", "--limit", "2"],
                       capture_output=True, text=True, timeout=120)     # files already there: kept, said in one line
    assert r.returncode == 2 and r.stderr.strip() == (
        f"error: FileExistsError: {tmp_path / 'out' / 'train.parquet'}, {tmp_path / 'out' / 'test.parquet'} already "
        "exist; pass overwrite=True (--overwrite) to replace")
    assert len(load_search_r1_parquet(tmp_path / "out" / "train.parquet")) == 2
    r = subprocess.run([*cli, "--out", str(tmp_path / "out"), "--datasets", "nq", "--limit", "2", "--overwrite"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and len(load_search_r1_parquet(tmp_path / "out" / "train.parquet")) == 4
    r = subprocess.run([*cli, "--out", str(tmp_path / "out2"), "--datasets", "nq,"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "error: ValueError: dataset names must not be empty, got train ['nq', 'hotpotqa'] and test ['nq', '']"]
    assert not (tmp_path / "out2").exists()


def test_prepare_flashrag_errors(tmp_path):
    src = _flashrag_dir(tmp_path / "flashrag")
    with pytest.raises(FileNotFoundError, match=r"musique/test\.jsonl"):
        prepare_flashrag(src, tmp_path / "out", datasets=("musique",), make_prompt=stand_in_prompt)
    with pytest.raises(FileNotFoundError):
        prepare_flashrag(tmp_path / "nowhere", tmp_path / "out", make_prompt=stand_in_prompt)
    for limit in (0, -1, 1.5, True):     # a slice [:-1] would have dropped the last row of each file silently
        with pytest.raises(ValueError, match="limit must be a row count >= 1"):
            prepare_flashrag(src, tmp_path / "out", datasets=("nq",), make_prompt=stand_in_prompt, limit=limit)
    assert not (tmp_path / "out").exists()
    bad = src / "nq" / "test.jsonl"
    bad.write_text('{"id": "0", "question": "q?", "golden_answers": ["a"]}\n{"id": "1", "question": "q2?"\n')
    with pytest.raises(DatasetFormatError, match=r"nq/test\.jsonl:2: not valid JSON"):
        prepare_flashrag(src, tmp_path / "out", datasets=("nq",), make_prompt=stand_in_prompt)
    bad.write_text('{"id": "0", "question": "q?", "golden_answers": ["a"]}\n'
                   '{"id": "1", "question": "q2?", "golden_answers": {"a": 1}}\n')
    with pytest.raises(DatasetFormatError, match=r":2: 'golden_answers'"):
        prepare_flashrag(src, tmp_path / "out", datasets=("nq",), make_prompt=stand_in_prompt)
    # the train files were fine, but nothing is written when a test file is not: no half-prepared folder
    assert not (tmp_path / "out").exists()
    for names in (("nq", ""), (" ",)):
        with pytest.raises(ValueError, match="dataset names must not be empty"):
            prepare_flashrag(src, tmp_path / "out", datasets=names, make_prompt=stand_in_prompt)
