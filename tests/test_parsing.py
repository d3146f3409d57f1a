"""Action parsers (agentgym/parsing.py): golden cases for every function plus hypothesis properties
(never raise on any text; round trips)."""

from __future__ import annotations

import json

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from agentgym.app.checking import MALFORMED_ACTIONS
from agentgym.parsing import (
    CodeBlock, ReActStep, TagMatch, ToolCall, ToolCallParse, all_tag_contents, extract_boxed,
    extract_code_blocks, first_tag, last_tag_content, parse_react, parse_tool_calls, tag_format_errors,
    truncate_after_stop,
)


# --------------------------------------------------------------------------- first_tag
def test_first_tag_search_before_answer():
    text = "think <search>capital of France</search> then <answer>Paris</answer>"
    m = first_tag(text)
    assert m == TagMatch("search", "capital of France", text.index("<search>"), text.index(" then"))
    assert text[m.start:m.end] == "<search>capital of France</search>"


def test_first_tag_answer_before_search():
    m = first_tag("<answer>Paris</answer><search>more</search>")
    assert (m.tag, m.content, m.start) == ("answer", "Paris", 0)


def test_first_tag_content_is_stripped_and_dotall():
    m = first_tag("<answer>\n  line one\nline two \t\n</answer>")
    assert m.content == "line one\nline two"


def test_first_tag_nested_outer_complete_tag_wins():
    m = first_tag("<answer><search>q</search></answer>")
    assert m.tag == "answer"
    assert m.content == "<search>q</search>"


def test_first_tag_unclosed_first_tag_is_skipped():
    # <search> is never closed, so the first *complete* tag is the answer
    m = first_tag("<search>who is it <answer>Ada</answer>")
    assert (m.tag, m.content) == ("answer", "Ada")


@pytest.mark.parametrize("text", [
    "", "no tags", "<answer>unclosed", "<search>q</answer>", "</answer>x<answer>", "<Answer>x</Answer>",
    "<answer >x</answer>",
])
def test_first_tag_none(text):
    assert first_tag(text) is None


def test_first_tag_mismatched_closer_then_complete():
    m = first_tag("<search>a</answer> <search>b</search>")
    assert (m.tag, m.content) == ("search", "a</answer> <search>b")


def test_first_tag_custom_tags_are_escaped():
    assert first_tag("<a.b>x</a.b>", ("a.b",)).content == "x"
    assert first_tag("<aXb>x</aXb>", ("a.b",)) is None
    m = first_tag('<tool_call>{"name": "f"}</tool_call><answer>1</answer>', ("tool_call", "answer"))
    assert (m.tag, m.content) == ("tool_call", '{"name": "f"}')
    assert first_tag("<search>x</search>", ("answer",)) is None


def test_first_tag_empty_content_and_no_tags_error():
    assert first_tag("<answer></answer>").content == ""
    assert first_tag("<answer>   </answer>").content == ""
    with pytest.raises(ValueError):
        first_tag("<answer>x</answer>", ())


# --------------------------------------------------------------------------- all / last tag content
def test_all_tag_contents_in_order_stripped():
    text = "<answer> a </answer> junk <answer>b\nc</answer><answer>unclosed"
    assert all_tag_contents(text, "answer") == ["a", "b\nc"]
    assert all_tag_contents(text, "search") == []
    assert all_tag_contents("<x.y>1</x.y><xzy>2</xzy>", "x.y") == ["1"]


def test_last_tag_content():
    assert last_tag_content("<answer>1</answer> <answer> 2 </answer>", "answer") == "2"
    assert last_tag_content("<answer>1</answer> <answer>2", "answer") == "1"
    assert last_tag_content("nothing", "answer") is None
    assert last_tag_content("<answer></answer>", "answer") == ""


# --------------------------------------------------------------------------- tag_format_errors
def test_tag_format_errors_well_formed():
    assert tag_format_errors("<search>a</search> text <answer>b</answer>", ("search", "answer")) == []
    assert tag_format_errors("no tags at all", ("search", "answer")) == []
    # tags not in the list are ignored
    assert tag_format_errors("<think>", ("search", "answer")) == []


