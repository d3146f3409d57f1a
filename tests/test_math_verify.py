"""``answers_equal`` beyond plain numbers: math-verify decides radicals, π, sets, intervals and equations,
while the exact-number rules stay (no rounding tolerance, ``%`` a unit); hostile inputs are unequal, fast,
from any thread. The real math-verify runs, in the helper process ``answers.py`` starts."""

from __future__ import annotations

import threading
import time

import pytest

from agentgym.envs.mathrl import answers
from agentgym.envs.mathrl.answers import answers_equal

pytest.importorskip("math_verify", reason="math-verify is not installed (pip install math-verify)")

EQUAL = [  # (prediction, gold)
    (r"\sqrt{2}/2", r"\frac{\sqrt{2}}{2}"),
    (r"\frac{1}{\sqrt{2}}", r"\frac{\sqrt{2}}{2}"),
    (r"2\sqrt{3}", r"\sqrt{12}"),
    (r"\pi \cdot 2", r"2\pi"),
    (r"\frac{\pi}{2}", r"\pi/2"),
    (r"\{2,1\}", r"\{1,2\}"),
    (r"\{3, 1, 2\}", r"\{1,2,3\}"),
    (r"[0,1)", r"[0, 1)"),
    (r"(-\infty, 3]", r"(-\infty,3]"),
    ("5", "x = 5"),                       # gold an equation, prediction its value
    ("x = 5", r"\frac{10}{2}"),           # and the other way round (one side a plain number)
    (r"\sqrt{4}", "2"),                   # a plain-number gold meets an expression equal to it
    ("x^2 + 2x + 1", "(x+1)^2"),
    ("0.5", r"\frac{1}{2}"),              # plain numbers: the exact path, unchanged
]

UNEQUAL = [
    (r"\sqrt{3}", r"\sqrt{2}"),
    ("0.333", "1/3"),                     # a decimal is the rational it spells
    ("0.7071", r"\frac{\sqrt{2}}{2}"),    # ... also against an irrational gold (no float rounding)
    ("0.70710678", r"\frac{\sqrt{2}}{2}"),
    (r"0.333\cdot 1", r"\frac{1}{3}"),    # a float inside an expression: 15 digits, not 6
    (r"\pi", r"2\pi"),
    ("3.14159", r"\pi"),
    (r"\{1,2\}", r"\{1,2,3\}"),
    (r"[0,1]", r"[0,1)"),
    ("x = 6", "5"),
    ("50%", "1/2"),                       # "%" stays a unit
    ("1" * 300, "1"),                     # a number too long for the exact path is not sent as a float
]


@pytest.mark.parametrize("prediction, gold", EQUAL)
def test_equivalent_forms_are_equal(prediction, gold):
    assert answers_equal(prediction, gold)


@pytest.mark.parametrize("prediction, gold", UNEQUAL)
def test_different_answers_are_unequal(prediction, gold):
    assert not answers_equal(prediction, gold)


HOSTILE = [
    "9" * 5000,                                   # huge string
    r"\sqrt{" * 400 + "2" + "}" * 400,            # deeply nested braces
    "{" * 10_000,
    r"\frac{1}{0}",
    r"\frac{1}{0} + \frac{0}{0}",
    r"\left(" * 50 + "x" + r"\right)" * 50,
    "x" * 999,
    "$$$$",
    "\\",
    "\x00\\frac{\x00}",
]


@pytest.mark.parametrize("hostile", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_inputs_are_unequal_fast_and_never_raise(hostile):
    start = time.monotonic()
    assert answers_equal(hostile, r"\sqrt{2}") is False
    assert answers_equal(r"\sqrt{2}", hostile) is False
    assert time.monotonic() - start < answers.VERIFY_TIMEOUT_S * 2 + 4


def test_a_computation_past_the_time_bound_is_cut_and_unequal():
    """A tower of powers sympy would evaluate for ages: killed at the bound, and the next call still works."""
    start = time.monotonic()
    assert answers_equal(r"9^{9^{9^{9}}}", r"\sqrt{2}", timeout_s=1.0) is False
    assert time.monotonic() - start < 1.0 + answers._GRACE_S + 3
    assert answers_equal(r"\sqrt{2}/2", r"\frac{\sqrt{2}}{2}")


@pytest.mark.parametrize("tower", [r"2^{2^{2^{2^{100}}}}", r"10^{10^{10}}", r"100000000!", r"(10^{100})!"])
def test_slow_inputs_get_a_verdict_within_the_bound(tower):
    start = time.monotonic()
    assert answers_equal(tower, r"\sqrt{2}", timeout_s=2.0) is False
    assert time.monotonic() - start < 2.0 + answers._GRACE_S + 3


def test_a_flood_of_unclosed_boxes_is_extracted_in_linear_time():
    """Thousands of ``\\boxed{`` that never close (scanning from each box to the end took cubic time: 26 s for
    200 of them), and boxes around them: the last balanced, non-empty one is the answer."""
    from agentgym.envs.mathrl.answers import extract_answer
    from agentgym.parsing import extract_boxed
    start = time.monotonic()
    assert extract_answer("\\boxed{" * 2000) is None and extract_boxed("\\boxed{" * 2000) is None
    found = extract_answer("\\boxed{1} " + "\\boxed{" * 2000 + "\\boxed{} \\boxed{ 7 }")
    assert (found.text, found.method) == ("7", "boxed")
    assert extract_answer("\\boxed{\\frac{1}{2}} " + "\\boxed{" * 2000).text == "\\frac{1}{2}"
    assert time.monotonic() - start < 2


def test_math_env_scores_hostile_replies_without_raising():
    import agentgym
    env = agentgym.make("Math-v0")
    for reply in ("", "\ud800", "\x00", "\\boxed{" * 2000, f"\\boxed{{{'9' * 10_000}}}", "\\boxed{1e999999}",
                  "x" * (1 << 20)):
        env.reset(seed=0)
        start = time.monotonic()
        obs, reward, terminated, truncated, info = env.step(reply)
        assert time.monotonic() - start < answers.VERIFY_TIMEOUT_S * 2 + 4, reply[:20]
        assert info["action_type"] in ("invalid", "answer") and reward <= 0.0, (reply[:20], info)
    env.close()


def test_calls_from_worker_threads_work():
    """math-verify's own timeouts use signals (main thread only); ours run in the helper process."""
    pairs = EQUAL[:6] + UNEQUAL[:6] + [(hostile, "1") for hostile in HOSTILE[:4]]
    results: dict[int, bool] = {}
    errors: list[BaseException] = []

    def judge(i: int, prediction: str, gold: str) -> None:
        try:
            results[i] = answers_equal(prediction + " ", gold)  # " ": not a cached pair
        except BaseException as e:  # noqa: BLE001 - the test reports it
            errors.append(e)

    threads = [threading.Thread(target=judge, args=(i, p, g)) for i, (p, g) in enumerate(pairs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert [results[i] for i in range(len(pairs))] == [True] * 6 + [False] * 10


def test_the_exact_path_needs_no_helper():
    """Plain numbers on both sides never reach math-verify (fast, and the Math-v0 semantics)."""
    before = answers._verify_cached.cache_info().misses
    assert answers_equal("1,234", "1234") and not answers_equal("0.333", "1/3") and answers_equal("50%", "50")
    assert answers._verify_cached.cache_info().misses == before
