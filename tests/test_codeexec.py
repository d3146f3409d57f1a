"""CodeExec-v0: bundled problems (each reference passes, a trivially wrong program fails), the oracle,
every reward term, invalid actions, multi-attempt repair, harness isolation, the train/test split, and
the HumanEval/MBPP loaders. Everything runs in a real sandbox: ``best_sandbox()`` (Docker in CI, else
bwrap) and, explicitly opted in (``UNSAFE``), the ``subprocess`` backend. Fail-closed selection itself
is tested in ``test_sandbox.py``.
"""

from __future__ import annotations

import gzip
import json
import time
from concurrent.futures import ThreadPoolExecutor

import gymnasium as gym
import pytest

import agentgym
from agentgym.app.checking import check_invalid_step, run_check_env
from agentgym.envs.codeexec import (
    CodeExecEnv, ProblemFormatError, bundled_problems, load_humaneval_jsonl, load_mbpp_jsonl, load_problems,
    run_tests, run_tests_batch, split_of,
)
from agentgym.envs.services.sandbox import SandboxRefusedError, best_sandbox
from agentgym.app.eval_run import env_takes_split

ENV_ID = "agentgym/CodeExec-v0"
UNSAFE = {"sandbox": "subprocess", "allow_unsafe": True}  # the unsafe backend, explicitly opted in to
if ENV_ID not in gym.registry:
    agentgym.register("CodeExec-v0", entry_point="agentgym.envs.codeexec.env:CodeExecEnv")


@pytest.fixture(scope="module")
def sandbox():
    with best_sandbox() as sb:
        yield sb


def fenced(code: str) -> str:
    return f"Here is my program.\n\n```python\n{code}\n```"


def trivially_wrong(problem: dict) -> str:
    if problem["entry_point"]:
        return f"def {problem['entry_point']}(*args, **kwargs):\n    return None\n"
    return "import sys\nsys.stdin.read()\n"


# --------------------------------------------------------------------------- bundled problems
def test_bundled_problem_set():
    problems = bundled_problems()
    assert len(problems) >= 40
    assert len({p["task_id"] for p in problems}) == len(problems)
    kinds = {t["kind"] for p in problems for t in p["tests"]}
    assert kinds == {"assert", "io"}
    for p in problems:
        assert len(p["tests"]) >= 4, p["task_id"]
        assert 1 <= p["visible"] < len(p["tests"]), p["task_id"]  # some tests stay hidden
        assert p["statement"] and p["solution"]
    assert CodeExecEnv(split=None, **UNSAFE).num_tasks == len(problems)


def test_every_reference_passes_and_a_trivially_wrong_program_fails(sandbox):
    problems = bundled_problems()
    jobs = [(p, p["solution"]) for p in problems] + [(p, trivially_wrong(p)) for p in problems]
    reports = run_tests_batch(sandbox, jobs, details=False, jobs_per_run=26)
    n = len(problems)
    for p, r in zip(problems, reports[:n]):
        assert r["error"] is None, r["error"]
        assert all(t["passed"] for t in r["tests"]), (p["task_id"], [t["status"] for t in r["tests"]])
    for p, r in zip(problems, reports[n:]):
        assert not all(t["passed"] for t in r["tests"]), p["task_id"]


def test_graded_chunks_go_to_the_sandbox_as_one_batch(sandbox):
    """run_tests_batch hands all its harness runs to ``run_batch`` at once (a warm sandbox: one
    round trip to one runner), and each chunk still gets its own report."""
    calls = []

    class Spy:  # the real sandbox underneath, only counting what reaches it
        name = sandbox.name

        def run(self, *a, **k):
            calls.append("run")
            return sandbox.run(*a, **k)

        def run_batch(self, specs):
            calls.append(("run_batch", len(specs)))
            return sandbox.run_batch(specs)

    problems = bundled_problems()[:3]
    jobs = [(p, p["solution"]) for p in problems] + [(problems[0], trivially_wrong(problems[0]))]
    reports = run_tests_batch(Spy(), jobs, jobs_per_run=1)
    assert calls == [("run_batch", 4)]
    assert [all(t["passed"] for t in r["tests"]) for r in reports] == [True, True, True, False]


