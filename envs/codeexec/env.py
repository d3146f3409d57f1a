"""``agentgym/CodeExec-v0``: write a Python program, get a test report, repair it.

Each response must hold a fenced ```python block (the last one counts). The env runs the task's
tests on it in a sandbox — all tests of one attempt in one sandbox run (see ``harness.py``) — and
replies with a report: how many tests passed, and for the failed ones the error excerpt. The policy
may answer with a corrected program, up to ``max_attempts`` attempts (multi-turn repair, as in
RLEF, Gehring et al. 2024). The episode terminates when all tests pass or after the last attempt.

Rewards (weights are constructor arguments):

* ``tests`` (1.0, terminal): the last attempt's pass rate (``reward_mode="pass_rate"``) or 1/0 for
  all tests passing (``"all_pass"``). The *last* attempt, not the best: the policy is graded on the
  program it ends with, so a repair that breaks a working program costs.
* ``format`` (0.1): -1 for a response without a non-empty ```python block (the invalid action).
* ``attempt_cost`` (0.05): -1 per repair attempt (the first attempt is free), so solving earlier pays.

Hidden tests: only the first ``visible`` tests of a task are shown in the prompt. By default the
report gives a hidden test's error type and the solution-side traceback but not the test's code,
input or expected value, so a repair cannot just hard-code failing cases (``reveal_hidden_tests``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from agentgym import AgentEnv, EnvConfig, Reward, Transition
from agentgym.parsing import extract_code_blocks, parse_python
from agentgym.rewards import CallCost, InvalidActionPenalty, StepEvent
from agentgym.envs.codeexec.harness import REPORT_MARK
from agentgym.splits import SPLITS
from agentgym.envs.codeexec.problems import bundled_problems, load_problems, select_split, validate_problem
from agentgym.envs.services.sandbox.selection import SANDBOX_SPECS, LazySandbox

__all__ = ["CodeExecEnv", "CodeExecConfig",
           "TestsPassed", "SYSTEM_PROMPT", "run_tests", "run_tests_batch", "format_report",
           "PYTHON_LANGS"]

SYSTEM_PROMPT = (
    "You are an expert Python programmer. Solve the task with a complete Python program inside one "
    "```python code block. The program is run against tests, only some of which are shown to you. You get "
    "a test report back and may reply with a corrected program, up to {max_attempts} attempt(s) in total. "
    "Every reply must contain the complete program, not just the changed lines."
)
PYTHON_LANGS = ("python", "py", "python3")
REWARD_MODES = ("pass_rate", "all_pass")
_HARNESS_SOURCE: str | None = None


def _harness_source() -> str:
    global _HARNESS_SOURCE
    if _HARNESS_SOURCE is None:
        _HARNESS_SOURCE = Path(__file__).with_name("harness.py").read_text(encoding="utf-8")
    return _HARNESS_SOURCE


def run_tests(sandbox: Any, problem: Mapping[str, Any], solution: str, *, test_time_limit_s: float = 4.0,
              time_limit_s: float = 20.0, memory_mb: int = 256, max_error_chars: int = 800,
              max_output_chars: int = 1000) -> dict[str, Any]:
    """Grade ``solution`` on all tests of ``problem`` in one sandbox run.

    Returns ``{"tests": [per-test result], "load": load-check result or None, "error": str | None,
    "exec": {"duration_s", "timed_out", "oom", "exit_code", "backend"}}``; ``error`` is set when the
    harness produced no report (time or memory limit of the whole run, a broken sandbox), in which
    case every test counts as failed.
    """
    return run_tests_batch(sandbox, [(problem, solution)], test_time_limit_s=test_time_limit_s,
                           time_limit_s=time_limit_s, memory_mb=memory_mb, max_error_chars=max_error_chars,
                           max_output_chars=max_output_chars)[0]


def run_tests_batch(sandbox: Any, jobs: Sequence[tuple[Mapping[str, Any], str]], *, test_time_limit_s: float = 4.0,
                    time_limit_s: float = 20.0, memory_mb: int = 256, max_error_chars: int = 800,
                    max_output_chars: int = 1000, details: bool = True, jobs_per_run: int = 16) -> list[dict[str, Any]]:
    """Grade many ``(problem, solution)`` pairs, ``jobs_per_run`` of them per sandbox run
    (``time_limit_s`` is per pair).

    One interpreter start for many pairs: validating a whole problem set (every reference passes,
    a wrong program fails) costs seconds instead of one sandbox start per problem. ``details=False``
    reports only each test's status (the report must fit the sandbox's output cap).
    """
    size = max(1, jobs_per_run)
    chunks = [jobs[k:k + size] for k in range(0, len(jobs), size)]
    specs = [{"code": _chunk_code(chunk, test_time_limit_s=test_time_limit_s, time_limit_s=time_limit_s,
                                  max_error_chars=max_error_chars, max_output_chars=max_output_chars, details=details),
              "time_limit_s": time_limit_s * len(chunk) + 10.0, "memory_mb": memory_mb} for chunk in chunks]
    # one call for every chunk: a warm sandbox runs them back to back in one runner (one round trip)
    run_batch = getattr(sandbox, "run_batch", None)
    results = run_batch(specs) if callable(run_batch) else [sandbox.run(**spec) for spec in specs]
    reports: list[dict[str, Any]] = []
    for chunk, res in zip(chunks, results):
        reports += _read_chunk(res, chunk, time_limit_s=time_limit_s, memory_mb=memory_mb,
                               max_error_chars=max_error_chars)
    return reports


def _chunk_code(jobs: Sequence[tuple[Mapping[str, Any], str]], *, test_time_limit_s: float, time_limit_s: float,
                max_error_chars: int, max_output_chars: int, details: bool) -> str:
    """The harness program grading ``jobs`` (solution + tests pairs) in one sandbox run."""
    payload = {"jobs": [{"solution": sol, "tests": list(p["tests"]), "setup": p.get("setup", "")} for p, sol in jobs],
               "test_time_limit_s": test_time_limit_s, "total_time_limit_s": time_limit_s,
               "max_error_chars": max_error_chars, "max_output_chars": max_output_chars, "max_output_bytes": 1 << 20,
               "details": details}
    return f"PAYLOAD = {json.dumps(json.dumps(payload, ensure_ascii=True))}\n" + _harness_source()


def _read_chunk(res: Any, jobs: Sequence[tuple[Mapping[str, Any], str]], *, time_limit_s: float, memory_mb: int,
                max_error_chars: int) -> list[dict[str, Any]]:
    """The per-job reports of one harness run (every test "not_run" with the reason when there is none)."""
    meta = {"duration_s": res.duration_s, "timed_out": res.timed_out, "oom": res.oom, "exit_code": res.exit_code,
            "backend": res.backend}
    report = None
    for line in reversed(res.stdout.splitlines()):
        if line.startswith(REPORT_MARK):
            try:
                report = json.loads(line[len(REPORT_MARK):])
            except json.JSONDecodeError:
                report = None
            break
    if (not isinstance(report, dict) or len(report.get("jobs", [])) != len(jobs)
            or any(len(r.get("tests", [])) != len(p["tests"]) for r, (p, _) in zip(report["jobs"], jobs))):
        if res.timed_out:
            why = f"the test run did not finish within its time limit ({time_limit_s:g}s)"
        elif res.oom:
            why = f"the test run ran out of memory ({memory_mb} MB)"
        else:
            why = f"the test run ended without a report (exit code {res.exit_code}"
            why += ", output cut by the sandbox)" if res.output_truncated else ")"
            if res.stderr.strip():
                why += ": " + res.stderr.strip()[-max_error_chars:]
        report = {"jobs": [{"tests": [{"status": "not_run"} for _ in p["tests"]], "load": None, "error": why}
                           for p, _ in jobs]}
    for r, (p, _) in zip(report["jobs"], jobs):
        for i, (entry, test) in enumerate(zip(r["tests"], p["tests"])):
            entry.update(index=i, kind=test["kind"], passed=entry.get("status") == "passed")
        if r.get("load") is not None:
            r["load"]["passed"] = r["load"].get("status") == "passed"
        r.setdefault("error", None)
        r["exec"] = meta
    return report["jobs"]


# --------------------------------------------------------------------------- report text
def _indent(text: str, prefix: str = "    ", max_lines: int = 12, max_chars: int = 600) -> str:
    text = text if len(text) <= max_chars else text[:max_chars] + " ..."
    lines = text.rstrip("\n").split("\n")
    if len(lines) > max_lines:
        lines = lines[:max_lines] + [f"... ({len(lines) - max_lines} more lines)"]
    return "\n".join(prefix + line for line in lines) if lines != [""] else prefix + "(empty)"


def _format_error(error: Mapping[str, Any] | None, *, reveal: bool) -> str:
    """Traceback-like text; frames from hidden test code (and checked values) are left out unless revealed."""
    if not error:
        return ""
    out = []
    frames = [f for f in error.get("frames", []) if reveal or not str(f[0]).startswith("<test")]
    if frames:
        out.append("Traceback (most recent call last):")
        for filename, lineno, name, line in frames[-4:]:
            out.append(f'  File "{filename}", line {lineno}, in {name}')
            if line:
                out.append(f"    {line.strip()}")
    message = error.get("message") or ""
    etype = error.get("type", "Error")
    if etype == "AssertionError" and not reveal:
        message = ""  # the checked values would reveal the hidden test
    out.append(f"{etype}: {message}" if message else etype)
    return "\n".join(out)


def format_report(problem: Mapping[str, Any], report: Mapping[str, Any], *, attempt: int, max_attempts: int,
                  visible: int, reveal_hidden: bool = False, max_failures_shown: int = 3) -> str:
    """The observation after an attempt: pass count, then details for the first failed tests."""
    results = report["tests"]
    n = len(results)
    passed = sum(bool(r.get("passed")) for r in results)
    head = f"Attempt {attempt} of {max_attempts}: {passed} of {n} tests passed."
    if passed == n:
        return head + " All tests pass."
    parts = [head]
    if report.get("error"):
        parts.append(f"The tests could not be run: {report['error']}")
    load = report.get("load")
    if load is not None and not load.get("passed"):
        detail = _format_error(load.get("error"), reveal=True) or load.get("status", "")
        if load.get("status") == "timeout":
            detail = f"Loading your code did not finish within the time limit.\n{detail}"
        parts.append("Your code failed before any test could run:\n" + _indent(detail))
    failed = [r for r in results if not r.get("passed") and r.get("status") != "not_run"]
    for r in failed[:max_failures_shown]:
        i = r["index"]
        test = problem["tests"][i]
        shown = i < visible or reveal_hidden
        label = f"Test {i + 1}" + ("" if i < visible else " (hidden)")
        status = r.get("status")
        err = _format_error(r.get("error"), reveal=shown)
        if status == "timeout":
            lines = [f"{label} timed out."]
        elif status == "wrong_output":
            lines = [f"{label} failed: wrong output."]
        elif err and "\n" not in err and not shown:
            lines, err = [f"{label} failed: {err}"], ""
        else:
            lines = [f"{label} failed."]
        if shown and test["kind"] == "assert":
            lines.append(_indent(test["code"]))
        if shown and test["kind"] == "io":
            lines.append("  input:\n" + _indent(test.get("stdin", "")))
            lines.append("  expected output:\n" + _indent(test["stdout"]))
            lines.append("  your output:\n" + _indent(r.get("stdout", "")))
        if err and status != "timeout":
            lines.append(_indent(err, prefix="  "))
        if status == "crashed" and r.get("stderr", "").strip():
            lines.append("  stderr:\n" + _indent(r["stderr"]))
        parts.append("\n".join(lines))
    rest = failed[max_failures_shown:]
    if rest:
        parts.append("Also failed: " + ", ".join(f"test {r['index'] + 1}" for r in rest) + ".")
    if attempt < max_attempts:
        parts.append("Reply with the complete corrected program in one ```python block.")
    else:
        parts.append("No attempts left.")
    return "\n\n".join(parts)


# --------------------------------------------------------------------------- reward
class TestsPassed:
    """Terminal: the last attempt's pass rate (``pass_rate``) or 1 if it passed every test (``all_pass``)."""
    __test__ = False  # not a pytest class

    def __init__(self, mode: str = "pass_rate", name: str = "tests"):
        if mode not in REWARD_MODES:
            raise ValueError(f"reward_mode must be one of {REWARD_MODES}, got {mode!r}")
        self.mode, self.name = mode, name

    def __call__(self, event: StepEvent) -> float:
        if not event.done:
            return 0.0
        infos = [event.info] + [r.info for r in reversed(event.history)]
        last = next((i for i in infos if "pass_rate" in i), None)
        if last is None:
            return 0.0
        return float(last["pass_rate"]) if self.mode == "pass_rate" else float(last["all_passed"])


