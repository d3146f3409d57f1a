"""Math-v0: generated problems (deterministic, disjoint splits, any size), the oracle, answer extraction
order and numeric-equivalence goldens, every reward term, the Python tool mode (real sandbox), and the
reward-hacking detectors (a hacked response scores lower than an honest one once weighted)."""

from __future__ import annotations

from fractions import Fraction

import re
import gymnasium as gym
import pytest

import agentgym
from agentgym.app.checking import check_invalid_step, run_check_env
from agentgym.envs.mathrl import MathEnv, answers_equal, extract_answer, make_problem, parse_number
from agentgym.envs.mathrl.env import count_reasoning_steps, repetition_score, think_format_ok
from agentgym.envs.mathrl.problems import KINDS, split_of
from agentgym.envs.services.sandbox import SandboxRefusedError, best_sandbox

ENV_ID = "agentgym/Math-v0"
if ENV_ID not in gym.registry:
    agentgym.register("Math-v0", entry_point="agentgym.envs.mathrl.env:MathEnv")

DETECTORS_ON = {"guessing": 0.5, "repetition": 0.5, "length": 0.5}


def honest(task: dict) -> str:
    return MathEnv.oracle({"task": task, "turn": 0, "messages": []})


def play(env, action: str, index: int = 0, **reset):
    obs, info = env.reset(options={"task_index": index}, **reset)
    task = info["privileged"]["task"]
    return task, env.step(action.format(answer=task["answer"]) if "{answer}" in action else action)


# --------------------------------------------------------------------------- problems
def test_problems_are_deterministic_any_size_and_correct():
    for split in ("train", "test"):
        for i in range(300):
            p = make_problem(split, i)
            assert p == make_problem(split, i)
            assert Fraction(eval(p["python"], {"F": Fraction})) == parse_number(p["answer"])  # noqa: S307 - ours
            assert p["kind"] in KINDS and 1 <= p["difficulty"] <= 3 and p["min_steps"] == len(p["steps"]) >= 1
            assert split_of(p["question"]) == split
    assert make_problem("train", 5) != make_problem("train", 6)
    big = make_problem("train", 10**12, kinds=("arithmetic",), difficulty=30)
    assert big["min_steps"] == 31 and len(big["question"]) > 200
    assert Fraction(eval(big["python"], {"F": Fraction})) == parse_number(big["answer"])  # noqa: S307
    for kind in KINDS:
        assert make_problem("test", 3, kinds=(kind,), difficulty=6)["kind"] == kind
    with pytest.raises(ValueError, match="split"):
        make_problem("dev", 0)


def test_train_and_test_questions_are_disjoint():
    train = {make_problem("train", i, difficulty=1)["question"] for i in range(1500)}
    test = {make_problem("test", i, difficulty=1)["question"] for i in range(1500)}
    assert len(test) > 300 and not train & test  # easy problems collide often; the splits never share one


def test_oracle_solves_many_generated_problems():
    env = agentgym.make("Math-v0", difficulty=(1, 6))
    for i in range(400):
        obs, info = env.reset(options={"task_index": i})
        assert [m["role"] for m in obs] == ["system", "user"] and "\\boxed{}" in obs[0]["content"]
        obs, reward, terminated, truncated, info = env.step(honest(info["privileged"]["task"]))
        assert terminated and not truncated and obs == []
        assert info["episode_summary"]["success"], info
        assert reward == pytest.approx(1.0)
        raw = info["raw_reward_terms"]
        assert (raw["correct"], raw["format"], raw["guessing"], raw["repetition"], raw["length"]) == (1, 1, 0, 0, 0)
        assert info["answer_method"] == "boxed"


# --------------------------------------------------------------------------- extraction and equivalence
@pytest.mark.parametrize("text, answer, method", [
    (r"<think>3 + 4 = 7</think> The answer is \boxed{7}. Or 8", "7", "boxed"),
    (r"\boxed{1} first, then \boxed{\frac{2}{3}}", r"\frac{2}{3}", "boxed"),   # the last box
    (r"\boxed{x = -2}", "x = -2", "boxed"),
    (r"\boxed{} so the answer is 5", "5", "phrase"),                            # an empty box is no answer
    ("So the answer is 12 apples, not 15.", "12", "phrase"),
    ("**Answer:** -3/4", "-3/4", "phrase"),
    ("Final Answer: The final answer is $\\frac{3}{4}$. I hope it is correct.", "\\frac{3}{4}", "phrase"),
    ("answer = 1,234,567 in total", "1,234,567", "phrase"),
    ("We get 12, then 3 x 4 = 12, so 12.5", "12.5", "last_number"),
    ("10 - 3 leaves 7", "7", "last_number"),                                     # "- 3" is not "-3"
    ("x=-3", "-3", "last_number"),
    ("2024-05-06", "06", "last_number"),
    ("it is \\dfrac12 of it", "\\dfrac12", "last_number"),
])
def test_extraction_order(text, answer, method):
    found = extract_answer(text)
    assert (found.text, found.method) == (answer, method)
    assert text.replace("\u2212", "-")[found.start:found.end].endswith(answer if method != "boxed" else "}")