def test_tag_format_errors_unclosed():
    assert tag_format_errors("<answer>x", ("answer",)) == ["<answer> is never closed"]


def test_tag_format_errors_nested():
    errs = tag_format_errors("<answer><search>q</search></answer>", ("search", "answer"))
    assert errs[0] == "<search> opened inside <answer> at offset 8"
    assert len(errs) == 2  # the outer </answer> then closes nothing
    assert "</answer> at offset" in errs[1] and "closes nothing" in errs[1]


def test_tag_format_errors_stray_closer():
    assert tag_format_errors("x</search>", ("search",)) == ["</search> at offset 1 closes nothing"]


def test_tag_format_errors_needs_tags():
    with pytest.raises(ValueError):
        tag_format_errors("x", [])


# --------------------------------------------------------------------------- truncate_after_stop
def test_truncate_after_stop():
    assert truncate_after_stop("a <answer>1</answer> trailing", ["</answer>"]) == "a <answer>1</answer>"
    assert truncate_after_stop("no stop here", ["</answer>"]) == "no stop here"
    assert truncate_after_stop("abc", []) == "abc"
    # the stop string that *completes* first wins (what a streaming generator would stop at)
    text = "<search>q</search> <answer>a</answer>"
    assert truncate_after_stop(text, ["</answer>", "</search>"]) == "<search>q</search>"
    assert truncate_after_stop("xabcd", ["abcd", "bc"]) == "xabc"
    # the first occurrence of a stop string, not a later one
    assert truncate_after_stop("1</a>2</a>", ["</a>"]) == "1</a>"


# --------------------------------------------------------------------------- parse_tool_calls
def _tc(payload: str) -> str:
    return f"<tool_call>{payload}</tool_call>"


def test_parse_tool_call_valid():
    out = parse_tool_calls('before ' + _tc('{"name": "calculator", "arguments": {"expression": "1+2"}}') + " after")
    assert out == ToolCallParse([ToolCall("calculator", {"expression": "1+2"})], [])
    assert out.found


def test_parse_tool_call_arguments_as_json_string():
    payload = json.dumps({"name": "search", "arguments": json.dumps({"query": "x", "k": 2})})
    out = parse_tool_calls(_tc(payload))
    assert out.calls == [ToolCall("search", {"query": "x", "k": 2})]
    assert out.errors == []


def test_parse_tool_call_parameters_alias_null_and_missing_args():
    assert parse_tool_calls(_tc('{"name": "f", "parameters": {"a": 1}}')).calls == [ToolCall("f", {"a": 1})]
    assert parse_tool_calls(_tc('{"name": "f", "arguments": null}')).calls == [ToolCall("f", {})]
    assert parse_tool_calls(_tc('{"name": "f"}')).calls == [ToolCall("f", {})]
    assert parse_tool_calls(_tc('{"name": "f", "arguments": "  "}')).calls == [ToolCall("f", {})]
    assert parse_tool_calls(_tc('{"name": "  f  ", "arguments": {}}')).calls == [ToolCall("f", {})]


@pytest.mark.parametrize("payload", ['{"arguments": {}}', '{"name": 3}', '{"name": ""}', '{"name": "   "}'])
def test_parse_tool_call_missing_name(payload):
    out = parse_tool_calls(_tc(payload))
    assert out.calls == []
    assert out.errors == ['a tool call needs a string "name"']


@pytest.mark.parametrize("args, kind", [("[1, 2]", "list"), ("5", "int"), ('"[1]"', "list")])
def test_parse_tool_call_non_object_arguments(args, kind):
    out = parse_tool_calls(_tc('{"name": "f", "arguments": ' + args + "}"))
    assert out.calls == []
    assert out.errors == [f"\"arguments\" of 'f' must be a JSON object, got {kind}"]


