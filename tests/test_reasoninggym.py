"""``agentgym/ReasoningGym-v0``: reasoning-gym's real generators and scorers behind the env API — the oracle
scores 1, a wrong answer 0, splits are disjoint and deduplicated, a mix keeps its weights, a bad config is one
clear line, and ``agentgym eval --policy oracle`` runs it end to end."""

from __future__ import annotations

import json
import re
import time
from collections import Counter

import pytest

pytest.importorskip("reasoning_gym", reason="reasoning-gym is not installed (pip install reasoning-gym)")

import agentgym  # noqa: E402
from agentgym.envs.reasoninggym import ReasoningGymEnv, _split_tasks, dataset_names  # noqa: E402
from agentgym.splits import SPLITS, normalise_task_text  # noqa: E402

ORACLE_TASKS = ["basic_arithmetic", "chain_sum", "leg_counting", "gsm_symbolic", "shortest_path",
                "syllogism", "family_relationships", "graph_color"]  # graph_color: answer None, metadata example


def play(env: ReasoningGymEnv, index: int, reply: str | None = None):
    """One episode of task ``index`` answered with ``reply`` (default: the oracle's)."""
    _, info = env.reset(options={"task_index": index})
    task = info["privileged"]["task"]
    reply = ReasoningGymEnv.oracle({"task": task, "turn": 0}) if reply is None else reply
    return task, env.step(reply)


@pytest.mark.parametrize("name", ORACLE_TASKS)
def test_oracle_scores_one(name):
    env = ReasoningGymEnv(task=name, split="test", size=5)
    for i in range(env.num_tasks):
        task, (obs, reward, terminated, truncated, info) = play(env, i)
        assert task["dataset"] == name and task["question"] in env.messages[1]["content"]
        assert (reward, terminated, truncated) == (1.0, True, False), (task, info)
        assert info["episode_summary"]["success"] and info["reward_terms"] == {"score": 1.0, "invalid": 0.0}


def test_wrong_answer_scores_zero_and_a_reply_without_a_tag_is_invalid():
    env = ReasoningGymEnv(task="chain_sum", split="test", size=3)
    task, (_, reward, terminated, _, info) = play(env, 0, f"<answer>{int(env.get_task(0)['answer']) + 1}</answer>")
    assert (reward, terminated, info["score"], info["episode_summary"]["success"]) == (0.0, True, 0.0, False)
    # no tag: invalid, said in the observation, penalised; the default second turn may still answer
    _, info = env.reset(options={"task_index": 1})
    obs, reward, terminated, truncated, info = env.step("The answer is 12.")
    assert info["action_type"] == "invalid" and "<answer>" in obs[0]["content"] and reward == pytest.approx(-0.1)
    assert not terminated and not truncated
    _, reward, terminated, _, info = env.step(ReasoningGymEnv.oracle({"task": env.task}))
    assert terminated and reward == 1.0 and info["episode_summary"]["return"] == pytest.approx(0.9)
    # one turn only: the invalid reply ends the episode
    env1 = ReasoningGymEnv(task="chain_sum", split="test", size=3, max_turns=1)
    env1.reset(options={"task_index": 0})
    _, _, terminated, truncated, info = env1.step("no tag here")
    assert truncated and not terminated and not info["episode_summary"]["success"]


def test_flexible_answers_take_a_reply_without_the_tag():
    """answer_format="flexible": the tag first, else Math-v0's order (boxed, "answer is", last number); the
    score stays the dataset's own, and info says which rule found the answer."""
    env = ReasoningGymEnv(task="chain_sum", split="test", size=4, answer_format="flexible")
    gold = int(env.get_task(0)["answer"])
    cases = [(f"So the total is {gold}.", "last_number", 1.0), (f"The answer is {gold + 1}, not {gold}.", "phrase", 0.0),
             (f"\\boxed{{{gold}}} then 5", "boxed", 1.0), (f"<answer>{gold}</answer> and {gold + 3}", "tag", 1.0),
             (f"<answer>{gold + 1}</answer> but {gold}", "tag", 0.0)]
    for reply, rule, score in cases:
        _, (_, reward, terminated, _, info) = play(env, 0, reply)
        assert (info["extraction"], info["score"], reward, terminated) == (rule, score, score, True), reply
    # nothing to extract: still invalid, with the same observation and penalty as under "tag"
    _, (obs, reward, terminated, _, info) = play(env, 0, "I do not know.")
    assert info["action_type"] == "invalid" and not terminated and reward == pytest.approx(-0.1)
    # the default is reasoning-gym's own rule: the same reply without a tag is invalid
    strict = ReasoningGymEnv(task="chain_sum", split="test", size=4)
    _, (_, _, terminated, _, info) = play(strict, 0, f"So the total is {gold}.")
    assert info["action_type"] == "invalid" and not terminated