# --------------------------------------------------------------------------- env
@dataclass
class CodeExecConfig(EnvConfig):
    """The settings of ``CodeExec-v0``."""
    split: str | None = field(default="train", metadata={
        "help": "train, validation or test: disjoint shares of the bundled problems by a hash of each task_id "
                "(null: all); problems you pass (data_path, problems) are used whole"})
    data_path: str | Path | None = field(default=None, metadata={
        "help": "a problem file (HumanEval-style, MBPP-style or agentgym jsonl, .gz ok); null: the bundled problems"})
    data_format: str = field(default="auto", metadata={
        "help": "auto (detected), agentgym, humaneval or mbpp"})
    problems: Sequence[Mapping[str, Any]] | None = field(default=None, metadata={
        "help": "the problems as a list of dicts (instead of data_path)"})
    max_attempts: int = field(default=3, metadata={"help": "code submissions per episode"})
    reward_mode: str = field(default="pass_rate", metadata={"help": "the tests term: pass_rate or all_pass"})
    attempt_cost: float = field(default=0.05, metadata={"help": "weight of the per-repair cost"})
    format_penalty: float = field(default=0.1, metadata={"help": "weight of the no-code penalty"})
    sandbox: Any = field(default="auto", metadata={
        "help": "auto (docker, else bwrap; refused at construction when neither works), a backend name, or a "
                "Sandbox; subprocess is no security boundary and needs allow_unsafe"})
    allow_unsafe: bool = field(default=False, metadata={
        "help": "allow sandbox=subprocess (or set AGENTGYM_ALLOW_UNSAFE_SANDBOX=1)"})
    test_time_limit_s: float = field(default=4.0, metadata={"help": "wall time of one test"})
    time_limit_s: float = field(default=20.0, metadata={"help": "wall time of one attempt"})
    memory_mb: int = field(default=256, metadata={"help": "memory of one attempt"})
    visible_tests: int | None = field(default=None, metadata={
        "help": "how many leading tests the prompt shows; null: each problem's visible"})
    reveal_hidden_tests: bool = field(default=False, metadata={
        "help": "show hidden tests' code and values in failure reports"})
    max_turns: int | None = field(default=None, metadata={
        "help": "null: max_attempts (a response without code uses up a turn too)"})

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if self.reward_mode not in REWARD_MODES:
            raise ValueError(f"reward_mode must be one of {REWARD_MODES}, got {self.reward_mode!r}")
        if self.split is not None and self.split not in SPLITS:
            raise ValueError(f"split must be one of {list(SPLITS)} or None, got {self.split!r}")
        if isinstance(self.sandbox, str) and self.sandbox not in SANDBOX_SPECS:
            raise ValueError(f"unknown sandbox {self.sandbox!r}; use one of {SANDBOX_SPECS} or a Sandbox instance")
        if self.visible_tests is not None and self.visible_tests < 0:
            raise ValueError("visible_tests must be >= 0")
        if self.problems is not None and self.data_path is not None:
            raise ValueError("give either problems= or data_path=, not both")