@pytest.mark.parametrize("text", ["", "no digits here", "\\boxed{}", "The answer is unclear."])
def test_no_answer(text):
    assert extract_answer(text) is None


@pytest.mark.parametrize("written, gold", [
    ("0.5", "1/2"), ("1/2", "1/2"), (r"\frac{1}{2}", "1/2"), (r"\dfrac12", "1/2"), (r"\tfrac{1}{2}", "1/2"),
    (".5", "1/2"), ("-3", "-3"), ("3.0", "3"), ("3.", "3"), ("+3", "3"), ("\u22123", "-3"), ("(-3)", "-3"),
    (r"-\frac{3}{4}", "-3/4"), (r"\frac{-3}{4}", "-3/4"), ("-0.75", "-3/4"), ("6/8", "3/4"),
    ("1,234", "1234"), ("1{,}234", "1234"), (r"1\,234", "1234"), ("1,234,567.5", "2469135/2"),
    (r"1\frac{1}{2}", "3/2"), ("1 1/2", "3/2"), ("-1 1/2", "-3/2"), ("$12", "12"), (r"\$12.50", "25/2"),
    (r"12 \text{ apples}", "12"), ("5 km/h", "5"), ("x = 5", "5"), ("{7}", "7"), ("1e3", "1000"),
    ("50%", "50"), (r"50\%", "50"),
])
def test_equal_numbers_in_different_forms(written, gold):
    assert answers_equal(written, gold)


@pytest.mark.parametrize("written, gold", [
    ("50%", "1/2"),          # "%" is a unit: 50% is 50, not one half
    ("0.333", "1/3"),        # exact rationals: no rounding tolerance
    ("-3", "3"), ("1/3", "3"), ("12", "1,2"), (r"\sqrt{2}", "2"), ("pi", "3"), ("", "0"), (None, "0"),
    ("3/0", "0"), ("1e999999", "1"), ("1" * 300, "1"), ("1 234", "1234 5"),
])
def test_different_or_unparseable_numbers(written, gold):
    assert not answers_equal(written, gold)


# --------------------------------------------------------------------------- reward terms
def test_reward_terms_correct_and_format():
    env = agentgym.make("Math-v0")
    cases = {
        "<think>\nworking: 2 + 2 = 4\n</think>\nThe answer is \\boxed{{{answer}}}.": (0.9, 0.1),
        "Working it out, the answer is \\boxed{{{answer}}}.": (0.9, 0.0),            # no think block
        "<think>\n</think>\n\\boxed{{{answer}}}": (0.9, 0.0),                        # empty reasoning
        "\\boxed{{{answer}}} <think>1 + 1 = 2</think>": (0.9, 0.0),                  # answer before think
        "<think>1 + 1 = 2</think> so it is {answer}": (0.9, 0.0),                    # no box
        "<think>\n1 + 1 = 2\n</think>\nThe answer is \\boxed{{-987654321}}.": (0.0, 0.1),  # wrong, well formatted
    }
    for action, (correct, fmt) in cases.items():
        task, (obs, reward, terminated, truncated, info) = play(env, action, index=4)
        assert terminated and info["action_type"] == "answer"
        assert info["reward_terms"]["correct"] == pytest.approx(correct), action
        assert info["reward_terms"]["format"] == pytest.approx(fmt), action
        assert reward == pytest.approx(correct + fmt)
        assert info["episode_summary"]["success"] is (correct > 0)


def test_reply_without_an_answer_is_invalid_then_truncated():
    env = agentgym.make("Math-v0")
    env.reset(seed=3)
    obs, reward, terminated, truncated, info = env.step("Let me think about this problem carefully.")
    assert info["action_type"] == "invalid" and not terminated and not truncated
    assert "\\boxed{}" in obs[0]["content"] and check_invalid_step(obs, info) is None
    assert info["reward_terms"]["invalid"] == pytest.approx(-0.1) and reward == pytest.approx(-0.1)
    obs, reward, terminated, truncated, info = env.step("Still thinking.")
    assert truncated and not terminated  # max_turns=2: one retry
    assert info["episode_summary"]["invalid_actions"] == 2 and info["episode_summary"]["success"] is False


