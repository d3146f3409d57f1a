"""CodeExec problems: the bundled set and loaders for HumanEval- and MBPP-style jsonl files.

Every loader returns problems in one normalised form (a plain dict, so it travels through
``options={"task": ...}`` and ``info["privileged"]`` unchanged)::

    {"task_id": str, "source": "agentgym" | "humaneval" | "mbpp",
     "statement": str,                 # shown to the model
     "entry_point": str | None,        # function/class the asserts call; None for stdin/stdout programs
     "tests": [{"kind": "assert", "code": "assert f(1) == 2"},
               {"kind": "io", "stdin": "1 2\\n", "stdout": "3\\n"}],
     "visible": int,                   # the first `visible` tests are shown in the prompt as examples
     "setup": str,                     # code run before every assert test (MBPP's test_setup_code)
     "solution": str}                  # reference program (oracle, data validation)

The bundled file ``problems.jsonl`` is written in exactly this form (``source`` defaults to
``"agentgym"``), so a user's own problems can use it too. The bundled statements, tests and
solutions were written for this project.

Splits: a bundled problem's split (``train``, ``validation`` or ``test``) is a hash of its ``task_id``
(:func:`split_of`; one in four is test, as before validation existed). Every file is checked at load:
two problems the model would see alike (the same statement and shown tests, compared normalised) are
an error naming them, as is a task shown in two splits of the bundled set (:func:`agentgym.splits.check_splits`).
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path
from typing import Any, Callable, Iterator

from agentgym.jsonl import read_jsonl
from agentgym.parsing import parse_python
from agentgym.splits import SPLITS, check_split, check_splits
from agentgym.splits import split_of as _split_of

__all__ = ["ProblemFormatError", "bundled_problems", "load_problems", "load_humaneval_jsonl", "load_mbpp_jsonl",
           "load_agentgym_jsonl", "detect_format", "validate_problem", "BUNDLED_PATH", "split_of", "select_split",
           "task_text"]

BUNDLED_PATH = Path(__file__).with_name("problems.jsonl")
FORMATS = ("agentgym", "humaneval", "mbpp")
_KEYS = {
    "humaneval": ("task_id", "prompt", "canonical_solution", "test", "entry_point"),
    "mbpp": ("task_id", "text", "code", "test_list"),
    "agentgym": ("task_id", "statement", "tests", "solution"),
}


class ProblemFormatError(ValueError):
    """A problem file or line is malformed; the message names the file and line."""


def _where(path: str | Path, lineno: int | None) -> str:
    return f"{path}:{lineno}" if lineno is not None else str(path)


def _rows(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-blank line of a ``.jsonl`` or ``.jsonl.gz`` file."""
    return read_jsonl(path, what="problem", error=ProblemFormatError)


def _require(obj: dict[str, Any], keys: tuple[str, ...], fmt: str, where: str) -> None:
    missing = [k for k in keys if k not in obj]
    if missing:
        raise ProblemFormatError(f"{where}: missing key(s) {missing} for the {fmt} format "
                                 f"(expected {list(keys)}, found {sorted(obj)})")


def _string(obj: dict[str, Any], key: str, where: str, *, allow_empty: bool = False) -> str:
    value = obj[key]
    if not isinstance(value, str) or (not allow_empty and not value.strip()):
        raise ProblemFormatError(f"{where}: {key!r} must be a non-empty string, got {type(value).__name__}"
                                 + ("" if isinstance(value, str) else f" {value!r}"[:80]))
    return value


def _check_python(source: str, what: str, where: str) -> None:
    try:
        parse_python(source)
    except (SyntaxError, ValueError) as e:
        raise ProblemFormatError(f"{where}: {what} is not valid Python ({type(e).__name__}: {e})") from None


