"""Tools (agentgym/tools.py) and the calculator tool (envs/calculator.py)."""

from __future__ import annotations

import json
import re
import time
from fractions import Fraction
from typing import Literal, Optional

import jsonschema
import pytest

from agentgym import Tool, ToolResult, ToolSet, tool
from agentgym.envs.calculator import calculate, calculator


def search(query: str, k: int = 3, temperature: float = 0.5, exact: bool = False,
           ids: list[int] | None = None, mode: Literal["fast", "slow"] = "fast",
           note: Optional[str] = None) -> str:
    """Search the corpus for passages.

    Longer explanation that is not part of the summary's first paragraph.

    Args:
        query: what to look for.
        k (int): how many results
            to return.
        temperature: sampling temperature.
        exact: only exact matches.
        ids: restrict to these document ids.
        mode: search mode.
        note: free text.

    Returns:
        The passages.
    """
    return f"{query}|{k}|{temperature}|{exact}|{ids}|{mode}|{note}"


# --------------------------------------------------------------------------- Tool.from_function
def test_from_function_schema_from_type_hints_and_docstring():
    t = Tool.from_function(search)
    assert t.name == "search"
    assert t.description.startswith("Search the corpus for passages.")
    assert "Args:" not in t.description and "Returns" not in t.description
    assert t.parameters == {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "what to look for."},
            "k": {"type": "integer", "description": "how many results to return.", "default": 3},
            "temperature": {"type": "number", "description": "sampling temperature.", "default": 0.5},
            "exact": {"type": "boolean", "description": "only exact matches.", "default": False},
            "ids": {"type": ["array", "null"], "items": {"type": "integer"},
                    "description": "restrict to these document ids."},
            "mode": {"enum": ["fast", "slow"], "description": "search mode.", "default": "fast"},
            "note": {"type": ["string", "null"], "description": "free text."},
        },
        "required": ["query"],
        "additionalProperties": False,
    }
    jsonschema.Draft202012Validator.check_schema(t.parameters)


def test_from_function_schema_validates_like_python_would_accept():
    t = Tool.from_function(search)
    assert t.validation_errors({"query": "x"}) == []
    assert t.validation_errors({"query": "x", "k": 2, "temperature": 1, "exact": True, "ids": [1, 2],
                                "mode": "slow", "note": None}) == []
    assert t.validation_errors({"query": "x", "ids": None}) == []  # Optional admits null
    assert t.validation_errors({"query": "x", "k": "2"})
    assert t.validation_errors({"query": "x", "k": True})       # bool is not an integer
    assert t.validation_errors({"query": "x", "ids": [1, "2"]})
    assert t.validation_errors({"query": "x", "mode": "medium"})
    assert t.validation_errors({"query": None})
    assert t.validation_errors({"k": 1}) == ["'query' is a required property"]


def test_from_function_more_annotations():
    def f(a: dict, b: list, c: tuple[int, ...], d: int | str, e: Optional[Literal[1, 2]] = None, f=None, *args, **kw):
        """No Args section."""
    t = Tool.from_function(f, name="other", description="custom")
    assert (t.name, t.description) == ("other", "custom")
    p = t.parameters["properties"]
    assert p["a"] == {"type": "object"}
    assert p["b"] == {"type": "array"}
    assert p["c"] == {"type": "array", "items": {"type": "integer"}}
    assert p["d"] == {"anyOf": [{"type": "integer"}, {"type": "string"}]}
    assert p["e"] == {"enum": [1, 2, None]}
    assert p["f"] == {}
    assert set(p) == {"a", "b", "c", "d", "e", "f"}   # *args / **kw are not parameters
    assert t.parameters["required"] == ["a", "b", "c", "d"]


def test_from_function_unsupported_annotation_and_bad_name():
    def f(x: set[int]):
        pass
    with pytest.raises(TypeError):
        Tool.from_function(f)
    with pytest.raises(ValueError):
        Tool("bad name!", "d", {}, lambda: None)
    with pytest.raises(jsonschema.SchemaError):
        Tool("t", "d", {"type": "object", "properties": {"x": {"type": "no-such-type"}}}, lambda **k: None)