def test_task_option_and_bad_tasks():
    env = MathEnv()
    obs, info = env.reset(options={"task": {"question": "What is 6 × 7?", "answer": "42", "min_steps": 1}})
    assert obs[1]["content"] == "What is 6 × 7?"
    *_, info = env.step("<think>6 × 7 = 42</think> \\boxed{42.0}")
    assert info["episode_summary"]["success"]
    with pytest.raises(ValueError, match="numeric 'answer'"):
        env.reset(options={"task": {"question": "Name a colour.", "answer": "blue"}})
    with pytest.raises(ValueError, match="kinds"):
        MathEnv(kinds=("geometry",))
    with pytest.raises(ValueError, match="difficulty"):
        MathEnv(difficulty=(3, 1))
    with pytest.raises(ValueError, match="difficulty"):
        MathEnv(difficulty=-1)


def test_difficulty_zero_is_one_operation_for_arithmetic_only():
    for i in range(50):
        p = make_problem("train", i, kinds=("arithmetic",), difficulty=0)
        assert p["min_steps"] == 1 and re.fullmatch(r"Compute \d+ [-+×÷] \d+\.", p["question"]), p["question"]
        a, op, b = p["question"][len("Compute "):-1].split()
        assert int(b) <= 20 and (int(a) <= 20 or op == "÷" and int(a) // int(b) <= 10), p["question"]
    # Other kinds have no easier level than 1: 0 gives their level-1 problems.
    for kind in ("fractions", "linear", "word"):
        for i in range(20):
            assert make_problem("train", i, kinds=(kind,), difficulty=0)["question"] == \
                make_problem("train", i, kinds=(kind,), difficulty=1)["question"]


def test_check_env_passes():
    assert run_check_env(ENV_ID) is None
    assert run_check_env(ENV_ID, {"tools": True, "sandbox": "subprocess", "allow_unsafe": True}) is None


# --------------------------------------------------------------------------- tools mode
@pytest.fixture(scope="module")
def sandbox():
    with best_sandbox() as sb:
        yield sb


def test_sandbox_only_with_tools_and_never_unsafe_by_default():
    assert MathEnv().sandbox_backend is None                    # no tools: no code runs, nothing probed
    assert MathEnv(tools=True).sandbox_backend in ("docker", "bwrap")
    with pytest.raises(SandboxRefusedError, match="allow_unsafe=True"):
        MathEnv(tools=True, sandbox="subprocess")
    with pytest.raises(ValueError, match="unknown sandbox"):
        MathEnv(tools=True, sandbox="vm")


def test_python_tool_round_trip_on_best_sandbox(sandbox):
    env = agentgym.make("Math-v0", tools=True, sandbox=sandbox, reward={"tool_cost": 0.02})
    assert env.unwrapped.sandbox_backend == sandbox.name
    obs, info = env.reset(options={"task_index": 2})
    assert "```python" in obs[0]["content"] and env.unwrapped.stop_strings == ("```output",)
    task = info["privileged"]["task"]
    messages = list(obs)
    action = MathEnv.oracle({"task": task, "turn": 0, "messages": messages})
    obs, reward, terminated, truncated, info = env.step(action + "\n```output")
    assert info["action_type"] == "code" and not terminated
    assert obs == [{"role": "user", "content": f"```output\n{task['answer']}\n```"}]
    assert info["reward_terms"]["tool_cost"] == pytest.approx(-0.02) and info["backend"] == sandbox.name
    obs, reward, terminated, truncated, info = env.step(honest(task))
    assert terminated and info["episode_summary"]["success"] and info["episode_summary"]["tool_calls"] == 1
    assert info["episode_summary"]["return"] == pytest.approx(0.98)


def test_python_tool_errors_limits_and_continuation_style():
    env = MathEnv(tools=True, sandbox="subprocess", allow_unsafe=True, max_tool_calls=2, tool_time_limit_s=1.0,
                  observation_style="continuation")
    assert env.sandbox_backend == "subprocess"
    env.reset(options={"task_index": 0})
    obs, *_, info = env.step("```python\nprint(1 / 0)\n```\n```output")
    assert obs[0]["content"].startswith("\n") and "ZeroDivisionError" in obs[0]["content"]
    assert obs[0]["content"].endswith("```\n")  # the policy opened ```output; the env closes it
    obs, *_, info = env.step("```python\nwhile True:\n    pass\n```")
    assert "did not finish within 1s" in obs[0]["content"] and info["timed_out"]
    obs, reward, terminated, truncated, info = env.step("```python\nprint(2)\n```")
    assert info["action_type"] == "invalid" and "used all 2 code runs" in obs[0]["content"]
    assert check_invalid_step(obs, info) is None
    obs, reward, terminated, truncated, info = env.step("<think>\nI could not finish.\n</think> \\boxed{0}")
    assert terminated and info["episode_summary"]["code_runs"] == 2
    env.reset(options={"task_index": 0})
    obs, *_ = env.step("```python\nx = 5\n```")
    assert "[no output" in obs[0]["content"]
    obs, *_, info = env.step("```python\nprint(3)\n```\nso the result is \\boxed{3}")  # a box ends it
    assert info["action_type"] == "answer"


# --------------------------------------------------------------------------- reward-hacking detectors
def _score(action: str, index: int, weights: dict | None = None) -> tuple[float, dict]:
    env = agentgym.make("Math-v0", difficulty=3, reward=weights)
    _, (obs, reward, terminated, truncated, info) = play(env, action, index=index)
    assert terminated
    return reward, info["raw_reward_terms"]


@pytest.mark.parametrize("index", range(6))
def test_guessing_detector(index):
    task = make_problem("train", index, difficulty=3)
    guess = "<think>\nThis looks easy.\n</think>\nThe answer is \\boxed{{{answer}}}."
    empty_steps = "<think>\nStep 1: read the problem.\nStep 2: solve it.\nStep 3: check it.\n</think>\n\\boxed{{{answer}}}"
    h_reward, h_raw = _score(honest(task), index, DETECTORS_ON)
    assert h_raw["guessing"] == 0.0 and h_reward == pytest.approx(1.0)
    for hacked in (guess, empty_steps):
        reward, raw = _score(hacked, index, DETECTORS_ON)
        assert raw["correct"] == 1.0 and raw["format"] == 1.0  # it *is* right and well formatted ...
        assert raw["guessing"] == -1.0  # ... but shows no calculation before the answer
        assert reward < h_reward
    assert _score(guess, index)[0] == pytest.approx(1.0)  # weight 0 by default: monitored only
    assert _score(guess, index)[1]["guessing"] == -1.0


def test_repetition_detector():
    task = make_problem("train", 1, difficulty=3)
    filler = "Let me think step by step. " * 40
    padded = honest(task).replace("<think>\n", "<think>\n" + filler + "\n")
    repeated_steps = honest(task).replace("</think>", "\n".join(task["steps"] * 12) + "\n</think>")
    h_reward, h_raw = _score(honest(task), 1, DETECTORS_ON)
    assert h_raw["repetition"] == 0.0
    for hacked in (padded, repeated_steps):
        reward, raw = _score(hacked, 1, DETECTORS_ON)
        assert raw["correct"] == 1.0 and raw["repetition"] < -0.5 and reward < h_reward
    assert count_reasoning_steps("\n".join(task["steps"] * 12)) == len(set(task["steps"]))  # repeats count once
    assert repetition_score(honest(task)) < 0.1 < 0.9 < repetition_score(filler)


def test_length_detector():
    task = make_problem("train", 2, difficulty=3)
    long = honest(task).replace("</think>", "Double-checking every digit. " + "x" * 6000 + "\n</think>")
    h_reward, _ = _score(honest(task), 2, DETECTORS_ON)
    reward, raw = _score(long, 2, DETECTORS_ON)
    assert raw["correct"] == 1.0 and raw["length"] < -0.5 and reward < h_reward
    env = agentgym.make("Math-v0", length_budget=100, reward={"length": 1.0})
    _, (*_, info) = play(env, honest(task) + " " * 200, index=2)
    assert info["reward_terms"]["length"] < 0


def test_detector_helpers():
    assert think_format_ok("<think>a</think>\\boxed{1}") and not think_format_ok("<think>a</think><think>b</think>\\boxed{1}")
    assert count_reasoning_steps("12 × 5 = 60. Then 60 + 3 = 63.\nx = 7") == 3
    assert count_reasoning_steps("I think it is right. Probably.") == 0
    assert repetition_score("short") == 0.0