def test_parse_tool_call_arguments_string_not_json():
    out = parse_tool_calls(_tc('{"name": "f", "arguments": "{bad"}'))
    assert out.calls == []
    assert len(out.errors) == 1
    assert out.errors[0].startswith("\"arguments\" of 'f' is a string that is not valid JSON")


@pytest.mark.parametrize("payload, kind", [("[]", "list"), ('"f"', "str"), ("3", "int"), ("null", "NoneType")])
def test_parse_tool_call_not_an_object(payload, kind):
    assert parse_tool_calls(_tc(payload)).errors == [f"a tool call must be a JSON object, got {kind}"]


def test_parse_tool_call_broken_json_reports_line_and_column():
    payload = '{"name": "calc",\n "arguments": {"x": }}'
    out = parse_tool_calls(_tc(payload))
    assert out.calls == []
    (err,) = out.errors
    assert err.startswith("invalid JSON in <tool_call>: Expecting value at line 2 column 21")
    assert "near" in err


def test_parse_tool_call_unclosed_tag():
    out = parse_tool_calls('<tool_call>{"name": "f", "arguments": {}}')
    assert out.calls == []
    assert out.errors == ["<tool_call> is opened but never closed with </tool_call>"]
    assert out.found


def test_parse_tool_call_unclosed_after_a_good_one():
    out = parse_tool_calls(_tc('{"name": "a"}') + ' <tool_call>{"name": "b"}')
    assert out.calls == [ToolCall("a", {})]
    assert out.errors == ["<tool_call> is opened but never closed with </tool_call>"]


@pytest.mark.parametrize("payload", ["", "   ", "\n"])
def test_parse_tool_call_empty_tag(payload):
    out = parse_tool_calls(_tc(payload))
    assert out.calls == []
    assert out.errors == ['empty <tool_call>: expected a JSON object with "name" and "arguments"']


def test_parse_tool_call_multiple_calls_in_order_with_errors_kept():
    text = (_tc('{"name": "a", "arguments": {"i": 1}}') + "\n" + _tc("{oops") + "\n"
            + _tc('{"name": "b", "arguments": {"i": 2}}'))
    out = parse_tool_calls(text)
    assert out.calls == [ToolCall("a", {"i": 1}), ToolCall("b", {"i": 2})]
    assert len(out.errors) == 1 and out.errors[0].startswith("invalid JSON in <tool_call>")


def test_parse_tool_call_none_found():
    out = parse_tool_calls("just text </tool_call>")
    assert out == ToolCallParse([], [])
    assert not out.found


def test_parse_tool_call_custom_tags():
    out = parse_tool_calls('[TOOL]{"name": "f", "arguments": {"a": 1}}[/TOOL]', "[TOOL]", "[/TOOL]")
    assert out.calls == [ToolCall("f", {"a": 1})]


@pytest.mark.parametrize("payload", [
    "[" * 100_000,
    "{" * 100_000,
    '{"name": "f", "arguments": ' + '{"a": ' * 50_000,
    '{"name": "f", "arguments": ' + '[' * 50_000 + ']' * 50_000 + '}',
    json.dumps({"name": "f", "arguments": "[" * 100_000}),
    json.dumps({"name": "f", "arguments": '{"a":' * 100_000}),
])
def test_parse_tool_call_deeply_nested_json_does_not_crash(payload):
    out = parse_tool_calls(_tc(payload))
    assert out.calls == []
    assert len(out.errors) == 1
    assert "JSON" in out.errors[0]


# --------------------------------------------------------------------------- parse_react
def test_parse_react_thought_action_input():
    out = parse_react("Thought: I should look it up.\nAction: search\nAction Input: capital of France\n")
    assert out == ReActStep(thought="I should look it up.", action="search", action_input="capital of France")


def test_parse_react_multiline_fields_and_indentation():
    out = parse_react("Thought: first line\nsecond line\n  Action:   calculator  \nAction Input:\n  12 * 7\n")
    assert out == ReActStep(thought="first line\nsecond line", action="calculator", action_input="12 * 7")