def test_tool_decorator_forms():
    @tool
    def add(a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: first.
            b: second.
        """
        return a + b

    @tool(name="mul", description="Multiply.")
    def times(a: int, b: int) -> int:
        return a * b

    assert isinstance(add, Tool) and add(a=2, b=3) == 5
    assert add.description == "Add two integers."
    assert add.parameters["properties"]["b"] == {"type": "integer", "description": "second."}
    assert (times.name, times.description) == ("mul", "Multiply.")
    assert times.parameters["properties"]["a"] == {"type": "integer"}


def test_spec_format():
    t = Tool.from_function(calculator)
    assert t.spec() == {"type": "function", "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression exactly.",
        "parameters": {"type": "object",
                       "properties": {"expression": {"type": "string", "description":
                                                     'numbers with + - * / // % ** and parentheses, e.g. "(12 + 7) * 3".'}},
                       "required": ["expression"], "additionalProperties": False}}}
    json.dumps(t.spec())  # JSON-serialisable
    ts = ToolSet([calculator, search])
    assert ts.specs() == [Tool.from_function(calculator).spec(), Tool.from_function(search).spec()]
    assert ts.names == ["calculator", "search"]
    assert "calculator" in ts and "nope" not in ts
    assert ts["search"].name == "search"
    described = ts.describe()
    assert described.startswith("- calculator: Evaluate an arithmetic expression exactly. Arguments (JSON Schema): ")
    assert '"required": ["expression"]' in described.splitlines()[0]
    assert "\n- search: Search the corpus for passages." in described


# --------------------------------------------------------------------------- ToolSet.call
def echo(text: str, times: int = 1) -> str:
    """Echo text."""
    return text * times


def structured(n: int) -> dict:
    return {"n": n, "items": list(range(n)), "word": "é"}


def boom(x: int) -> str:
    raise RuntimeError(f"kaboom {x}")


def slow(seconds: float) -> str:
    time.sleep(seconds)
    return "done"


@pytest.fixture
def toolset():
    ts = ToolSet([echo, structured, boom, slow], timeout_s=0.2, max_output_chars=10)
    yield ts
    ts.close()


def test_call_success(toolset):
    assert toolset.call("echo", {"text": "hi"}) == ToolResult("echo", "hi", ok=True, error=None)
    assert toolset.call("echo", {"text": "ab", "times": 2}).content == "abab"
    r = ToolSet([structured]).call("structured", {"n": 2})
    assert r.ok and json.loads(r.content) == {"n": 2, "items": [0, 1], "word": "é"}
    assert "é" in r.content  # not \u-escaped
    assert r.as_message() == {"role": "tool", "name": "structured", "content": r.content}
    assert r.as_message("call_1")["tool_call_id"] == "call_1"


def test_call_without_timeout_runs_inline():
    ts = ToolSet([echo, boom], timeout_s=None)
    assert ts.call("echo", {"text": "x"}).content == "x"
    r = ts.call("boom", {"x": 1})
    assert (r.ok, r.error) == (False, "exception")


def test_call_unknown_tool(toolset):
    r = toolset.call("nope", {})
    assert (r.ok, r.error, r.name) == (False, "unknown_tool", "nope")
    assert r.content == "Error: unknown tool 'nope'. Available tools: echo, structured, boom, slow."


@pytest.mark.parametrize("args, fragment", [
    ({"text": 5}, "text: 5 is not of type 'string'"),
    ({}, "'text' is a required property"),
    ({"text": "a", "extra": 1}, "Additional properties are not allowed ('extra' was unexpected)"),
    ({"text": "a", "times": 1.5}, "times: 1.5 is not of type 'integer'"),
    (["a"], "['a'] is not of type 'object'"),
    (None, "None is not of type 'object'"),
    ("text", "'text' is not of type 'object'"),
])
def test_call_schema_violations(toolset, args, fragment):
    r = toolset.call("echo", args)
    assert (r.ok, r.error) == (False, "invalid_arguments")
    assert r.content.startswith("Error: invalid arguments for echo: ")
    assert fragment in r.content


def test_call_tool_that_raises(toolset):
    r = toolset.call("boom", {"x": 7})
    assert (r.ok, r.error) == (False, "exception")
    assert r.content == "Error: boom failed: RuntimeError: kaboom 7"


def test_call_timeout(toolset):
    t0 = time.perf_counter()
    r = toolset.call("slow", {"seconds": 1.0})
    elapsed = time.perf_counter() - t0
    assert (r.ok, r.error) == (False, "timeout")
    assert r.content == "Error: slow timed out after 0.2 s."
    assert elapsed < 1.0
    # a fast call on the same toolset still works afterwards
    assert toolset.call("slow", {"seconds": 0.0}).content == "done"


def test_call_output_truncated_with_note(toolset):
    r = toolset.call("echo", {"text": "abcdefghij", "times": 5})
    assert r.ok
    assert r.content == "abcdefghij\n[output truncated: 50 characters, showing 10]"
    assert toolset.call("echo", {"text": "abcdefghij"}).content == "abcdefghij"  # exactly at the cap


def test_toolset_duplicate_names_and_plain_functions():
    with pytest.raises(ValueError, match="duplicate"):
        ToolSet([echo, Tool.from_function(echo)])
    ts = ToolSet([echo, Tool.from_function(echo, name="echo2")])
    assert ts.names == ["echo", "echo2"]


@pytest.mark.parametrize("name, args", [
    ("nope", {"x": 1}), ("echo", {"text": object()}), ("echo", []), ("boom", {"x": 1}),
    ("structured", {"n": -1}), ("echo", {"text": "x" * 100, "times": 1000}),
])
def test_call_never_raises(toolset, name, args):
    r = toolset.call(name, args)
    assert isinstance(r, ToolResult) and isinstance(r.content, str)


# --------------------------------------------------------------------------- calculator
@pytest.mark.parametrize("expr, value", [
    ("2 + 3 * 4", 14), ("(12 + 7) * 3", 57), ("7 // 2", 3), ("7 % 3", 1), ("-7 // 2", -4), ("2 ** 10", 1024),
    ("-5 + 2", -3), ("--3", 3), ("+4", 4), ("1,234 + 1", 1235), ("3 × 4", 12), ("8 ÷ 2", 4), ("2^3", 8),
    ("12345 * 6789", 83810205), ("2 ** 100", 2**100), ("1.5 * 2", 3), ("1e3", 1000),
])
def test_calculate_results(expr, value):
    out = calculate(expr)
    assert out == value and type(out) is int


@pytest.mark.parametrize("expr, value", [
    ("1 / 3", Fraction(1, 3)), ("7 / 2", Fraction(7, 2)), ("10 / 4", Fraction(5, 2)), ("0.1 + 0.2", Fraction(3, 10)),
    ("2 ** -1", Fraction(1, 2)), ("3 ** -2", Fraction(1, 9)), ("(1/3) ** 2", Fraction(1, 9)), ("2.5e-3", Fraction(1, 400)),
    ("1/3 + 1/6", Fraction(1, 2)),
])
def test_calculate_exact_fractions(expr, value):
    out = calculate(expr)
    assert out == value and isinstance(out, Fraction)


def test_calculate_fractional_powers_are_floats():
    assert calculate("2 ** 0.5") == pytest.approx(2 ** 0.5)
    assert calculate("4 ** 0.5") == 2.0


def test_calculator_tool_text():
    assert calculator("6 * 7") == "42"
    assert calculator("1/3") == "1/3 (≈ 0.3333333333)"
    assert calculator("4/2") == "2"


@pytest.mark.parametrize("expr, message", [
    ("x + 1", "unsupported element Name"),
    ("abs(-1)", "unsupported element Call"),
    ("__import__('os').system('true')", "unsupported element"),
    ("(1).real", "unsupported element Attribute"),
    ("'a' * 3", "unsupported element Constant"),
    ("True + 1", "unsupported element Constant"),
    ("[1]", "unsupported element List"),
    ("1 < 2", "unsupported element Compare"),
    ("9 ** 9 ** 9 ** 9", "exponent too large"),
    ("10 ** 5000", "exponent too large"),
    ("999999 ** 999", "result too large"),
    ("((1/3**999)**999)**999", "result too large"),   # huge denominators, not only numerators
    ("(2**999) * (2**999) * (2**999) * (2**999) * (2**999) * (2**999) * (2**999) * (2**999) * (2**999) "
     "* (2**999) * (2**999) * (2**999) * (2**999) * (2**999)", "result too large"),
    ("1 / 0", "division by zero"), ("1 // 0", "division by zero"), ("1 % 0", "division by zero"),
    ("0 ** -1", "division by zero"),
    ("(-8) ** 0.5", "fractional power of a negative number"),
    ("1e999", "number too large"),
    ("1" * 501, "longer than 500"),
    ("1 +", "not an arithmetic expression"),
    ("", "not an arithmetic expression"),
])
def test_calculate_rejects_with_value_error(expr, message):
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=re.escape(message)):
        calculate(expr)
    assert time.perf_counter() - t0 < 1.0


@pytest.mark.parametrize("expr", ["x + 1", "abs(-1)", "__import__('os')", "(1).real", "9**9**9**9", "1/0", "1e999"])
def test_toolset_turns_calculator_errors_into_results(expr):
    ts = ToolSet([calculator], timeout_s=2.0)
    r = ts.call("calculator", {"expression": expr})
    ts.close()
    assert (r.ok, r.error) == (False, "exception")
    assert r.content.startswith("Error: calculator failed: ValueError: ")


def test_toolset_calculator_success_and_schema():
    ts = ToolSet([calculator])
    assert ts.call("calculator", {"expression": "12*34"}) == ToolResult("calculator", "408")
    assert ts.call("calculator", {"expression": 5}).error == "invalid_arguments"
    assert ts.call("calculator", {"expr": "1"}).error == "invalid_arguments"
    ts.close()
