"""Action parsing shared by all environments. Pure functions; no env state.

Every parser returns a value describing what it found *or* a human-readable error string, and
never raises on model output: an env turns the error into an observation and a penalty.
"""

from __future__ import annotations

import ast
import bisect
import functools
import json
import re
import threading
from dataclasses import dataclass, field
from typing import Any, Sequence

__all__ = [
    "parse_python", "TagMatch", "first_tag", "last_tag_content", "all_tag_contents", "tag_format_errors",
    "ToolCall", "ToolCallParse", "parse_tool_calls",
    "ReActStep", "parse_react",
    "CodeBlock", "extract_code_blocks",
    "extract_boxed", "boxed_spans", "truncate_after_stop",
]


# --------------------------------------------------------------------------- tags
@dataclass(frozen=True)
class TagMatch:
    tag: str
    content: str
    start: int
    end: int


def _tag_alternation(tags: Sequence[str]) -> str:
    if not tags:
        raise ValueError("need at least one tag name")
    return "|".join(re.escape(t) for t in tags)


@functools.lru_cache(maxsize=512)
def _tag_regex(template: str, tags: tuple[str, ...], flags: int = 0) -> re.Pattern[str]:
    """``template`` with ``@`` replaced by the escaped alternation of ``tags``, compiled once (envs
    parse every action with the same few tag sets)."""
    return re.compile(template.replace("@", _tag_alternation(tags)), flags)


def first_tag(text: str, tags: Sequence[str] = ("search", "answer")) -> TagMatch | None:
    """The first *complete* ``<tag>...</tag>`` among ``tags`` (Search-R1 rule: the first match of
    ``<(search|answer)>(.*?)</\\1>`` decides the action). Content is stripped."""
    m = _tag_regex(r"<(@)>(.*?)</\1>", tuple(tags), re.DOTALL).search(text)
    if m is None:
        return None
    return TagMatch(m.group(1), m.group(2).strip(), m.start(), m.end())


def all_tag_contents(text: str, tag: str) -> list[str]:
    """Contents (stripped) of every complete ``<tag>...</tag>`` in order."""
    return [c.strip() for c in _tag_regex(r"<@>(.*?)</@>", (tag,), re.DOTALL).findall(text)]


def last_tag_content(text: str, tag: str) -> str | None:
    """Content of the last complete ``<tag>...</tag>`` (Search-R1 answer extraction), or None."""
    found = all_tag_contents(text, tag)
    return found[-1] if found else None


def tag_format_errors(text: str, tags: Sequence[str]) -> list[str]:
    """Problems with tag markup: unbalanced or nested open/close tags. Empty list = well-formed."""
    errors: list[str] = []
    token = _tag_regex(r"<(/?)(@)>", tuple(tags))
    open_tag: str | None = None
    for m in token.finditer(text):
        closing, name = m.group(1) == "/", m.group(2)
        if not closing:
            if open_tag is not None:
                errors.append(f"<{name}> opened inside <{open_tag}> at offset {m.start()}")
            open_tag = name
        else:
            if open_tag != name:
                errors.append(f"</{name}> at offset {m.start()} closes nothing")
            else:
                open_tag = None
    if open_tag is not None:
        errors.append(f"<{open_tag}> is never closed")
    return errors


def truncate_after_stop(text: str, stops: Sequence[str]) -> str:
    """Cut ``text`` right after the earliest occurrence of any stop string (kept)."""
    best = None
    for s in stops:
        i = text.find(s)
        if i >= 0 and (best is None or i + len(s) < best):
            best = i + len(s)
    return text if best is None else text[:best]


# --------------------------------------------------------------------------- tool calls
@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ToolCallParse:
    """Result of :func:`parse_tool_calls`: the calls that parsed and an error per one that did not."""
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def found(self) -> bool:
        return bool(self.calls or self.errors)


def _describe_json_error(payload: str, err: json.JSONDecodeError) -> str:
    lo, hi = max(0, err.pos - 20), min(len(payload), err.pos + 20)
    return (f"invalid JSON in <tool_call>: {err.msg} at line {err.lineno} column {err.colno} "
            f"(near {payload[lo:hi]!r})")


def _value_error(err: ValueError) -> str:
    """The first clause of a ``json.loads`` ValueError that is no JSONDecodeError (an integer over Python's
    4300-digit limit): ``Exceeds the limit (4300 digits) for integer string conversion``."""
    return str(err).split(":")[0]


