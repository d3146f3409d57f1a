"""Tools: a name, a description, a JSON Schema for arguments, and a callable.

:class:`ToolSet` executes calls and turns every failure (unknown tool, schema violation, exception,
timeout) into a :class:`ToolResult` with ``ok=False`` and a message a model can act on. It never
raises on a model's call, except :class:`~agentgym.errors.InfraError` from a tool's backend (a sandbox,
a retrieval server): that is not the model's failure, and the env marks the episode instead.
"""

from __future__ import annotations

import concurrent.futures as cf
import functools
import inspect
import json
import re
import types
import typing
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Literal, Mapping, Sequence

from agentgym.errors import InfraError

import jsonschema

__all__ = ["Tool", "ToolResult", "ToolSet", "tool"]

_PY_TO_JSON = {str: "string", int: "integer", float: "number", bool: "boolean", dict: "object", list: "array"}


def _schema_for(tp: Any) -> dict[str, Any]:
    """JSON Schema for a Python annotation (str/int/float/bool/list[T]/dict/Literal/Optional)."""
    origin = typing.get_origin(tp)
    if tp is inspect.Parameter.empty or tp is Any:
        return {}
    if origin is Literal:
        values = list(typing.get_args(tp))
        return {"enum": values}
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        out = _schema_for(args[0]) if len(args) == 1 else {"anyOf": [_schema_for(a) for a in args]}
        if len(args) < len(typing.get_args(tp)):  # Optional[T]: null is a valid value, as None is in Python
            if isinstance(out.get("type"), str):
                out["type"] = [out["type"], "null"]
            elif "enum" in out:
                out["enum"] = [*out["enum"], None]
            elif "anyOf" in out:
                out["anyOf"] = [*out["anyOf"], {"type": "null"}]
            elif out:  # an unconstrained schema ({}) already admits null
                out = {"anyOf": [out, {"type": "null"}]}
        return out
    if origin in (list, Sequence, tuple):
        args = typing.get_args(tp)
        out: dict[str, Any] = {"type": "array"}
        if args and args[0] is not Ellipsis:
            out["items"] = _schema_for(args[0])
        return out
    if origin in (dict, Mapping):
        return {"type": "object"}
    if tp in _PY_TO_JSON:
        return {"type": _PY_TO_JSON[tp]}
    raise TypeError(f"cannot derive a JSON Schema for annotation {tp!r}")


def _doc_parts(doc: str | None) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into its summary and the ``Args:`` descriptions."""
    if not doc:
        return "", {}
    doc = inspect.cleandoc(doc)
    parts = re.split(r"^\s*(?:Args|Arguments|Parameters)\s*:\s*$", doc, maxsplit=1, flags=re.MULTILINE)
    summary = parts[0].strip()
    params: dict[str, str] = {}
    if len(parts) == 2:
        current = None
        for line in parts[1].splitlines():
            if re.match(r"^\s*(Returns|Raises|Yields|Examples?)\s*:", line):
                break
            m = re.match(r"^\s{0,8}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$", line)
            if m:
                current = m.group(1)
                params[current] = m.group(2).strip()
            elif current and line.strip():
                params[current] += " " + line.strip()
    return summary, params


@dataclass
class ToolResult:
    name: str
    content: str
    ok: bool = True
    error: str | None = None  # unknown_tool | invalid_arguments | exception | timeout | output_too_long

    def as_message(self, call_id: str | None = None) -> dict[str, str]:
        msg = {"role": "tool", "name": self.name, "content": self.content}
        if call_id is not None:
            msg["tool_call_id"] = call_id
        return msg


@functools.lru_cache(maxsize=1024)
def _validator_for(schema_json: str) -> jsonschema.Draft202012Validator:
    """Checked, compiled validators shared by equal schemas: envs build their tools per instance,
    and checking a schema costs ~10 ms (a broken schema is a programming error: it raises)."""
    schema = json.loads(schema_json)
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


class Tool:
    """A callable with a JSON-Schema-validated argument object.

    Args:
        name: identifier the model uses.
        description: what the tool does, shown to the model.
        parameters: JSON Schema of the arguments object (``type: object``).
        fn: called as ``fn(**arguments)``; its return value is turned into text (str as is,
            everything else as JSON).
    """

    def __init__(self, name: str, description: str, parameters: Mapping[str, Any], fn: Callable[..., Any]):
        if not re.fullmatch(r"[A-Za-z_][\w.-]{0,63}", name):
            raise ValueError(f"invalid tool name {name!r}")
        schema = dict(parameters)
        schema.setdefault("type", "object")
        self.name, self.description, self.parameters, self.fn = name, description, schema, fn
        self._validator = _validator_for(json.dumps(schema, sort_keys=True))

    @classmethod
    def from_function(cls, fn: Callable[..., Any], name: str | None = None, description: str | None = None) -> "Tool":
        """Build a tool from a type-annotated function with a Google-style docstring."""
        summary, arg_docs = _doc_parts(fn.__doc__)
        hints = typing.get_type_hints(fn)
        props: dict[str, Any] = {}
        required: list[str] = []
        for pname, p in inspect.signature(fn).parameters.items():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                continue
            prop = _schema_for(hints.get(pname, p.annotation))
            if pname in arg_docs:
                prop["description"] = arg_docs[pname]
            if p.default is p.empty:
                required.append(pname)
            elif p.default is not None and isinstance(p.default, (str, int, float, bool)):
                prop["default"] = p.default
            props[pname] = prop
        schema = {"type": "object", "properties": props, "required": required, "additionalProperties": False}
        return cls(name or fn.__name__, description or summary or fn.__name__, schema, fn)

    def validation_errors(self, arguments: Any) -> list[str]:
        errs = sorted(self._validator.iter_errors(arguments), key=lambda e: list(e.path))
        out = []
        for e in errs:
            where = "/".join(str(p) for p in e.path)
            out.append(f"{where}: {e.message}" if where else e.message)
        return out

    def spec(self) -> dict[str, Any]:
        """OpenAI / HF chat-template tool spec (``{"type": "function", "function": {...}}``)."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                  "parameters": self.parameters}}

    def __call__(self, **arguments: Any) -> Any:
        return self.fn(**arguments)

    def __repr__(self) -> str:
        return f"Tool({self.name!r})"


