"""Tools from MCP servers: :meth:`agentgym.tools.ToolSet.from_mcp`.

An MCP server's tools become ordinary :class:`~agentgym.tools.Tool` objects: the server's JSON Schema of
each tool's arguments is the tool's schema, so the model's arguments are validated locally with
``jsonschema`` exactly as for a local tool (a bad call never reaches the server), and ``specs()`` gives
the chat-template tool specs. Envs call tools synchronously from ``step``; the MCP client (the official
``mcp`` SDK) is async. So each :class:`MCPToolSet` owns one client session, held open on a private
event-loop thread, and a call is submitted to that loop with ``asyncio.run_coroutine_threadsafe`` and
waited for at most ``timeout_s``.

Whose failure is what:

* the tool itself failed (the server answers ``isError``: the tool raised, or the server refused the
  arguments) → a failed :class:`~agentgym.tools.ToolResult` carrying the server's message, an observation
  the model can act on;
* the server is gone, hung, or broke the protocol → :class:`~agentgym.errors.InfraError` within
  ``timeout_s``, never a hang; the env ends the episode marked ``infra_error`` and the trainer keeps it
  out of the loss.

``close()`` ends the session and, for stdio, the server process (the SDK closes its stdin, then
terminates its process tree). It is idempotent and also runs on garbage collection, at interpreter exit
and when a ``with`` block ends.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import json
import threading
import warnings
import weakref
from typing import Any, Awaitable, Callable, Mapping, Sequence

import jsonschema

from agentgym.errors import InfraError
from agentgym.tools import Tool, ToolSet

try:
    import mcp.types as mcp_types
    from mcp import Client, MCPError, StdioServerParameters
except ImportError as e:  # pragma: no cover - depends on the installation
    raise ImportError("ToolSet.from_mcp needs the MCP SDK: pip install 'mcp>=2'") from e

__all__ = ["MCPConnection", "MCPToolError", "MCPToolSet", "connect"]

#: how long close() waits for the session and the server process to end (the SDK's own shutdown of a
#: stdio server is bounded: stdin closed, 2 s grace, then SIGTERM / SIGKILL of its process tree)
CLOSE_TIMEOUT_S = 10.0


class MCPToolError(RuntimeError):
    """The MCP server answered a call with ``isError``: the tool failed. :class:`ToolSet` turns it into a
    failed :class:`~agentgym.tools.ToolResult` (an observation for the model), unlike :class:`InfraError`."""


class MCPConnection:
    """One MCP client session held open on a private event-loop thread.

    The session must be entered and exited by one task (anyio's rule for its task groups), so a single
    long-lived task ``_hold`` opens the client, waits for the stop signal and closes it; calls run as
    further tasks on the same loop. Every wait from the caller's thread is bounded.

    Args:
        server: ``StdioServerParameters`` (launch a subprocess, talk over stdin/stdout) or a URL
            (streamable HTTP).
        description: how errors name the server (the command or the URL).
        connect_timeout_s: the bound on starting the server and the protocol handshake.
    """

    def __init__(self, server: StdioServerParameters | str, description: str, connect_timeout_s: float):
        self.description = description
        self.call_timeout_s: float | None = None  # set by the tool set that owns the connection
        self._client: Client | None = None
        self._closed = False
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._stop = asyncio.Event()  # bound to the loop on first use, which happens on the loop's thread
        self._task: asyncio.Task[None] | None = None
        self._ended: cf.Future[BaseException | None] = cf.Future()  # the session's end, and its error
        self._thread = threading.Thread(target=self._loop.run_forever, name="agentgym-mcp", daemon=True)
        self._thread.start()
        ready: cf.Future[None] = cf.Future()
        self._loop.call_soon_threadsafe(self._start, server, ready)
        cf.wait([ready, self._ended], timeout=connect_timeout_s, return_when=cf.FIRST_COMPLETED)
        if not ready.done():
            cause = self._ended.result() if self._ended.done() else None
            why = (f"could not connect: {_describe(cause)}" if self._ended.done()
                   else f"did not complete the MCP handshake within {connect_timeout_s:g} s")
            self.close()
            raise InfraError(f"MCP server {description} {why}") from cause

    def _start(self, server: StdioServerParameters | str, ready: cf.Future[None]) -> None:
        """On the loop: create the session's task (before any later callback, so close() always finds it)."""
        self._task = self._loop.create_task(self._hold(server, ready))
        self._task.add_done_callback(self._on_end)

    async def _hold(self, server: StdioServerParameters | str, ready: cf.Future[None]) -> None:
        async with Client(server) as client:
            self._client = client
            ready.set_result(None)
            await self._stop.wait()

    def _on_end(self, task: asyncio.Task[None]) -> None:
        self._ended.set_result(asyncio.CancelledError("the session was cancelled") if task.cancelled()
                               else task.exception())

    def run(self, make: Callable[[Client], Awaitable[Any]], timeout_s: float | None, what: str) -> Any:
        """Run ``make(client)`` on the session's loop and wait for it at most ``timeout_s``.

        Raises:
            InfraError: the connection is closed or gone, the call outlived ``timeout_s`` (it is then
                cancelled), or the server answered with a protocol error.
        """
        if self._closed:
            raise InfraError(f"{what}: the MCP tool set for {self.description} is closed")
        if self._ended.done():
            raise InfraError(f"{what}: the MCP server {self.description} is gone ({self._end_reason()})")
        assert self._client is not None
        future = asyncio.run_coroutine_threadsafe(make(self._client), self._loop)
        try:
            return future.result(timeout=timeout_s)
        except cf.TimeoutError:
            future.cancel()
            gone = f" (the server is gone: {self._end_reason()})" if self._ended.done() else ""
            raise InfraError(f"{what}: no answer from the MCP server {self.description} within {timeout_s:g} s"
                             f"{gone}") from None
        except cf.CancelledError:
            raise InfraError(f"{what}: the call to the MCP server {self.description} was cancelled") from None
        except MCPError as e:
            raise InfraError(f"{what}: the MCP server {self.description} failed: {_describe(e)}") from e
        except Exception as e:  # transport and protocol failures: not the model's doing
            raise InfraError(f"{what}: talking to the MCP server {self.description} failed: {_describe(e)}") from e

    def _end_reason(self) -> str:
        error = self._ended.result()
        return "the session ended" if error is None else _describe(error)

    async def _shutdown(self) -> None:
        """On the loop: stop the session (cancel it while it is still connecting) and wait for its end."""
        assert self._task is not None  # _start was queued before this coroutine
        if self._client is None:
            self._task.cancel()  # the SDK's shutdown of the process is shielded from the cancellation
        else:
            self._stop.set()
        await asyncio.wait([self._task], timeout=CLOSE_TIMEOUT_S)
        if not self._task.done():
            self._task.cancel()
            await asyncio.wait([self._task], timeout=CLOSE_TIMEOUT_S)

    def close(self) -> None:
        """End the session and the server process, then the loop thread; every wait is bounded."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._loop.is_closed():
            return
        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(timeout=2 * CLOSE_TIMEOUT_S + 1)
        except Exception:  # a session that cannot be ended is abandoned with its daemon thread
            pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=CLOSE_TIMEOUT_S)
        if not self._thread.is_alive():
            self._loop.close()


def _describe(error: BaseException | None) -> str:
    """One line for an error, looking inside exception groups (anyio raises them from task groups)."""
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    if error is None:
        return "no error"
    return f"{type(error).__name__}: {error}"


def result_text(result: mcp_types.CallToolResult) -> str:
    """The text of a tool result: its text blocks joined by newlines; a placeholder naming each non-text
    block (image, audio, resource); the structured content as JSON when there are no blocks."""
    parts = []
    for block in result.content:
        if isinstance(block, mcp_types.TextContent):
            parts.append(block.text)
        elif isinstance(block, (mcp_types.ImageContent, mcp_types.AudioContent)):
            parts.append(f"[{block.type}: {block.mime_type}, {len(block.data)} base64 characters]")
        elif isinstance(block, mcp_types.ResourceLink):
            parts.append(f"[resource: {block.uri}]")
        elif isinstance(block, mcp_types.EmbeddedResource):
            resource = block.resource
            parts.append(resource.text if isinstance(resource, mcp_types.TextResourceContents)
                         else f"[resource: {resource.uri}, {resource.mime_type or 'binary'}]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False, default=str))
    return "\n".join(parts)


def _remote_call(connection: MCPConnection, name: str) -> Callable[..., str]:
    """The callable of one remote tool: send the (already validated) arguments, return the text."""
    def call(**arguments: Any) -> str:
        result = connection.run(lambda client: client.call_tool(name, arguments), connection.call_timeout_s,
                                f"tool {name!r}")
        text = result_text(result)
        if result.is_error:
            raise MCPToolError(text or "the tool reported an error")
        return text
    call.__name__ = name
    return call


class MCPToolSet(ToolSet):
    """A :class:`ToolSet` whose tools live on one MCP server (one session, one background loop thread).

    ``call_timeout_s`` bounds each call on the server; the caller's thread waits for it directly (no
    worker pool: the base class's ``timeout_s`` is None), and running past it is an :class:`InfraError`,
    not a failed result, because a hung server is not the model's doing. Close it (or use it in a
    ``with`` block) when done; an env it is passed to does not own it.
    """

    def __init__(self, connection: MCPConnection, tools: Sequence[Tool], call_timeout_s: float | None,
                 max_output_chars: int):
        super().__init__(tools, timeout_s=None, max_output_chars=max_output_chars)
        self.connection = connection
        connection.call_timeout_s = call_timeout_s
        self._finalizer = weakref.finalize(self, connection.close)  # on GC and at interpreter exit

    @property
    def call_timeout_s(self) -> float | None:
        """The bound on each call (settable; None waits forever, which an env should never do)."""
        return self.connection.call_timeout_s

    @call_timeout_s.setter
    def call_timeout_s(self, value: float | None) -> None:
        self.connection.call_timeout_s = value

    def close(self) -> None:
        """End the session and the server process (idempotent)."""
        super().close()
        self._finalizer()

    def __enter__(self) -> "MCPToolSet":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"MCPToolSet({self.connection.description}, tools={self.names})"


def _list_tools(connection: MCPConnection, timeout_s: float) -> list[mcp_types.Tool]:
    async def all_pages(client: Client) -> list[mcp_types.Tool]:
        tools, cursor = [], None
        for _ in range(1000):  # a bound on pages, against a server that never stops paginating
            page = await client.list_tools(cursor=cursor)
            tools += page.tools
            cursor = page.next_cursor
            if cursor is None:
                break
        return tools
    return connection.run(all_pages, timeout_s, "listing tools")


def _as_tools(connection: MCPConnection, listing: Sequence[mcp_types.Tool]) -> list[Tool]:
    """Our tools for the server's; one whose name or schema we cannot use is skipped with a warning."""
    tools = []
    for spec in listing:
        try:
            tools.append(Tool(spec.name, spec.description or spec.title or spec.name, spec.input_schema,
                              _remote_call(connection, spec.name)))
        except (ValueError, jsonschema.SchemaError) as e:
            warnings.warn(f"skipping MCP tool {spec.name!r} of {connection.description}: {e}", stacklevel=3)
    return tools