def parse_tool_calls(text: str, open_tag: str = "<tool_call>", close_tag: str = "</tool_call>") -> ToolCallParse:
    """Parse Hermes/Qwen-style ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks.

    ``arguments`` may also be given as a JSON-encoded string (some models emit that). An opened but
    unclosed tag, broken JSON, a missing/non-string ``name`` or non-object ``arguments`` each give
    one clear error message.
    """
    calls: list[ToolCall] = []
    errors: list[str] = []
    pos = 0
    while True:
        start = text.find(open_tag, pos)
        if start < 0:
            break
        end = text.find(close_tag, start + len(open_tag))
        if end < 0:
            errors.append(f"{open_tag} is opened but never closed with {close_tag}")
            break
        payload = text[start + len(open_tag):end].strip()
        pos = end + len(close_tag)
        if not payload:
            errors.append(f"empty {open_tag}: expected a JSON object with \"name\" and \"arguments\"")
            continue
        try:
            obj = json.loads(payload)
        except json.JSONDecodeError as e:
            errors.append(_describe_json_error(payload, e))
            continue
        except RecursionError:
            errors.append("invalid JSON in <tool_call>: nested too deeply")
            continue
        except ValueError as e:  # a number too long for Python's int (over 4300 digits)
            errors.append(f"invalid JSON in <tool_call>: {_value_error(e)}")
            continue
        if not isinstance(obj, dict):
            errors.append(f"a tool call must be a JSON object, got {type(obj).__name__}")
            continue
        name = obj.get("name")
        if not isinstance(name, str) or not name.strip():
            errors.append('a tool call needs a string "name"')
            continue
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError as e:
                errors.append(f"\"arguments\" of {name!r} is a string that is not valid JSON: {e.msg}")
                continue
            except RecursionError:
                errors.append(f"\"arguments\" of {name!r} is a string that is not valid JSON: nested too deeply")
                continue
            except ValueError as e:
                errors.append(f"\"arguments\" of {name!r} is a string that is not valid JSON: {_value_error(e)}")
                continue
        if args is None:
            args = {}
        if not isinstance(args, dict):
            errors.append(f"\"arguments\" of {name!r} must be a JSON object, got {type(args).__name__}")
            continue
        calls.append(ToolCall(name.strip(), args))
    return ToolCallParse(calls, errors)


# --------------------------------------------------------------------------- ReAct
@dataclass(frozen=True)
class ReActStep:
    """One ReAct turn. Exactly one of (``action``) or (``final_answer``) is set unless ``error``."""
    thought: str | None = None
    action: str | None = None
    action_input: str | None = None
    final_answer: str | None = None
    error: str | None = None


_REACT_FIELD = re.compile(r"^[ \t]*(Thought|Action Input|Action|Final Answer|Observation)[ \t]*:[ \t]?", re.MULTILINE)


def parse_react(text: str) -> ReActStep:
    """Parse ``Thought: / Action: / Action Input:`` or ``Final Answer:`` (ReAct, Yao et al. 2023).

    Field labels start a line. Anything after a model-written ``Observation:`` is ignored (the model
    must not invent observations). If both an action and a final answer appear, the one written
    first wins, mirroring the tag rule "first complete action decides".
    """
    fields: dict[str, str] = {}
    order: list[str] = []
    matches = list(_REACT_FIELD.finditer(text))
    for i, m in enumerate(matches):
        label = m.group(1)
        if label == "Observation":
            break
        end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
        if label not in fields:
            fields[label] = text[m.end():end].strip()
            order.append(label)
    thought = fields.get("Thought")
    if "Final Answer" in fields and ("Action" not in fields or order.index("Final Answer") < order.index("Action")):
        answer = fields["Final Answer"]
        if not answer:
            return ReActStep(thought=thought, error="'Final Answer:' is empty")
        return ReActStep(thought=thought, final_answer=answer)
    if "Action" in fields:
        action = fields["Action"].strip()
        if not action:
            return ReActStep(thought=thought, error="'Action:' names no tool")
        action_input = fields.get("Action Input")
        if action_input is None:
            # Also accept the compact form ``Action: tool[input]`` of the ReAct paper.
            m = re.fullmatch(r"(\w+)\[(.*)\]", action, flags=re.DOTALL)
            if m:
                return ReActStep(thought=thought, action=m.group(1), action_input=m.group(2).strip())
            return ReActStep(thought=thought, action=action, error="'Action:' without 'Action Input:'")
        return ReActStep(thought=thought, action=action, action_input=action_input)
    if "Action Input" in fields:
        return ReActStep(thought=thought, error="'Action Input:' without 'Action:'")
    return ReActStep(thought=thought, error="expected 'Action:' + 'Action Input:' lines or a 'Final Answer:' line")


# --------------------------------------------------------------------------- code
@dataclass(frozen=True)
class CodeBlock:
    language: str
    code: str


_FENCE_OPEN = re.compile(r"[ \t]*(`{3,}|~{3,})[ \t]*([\w+#.-]*)")


