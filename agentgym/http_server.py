"""One way to run an ASGI app (FastAPI) with uvicorn in a background thread of this process: the
retrieval server (:mod:`agentgym.envs.services.retrieval.server`) and ``agentgym serve``'s OpenEnv server
(:class:`agentgym.adapters.openenv_server.BackgroundOpenEnvServer`) both start this way for tests,
benchmarks and self-contained runs.

The socket is bound before the thread starts (``port=0``: a free port, so callers never race for one, and
"port in use" is the first thing a user sees, as :class:`ServerBindError`). ``start`` waits until uvicorn
serves and ``stop`` joins the thread, each within a bound: they raise rather than hang. Signals stay with
the main thread (uvicorn listens to them only there). uvicorn is imported only when a server starts.
"""

from __future__ import annotations

import errno
import socket
import threading
import time
from typing import Any

__all__ = ["ServerBindError", "bind_socket", "BackgroundServer"]


class ServerBindError(OSError):
    """The address to serve on is in use or cannot be bound; the message says which and what to do."""


def bind_socket(host: str = "127.0.0.1", port: int = 8000) -> socket.socket:
    """A listening socket on ``host:port`` (``port=0``: a free one), or :class:`ServerBindError`.

    Binding first, before an index is loaded or a line is printed, makes "port in use" the first and
    only thing a user sees when it happens.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family)
    except OSError as e:
        why = ("the port is in use; stop the other server or choose another port (--port)"
               if e.errno == errno.EADDRINUSE else (e.strerror or str(e)))
        err = ServerBindError(f"cannot serve on {host}:{port}: {why}")
        err.errno = e.errno
        raise err from None


class BackgroundServer:
    """``app`` served by uvicorn in a daemon thread on a pre-bound socket; a context manager.

    ``url`` is known once started (``port=0`` picks a free port). A subclass that needs other uvicorn
    settings (limits, shutdown grace) overrides :meth:`make_server`.
    """

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, *, start_timeout_s: float = 30.0,
                 name: str = "http server") -> None:
        self.app, self.host, self.port = app, host, port
        self.start_timeout_s, self.name = start_timeout_s, name
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None
        self._failure: str | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def make_server(self) -> Any:
        """The ``uvicorn.Server`` to run: quiet logs, the app's lifespan on."""
        import uvicorn
        return uvicorn.Server(uvicorn.Config(self.app, log_level="warning", lifespan="on"))

    def start(self, timeout_s: float | None = None) -> str:
        """Bind, serve in the background and wait until uvicorn is ready; returns :attr:`url`. Raises
        :class:`ServerBindError`, ``RuntimeError`` (the server exited while starting: its log says why) or
        ``TimeoutError`` (not ready within ``timeout_s``, default ``start_timeout_s``), leaving nothing running."""
        if self._thread is not None:
            raise RuntimeError(f"{self.name} on {self.url} is already running")
        timeout_s = self.start_timeout_s if timeout_s is None else timeout_s
        self._sock = bind_socket(self.host, self.port)
        self.port = self._sock.getsockname()[1]
        self._server = self.make_server()
        self._failure: str | None = None
        self._thread = threading.Thread(target=self._serve, args=(self._server, self._sock), daemon=True,
                                        name=f"{self.name}-{self.port}".replace(" ", "-"))
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive():
                why = self._failure
                self.stop()
                raise RuntimeError(f"{self.name} on {self.url} exited during start-up ({why}; its log above says why)")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"{self.name} on {self.url} did not start within {timeout_s}s")
            time.sleep(0.01)
        return self.url

    def _serve(self, server: Any, sock: socket.socket) -> None:
        """The thread: uvicorn exits (``SystemExit``) when the app fails to start; that is kept for
        :meth:`start`'s message rather than left to escape the thread."""
        try:
            server.run(sockets=[sock])
        except SystemExit as e:
            self._failure = f"uvicorn exit status {e.code}"
        except Exception as e:  # noqa: BLE001 - reported by start()
            self._failure = repr(e)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Ask uvicorn to shut down gracefully, force it after ``timeout_s``; raises ``TimeoutError`` when the
        thread is still alive after twice that. A server not running is left as it is."""
        if self._server is None or self._thread is None:
            return
        self._server.should_exit = True
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            self._server.force_exit = True
            self._thread.join(timeout_s)
        if self._sock is not None:
            self._sock.close()
        alive = self._thread.is_alive()
        self._server = self._thread = self._sock = None
        if alive:
            raise TimeoutError(f"{self.name} on {self.url} did not stop within {2 * timeout_s}s")

    def __enter__(self) -> "BackgroundServer":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