def connect(command: Sequence[str] | None = None, *, url: str | None = None, env: Mapping[str, str] | None = None,
            cwd: str | None = None, timeout_s: float | None = 30.0, connect_timeout_s: float = 60.0,
            max_output_chars: int = 8_000) -> MCPToolSet:
    """Connect to an MCP server and return its tools as an :class:`MCPToolSet` (see
    :meth:`agentgym.tools.ToolSet.from_mcp`, which calls this)."""
    if (command is None) == (url is None):
        raise ValueError("give exactly one of command=[...] (a stdio server) or url=... (streamable HTTP)")
    if command is not None:
        if isinstance(command, str) or not command:
            raise ValueError(f"command must be a non-empty list of arguments, got {command!r}")
        server: StdioServerParameters | str = StdioServerParameters(
            command=str(command[0]), args=[str(a) for a in command[1:]], env=dict(env) if env else None, cwd=cwd)
        description = " ".join(str(c) for c in command)
    else:
        if env is not None or cwd is not None:
            raise ValueError("env= and cwd= apply to a stdio server (command=), not to url=")
        server, description = str(url), str(url)
    connection = MCPConnection(server, description, connect_timeout_s)
    try:
        tools = _as_tools(connection, _list_tools(connection, connect_timeout_s))
        return MCPToolSet(connection, tools, timeout_s, max_output_chars)
    except BaseException:
        connection.close()
        raise