def test_oracle_solves_every_bundled_problem_with_the_subprocess_backend():
    """The oracle policy through the env API, in parallel episodes (as a rollout engine would)."""
    def episode(index: int) -> tuple[float, dict]:
        env = agentgym.make("CodeExec-v0", split=None, **UNSAFE)
        obs, info = env.reset(options={"task_index": index})
        action = env.unwrapped.oracle({"task": info["privileged"]["task"], "turn": 0, "messages": obs})
        obs, reward, terminated, truncated, info = env.step(action)
        assert terminated and not truncated
        assert info["exec"]["backend"] == "subprocess"
        return reward, info

    n = CodeExecEnv(split=None, **UNSAFE).num_tasks
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(episode, range(n)))
    for index, (reward, info) in enumerate(results):
        assert info["episode_summary"]["success"], (index, info["test_status"])
        assert reward == pytest.approx(1.0)
        assert info["reward_terms"] == {"tests": 1.0, "format": 0.0, "attempt_cost": 0.0}
        assert info["episode_summary"]["solved_at_attempt"] == 1


# --------------------------------------------------------------------------- prompts
def test_prompt_shows_statement_and_visible_tests_only():
    env = CodeExecEnv(split=None, **UNSAFE)
    task = next(p for p in env.problems if p["task_id"] == "agentgym/merge_intervals")
    obs, info = env.reset(options={"task": task})
    assert [m["role"] for m in obs] == ["system", "user"]
    text = obs[1]["content"]
    assert task["statement"] in text and "`merge_intervals`" in text
    assert task["tests"][0]["code"] in text and task["tests"][1]["code"] in text
    assert all(t["code"] not in text for t in task["tests"][2:])
    assert "3 attempt(s)" in obs[0]["content"]
    io_task = next(p for p in env.problems if p["entry_point"] is None)
    obs, _ = env.reset(options={"task": io_task})
    assert io_task["tests"][0]["stdin"].strip() in obs[1]["content"] and "standard input" in obs[1]["content"]
    assert io_task["tests"][1]["stdin"].strip() not in obs[1]["content"].replace(io_task["tests"][0]["stdin"], "")


# --------------------------------------------------------------------------- repair and rewards
def test_wrong_then_right_repair_on_best_sandbox(sandbox):
    env = agentgym.make("CodeExec-v0", sandbox=sandbox, split=None)
    obs, info = env.reset(options={"task_index": next(i for i, p in enumerate(bundled_problems())
                                                      if p["task_id"] == "agentgym/rle_encode")})
    task = info["privileged"]["task"]
    wrong = "def rle_encode(text):\n    return ''.join(f'{c}1' for c in text)\n"  # ignores runs
    obs, reward, terminated, truncated, info = env.step(fenced(wrong))
    assert not terminated and not truncated and info["action_type"] == "code"
    assert info["reward_terms"] == {"tests": 0.0, "format": 0.0, "attempt_cost": 0.0}  # terminal term: not yet
    assert 0 < info["pass_rate"] < 1 and info["attempt"] == 1
    report = obs[0]["content"]
    assert report.startswith("Attempt 1 of 3:") and f"of {len(task['tests'])} tests passed" in report
    assert 'assert rle_encode("aaabcc") == "a3b1c2"' in report  # a visible test: its code is shown
    assert "left side was 'a1a1a1b1c1c1'" in report  # ... and what the program returned
    assert "Reply with the complete corrected program" in report
    obs, reward, terminated, truncated, info = env.step(env.unwrapped.oracle({"task": task}))
    assert terminated and not truncated
    assert info["reward_terms"] == pytest.approx({"tests": 1.0, "format": 0.0, "attempt_cost": -0.05})
    assert reward == pytest.approx(0.95)
    summary = info["episode_summary"]
    assert summary["success"] and summary["attempts"] == 2 and summary["solved_at_attempt"] == 2
    assert summary["tool_calls"] == 0 and summary["action_counts"] == {"code": 2}
    assert "All tests pass" in obs[0]["content"]
    assert info["exec"]["backend"] == sandbox.name


def _partial_solution_env(**kwargs):
    env = CodeExecEnv(split=None, **UNSAFE, **kwargs)
    index = next(i for i, p in enumerate(env.problems) if p["task_id"] == "agentgym/digital_root")
    env.reset(options={"task_index": index})
    return env, "def digital_root(n):\n    return n if n < 10 else sum(map(int, str(n)))\n"  # one round only