def validate_problem(problem: dict[str, Any], where: str = "problem") -> dict[str, Any]:
    """Check a normalised problem (types, test kinds, Python syntax) and fill defaults."""
    if not isinstance(problem, dict):
        raise ProblemFormatError(f"{where}: a problem must be a dict, got {type(problem).__name__}")
    _require(problem, _KEYS["agentgym"], "agentgym", where)
    p = dict(problem)
    p["task_id"] = str(p["task_id"])
    p.setdefault("source", "agentgym")
    _string(p, "statement", where)
    _string(p, "solution", where)
    entry = p.setdefault("entry_point", None)
    if entry is not None and (not isinstance(entry, str) or not entry.isidentifier()):
        raise ProblemFormatError(f"{where}: 'entry_point' must be a Python identifier or null, got {entry!r}")
    setup = p.setdefault("setup", "")
    if not isinstance(setup, str):
        raise ProblemFormatError(f"{where}: 'setup' must be a string")
    tests = p["tests"]
    if not isinstance(tests, list) or not tests:
        raise ProblemFormatError(f"{where}: 'tests' must be a non-empty list")
    clean = []
    for i, t in enumerate(tests):
        if not isinstance(t, dict) or t.get("kind") not in ("assert", "io"):
            raise ProblemFormatError(f"{where}: test {i} must be an object with kind 'assert' or 'io', got {t!r}"[:300])
        if t["kind"] == "assert":
            if not isinstance(t.get("code"), str) or not t["code"].strip():
                raise ProblemFormatError(f"{where}: assert test {i} needs a non-empty 'code' string")
            _check_python(t["code"], f"assert test {i}", where)
            clean.append({"kind": "assert", "code": t["code"]})
        else:
            if not isinstance(t.get("stdin", ""), str) or not isinstance(t.get("stdout"), str):
                raise ProblemFormatError(f"{where}: io test {i} needs string 'stdin' and 'stdout'")
            clean.append({"kind": "io", "stdin": t.get("stdin", ""), "stdout": t["stdout"]})
    p["tests"] = clean
    visible = p.setdefault("visible", 0)
    if isinstance(visible, bool) or not isinstance(visible, int) or visible < 0:
        raise ProblemFormatError(f"{where}: 'visible' must be a non-negative int, got {visible!r}")
    _check_python(p["solution"], "the solution", where)
    _check_python(setup, "'setup'", where)
    return p


def task_text(problem: dict[str, Any]) -> str:
    """What the model is shown of a problem (its statement and visible tests): two problems with the same
    text, compared normalised, are one task."""
    shown = [t.get("code") or f"{t.get('stdin', '')}->{t.get('stdout', '')}" for t in problem["tests"][:problem["visible"]]]
    return "\n".join([problem["statement"], *shown])


def _unique(problems: list[dict[str, Any]], path: str | Path) -> list[dict[str, Any]]:
    """``problems`` if their task_ids and their texts (:func:`task_text`) are unique, else the one-line error."""
    if not problems:
        raise ProblemFormatError(f"{path}: contains no problems")
    seen: set[str] = set()
    for p in problems:
        if p["task_id"] in seen:
            raise ProblemFormatError(f"{path}: task_id {p['task_id']!r} occurs more than once")
        seen.add(p["task_id"])
    try:
        check_splits({"file": [task_text(p) for p in problems]}, source=str(path), what="problem")
    except ValueError as e:
        raise ProblemFormatError(str(e)) from None
    return problems