def tool(fn: Callable[..., Any] | None = None, *, name: str | None = None, description: str | None = None):
    """Decorator form of :meth:`Tool.from_function` (``@tool`` or ``@tool(name=...)``)."""
    if fn is None:
        return lambda f: Tool.from_function(f, name=name, description=description)
    return Tool.from_function(fn, name=name, description=description)


def _to_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value)


class ToolSet:
    """Executes calls against named tools with a per-call timeout and an output cap.

    Timeouts run the call in a worker thread and stop *waiting* after ``timeout_s``; Python cannot
    kill a thread, so tools doing unbounded CPU work should enforce limits themselves (code runs in
    a sandbox, not here). ``max_output_chars`` caps the text returned to the model.
    """

    def __init__(self, tools: Iterable[Tool | Callable[..., Any]], timeout_s: float | None = 10.0,
                 max_output_chars: int = 8_000):
        self.tools: dict[str, Tool] = {}
        for t in tools:
            t = t if isinstance(t, Tool) else Tool.from_function(t)
            if t.name in self.tools:
                raise ValueError(f"duplicate tool name {t.name!r}")
            self.tools[t.name] = t
        self.timeout_s, self.max_output_chars = timeout_s, max_output_chars
        self._pool: cf.ThreadPoolExecutor | None = None

    @classmethod
    def from_mcp(cls, command: Sequence[str] | None = None, *, url: str | None = None,
                 env: Mapping[str, str] | None = None, cwd: str | None = None, timeout_s: float | None = 30.0,
                 connect_timeout_s: float = 60.0, max_output_chars: int = 8_000) -> "ToolSet":
        """The tools of an MCP server, as a tool set whose calls go to the server.

        Args:
            command: launch a stdio server: the program and its arguments (e.g. ``[sys.executable, "srv.py"]``).
            url: or connect to a streamable-HTTP server (e.g. ``"http://127.0.0.1:8000/mcp"``).
            env: extra environment variables for a stdio server (over the SDK's minimal default
                environment: ``HOME``, ``PATH``, ...).
            cwd: the stdio server's working directory.
            timeout_s: the bound on each call; a server that does not answer in time (hung, dead) is an
                :class:`~agentgym.errors.InfraError`, not a failed tool result.
            connect_timeout_s: the bound on starting the server, the handshake and listing its tools.
            max_output_chars: cap on the text returned to the model.

        The result (:class:`agentgym.adapters.mcp.MCPToolSet`) holds one session and, for stdio, the server
        process: close it, or use it in a ``with`` block. Needs the ``mcp`` package (imported only here).
        """
        from agentgym.adapters.mcp import connect  # lazily: the kernel does not depend on the MCP SDK

        return connect(command, url=url, env=env, cwd=cwd, timeout_s=timeout_s,
                       connect_timeout_s=connect_timeout_s, max_output_chars=max_output_chars)

    def __contains__(self, name: str) -> bool:
        return name in self.tools

    def __getitem__(self, name: str) -> Tool:
        return self.tools[name]

    @property
    def names(self) -> list[str]:
        return list(self.tools)

    def specs(self) -> list[dict[str, Any]]:
        return [t.spec() for t in self.tools.values()]

    def describe(self) -> str:
        """A plain-text listing of tools and their argument schemas, for prompts."""
        return "\n".join(f"- {t.name}: {t.description} Arguments (JSON Schema): {json.dumps(t.parameters)}"
                         for t in self.tools.values())

    def call(self, name: str, arguments: Any) -> ToolResult:
        tool_ = self.tools.get(name)
        if tool_ is None:
            return ToolResult(name, f"Error: unknown tool {name!r}. Available tools: {', '.join(self.tools) or 'none'}.",
                              ok=False, error="unknown_tool")
        errs = tool_.validation_errors(arguments)
        if errs:
            return ToolResult(name, f"Error: invalid arguments for {name}: " + "; ".join(errs),
                              ok=False, error="invalid_arguments")
        try:
            if self.timeout_s is None:
                value = tool_.fn(**arguments)
            else:
                if self._pool is None:
                    self._pool = cf.ThreadPoolExecutor(max_workers=4, thread_name_prefix="agentgym-tool")
                value = self._pool.submit(tool_.fn, **arguments).result(timeout=self.timeout_s)
        except cf.TimeoutError:
            return ToolResult(name, f"Error: {name} timed out after {self.timeout_s:g} s.", ok=False, error="timeout")
        except InfraError:      # the tool's backend failed, not the model: the env marks the episode
            raise
        except Exception as e:  # a tool's failure is an observation for the model, not a crash
            return ToolResult(name, f"Error: {name} failed: {type(e).__name__}: {e}", ok=False, error="exception")
        text = _to_text(value)
        if len(text) > self.max_output_chars:
            text = text[: self.max_output_chars] + f"\n[output truncated: {len(text)} characters, showing {self.max_output_chars}]"
        return ToolResult(name, text)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