def test_episode_ends_on_the_last_attempt_with_the_last_pass_rate():
    env, partial = _partial_solution_env(max_attempts=2)
    *_, info = env.step(fenced("def digital_root(n):\n    return 0\n"))
    first = info["pass_rate"]
    obs, reward, terminated, truncated, info = env.step(fenced(partial))
    assert terminated and not truncated  # the last attempt ends the episode
    assert 0 < info["pass_rate"] < 1 and info["pass_rate"] != first
    assert info["reward_terms"]["tests"] == pytest.approx(info["pass_rate"])  # the last attempt counts
    assert reward == pytest.approx(info["pass_rate"] - 0.05)
    assert "No attempts left." in obs[0]["content"]
    assert info["episode_summary"]["success"] is False and info["episode_summary"]["solved_at_attempt"] == 0


def test_all_pass_reward_mode_and_custom_weights():
    env, partial = _partial_solution_env(max_attempts=1, reward_mode="all_pass")
    *_, info = env.step(fenced(partial))
    assert info["raw_reward_terms"]["tests"] == 0.0 and 0 < info["pass_rate"] < 1
    env, _ = _partial_solution_env(max_attempts=1, reward_mode="all_pass")
    *_, info = env.step(env.oracle({"task": env.task}))
    assert info["raw_reward_terms"]["tests"] == 1.0
    env, partial = _partial_solution_env(max_attempts=2, max_turns=3, attempt_cost=0.2, format_penalty=0.5)
    *_, info = env.step("no code")
    assert info["reward_terms"]["format"] == pytest.approx(-0.5)
    env.step(fenced(partial))
    *_, info = env.step(fenced(partial))
    assert info["reward_terms"]["attempt_cost"] == pytest.approx(-0.2)
    with pytest.raises(ValueError, match="reward_mode"):
        CodeExecEnv(reward_mode="best")


@pytest.mark.parametrize("action, why", [
    ("I would sort the list first.", "contains no code block"),
    ("```\nprint(1)\n```", "not marked as Python"),
    ("```python\ndef f():\n    return 1\n", "not closed"),
    ("```python\n   \n```", "is empty"),
])
def test_invalid_actions_explain_and_cost(action, why):
    env = agentgym.make("CodeExec-v0", **UNSAFE)
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(action)
    assert info["action_type"] == "invalid" and not terminated and not truncated
    assert why in obs[0]["content"] and "```python" in obs[0]["content"]
    assert info["reward_terms"] == {"tests": 0.0, "format": pytest.approx(-0.1), "attempt_cost": 0.0}
    assert check_invalid_step(obs, info) is None
    assert env.unwrapped._attempts == 0  # a reply without code uses a turn, not an attempt


def test_invalid_turns_exhaust_the_turn_limit():
    env = agentgym.make("CodeExec-v0", **UNSAFE)
    env.reset(seed=1)
    steps = [env.step("no code here")[2:4] for _ in range(3)]
    assert steps == [(False, False), (False, False), (False, True)]


def test_last_python_block_counts_and_syntax_errors_need_no_sandbox():
    env, _ = _partial_solution_env()
    action = ("First try:\n```python\ndef digital_root(n):\n    return 0\n```\nBetter:\n"
              + fenced(env.task["solution"]))
    *_, info = env.step(action)
    assert info["all_passed"]
    env, _ = _partial_solution_env()
    obs, reward, terminated, truncated, info = env.step(fenced("def digital_root(n)\n    return n"))
    assert info["action_type"] == "code" and info["pass_rate"] == 0.0 and info["exec"] is None
    assert "SyntaxError" in obs[0]["content"] and "line 1" in obs[0]["content"]
    assert "failed before any test could run" in obs[0]["content"]