# --------------------------------------------------------------------------- formats
def load_agentgym_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Problems already in the normalised form (the bundled file's format)."""
    return _unique([validate_problem(obj, _where(path, n)) for n, obj in _rows(path)], path)


def _humaneval_tests(test: str, entry_point: str, where: str) -> list[dict[str, str]]:
    """HumanEval's ``check(candidate)`` as tests: one per assert when its body is only asserts (so the
    pass rate is graded), else the whole check as one test."""
    try:
        tree = parse_python(test)
    except (SyntaxError, ValueError) as e:
        raise ProblemFormatError(f"{where}: 'test' is not valid Python ({type(e).__name__}: {e})") from None
    checks = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"]
    if not checks:
        raise ProblemFormatError(f"{where}: 'test' defines no check(candidate) function")
    check = checks[-1]
    body = list(check.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]  # docstring
    params = [a.arg for a in check.args.args]
    if len(body) > 1 and len(params) == 1 and all(isinstance(s, ast.Assert) for s in body):
        prelude = "\n".join(ast.get_source_segment(test, n, padded=True) or "" for n in tree.body if n is not check)
        prelude = textwrap.dedent(prelude).strip()
        tests = []
        for stmt in body:
            segment = textwrap.dedent(ast.get_source_segment(test, stmt, padded=True) or "").strip()
            code = (prelude + "\n" if prelude else "") + f"{params[0]} = {entry_point}\n{segment}"
            tests.append({"kind": "assert", "code": code})
        return tests
    return [{"kind": "assert", "code": test.rstrip() + f"\n\ncheck({entry_point})\n"}]


def load_humaneval_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """HumanEval-style jsonl (``task_id, prompt, canonical_solution, test, entry_point``; ``.gz`` ok).

    The model sees the prompt (signature + docstring) and writes the whole function; the reference
    solution is ``prompt + canonical_solution``. No test is shown (the docstring has the examples).
    """
    problems = []
    for n, obj in _rows(path):
        where = _where(path, n)
        _require(obj, _KEYS["humaneval"], "HumanEval", where)
        prompt = _string(obj, "prompt", where)
        body = _string(obj, "canonical_solution", where)
        test = _string(obj, "test", where)
        entry = _string(obj, "entry_point", where).strip()
        if not entry.isidentifier():
            raise ProblemFormatError(f"{where}: 'entry_point' must be a Python identifier, got {entry!r}")
        statement = ("Complete the following Python function. Reply with the whole function (its `def` line, "
                     "body and any imports or helpers it needs).\n\n```python\n" + prompt.rstrip() + "\n```")
        problem = {"task_id": str(obj["task_id"]), "source": "humaneval", "statement": statement,
                   "entry_point": entry, "tests": _humaneval_tests(test, entry, where), "visible": 0,
                   "setup": "", "solution": prompt + body}
        problems.append(validate_problem(problem, where))
    return _unique(problems, path)


def load_mbpp_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """MBPP-style jsonl (``task_id, text, code, test_list``; optional ``test_setup_code``).

    As in the MBPP paper's prompt, the tests are shown (they name the function); each assert is one test.
    """
    problems = []
    for n, obj in _rows(path):
        where = _where(path, n)
        _require(obj, _KEYS["mbpp"], "MBPP", where)
        text = _string(obj, "text", where)
        code = _string(obj, "code", where)
        tests = obj["test_list"]
        if not isinstance(tests, list) or not tests or not all(isinstance(t, str) and t.strip() for t in tests):
            raise ProblemFormatError(f"{where}: 'test_list' must be a non-empty list of assert strings")
        setup = obj.get("test_setup_code") or ""
        if not isinstance(setup, str):
            raise ProblemFormatError(f"{where}: 'test_setup_code' must be a string")
        problem = {"task_id": str(obj["task_id"]), "source": "mbpp", "statement": text.strip(), "entry_point": None,
                   "tests": [{"kind": "assert", "code": t.strip()} for t in tests], "visible": len(tests),
                   "setup": setup, "solution": code.replace("\r\n", "\n")}
        problems.append(validate_problem(problem, where))
    return _unique(problems, path)


_LOADERS: dict[str, Callable[[str | Path], list[dict[str, Any]]]] = {
    "agentgym": load_agentgym_jsonl, "humaneval": load_humaneval_jsonl, "mbpp": load_mbpp_jsonl}


def detect_format(path: str | Path) -> str:
    """``agentgym``, ``humaneval`` or ``mbpp``, from the keys of the file's first object."""
    for n, obj in _rows(path):
        for fmt in ("humaneval", "mbpp", "agentgym"):
            if all(k in obj for k in _KEYS[fmt]):
                return fmt
        raise ProblemFormatError(
            f"{_where(path, n)}: cannot tell the format from keys {sorted(obj)}; expected HumanEval "
            f"{list(_KEYS['humaneval'])}, MBPP {list(_KEYS['mbpp'])} or agentgym {list(_KEYS['agentgym'])}")
    raise ProblemFormatError(f"{path}: contains no problems")


def load_problems(path: str | Path, fmt: str = "auto") -> list[dict[str, Any]]:
    """Load a problem file; ``fmt`` is ``auto`` (detected from the first line) or one of :data:`FORMATS`."""
    if fmt == "auto":
        fmt = detect_format(path)
    if fmt not in _LOADERS:
        raise ValueError(f"unknown problem format {fmt!r}; use 'auto' or one of {list(FORMATS)}")
    return _LOADERS[fmt](path)


_BUNDLED: list[dict[str, Any]] | None = None


def bundled_problems() -> list[dict[str, Any]]:
    """The problems shipped with agentgym (loaded once per process; callers get copies)."""
    global _BUNDLED
    if _BUNDLED is None:
        _BUNDLED = load_agentgym_jsonl(BUNDLED_PATH)
    return [dict(p, tests=[dict(t) for t in p["tests"]]) for p in _BUNDLED]


def split_of(task_id: str) -> str:
    """``"train"``, ``"validation"`` or ``"test"`` for a problem, from a hash of its ``task_id``: stable across
    machines and Python versions, and adding a problem never moves another one to another split. One in
    four is test (the same ones as before validation existed); of the rest, one in eight is validation
    (a small set, so that most of the bundled problems stay for training)."""
    return _split_of(task_id, test_every=4, validation_every=8)


def select_split(problems: list[dict[str, Any]], split: str | None) -> list[dict[str, Any]]:
    """The problems of ``split`` (``None``: all of them), in their original order; the splits of
    ``problems`` must be disjoint (:func:`agentgym.splits.check_splits` on :func:`task_text`)."""
    check_split(split, allow_none=True)
    by_split = {s: [p for p in problems if split_of(p["task_id"]) == s] for s in SPLITS}
    check_splits({s: [task_text(p) for p in ps] for s, ps in by_split.items()}, what="problem")
    return problems if split is None else by_split[split]