def test_parse_react_final_answer():
    assert parse_react("Thought: I know it.\nFinal Answer: Paris") == ReActStep(thought="I know it.", final_answer="Paris")
    assert parse_react("Final Answer: 42") == ReActStep(final_answer="42")


def test_parse_react_compact_form():
    assert parse_react("Action: search[capital of France]") == ReActStep(action="search", action_input="capital of France")
    assert parse_react("Action: lookup[ x [y] ]") == ReActStep(action="lookup", action_input="x [y]")


def test_parse_react_invented_observation_is_ignored():
    text = ("Thought: t\nAction: search\nAction Input: q\nObservation: Paris is the capital\n"
            "Thought: done\nFinal Answer: Paris")
    assert parse_react(text) == ReActStep(thought="t", action="search", action_input="q")


def test_parse_react_observation_before_everything():
    out = parse_react("Observation: fake\nFinal Answer: x")
    assert out.final_answer is None and out.action is None
    assert out.error is not None


def test_parse_react_missing_input():
    out = parse_react("Thought: t\nAction: search")
    assert out == ReActStep(thought="t", action="search", error="'Action:' without 'Action Input:'")


def test_parse_react_empty_action_input_is_an_empty_input():
    assert parse_react("Action: search\nAction Input:") == ReActStep(action="search", action_input="")


def test_parse_react_empty_action_and_input_without_action():
    assert parse_react("Action:\nAction Input: x").error == "'Action:' names no tool"
    assert parse_react("Thought: t\nAction Input: x") == ReActStep(thought="t", error="'Action Input:' without 'Action:'")


def test_parse_react_empty_final_answer():
    assert parse_react("Thought: hmm\nFinal Answer:   ") == ReActStep(thought="hmm", error="'Final Answer:' is empty")


def test_parse_react_both_action_and_final_answer_first_wins():
    a_first = parse_react("Action: search\nAction Input: q\nFinal Answer: 5")
    assert a_first == ReActStep(action="search", action_input="q")
    f_first = parse_react("Final Answer: 5\nAction: search\nAction Input: q")
    assert f_first == ReActStep(final_answer="5")


def test_parse_react_labels_only_at_line_start_and_repeated_labels():
    out = parse_react("I think the Action: is unclear")
    assert out.error == "expected 'Action:' + 'Action Input:' lines or a 'Final Answer:' line"
    # the first occurrence of a label is kept
    out = parse_react("Action: a\nAction Input: 1\nAction: b\nAction Input: 2")
    assert (out.action, out.action_input) == ("a", "1")


def test_parse_react_nothing():
    assert parse_react("") == ReActStep(error="expected 'Action:' + 'Action Input:' lines or a 'Final Answer:' line")


# --------------------------------------------------------------------------- extract_code_blocks
MIXED = ("Here:\n```python\nprint(1)\n```\nand\n```bash\necho hi\n```\n"
         "~~~\nplain\n~~~\n```Python extra info\nx = 2\ny = 3\n```\n")


def test_extract_code_blocks_all_in_order():
    assert extract_code_blocks(MIXED) == [
        CodeBlock("python", "print(1)\n"), CodeBlock("bash", "echo hi\n"), CodeBlock("", "plain\n"),
        CodeBlock("python", "x = 2\ny = 3\n")]


def test_extract_code_blocks_language_filter():
    assert [b.code for b in extract_code_blocks(MIXED, "python")] == ["print(1)\n", "x = 2\ny = 3\n"]
    assert [b.code for b in extract_code_blocks(MIXED, "PYTHON")] == ["print(1)\n", "x = 2\ny = 3\n"]
    assert [b.language for b in extract_code_blocks(MIXED, ["bash", ""])] == ["bash", ""]
    assert extract_code_blocks(MIXED, "") == [CodeBlock("", "plain\n")]
    assert extract_code_blocks(MIXED, "rust") == []