# --------------------------------------------------------------------------- harness behaviour
ISOLATION_PROBLEM = {
    "task_id": "isolation", "statement": "Write f(x) returning x + 1.", "entry_point": "f", "visible": 8,
    "tests": [{"kind": "assert", "code": f"assert f({i}) == {i + 1}"} for i in (1, 2, 3, 4)]
    + [{"kind": "assert", "code": "assert calls() == 1"}, {"kind": "assert", "code": "assert calls() == 1"}]
    + [{"kind": "assert", "code": f"assert f({i}) == {i + 1}"} for i in (6, 7)],
    "solution": "def f(x):\n    return x + 1\n\ndef calls():\n    return 1\n",
}
NASTY_SOLUTION = """
import os, sys
print("@@AGENTGYM_CODEEXEC_REPORT@@" + '{"jobs": []}')
_calls = []

class Anything:
    def __eq__(self, other):
        return True

def calls():
    _calls.append(1)
    return len(_calls)

def f(x):
    if x == 2:
        os._exit(0)
    if x == 3:
        while True:
            pass
    if x == 4:
        return Anything()
    if x == 6:
        for _ in range(5000):
            print("x" * 1000)
    if x == 7:
        print('@@AGENTGYM_CODEEXEC_REPORT@@{"jobs": [{"tests": []}]}')
    return x + 1
"""


def test_each_test_is_isolated_from_the_others(sandbox):
    t0 = time.monotonic()
    report = run_tests(sandbox, ISOLATION_PROBLEM, NASTY_SOLUTION, test_time_limit_s=1.5)
    statuses = [t["status"] for t in report["tests"]]
    assert statuses == ["passed", "crashed", "timeout", "failed", "passed", "passed", "failed", "passed"]
    assert "Anything object" in report["tests"][3]["error"]["message"]  # the __eq__ hack does not pass
    assert report["tests"][6]["error"]["type"] == "OSError"  # 5 MB of stdout: the write limit hit it
    assert time.monotonic() - t0 < 15
    env = CodeExecEnv(problems=[ISOLATION_PROBLEM], sandbox=sandbox, test_time_limit_s=1.5)
    env.reset(seed=0)
    obs, *_, info = env.step(fenced(NASTY_SOLUTION))
    text = obs[0]["content"]
    assert "4 of 8 tests passed" in text and info["pass_rate"] == 0.5
    assert "Test 2 failed." in text and "exited with status 0 before the test finished" in text
    assert "Test 3 timed out." in text


def test_a_memory_hog_fails_only_its_own_test(sandbox):
    problem = dict(ISOLATION_PROBLEM, tests=ISOLATION_PROBLEM["tests"][:3])
    hog = "def f(x):\n    if x == 2:\n        return len(bytearray(1 << 30))\n    return x + 1\n"
    report = run_tests(sandbox, problem, hog, memory_mb=256)
    statuses = [t["status"] for t in report["tests"]]
    assert statuses[0] == statuses[2] == "passed"
    assert statuses[1] in ("failed", "crashed")  # MemoryError under rlimits, an OOM kill under a cgroup


def test_code_that_fails_to_load_fails_every_test_once(sandbox):
    problem = dict(ISOLATION_PROBLEM, tests=ISOLATION_PROBLEM["tests"][:4])
    report = run_tests(sandbox, problem, "import sys\nprint('hi')\nraise RuntimeError('boom at import')\n")
    assert [t["status"] for t in report["tests"]] == ["not_run"] * 4
    assert report["load"]["error"]["message"] == "boom at import"
    t0 = time.monotonic()
    report = run_tests(sandbox, problem, "while True:\n    pass\n", test_time_limit_s=1.0)
    assert report["load"]["status"] == "timeout" and time.monotonic() - t0 < 8  # one timeout, not four
    env = CodeExecEnv(problems=[problem], sandbox=sandbox, test_time_limit_s=1.0)
    env.reset(seed=0)
    obs, *_ = env.step(fenced("def f(x):\n    return x + 1\nf(None)\n"))
    text = obs[0]["content"]
    assert "failed before any test could run" in text and "TypeError" in text
    assert 'File "solution.py", line 3' in text and "f(None)" in text


