"""The kernel's one background-server helper (agentgym/http_server.py), which the retrieval server and
the OpenEnv server both start with: it serves at once on a free port, says why when it cannot start, and
stops within its bound."""

from __future__ import annotations

import socket
from contextlib import asynccontextmanager

import httpx
import pytest
from fastapi import FastAPI

from agentgym.http_server import BackgroundServer, ServerBindError


def _app(fail_at_start: bool = False) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app):
        if fail_at_start:
            raise RuntimeError("the index did not load")
        yield

    app = FastAPI(lifespan=lifespan)

    @app.get("/ping")
    def ping() -> dict:
        return {"pong": True}
    return app


def test_serves_on_a_free_port_and_stops():
    with BackgroundServer(_app()) as server:
        assert server.port != 0 and server.url.endswith(f":{server.port}")
        assert httpx.get(server.url + "/ping", timeout=10).json() == {"pong": True}
    with pytest.raises(httpx.ConnectError):
        httpx.get(server.url + "/ping", timeout=2)
    server.stop()   # stopping a stopped server is a no-op


def test_a_port_in_use_is_one_clear_error():
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(ServerBindError, match=rf"cannot serve on 127\.0\.0\.1:{port}: the port is in use"):
            BackgroundServer(_app(), port=port).start()


def test_an_app_that_fails_at_start_up_raises_and_leaves_nothing_running():
    server = BackgroundServer(_app(fail_at_start=True), name="test server")
    with pytest.raises(RuntimeError, match=r"test server on http://127\.0\.0\.1:\d+ exited during start-up"):
        server.start(timeout_s=20)
    assert server._thread is None
    with BackgroundServer(_app(), port=server.port) as again:   # the port was given back
        assert httpx.get(again.url + "/ping", timeout=10).status_code == 200


def test_agentgym_serve_on_a_port_in_use_says_so_in_one_line(capsys):
    """`agentgym serve` binds through the same helper: a taken port is exit 1 and one line naming the fix."""
    from agentgym.app.cli import main
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        rc = main(["serve", "Arithmetic-v0", "--port", str(port)])
    err = capsys.readouterr().err.strip()
    assert rc == 1 and err == (f"error: cannot serve on 127.0.0.1:{port}: the port is in use; stop the other "
                               "server or choose another port (--port)")
