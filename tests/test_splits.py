"""Held-out splits (agentgym/splits.py): the helpers, and every built-in env's train / validation / test
sets checked disjoint and free of duplicates by normalised question text."""

from __future__ import annotations

import hashlib
import json

import pytest

import agentgym
from agentgym.splits import (SPLITS, DistinctDraws, SplitExhausted, check_split, check_splits,
                             normalise_task_text, split_of)
from agentgym.envs.arithmetic import ArithmeticEnv
from agentgym.envs.codeexec.problems import ProblemFormatError, bundled_problems, load_problems, select_split, task_text
from agentgym.envs.codeexec.problems import split_of as problem_split
from agentgym.envs.mathrl.problems import make_problem
from agentgym.envs.searchqa.data import bundled_questions
from agentgym.envs.toolcall import ToolCallEnv
from agentgym.envs.toolcall.tasks import task_key


def _check(named: dict[str, list[str]], counts: dict[str, int]) -> None:
    """No duplicate in a split, no text in two splits, and each split as long as asked."""
    check_splits(named)
    assert {s: len(v) for s, v in named.items()} == counts


# --------------------------------------------------------------------------- helpers
def test_normalise_task_text_ignores_case_width_and_whitespace():
    assert normalise_task_text("  Compute\t3 +  4.\n") == "compute 3 + 4."
    assert normalise_task_text("ＷＨＡＴ is 2?") == normalise_task_text("what is 2?")  # NFKC: full-width letters
    assert normalise_task_text("3 - 4") != normalise_task_text("3 4")  # punctuation is content


def test_split_of_is_a_stable_hash_whose_test_rule_predates_validation():
    keys = [f"question {i}" for i in range(3000)]
    splits = [split_of(k) for k in keys]
    assert set(splits) == set(SPLITS) and splits == [split_of(k) for k in keys]
    shares = {s: splits.count(s) / len(keys) for s in SPLITS}
    assert 0.17 < shares["test"] < 0.23 and 0.17 < shares["validation"] < 0.23 and 0.56 < shares["train"] < 0.64
    for k in keys[:300]:  # the rule the envs used before validation existed picks the same test tasks
        h = int.from_bytes(hashlib.sha256(k.encode()).digest()[:8], "big")
        assert (split_of(k, test_every=4) == "test") == (h % 4 == 0)
    with pytest.raises(ValueError, match="must be >= 2"):
        split_of("x", test_every=1)


def test_check_split_names_the_choices():
    assert check_split("validation") == "validation" and check_split(None, allow_none=True) is None
    with pytest.raises(ValueError, match=r"split must be one of \['train', 'validation', 'test'\], got 'dev'"):
        check_split("dev")
    for make in (lambda: ArithmeticEnv(split="dev"), lambda: ToolCallEnv(split="dev"),
                 lambda: agentgym.make("Math-v0", split="dev")):
        with pytest.raises(ValueError, match="split must be one of"):
            make()


def test_check_splits_reports_a_duplicate_or_a_leak_in_one_line():
    check_splits({"train": ["What is 2?", "What is 3?"], "test": ["What is 4?"]})
    with pytest.raises(ValueError, match=r"^q.jsonl: duplicate task in split 'test' \(#0 and #2\): 'what is 2\?'$"):
        check_splits({"test": ["What is 2?", "What is 3?", "what is  2?"]}, source="q.jsonl")
    with pytest.raises(ValueError, match=r"task in two splits, 'train' \(#1\) and 'validation' \(#0\)"):
        check_splits({"train": ["a", "B"], "validation": ["b "]})


def test_distinct_draws_never_repeat_and_stop_honestly_when_the_pool_runs_out():
    def draw(index: int, attempt: int) -> int:  # 40 values, a seeded stream with many repeats
        return int(hashlib.sha256(f"{index}/{attempt}".encode()).hexdigest(), 16) % 40

    def in_split(split):
        return lambda v: split_of(str(v)) == split

    pools = {s: [v for v in range(40) if split_of(str(v)) == s] for s in SPLITS}
    for split in ("validation", "test"):
        seq = DistinctDraws(split, draw, key=str, in_split=in_split(split), what="numbers")
        got = [seq.get(i) for i in range(len(pools[split]))]
        assert sorted(got) == pools[split]  # every value of the split once, none of another split
        with pytest.raises(SplitExhausted, match=f"split '{split}' holds only {len(pools[split])} distinct numbers"):
            seq.get(len(pools[split]))
    train = DistinctDraws("train", draw, key=str, in_split=in_split("train"), prefix=50)
    got = [train.get(i) for i in range(60)]
    assert sorted(got[:len(pools["train"])]) == pools["train"]  # distinct first, then repeats (training samples)
    assert set(got) == set(pools["train"]) and train.get(10**9) in pools["train"]  # beyond the prefix: one draw