def test_extract_code_blocks_tilde_fences_and_inner_backticks():
    text = "~~~python\ns = '```'\n~~~\n"
    assert extract_code_blocks(text) == [CodeBlock("python", "s = '```'\n")]


def test_extract_code_blocks_longer_fence_contains_shorter():
    text = "````markdown\n```python\nx\n```\n````\n"
    assert extract_code_blocks(text) == [CodeBlock("markdown", "```python\nx\n```\n")]


def test_extract_code_blocks_empty_unclosed_and_inline():
    assert extract_code_blocks("```python\n```") == [CodeBlock("python", "")]
    assert extract_code_blocks("```python\nprint(1)\n") == []
    assert extract_code_blocks("inline ```python print(1)``` here") == []


def test_extract_code_blocks_indented_fences():
    assert extract_code_blocks("  ```js\n  let a = 1;\n  ```") == [CodeBlock("js", "  let a = 1;\n")]


# --------------------------------------------------------------------------- extract_boxed
def test_extract_boxed_nested_braces():
    assert extract_boxed(r"so \boxed{\frac{1}{2}}.") == r"\frac{1}{2}"
    assert extract_boxed(r"\boxed{ {a}{b{c}} }") == "{a}{b{c}}"


def test_extract_boxed_fbox_and_spacing():
    assert extract_boxed(r"\fbox{42}") == "42"
    assert extract_boxed(r"\boxed {7}") == "7"


def test_extract_boxed_first_vs_last():
    text = r"first \boxed{1}, then \fbox{2}, finally \boxed{3}"
    assert extract_boxed(text) == "3"
    assert extract_boxed(text, which="last") == "3"
    assert extract_boxed(text, which="first") == "1"
    with pytest.raises(ValueError):
        extract_boxed(text, which="middle")


@pytest.mark.parametrize("text", [r"\boxed{", r"\boxed{1", r"\boxed{{1}", r"\boxed{\}", "boxed{1}", "no box", ""])
def test_extract_boxed_unbalanced_or_absent_is_none(text):
    assert extract_boxed(text) is None
    assert extract_boxed(text, which="first") is None


def test_extract_boxed_escaped_braces():
    assert extract_boxed(r"\boxed{\{1, 2\}}") == r"\{1, 2\}"
    assert extract_boxed(r"\boxed{a \} b}") == r"a \} b"
    assert extract_boxed(r"\boxed{x \\}") == r"x \\"


def test_extract_boxed_unbalanced_first_then_balanced():
    assert extract_boxed(r"\boxed{1 and \boxed{2}") == "2"
    assert extract_boxed(r"\boxed{1 and \boxed{2}", which="first") == "2"


def test_extract_boxed_empty():
    assert extract_boxed(r"\boxed{}") == ""


# --------------------------------------------------------------------------- properties
_FRAGMENTS = ["<answer>", "</answer>", "<search>", "</search>", "<tool_call>", "</tool_call>", "{", "}", "[", "]",
              '"name"', ":", '"arguments"', "\\boxed{", "\\fbox{", "\\", "```", "~~~", "```python\n", "\n",
              "Thought:", "Action:", "Action Input:", "Final Answer:", "Observation:", " ", "x", "1", '"']
markupish = st.lists(st.one_of(st.sampled_from(_FRAGMENTS), st.text(max_size=5)), max_size=30).map("".join)
any_text = st.one_of(st.text(), markupish, st.sampled_from(MALFORMED_ACTIONS))


