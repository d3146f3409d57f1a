"""``ToolSet.from_mcp``: tools of a real MCP server (the SDK's own ``MCPServer``, launched over stdio as a
subprocess, or served over streamable HTTP on loopback) used as agentgym tools and from env steps.

What each failure must become: a tool's own failure is a failed ``ToolResult`` (an observation); bad
arguments are refused locally and never sent; a dead or hung server is an ``InfraError`` within the call
timeout (timed here), never a hang; ``close()`` (or garbage collection) ends the server process.
"""

from __future__ import annotations

import gc
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("mcp", reason="the MCP SDK is not installed (the protocols extra: scripts/setup.sh installs it)")

import agentgym
from agentgym import ToolSet
from agentgym.errors import InfraError

SERVER = '''
import os, sys, time
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("agentgym-test", log_level="WARNING")
received = []

@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    received.append("add")
    return a + b

@server.tool()
def divide(a: float, b: float) -> float:
    """Divide a by b."""
    received.append("divide")
    if b == 0:
        raise ToolError("cannot divide by zero")
    return a / b

@server.tool()
def crash(note: str) -> str:
    """Raises an unexpected exception."""
    received.append("crash")
    raise ValueError("internal detail " + note)

@server.tool()
def calls() -> list[str]:
    """The tools this server has run so far."""
    return list(received)

@server.tool()
def pid() -> int:
    """The server's process id."""
    return os.getpid()

@server.tool()
def hang() -> str:
    """Never returns."""
    time.sleep(10**6)
    return "unreachable"

if __name__ == "__main__":
    if len(sys.argv) > 1:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[1]))
    else:
        server.run()
'''

TIMEOUT_S = 2.0  # the call timeout of the tests that time one
SLACK_S = 1.5  # scheduling on a loaded 2-core machine; a hang would take forever, not 1.5 s
CALL_TIMEOUT_S = 20.0  # the others' (a server logging a crash's traceback can take seconds on a loaded machine)