def test_a_duplicate_in_a_users_problem_file_is_an_error_at_load(tmp_path):
    problem = {"task_id": "a", "statement": "Write f(x) returning x + 1.", "entry_point": "f",
               "tests": [{"kind": "assert", "code": "assert f(1) == 2"}], "solution": "def f(x):\n    return x + 1\n"}
    path = tmp_path / "mine.jsonl"
    path.write_text("\n".join(json.dumps(p) for p in (problem, {**problem, "task_id": "b",
                                                                "statement": "write f(x)  returning x + 1."})))
    with pytest.raises(ProblemFormatError, match=r"mine.jsonl: duplicate problem in split 'file' \(#0 and #1\)"):
        load_problems(path)
    first = bundled_problems()[0]  # its text again, under an id of another split
    twin = {**first, "task_id": next(f"twin-{i}" for i in range(100)
                                     if problem_split(f"twin-{i}") != problem_split(first["task_id"]))}
    with pytest.raises(ValueError, match="problem in two splits"):
        select_split(bundled_problems() + [twin], "train")


# --------------------------------------------------------------------------- every built-in env
def test_math_splits_are_disjoint_and_repeat_no_question():
    for kwargs, n in (({}, {"train": 300, "validation": 300, "test": 300}),
                      ({"kinds": ("arithmetic",), "difficulty": 0}, {"train": 300, "validation": 200, "test": 200})):
        _check({s: [make_problem(s, i, **kwargs)["question"] for i in range(k)] for s, k in n.items()}, n)
    # the main job's warm-up level: 256 distinct test questions exist, and asking past them is an error
    warm = {"kinds": ("arithmetic",), "difficulty": 0}
    assert len({make_problem("test", i, **warm)["question"] for i in range(256)}) == 256
    with pytest.raises(SplitExhausted, match="split 'test' holds only 256 distinct questions"):
        make_problem("test", 256, **warm)
    env = agentgym.make("Math-v0", split="validation", kinds=["arithmetic"], difficulty=0)
    obs, info = env.reset(options={"task_index": 3})
    assert info["privileged"]["task"] == make_problem("validation", 3, **warm)


def test_arithmetic_splits_are_disjoint_and_repeat_no_question():
    n = {"train": 300, "validation": 150, "test": 150}
    _check({s: [ArithmeticEnv(split=s).get_task(i)["question"] for i in range(k)] for s, k in n.items()}, n)
    n = {s: 300 for s in SPLITS}
    _check({s: [ArithmeticEnv(split=s, hard_fraction=1.0).get_task(i)["question"] for i in range(300)]
            for s in SPLITS}, n)


def test_codeexec_bundled_problems_split_three_ways_without_duplicates():
    problems = bundled_problems()
    named = {s: [task_text(p) for p in select_split(problems, s)] for s in SPLITS}
    _check(named, {"train": 32, "validation": 6, "test": 13})


@pytest.mark.parametrize("size, n", [("tiny", (200, 60, 60)), ("small", (1000, 300, 300))])
def test_searchqa_bundled_questions_split_three_ways_without_duplicates(size, n):
    named = {s: [q["question"] for q in bundled_questions(s, size=size)] for s in SPLITS}
    _check(named, dict(zip(SPLITS, n)))


def test_react_questions_come_from_the_disjoint_searchqa_splits():
    named = {s: [q["question"] for q in agentgym.make("ReAct-v0", split=s, retriever="bm25").unwrapped.questions]
             for s in SPLITS}
    check_splits(named)
    assert min(len(v) for v in named.values()) >= 100


def test_toolcall_splits_never_show_the_same_task_twice():
    n = {s: 150 for s in SPLITS}
    named = {s: [task_key(ToolCallEnv(split=s).get_task(i)) for i in range(150)] for s in SPLITS}
    _check(named, n)