def _run_all_parsers(text: str) -> None:
    m = first_tag(text)
    assert m is None or (m.tag in ("search", "answer") and text[m.start:m.end].startswith(f"<{m.tag}>"))
    assert isinstance(all_tag_contents(text, "answer"), list)
    last = last_tag_content(text, "answer")
    assert last is None or isinstance(last, str)
    assert all(isinstance(e, str) for e in tag_format_errors(text, ("search", "answer")))
    assert text.startswith(truncate_after_stop(text, ["</answer>", "</search>"]))
    tc = parse_tool_calls(text)
    assert all(isinstance(c, ToolCall) and isinstance(c.arguments, dict) for c in tc.calls)
    assert all(isinstance(e, str) and e for e in tc.errors)
    r = parse_react(text)
    # exactly one of action / final answer, or an error
    assert r.error is not None or ((r.action is None) != (r.final_answer is None))
    assert all(isinstance(b, CodeBlock) for b in extract_code_blocks(text))
    for which in ("first", "last"):
        b = extract_boxed(text, which)
        assert b is None or isinstance(b, str)


@settings(max_examples=300, deadline=None)
@given(any_text)
def test_parsers_never_raise(text):
    _run_all_parsers(text)


_no_markup = st.text().filter(lambda s: "</answer>" not in s)


@settings(max_examples=200, deadline=None)
@given(_no_markup)
def test_first_tag_round_trip(s):
    m = first_tag(f"<answer>{s}</answer>")
    assert m is not None and m.tag == "answer" and m.content == s.strip()
    assert last_tag_content(f"<answer>{s}</answer>", "answer") == s.strip()


@settings(max_examples=100, deadline=None)
@given(st.lists(_no_markup, max_size=5))
def test_all_tag_contents_round_trip(parts):
    text = "junk".join(f"<answer>{s}</answer>" for s in parts)
    assert all_tag_contents(text, "answer") == [s.strip() for s in parts]


_json_value = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=10),
                           lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=5), kids, max_size=3),
                           max_leaves=10)


@settings(max_examples=150, deadline=None)
@given(name=st.text(min_size=1).filter(lambda n: n.strip()),
       args=st.dictionaries(st.text(max_size=8), _json_value, max_size=4),
       as_string=st.booleans())
def test_parse_tool_calls_round_trip(name, args, as_string):
    payload = json.dumps({"name": name, "arguments": json.dumps(args) if as_string else args})
    assume("</tool_call>" not in payload)
    out = parse_tool_calls(f"text <tool_call>{payload}</tool_call> more")
    assert out.errors == []
    assert out.calls == [ToolCall(name.strip(), args)]


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_characters="{}\\")), st.sampled_from(["boxed", "fbox"]))
def test_extract_boxed_round_trip(s, macro):
    assert extract_boxed(f"The answer is \\{macro}{{{s}}}.") == s.strip()
    assert extract_boxed(f"\\boxed{{{{{s}}}}}") == "{" + s + "}"


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_characters="`~\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")),
       st.sampled_from(["python", "bash", ""]))
def test_extract_code_blocks_round_trip(line, lang):
    text = f"intro\n```{lang}\n{line}\n```\noutro"
    assert extract_code_blocks(text) == [CodeBlock(lang, line + "\n")]


@settings(max_examples=150, deadline=None)
@given(st.text(), st.text(min_size=1))
def test_truncate_after_stop_properties(text, stop):
    out = truncate_after_stop(text, [stop])
    if stop in text:
        assert out == text[: text.index(stop) + len(stop)]
    else:
        assert out == text


def test_parse_python_from_many_threads_at_once():
    """CPython 3.11's ast.parse can fail with SystemError when threads parse at once (python/cpython#106905);
    env workers validate code in threads, so parse_python takes one parse at a time."""
    import ast
    from concurrent.futures import ThreadPoolExecutor

    from agentgym.parsing import parse_python
    nested = "".join(f"    if n > {i}:\n        n = [n, [n, (n, {{n: n}})]]\n" for i in range(40))
    source = "def f(n):\n" + nested + "    return n\n"
    with ThreadPoolExecutor(8) as pool:
        trees = list(pool.map(lambda _: parse_python(source), range(400)))
    assert all(isinstance(t, ast.Module) and t.body[0].name == "f" for t in trees)
    with pytest.raises(SyntaxError):
        parse_python("def (")
    assert isinstance(parse_python("1 + 2", mode="eval"), ast.Expression)