def test_the_program_cannot_simply_read_the_tests(sandbox):
    """The payload with every test is gone from the script file, the module and the stack."""
    problem = {"task_id": "peek", "statement": "Print ok.", "entry_point": None, "visible": 1,
               "solution": "print('ok')\n", "tests": [{"kind": "io", "stdin": "", "stdout": "ok\n"},
                                                      {"kind": "io", "stdin": "x\n", "stdout": "EXPECTED-7f3a\n"}]}
    peek = ("import __main__, os, sys\n"
            "def found():\n"
            "    needle = 'EXPECTED-' + '7f3a'\n"
            "    texts, f = [repr(vars(__main__))], sys._getframe().f_back\n"
            "    while f is not None:\n"
            "        texts.append(repr(f.f_locals))\n"
            "        f = f.f_back\n"
            "    return any(needle in t for t in texts)\n"
            "print(getattr(__main__, 'PAYLOAD', 1) is None, os.path.exists('main.py'), found())\n")
    report = run_tests(sandbox, problem, peek)
    assert report["tests"][0]["status"] == "wrong_output"
    assert report["tests"][0]["stdout"] == "True False False\n"


def test_hidden_test_details_stay_hidden_unless_revealed(sandbox):
    problem = dict(ISOLATION_PROBLEM, tests=ISOLATION_PROBLEM["tests"][:4], visible=1)
    wrong = "def f(x):\n    return x + 2\n"
    for reveal in (False, True):
        env = CodeExecEnv(problems=[problem], sandbox=sandbox, reveal_hidden_tests=reveal)
        env.reset(seed=0)
        obs, *_ = env.step(fenced(wrong))
        text = obs[0]["content"]
        assert "assert f(1) == 2" in text and "left side was 3, expected 2" in text  # visible test
        assert "Test 2 (hidden) failed" in text
        assert ("assert f(2) == 3" in text) is reveal
        assert ("left side was 4" in text) is reveal


def test_stdin_stdout_problem_feedback(sandbox):
    problem = {"task_id": "add", "statement": "Read two integers and print their sum.", "entry_point": None,
               "visible": 1, "solution": "a, b = map(int, input().split())\nprint(a + b)\n",
               "tests": [{"kind": "io", "stdin": "1 2\n", "stdout": "3\n"},
                         {"kind": "io", "stdin": "5 0\n", "stdout": "5\n"},
                         {"kind": "io", "stdin": "10 20\n", "stdout": "30\n"}]}
    env = CodeExecEnv(problems=[problem], sandbox=sandbox)
    env.reset(seed=0)
    obs, *_, info = env.step(fenced("a, b = map(int, input().split())\nprint(a - b)\n"))
    text = obs[0]["content"]
    assert info["test_status"] == ["wrong_output", "passed", "wrong_output"]
    assert "Test 1 failed: wrong output." in text and "expected output:\n    3" in text
    assert "your output:\n    -1" in text
    assert "Test 3 (hidden) failed: wrong output." in text and "30" not in text
    obs, reward, terminated, *_ = env.step(fenced("import sys\nprint(sum(map(int, sys.stdin.read().split())))  \n"))
    assert terminated and reward == pytest.approx(0.95)


def test_sandbox_argument_forms_and_the_backend_used():
    env = CodeExecEnv()
    assert env.sandbox_backend in ("docker", "bwrap")       # chosen at construction, started on first use
    assert not env._code_sandbox.started and env.sandbox.name == env.sandbox_backend
    assert CodeExecEnv().sandbox is env.sandbox              # one shared sandbox per process
    assert CodeExecEnv(**UNSAFE).sandbox.name == CodeExecEnv(**UNSAFE).sandbox_backend == "subprocess"
    with pytest.raises(SandboxRefusedError, match="allow_unsafe=True"):
        CodeExecEnv(sandbox="subprocess")                    # named, but not opted in to
    with best_sandbox() as sb:
        assert CodeExecEnv(sandbox=sb).sandbox is sb and CodeExecEnv(sandbox=sb).sandbox_backend == sb.name
    with pytest.raises(ValueError, match="unknown sandbox"):
        CodeExecEnv(sandbox="vm")