def test_partial_credit_is_the_datasets_own_score():
    """leg_counting keeps reasoning-gym's default score_answer: partial credit for a reply containing the answer."""
    env = ReasoningGymEnv(task="leg_counting", split="test", size=2)
    answer = env.get_task(0)["answer"]
    _, (_, reward, *_, info) = play(env, 0, f"<answer>{answer} legs in total</answer>")
    from reasoning_gym import create_dataset
    expected = create_dataset("leg_counting").score_answer(f"{answer} legs in total", env.get_task(0))
    assert 0 < expected < 1 and reward == pytest.approx(expected) and not info["episode_summary"]["success"]


@pytest.mark.parametrize("name, config", [
    ("basic_arithmetic", {"min_terms": 2, "max_terms": 2, "max_digits": 1, "operators": ["+"],
                          "allow_parentheses": False}),
    ("chain_sum", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "allow_negation": False}),
    ("leg_counting", {"min_animals": 1, "max_animals": 1, "max_instances": 3}),
])
def test_splits_are_disjoint_and_deduplicated(name, config):
    """Small question spaces force repeats: each one is dropped, within a split and across splits."""
    sizes = {"train": 60, "validation": 10, "test": 10}
    envs = {s: ReasoningGymEnv(task=name, task_config=config, split=s, size=sizes) for s in SPLITS}
    questions = {s: [normalise_task_text(envs[s].get_task(i)["question"]) for i in range(sizes[s])] for s in SPLITS}
    for s in SPLITS:
        assert envs[s].num_tasks == sizes[s] and len(set(questions[s])) == sizes[s]
    assert not set(questions["train"]) & set(questions["validation"])
    assert not set(questions["train"]) & set(questions["test"])
    assert not set(questions["validation"]) & set(questions["test"])
    drawn = max(envs["train"].get_task(i)["source_index"] for i in range(sizes["train"]))
    assert drawn >= sizes["train"], "no repeat was drawn: the test would not see the deduplication"
    # deterministic: drawn afresh (the per-process cache emptied), the split is the same
    _split_tasks.cache_clear()
    again = ReasoningGymEnv(task=name, task_config=config, split="train", size=sizes)
    assert [again.get_task(i) for i in range(5)] == [envs["train"].get_task(i) for i in range(5)]


def test_too_small_a_question_space_says_so():
    config = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "allow_negation": False}
    env = ReasoningGymEnv(task="chain_sum", task_config=config, split="test", size=500)
    with pytest.raises(ValueError, match="distinct new questions .* ask for fewer"):
        env.reset()


def test_seeds_give_other_questions():
    a = ReasoningGymEnv(split="test", size=5, seed=0)
    b = ReasoningGymEnv(split="test", size=5, seed=1)
    assert [a.get_task(i)["question"] for i in range(5)] != [b.get_task(i)["question"] for i in range(5)]


def test_a_mix_keeps_its_weights_and_scores_each_task_by_its_own_dataset():
    env = ReasoningGymEnv(tasks={"basic_arithmetic": 3, "leg_counting": 1}, split="test", size=400,
                          task_config={"leg_counting": {"min_animals": 1, "max_animals": 2}})
    counts = Counter(env.get_task(i)["dataset"] for i in range(400))
    assert set(counts) == {"basic_arithmetic", "leg_counting"}
    assert abs(counts["basic_arithmetic"] / 400 - 0.75) < 0.07
    assert all(env.get_task(i)["metadata"]["num_animals"] <= 2
               for i in range(400) if env.get_task(i)["dataset"] == "leg_counting")
    for i in range(6):
        _, (_, reward, *_) = play(env, i)
        assert reward == 1.0


def test_a_task_given_at_reset_is_scored_by_its_dataset():
    from reasoning_gym import create_dataset
    entry = create_dataset("syllogism", seed=3, size=1)[0]
    env = ReasoningGymEnv(split="test", size=2)
    env.reset(options={"task": {**entry, "dataset": "syllogism"}})
    _, reward, *_ = env.step(f"<answer>{entry['answer']}</answer>")
    assert reward == 1.0