@pytest.fixture(scope="module")
def server_script(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("mcp") / "server.py"
    path.write_text(SERVER)
    return path


@pytest.fixture(scope="module")
def shared(server_script):
    """One server for the tests that leave it working (each start costs ~1-3 s)."""
    with ToolSet.from_mcp([sys.executable, str(server_script)], timeout_s=CALL_TIMEOUT_S) as tools:
        yield tools


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, dead but not yet reaped, counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _wait_ended(pid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _alive(pid)


def test_tools_are_listed_with_their_schemas(shared):
    assert set(shared.names) == {"add", "divide", "crash", "calls", "pid", "hang"}
    add = shared["add"]
    assert add.description == "Add two integers."
    assert add.parameters["properties"]["a"]["type"] == "integer" and add.parameters["required"] == ["a", "b"]
    spec = next(s for s in shared.specs() if s["function"]["name"] == "add")
    assert spec == {"type": "function", "function": {"name": "add", "description": "Add two integers.",
                                                     "parameters": add.parameters}}


def test_a_good_call_returns_the_tools_answer(shared):
    result = shared.call("add", {"a": 2, "b": 40})
    assert result.ok and result.content == "42" and result.error is None
    assert shared.call("divide", {"a": 1, "b": 4}).content == "0.25"


def test_bad_arguments_are_refused_locally_and_never_sent(shared):
    before = shared.call("calls", {}).content
    result = shared.call("add", {"a": "two"})
    assert not result.ok and result.error == "invalid_arguments"
    assert "'b' is a required property" in result.content and "'two' is not of type 'integer'" in result.content
    assert shared.call("calls", {}).content == before  # the server never saw the call


def test_a_tool_that_fails_is_a_failed_result(shared):
    refused = shared.call("divide", {"a": 1, "b": 0})
    assert not refused.ok and refused.error == "exception" and "cannot divide by zero" in refused.content
    crashed = shared.call("crash", {"note": "x"})
    assert not crashed.ok and crashed.error == "exception" and "crash" in crashed.content
    assert shared.call("add", {"a": 1, "b": 1}).content == "2"  # the session goes on


def test_a_hung_tool_is_an_infra_error_within_the_timeout(shared):
    shared.call_timeout_s = TIMEOUT_S
    try:
        start = time.monotonic()
        with pytest.raises(InfraError, match="within 2 s"):
            shared.call("hang", {})
        assert time.monotonic() - start < TIMEOUT_S + SLACK_S
    finally:
        shared.call_timeout_s = CALL_TIMEOUT_S
    assert shared.call("add", {"a": 1, "b": 2}).content == "3"  # other calls still work


def test_a_killed_server_is_an_infra_error_that_ends_the_episode(server_script):
    """Mid-episode in ToolCall-v0: the step after the kill ends the episode marked ``infra_error``."""
    with ToolSet.from_mcp([sys.executable, str(server_script)], timeout_s=TIMEOUT_S) as tools:
        env = agentgym.make("ToolCall-v0", extra_tools=tools)
        env.reset(seed=0, options={"task_index": 0})
        call = '<tool_call>{"name": "pid", "arguments": {}}</tool_call>'
        obs, _, terminated, truncated, info = env.step(call)
        assert info["tool_ok"] and not (terminated or truncated)
        os.kill(int(obs[0]["content"]), signal.SIGKILL)
        start = time.monotonic()
        obs, _, terminated, truncated, info = env.step(call.replace("pid", "add").replace("{}", '{"a": 1, "b": 2}'))
        assert time.monotonic() - start < TIMEOUT_S + SLACK_S
        assert truncated and not terminated and "InfraError" in info["infra_error"]
        assert info["episode_summary"]["infra_error"] == info["infra_error"]
        with pytest.raises(InfraError):  # outside an env, the call itself raises
            tools.call("add", {"a": 1, "b": 2})
        env.close()


def test_close_ends_the_server_process_even_with_a_call_hung(server_script):
    tools = ToolSet.from_mcp([sys.executable, str(server_script)], timeout_s=TIMEOUT_S)
    pid = int(tools.call("pid", {}).content)
    with pytest.raises(InfraError):
        tools.call("hang", {})  # leaves a thread of the server sleeping forever
    start = time.monotonic()
    tools.close()
    tools.close()  # idempotent
    assert _wait_ended(pid), "the server process outlived close()"
    assert time.monotonic() - start < 15
    with pytest.raises(InfraError, match="closed"):
        tools.call("add", {"a": 1, "b": 2})


def test_garbage_collection_ends_the_server_process(server_script):
    def use_and_drop() -> int:
        tools = ToolSet.from_mcp([sys.executable, str(server_script)], timeout_s=TIMEOUT_S)
        return int(tools.call("pid", {}).content)
    pid = use_and_drop()
    gc.collect()
    assert _wait_ended(pid), "the server process outlived its dropped ToolSet"


def test_a_server_that_exits_at_start_is_an_infra_error():
    start = time.monotonic()
    with pytest.raises(InfraError, match="MCP server"):
        ToolSet.from_mcp([sys.executable, "-c", "pass"], connect_timeout_s=10)
    assert time.monotonic() - start < 10 + SLACK_S
    with pytest.raises(ValueError, match="exactly one"):
        ToolSet.from_mcp()


def test_react_calls_mcp_tools_next_to_its_own(shared):
    env = agentgym.make("ReAct-v0", extra_tools=shared)
    obs, _ = env.reset(seed=0, options={"task_index": 0})
    assert "- add: Add two integers." in obs[0]["content"]
    obs, _, _, _, info = env.step('Thought: add them.\nAction: add\nAction Input: {"a": 20, "b": 22}')
    assert info["tool_ok"] and obs[0]["content"] == "Observation: 42"
    obs, _, _, _, info = env.step("Thought: one argument, plain text.\nAction: crash\nAction Input: boom")
    assert not info["tool_ok"] and "crash" in obs[0]["content"]
    obs, _, _, _, info = env.step("Thought: own tool.\nAction: calculator\nAction Input: 6 * 7")
    assert info["tool_ok"] and "42" in obs[0]["content"]
    env.close()
    assert shared.call("add", {"a": 1, "b": 1}).ok  # the env does not close a tool set it was given


def test_toolcall_lists_mcp_tools_in_its_specs_and_prompt(shared):
    env = agentgym.make("ToolCall-v0", extra_tools=shared)
    obs, _ = env.reset(seed=0, options={"task_index": 0})
    names = [s["function"]["name"] for s in env.unwrapped.tool_specs()]
    assert "search_product" in names and "add" in names
    assert "- add(a: integer, b: integer): Add two integers." in obs[0]["content"]
    _, _, _, _, info = env.step('<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>')
    assert info["tool"] == "add" and not info["tool_ok"] and info["tool_error"] == "invalid_arguments"
    env.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_streamable_http_server_by_url(server_script):
    port = _free_port()
    proc = subprocess.Popen([sys.executable, str(server_script), str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:  # wait until it listens
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "the HTTP server did not start"
                time.sleep(0.1)
        with ToolSet.from_mcp(url=f"http://127.0.0.1:{port}/mcp", timeout_s=TIMEOUT_S) as tools:
            assert "add" in tools.names and tools.call("add", {"a": 3, "b": 4}).content == "7"
            start = time.monotonic()
            with pytest.raises(InfraError):
                tools.call("hang", {})
            assert time.monotonic() - start < TIMEOUT_S + SLACK_S
    finally:
        proc.kill()
        proc.wait(timeout=10)