def test_train_and_test_splits_partition_the_bundled_problems():
    ids = lambda env: [p["task_id"] for p in env.problems]  # noqa: E731
    train, test = CodeExecEnv(split="train"), CodeExecEnv(split="test")
    validation = CodeExecEnv(split="validation")
    assert CodeExecEnv().split == "train" and ids(CodeExecEnv()) == ids(train)
    assert set(ids(train)).isdisjoint(ids(test)) and set(ids(validation)).isdisjoint(ids(train) + ids(test))
    assert sorted(ids(train) + ids(validation) + ids(test)) == sorted(p["task_id"] for p in bundled_problems())
    # a hash of each task_id: the same on every machine, and a new problem never moves another
    assert ids(test) == ["agentgym/rle_decode", "agentgym/second_largest", "agentgym/common_prefix",
                         "agentgym/flatten", "agentgym/chunked", "agentgym/matmul", "agentgym/summarize_ranges",
                         "agentgym/top_k", "agentgym/min_coins", "agentgym/column_name", "agentgym/can_halve",
                         "agentgym/io_bank", "agentgym/io_histogram"]
    assert all(split_of(t) == "test" for t in ids(test)) and test.num_tasks == 13
    assert validation.num_tasks == 6 and train.num_tasks == 32  # validation: one in eight of the other 38
    assert CodeExecEnv(problems=bundled_problems()[:3], split="test").num_tasks == 3  # your own problems: whole
    with pytest.raises(ValueError, match="split must be one of"):
        CodeExecEnv(split="dev")
    assert env_takes_split(ENV_ID)  # so `agentgym eval` evaluates on split="test"


def test_check_env_passes():
    assert run_check_env(ENV_ID, UNSAFE) is None


# --------------------------------------------------------------------------- loaders
HUMANEVAL_ROWS = [
    {"task_id": "Mini/0", "entry_point": "add_pairs",
     "prompt": 'def add_pairs(xs: list) -> list:\n    """Sums of neighbouring items.\n    >>> add_pairs([1, 2, 4])\n'
               '    [3, 6]\n    """\n',
     "canonical_solution": "    return [a + b for a, b in zip(xs, xs[1:])]\n",
     "test": "METADATA = {'author': 'test'}\n\n\ndef check(candidate):\n    assert candidate([1, 2, 4]) == [3, 6]\n"
             "    assert candidate([]) == []\n    assert candidate([5]) == []\n    assert candidate(\n        [1, 1, 1]\n"
             "    ) == [2, 2]\n"},
    {"task_id": "Mini/1", "entry_point": "shout",
     "prompt": 'def shout(s: str) -> str:\n    """Upper-case s and add "!"."""\n',
     "canonical_solution": "    return s.upper() + '!'\n",
     "test": "def check(candidate):\n    words = ['a', 'hey']\n    for w in words:\n        assert candidate(w) == w.upper() + '!'\n"},
]
MBPP_ROWS = [
    {"task_id": 11, "text": "Write a function to cube a number.", "code": "def cube(n):\r\n    return n ** 3",
     "test_list": ["assert cube(2) == 8", "assert cube(-1) == -1", "assert cube(0) == 0"], "test_setup_code": "",
     "challenge_test_list": []},
    {"task_id": 12, "text": "Write a function that scales x by the FACTOR constant.", "code": "def scaled(x):\n    return x * FACTOR",
     "test_list": ["assert scaled(2) == 20", "assert scaled(0) == 0"], "test_setup_code": "FACTOR = 10"},
]


def _write_jsonl(path, rows, opener=open):
    with opener(path, "wt", encoding="utf-8") as f:
        for row in rows:
            f.write((row if isinstance(row, str) else json.dumps(row)) + "\n")
    return path


def test_humaneval_loader_and_env(tmp_path, sandbox):
    path = _write_jsonl(tmp_path / "he.jsonl", HUMANEVAL_ROWS)
    problems = load_humaneval_jsonl(path)
    assert [p["task_id"] for p in problems] == ["Mini/0", "Mini/1"]
    assert [len(p["tests"]) for p in problems] == [4, 1]  # all-assert check() is split; a loop is kept whole
    assert problems[0]["tests"][3]["code"] == ("METADATA = {'author': 'test'}\ncandidate = add_pairs\n"
                                               "assert candidate(\n    [1, 1, 1]\n) == [2, 2]")
    assert problems[1]["tests"][0]["code"].endswith("check(shout)\n")
    assert problems[0]["visible"] == 0 and problems[0]["source"] == "humaneval"
    assert "def add_pairs(xs: list) -> list:" in problems[0]["statement"]
    gz = _write_jsonl(tmp_path / "he.jsonl.gz", HUMANEVAL_ROWS, opener=gzip.open)
    assert load_problems(gz) == problems
    env = agentgym.make("CodeExec-v0", data_path=str(path), sandbox=sandbox)
    assert env.unwrapped.num_tasks == 2
    for i in range(2):
        obs, info = env.reset(options={"task_index": i})
        assert "```python" in obs[1]["content"]
        *_, info = env.step(env.unwrapped.oracle({"task": info["privileged"]["task"]}))
        assert info["episode_summary"]["success"]
    env.reset(options={"task_index": 0})
    obs, *_, info = env.step(fenced("def add_pairs(xs):\n    return [a + b for a, b in zip(xs, xs[1:])][:1]\n"))
    assert info["test_status"] == ["failed", "passed", "passed", "failed"]
    assert "Test 1 (hidden) failed: AssertionError" in obs[0]["content"]