@pytest.mark.parametrize("kwargs, message", [
    ({"task": "basic_arithmetc"}, "unknown reasoning-gym dataset 'basic_arithmetc' (did you mean basic_arithmetic"),
    ({"task": "nope"}, "valid: ab, acre,"),
    ({"task_config": {"max_term": 3}}, "basic_arithmetic: unknown config key(s) max_term; valid: allow_negation,"),
    ({"task_config": {"seed": 3}}, "seed is set by the env"),
    ({"task_config": {"min_terms": 0}}, "basic_arithmetic: bad config {'min_terms': 0}: min_terms must be positive"),
    ({"task": "chain_sum", "tasks": {"chain_sum": 1}}, "not both"),
    ({"tasks": {"chain_sum": 0}}, "weight of 'chain_sum' must be a positive number"),
    ({"tasks": {"chain_sum": 1}, "task_config": {"leg_counting": {}}}, "task_config maps some of the mix"),
    ({"split": "dev"}, "split must be one of ['train', 'validation', 'test']"),
    ({"size": {"tests": 3}}, "unknown split(s) ['tests']"),
    ({"size": 0}, "must be a positive int"),
    ({"seed": -1}, "seed must be an int in [0, 2**30)"),
    ({"answer_format": "loose"}, "answer_format must be one of ['tag', 'flexible'], got 'loose'"),
    ({"size": 10**9}, "size of the train split must be at most 100000, got 1000000000"),   # drew for hours
    ({"size": {"test": 100_001}}, "size of the test split must be at most 100000"),
    ({"tasks": {"chain_sum": float("inf")}}, "'chain_sum' must be a positive number (not inf or nan), got inf"),
    ({"max_action_chars": -5}, "max_action_chars must be >= 1, got -5"),
    ({"max_turns": 0}, "max_turns must be >= 1, got 0"),
])
def test_bad_configs_are_one_line_errors(kwargs, message):
    with pytest.raises(ValueError) as e:
        ReasoningGymEnv(**kwargs)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_wrong_types_are_named_through_gymnasium_make_too():
    import gymnasium as gym
    for bad, message in (({"max_turns": "x"}, "max_turns must be int, got 'x'"),
                         ({"max_action_chars": "big"}, "max_action_chars must be int, got 'big'"),
                         ({"size": "abc"}, "size of the train split must be a positive int, got 'abc'"),
                         ({"task_config": "abc"}, "the config of 'basic_arithmetic' must be a mapping of its fields")):
        with pytest.raises((TypeError, ValueError), match=re.escape(message)):
            gym.make("agentgym/ReasoningGym-v0", **bad)


def test_a_failed_reset_leaves_the_env_usable():
    """Bad seeds, task indices and options are one clear error each, and the env plays on afterwards (Gymnasium
    1.4's env checker broke the first step when the very first reset had raised; agentgym.make mends that)."""
    import gymnasium as gym
    for first_reset_fails in (True, False):
        env = agentgym.make("ReasoningGym-v0", split="test", size=3)
        if not first_reset_fails:
            env.reset(seed=0)
        with pytest.raises(gym.error.Error, match="Seed must be a python integer"):
            env.reset(seed="abc")
        for options, message in (({"task_index": 10**9}, "task_index 1000000000 out of range [0, 3)"),
                                 ({"task_index": "1"}, "options['task_index'] must be an int, got '1'"),
                                 ([1], "options must be a mapping"),
                                 ({"task": "x"}, "options['task'] must be a mapping, got str")):
            with pytest.raises(ValueError, match=re.escape(message)):
                env.reset(options=options)
        _, info = env.reset(options={"task_index": 2})
        reply = ReasoningGymEnv.oracle({"task": info["privileged"]["task"]})
        obs, reward, terminated, truncated, info = env.step(reply)
        assert (reward, terminated) == (1.0, True)
        with pytest.raises(RuntimeError, match="finished episode; call reset"):
            env.step(reply)
        env.close()


def test_hostile_replies_are_scored_or_invalid_never_raised():
    for answer_format in ("tag", "flexible"):
        env = ReasoningGymEnv(split="test", size=2, answer_format=answer_format)
        for reply in ("", "\ud800", "\x00<answer>\x00</answer>", f"<answer>{'9' * 10_000}</answer>",
                      "\\boxed{" * 2000, "<answer>" * 2000, "x" * (1 << 20), "1 " * 8000):
            env.reset(options={"task_index": 0})
            start = time.monotonic()
            obs, reward, terminated, truncated, info = env.step(reply)
            assert time.monotonic() - start < 5, (answer_format, reply[:20])
            assert info["action_type"] in ("invalid", "answer") and 0.0 <= info.get("score", 0.0) <= 1.0


def test_registered_and_listed():
    env = agentgym.make("ReasoningGym-v0", task="leg_counting", split="validation", size=3)
    assert env.unwrapped.num_tasks == 3 and env.unwrapped.task_names == ["leg_counting"]
    assert "leg_counting" in dataset_names() and "composite" not in dataset_names()


def test_agentgym_eval_with_the_oracle(tmp_path):
    from agentgym.app.cli import main
    out = tmp_path / "eval.json"
    rc = main(["eval", "ReasoningGym-v0", "--policy", "oracle", "--episodes", "4", "--json", str(out),
               "--env-kwarg", 'tasks={"chain_sum": 1, "syllogism": 1}', "--env-kwarg", "size=8"])
    assert rc == 0
    result = json.loads(out.read_text())
    assert result["env"] == "agentgym/ReasoningGym-v0" and result["env_kwargs"]["split"] == "test"
    assert result["metrics"]["success_rate"] == 1.0 and result["metrics"]["episodes"] == 4, result["metrics"]