def extract_code_blocks(text: str, language: str | Sequence[str] | None = None) -> list[CodeBlock]:
    """Fenced code blocks (```lang ... ``` or ~~~), in order. ``language`` filters by the fence's
    info string (case-insensitive); blocks without a language match only when ``""`` is allowed.

    A block opens with a line that starts (after spaces or tabs) with three or more backticks or tildes and
    the language, and closes at the next line that holds the same fence alone (spaces or tabs around it).
    An opening without such a line may close at a line of three or more of its first characters (its
    fence cut shorter; the block then has no language), or opens no block. One pass over the lines, with
    each closing line looked up, so the time is linear in the text (a regex over the whole text took cubic
    time on thousands of unclosed fences)."""
    wanted: set[str] | None
    if language is None:
        wanted = None
    elif isinstance(language, str):
        wanted = {language.lower()}
    else:
        wanted = {s.lower() for s in language}
    lines = text.split("\n")
    starts = [0]
    for line in lines[:-1]:
        starts.append(starts[-1] + len(line) + 1)
    closers: dict[str, list[int]] = {}  # a fence -> the lines that hold it alone, in order
    for i, line in enumerate(lines):
        bare = line.strip(" \t")
        if len(bare) >= 3 and bare[0] in "`~" and bare == bare[0] * len(bare):
            closers.setdefault(bare, []).append(i)
    blocks = []
    i = 0
    while i < len(lines) - 1:  # an opening line needs a line after it
        m = _FENCE_OPEN.match(lines[i])
        close = None
        if m is not None:
            fence = m.group(1)
            for size in range(len(fence), 2, -1):  # the whole fence first, then shorter ones
                found = closers.get(fence[0] * size, [])
                k = bisect.bisect_right(found, i)
                if k < len(found):
                    close, lang = found[k], (m.group(2) if size == len(fence) else "")
                    break
        if close is None:
            i += 1
            continue
        if wanted is None or lang.lower() in wanted:
            blocks.append(CodeBlock(lang.lower(), text[starts[i + 1]:starts[close]]))
        i = close + 1
    return blocks


# --------------------------------------------------------------------------- boxed
# a box's opening, an escaped character (a backslash that does not start a box, and the character after it),
# or a brace: the only tokens that matter to the braces' balance
_BOX_TOKENS = re.compile(r"(\\(?:boxed|fbox)\s*\{)|\\(?!\\(?:boxed|fbox)\s*\{)[\s\S]|[{}]")


def boxed_spans(text: str) -> list[tuple[int, int, int]]:
    r"""Every balanced ``\boxed{...}`` (or ``\fbox{...}``) of ``text`` as ``(start, content_start, end)``,
    in the order the boxes start: ``text[content_start:end - 1]`` is the content, ``text[start:end]`` the box.

    One pass with a stack of open braces (escaped ``\{`` ``\}`` skipped), so the time is linear in the
    text: a reply of thousands of unclosed ``\boxed{`` costs no more than any other (scanning from each box
    to its end took cubic time there)."""
    spans: list[tuple[int, int, int]] = []
    stack: list[tuple[int, int] | None] = []  # per open brace: (box start, content start), None for a plain one
    for m in _BOX_TOKENS.finditer(text):
        token = m.group()
        if m.group(1):
            stack.append((m.start(), m.end()))
        elif token == "{":
            stack.append(None)
        elif token == "}" and stack:
            box = stack.pop()
            if box is not None:
                spans.append((box[0], box[1], m.end()))
    spans.sort()
    return spans


def extract_boxed(text: str, which: str = "last") -> str | None:
    r"""Content of ``\boxed{...}`` (or ``\fbox{...}``) with nested braces balanced.

    ``which`` is ``"last"`` (the usual rule for final answers) or ``"first"``. Returns None if no
    balanced box exists.
    """
    if which not in ("first", "last"):
        raise ValueError("which must be 'first' or 'last'")
    spans = boxed_spans(text)
    if not spans:
        return None
    _, content_start, end = spans[0] if which == "first" else spans[-1]
    return text[content_start:end - 1].strip()


_AST_LOCK = threading.Lock()


def parse_python(source: str, filename: str = "<unknown>", mode: str = "exec") -> ast.AST:
    """``ast.parse`` one call at a time in this process. CPython 3.11's AST constructor keeps its
    recursion depth in shared state, and parses in several threads at once (env workers) can fail with
    ``SystemError: AST constructor recursion depth mismatch`` (python/cpython#106905; reported from threaded
    programs, and seen here on 3.11.7).
    Raises what ``ast.parse`` raises (``SyntaxError``, ``ValueError``)."""
    with _AST_LOCK:
        return ast.parse(source, filename, mode)