class CodeExecEnv(AgentEnv):
    """Program synthesis with execution feedback and multi-turn repair; settings: :class:`CodeExecConfig`."""

    tool_action_types = ()  # attempts are reported as such, not as tool calls
    config_class = CodeExecConfig

    def __init__(self, config: CodeExecConfig | None = None, **settings: Any):
        c = self.config = self.config_class.build(config, settings)
        split, data_path, problems, sandbox, allow_unsafe = c.split, c.data_path, c.problems, c.sandbox, c.allow_unsafe
        if problems is not None:
            self.problems = [validate_problem(dict(p), f"problems[{i}]") for i, p in enumerate(problems)]
        elif data_path is not None:
            self.problems = load_problems(data_path, c.data_format)
        else:
            self.problems = select_split(bundled_problems(), split)
        if not self.problems:
            raise ValueError("no problems")
        self.split = split
        self.num_tasks = len(self.problems)
        self.max_attempts = int(c.max_attempts)
        self.reward_mode, self.attempt_cost, self.format_penalty = c.reward_mode, c.attempt_cost, c.format_penalty
        self.sandbox_spec, self.allow_unsafe = sandbox, allow_unsafe
        self._code_sandbox = LazySandbox(sandbox, allow_unsafe)   # fails closed here, before any code runs
        self.test_time_limit_s, self.time_limit_s, self.memory_mb = c.test_time_limit_s, c.time_limit_s, c.memory_mb
        self.visible_tests, self.reveal_hidden_tests = c.visible_tests, c.reveal_hidden_tests
        self._attempts = 0
        self._last: dict[str, Any] | None = None
        super().__init__(reward=c.reward, max_turns=c.max_turns or c.max_attempts,
                         max_action_chars=c.max_action_chars, render_mode=c.render_mode, group_reward=c.group_reward)

    @property
    def sandbox(self) -> Any:
        """The sandbox, started on first use and shared with other envs (the constructor only chose it)."""
        return self._code_sandbox.get()

    @property
    def sandbox_backend(self) -> str:
        """The backend the tests run in (``docker``, ``bwrap`` or, opted in, ``subprocess``)."""
        return self._code_sandbox.backend

    def default_reward(self) -> Reward:
        return Reward([TestsPassed(self.reward_mode),
                       (InvalidActionPenalty(name="format"), self.format_penalty),
                       (CallCost("code", name="attempt_cost", free=1), self.attempt_cost)])

    # ------------------------------------------------------------------ tasks
    def get_task(self, index: int) -> dict[str, Any]:
        p = self.problems[index]
        return dict(p, tests=[dict(t) for t in p["tests"]])

    def _visible(self, task: Mapping[str, Any]) -> int:
        v = self.visible_tests if self.visible_tests is not None else int(task.get("visible", 0))
        return min(v, len(task["tests"]))

    def initial_messages(self, task: Mapping[str, Any]) -> list[dict[str, str]]:
        parts = [task["statement"].strip()]
        shown = task["tests"][:self._visible(task)]
        asserts = [t["code"] for t in shown if t["kind"] == "assert"]
        ios = [t for t in shown if t["kind"] == "io"]
        if asserts:
            parts.append("Examples (some of the tests):\n```python\n" + "\n".join(asserts) + "\n```")
        for j, t in enumerate(ios, 1):
            parts.append(f"Example {j} input:\n```\n{t.get('stdin', '')}```\nExample {j} output:\n```\n{t['stdout']}```"
                         .replace("\n\n```", "\n```"))
        if any(t["kind"] == "io" for t in task["tests"]):
            parts.append("Your program reads standard input and writes standard output.")
        if task.get("entry_point"):
            parts.append(f"Your code must define `{task['entry_point']}`; the tests call it after running your code.")
        parts.append("Reply with your program in one ```python code block.")
        system = SYSTEM_PROMPT.format(max_attempts=self.max_attempts)
        return [{"role": "system", "content": system}, {"role": "user", "content": "\n\n".join(parts)}]

    def on_reset(self, task: Mapping[str, Any]) -> None:
        self.task = validate_problem(dict(task), "options['task']")  # a hand-made task is checked like a file
        self._attempts = 0
        self._last = None

    # ------------------------------------------------------------------ one step
    def transition(self, action: str) -> Transition:
        blocks = extract_code_blocks(action, PYTHON_LANGS)
        if not blocks:
            if "```" in action and not extract_code_blocks(action):
                why = "Your ``` code block is not closed."
            elif extract_code_blocks(action):
                why = "Your code block is not marked as Python."
            else:
                why = "Your reply contains no code block."
            return self.invalid(f"{why} Reply with the complete program in one ```python block, closed with ```.")
        code = blocks[-1].code
        if not code.strip():
            return self.invalid("Your ```python block is empty. Reply with the complete program in it.")
        self._attempts += 1
        syntax = _syntax_error(code)
        if syntax is not None:
            report = {"tests": [{"index": i, "kind": t["kind"], "passed": False, "status": "not_run", "error": None}
                                for i, t in enumerate(self.task["tests"])],
                      "load": {"passed": False, "status": "syntax", "error": syntax}, "error": None, "exec": None}
        else:
            report = run_tests(self.sandbox, self.task, code, test_time_limit_s=self.test_time_limit_s,
                               time_limit_s=self.time_limit_s, memory_mb=self.memory_mb)
        results = report["tests"]
        passed = sum(bool(r.get("passed")) for r in results)
        pass_rate = passed / len(results)
        all_passed = passed == len(results)
        self._last = {"pass_rate": pass_rate, "all_passed": all_passed, "attempt": self._attempts}
        text = format_report(self.task, report, attempt=self._attempts, max_attempts=self.max_attempts,
                             visible=self._visible(self.task), reveal_hidden=self.reveal_hidden_tests)
        done = all_passed or self._attempts >= self.max_attempts
        info = {"pass_rate": pass_rate, "all_passed": all_passed, "tests_passed": passed, "tests_total": len(results),
                "attempt": self._attempts, "test_status": [r.get("status") for r in results],
                "sandbox_error": report.get("error"), "exec": report.get("exec")}
        return Transition([{"role": "user", "content": text}], "code", parsed=code, terminated=done, info=info)

    # ------------------------------------------------------------------ summaries
    def episode_success(self) -> bool:
        return bool(self._last and self._last["all_passed"])

    def episode_metrics(self) -> dict[str, Any]:
        solved_at = self._last["attempt"] if self._last and self._last["all_passed"] else 0
        return {"attempts": self._attempts, "pass_rate": self._last["pass_rate"] if self._last else 0.0,
                "solved_at_attempt": solved_at, "source": self.task.get("source")}

    @staticmethod
    def oracle(context: Mapping[str, Any]) -> str:
        """The reference solution in a fenced block (privileged task info)."""
        return "Here is my solution.\n\n```python\n" + context["task"]["solution"].rstrip("\n") + "\n```"


def _syntax_error(code: str) -> dict[str, Any] | None:
    """Python's own syntax error for ``code`` (checked here: no sandbox run needed), or None."""
    try:
        parse_python(code, "solution.py")
    except SyntaxError as e:
        line = (e.text or "").rstrip("\n")
        return {"type": type(e).__name__, "message": f"{e.msg} (line {e.lineno})",
                "frames": [["solution.py", e.lineno or 0, "<module>", line]]}
    except (ValueError, RecursionError, MemoryError, OverflowError) as e:
        return {"type": "SyntaxError", "message": f"the code cannot be parsed ({type(e).__name__}: {e})"[:300],
                "frames": []}
    return None