def test_mbpp_loader_and_env(tmp_path, sandbox):
    path = _write_jsonl(tmp_path / "mbpp.jsonl", MBPP_ROWS)
    problems = load_problems(path)
    assert problems == load_mbpp_jsonl(path)
    assert [p["source"] for p in problems] == ["mbpp", "mbpp"] and [p["task_id"] for p in problems] == ["11", "12"]
    assert problems[0]["visible"] == 3 and problems[0]["solution"] == "def cube(n):\n    return n ** 3"
    assert problems[1]["setup"] == "FACTOR = 10"
    env = CodeExecEnv(data_path=path, data_format="mbpp", sandbox=sandbox)
    obs, info = env.reset(options={"task_index": 0})
    assert "assert cube(-1) == -1" in obs[1]["content"]  # MBPP shows its tests (they name the function)
    reports = run_tests_batch(sandbox, [(p, p["solution"]) for p in problems])
    assert all(t["passed"] for r in reports for t in r["tests"])


@pytest.mark.parametrize("rows, fmt, message", [
    (['{"task_id": "x", "prompt": "def f():\\n", '], "humaneval", r"he\.jsonl:1: not valid JSON"),
    ([HUMANEVAL_ROWS[0], "[1, 2]"], "humaneval", r"he\.jsonl:2: expected a JSON object"),
    ([{k: v for k, v in HUMANEVAL_ROWS[0].items() if k != "test"}], "humaneval", r":1: missing key\(s\) \['test'\]"),
    ([dict(HUMANEVAL_ROWS[0], test="assert True\n")], "humaneval", r"defines no check\(candidate\)"),
    ([dict(HUMANEVAL_ROWS[0], entry_point="add pairs")], "humaneval", "must be a Python identifier"),
    ([dict(HUMANEVAL_ROWS[0], test="def check(candidate):\n    assert (\n")], "humaneval", "'test' is not valid Python"),
    ([HUMANEVAL_ROWS[0], HUMANEVAL_ROWS[0]], "humaneval", "occurs more than once"),
    ([], "humaneval", "contains no problems"),
    ([dict(MBPP_ROWS[0], test_list="assert cube(2) == 8")], "mbpp", "'test_list' must be a non-empty list"),
    ([dict(MBPP_ROWS[0], code=5)], "mbpp", "'code' must be a non-empty string, got int"),
    ([dict(MBPP_ROWS[0], test_list=["assert cube(2 == 8"])], "mbpp", "assert test 0 is not valid Python"),
])
def test_malformed_files_get_clear_errors(tmp_path, rows, fmt, message):
    path = _write_jsonl(tmp_path / "he.jsonl", rows)
    with pytest.raises(ProblemFormatError, match=message):
        load_problems(path, fmt)


def test_format_detection_errors(tmp_path):
    path = _write_jsonl(tmp_path / "odd.jsonl", [{"question": "?", "answer": 1}])
    with pytest.raises(ProblemFormatError, match="cannot tell the format"):
        load_problems(path)
    with pytest.raises(ValueError, match="unknown problem format"):
        load_problems(path, "apps")
    with pytest.raises(FileNotFoundError):
        CodeExecEnv(data_path=tmp_path / "missing.jsonl")
    with pytest.raises(ProblemFormatError, match=r"options\['task'\]"):
        CodeExecEnv(**UNSAFE).reset(options={"task": {"task_id": "t", "statement": "s", "tests": []}})
