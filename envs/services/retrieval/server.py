"""HTTP retrieval server speaking Search-R1's protocol, so Search-R1 clients and ours interchange.

Protocol (PeterGriffinJin/Search-R1, ``search_r1/search/retrieval_server.py``): ``POST /retrieve``
with ``{"queries": [str, ...], "topk": int, "return_scores": bool}`` returns ``{"result": [[hit,
...], ...]}``, one list per query. As there, ``topk`` may be omitted (server default; Search-R1's
paper scripts use 3) and ``return_scores`` defaults to false.

``return_scores: false``. Search-R1's code means to return bare documents then, but its endpoint
unpacks ``results, scores = retriever.batch_search(...)`` while ``batch_search`` returns only the
results when no scores are asked for, so that path never worked; every Search-R1 client sends
``true`` and reads ``item["document"]["contents"]``. We therefore keep one item shape and only drop
the key: ``{"document": {"id", "contents"}}`` without ``"score"``. A client parsing
``["document"]`` works whatever it sends.

Differences from Search-R1, all on invalid input (which Search-R1 answers with a 500 or ignores):
``queries`` must be a non-empty list of strings of at most ``max_queries`` items; ``topk`` must be
an int in ``[1, max_topk]`` (Search-R1 treats 0 as "default"; we reject it). Violations get HTTP
422 with FastAPI's ``detail`` naming the field; a body that is not JSON gets 422 too. Empty or
blank query strings are valid and searched as they are, as Search-R1's server does (a dense index
embeds the empty string and returns its nearest passages; BM25 finds no terms and returns ``[]``).

Limits. A request body larger than ``max_request_bytes`` (default 1 MiB: a few thousand queries)
gets HTTP 413 ``{"detail": ...}`` and never reaches the worker, so one huge request cannot hold it
for seconds. The rest of such a body is read and discarded (up to max(64 MiB, 16x the limit) and
5 s) before the reply, so that a client which sends its whole body before reading gets the 413
rather than a connection reset (:class:`BodySizeLimit` says why). A 422 lists at most
``_MAX_ERRORS`` errors as ``{"loc", "msg", "type"}`` without FastAPI's ``input`` field, so an
invalid 50 KB body is not echoed back. :func:`agentgym.http_server.bind_socket` reserves the port before
anything slow happens, so "port in use" is one error, not a traceback after start-up; tests and
benchmarks serve in a background thread with :class:`agentgym.http_server.BackgroundServer`.

Concurrency. One worker thread owns the retriever: HF fast tokenizers are not safe to drive from
many threads, any user-supplied ``Retriever`` then needs no locking of its own, and batching is
where the speed is anyway. Requests are
queued; each time the worker is free it takes *everything* queued (up to ``max_batch_queries``),
runs one ``search`` per distinct ``topk`` and resolves every request's future. Under load that
coalesces concurrent requests into one encoder call; with one client it adds no waiting.
The event loop never blocks on retrieval, so ``/health`` stays responsive during a long batch.
"""

import asyncio
import concurrent.futures
import json
import logging
import queue
import socket
import threading
from collections import defaultdict
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from agentgym.http_server import bind_socket

from .base import DEFAULT_TOPK, Hit, Retriever

logger = logging.getLogger(__name__)

DEFAULT_MAX_REQUEST_BYTES = 1 << 20
DEFAULT_DRAIN_TIMEOUT_S = 5.0  # how long a refused body may take to arrive (see BodySizeLimit)
_DRAIN_MIN_BYTES = 64 << 20
_MAX_ERRORS = 10  # validation errors listed in one 422 reply
_MAX_MSG_CHARS = 200


class BodySizeLimit:
    """ASGI middleware: HTTP 413 for a request body over ``max_bytes``, delivered so clients read it.

    A declared ``Content-Length`` over the limit is refused without passing the body on; a body
    without one (chunked) is buffered up to the limit and refused as soon as it exceeds it. Either way
    at most ``max_bytes`` of a request are ever held in memory.

    Why the rest of a refused body is drained (read and discarded, one chunk at a time) before the
    413 goes out: a server that replies and closes while the client is still sending leaves unread
    bytes in its socket, and closing such a socket makes the kernel send a reset instead of a FIN.
    A client that sends the whole body before reading (httpx, requests) has its send fail with
    ECONNRESET and then may find the 413 gone: Linux usually keeps a reply that already arrived
    readable, but loaded machines have lost it (the client reported "connection reset" or a
    truncated reply), and stacks that flush their queues on a reset (RFC 793) lose it always. Once the body is fully read the connection is clean, so the 413 is
    sent without ``Connection: close`` and the connection stays usable.

    Why before and not after: uvicorn's ``receive()`` (``h11_impl`` and ``httptools_impl`` alike)
    returns ``http.disconnect`` at once when the response is complete, and its parsers drop body
    bytes arriving after it, so an ASGI app can read the body only until it finishes its reply.

    The drain is bounded, because it costs bandwidth and holds a connection (never memory):

    * in bytes, by ``drain_max_bytes`` (default :func:`default_drain_max_bytes`); a declared length
      over it is refused at once, without reading, as there is no point reading part of it;
    * in time, by ``drain_timeout_s`` from the moment of refusal, so a client that sends slowly or
      stops cannot hold a connection for longer than that.

    Past either bound the 413 is sent with ``Connection: close`` and the connection closed; a client
    still sending may then see a reset, which is the price of not reading without limit. A request
    with ``Expect: 100-continue`` and a declared length over the limit is refused before its body:
    the client has not sent it (it waits for the ``100``), so there is nothing to drain.
    """

    def __init__(self, app: Any, max_bytes: int, drain_max_bytes: int | None = None,
                 drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.drain_max_bytes = default_drain_max_bytes(max_bytes) if drain_max_bytes is None else drain_max_bytes
        self.drain_timeout_s = drain_timeout_s

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None:
            try:
                size = int(declared)
            except ValueError:
                size = -1
            if size > self.max_bytes:
                waits_for_100 = headers.get(b"expect", b"").lower() == b"100-continue"
                drained = False if waits_for_100 or size > self.drain_max_bytes else await self._drain(receive, 0)
                await self._refuse(send, size, drained)
                return
            await self.app(scope, receive, send)  # the server enforces the declared length
            return
        chunks, total = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # client went away
                await self.app(scope, _replay([message]), send)
                return
            total += len(message.get("body", b""))
            if total > self.max_bytes:
                chunks.clear()  # not needed any more: only the count matters
                drained = await self._drain(receive, total) if message.get("more_body", False) else True
                await self._refuse(send, None, drained)
                return
            chunks.append(message)
            if not message.get("more_body", False):
                break
        await self.app(scope, _replay(chunks, receive), send)

    async def _drain(self, receive: Any, already: int) -> bool:
        """Read and discard the rest of the body (``already`` bytes of it are read); True if all was.

        False when it ran past ``drain_max_bytes`` or ``drain_timeout_s``, or the client went away
        (replying then is harmless: uvicorn drops what is sent to a closed connection). Each
        ``receive()`` hands over what uvicorn has buffered (about its 64 KiB flow-control mark plus
        one socket read) and is awaited, so the event loop serves other connections meanwhile.
        """
        total = already
        try:
            async with asyncio.timeout(self.drain_timeout_s):
                while True:
                    message = await receive()
                    if message["type"] != "http.request":
                        return False
                    total += len(message.get("body", b""))
                    if not message.get("more_body", False):
                        return True
                    if total > self.drain_max_bytes:
                        return False
        except TimeoutError:
            return False

    async def _refuse(self, send: Any, size: int | None, drained: bool) -> None:
        """The 413 with its JSON ``detail``; ``Connection: close`` unless the body was read in full."""
        got = f"{size} bytes > " if size is not None else "over "
        body = json.dumps({"detail": f"request body too large ({got}the server's limit of {self.max_bytes} "
                                     f"bytes, --max-request-bytes); send fewer or shorter queries per "
                                     f"request"}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        if not drained:
            headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def default_drain_max_bytes(max_bytes: int) -> int:
    """How much of a refused body the server reads so that its client sees the 413: max(64 MiB, 16x).

    Reading and discarding costs no memory and little CPU (64 MiB in about 70 ms on loopback on a
    loaded 2-core VM; a 1 Gb/s link needs about 0.5 s), while a client that sends too much is nearly
    always one that batched too many queries, a few times the limit. 64 MiB covers that with room to
    spare at the default 1 MiB limit; 16x the limit keeps the same headroom when an operator raises
    it. A body past that is more likely abuse than a mistake and not worth the bandwidth.
    """
    return max(_DRAIN_MIN_BYTES, 16 * max_bytes)


def _replay(messages: list[dict], then: Any = None) -> Any:
    """An ASGI ``receive`` that hands out buffered messages first, then defers to ``then``."""
    pending = list(messages)

    async def receive() -> dict:
        if pending:
            return pending.pop(0)
        if then is not None:
            return await then()
        return {"type": "http.disconnect"}

    return receive


def _validation_reply(request: Request, exc: RequestValidationError) -> JSONResponse:
    """FastAPI's 422 shape (``detail``: a list of errors) without ``input``/``ctx`` echoes of the body."""
    errors = exc.errors()
    detail: list[dict[str, Any]] = []
    for e in errors[:_MAX_ERRORS]:
        msg = str(e.get("msg", ""))
        if e.get("type") == "json_invalid" and (e.get("ctx") or {}).get("error"):
            msg += f": {e['ctx']['error']}"  # the parser's reason, not the input
        detail.append({"loc": list(e.get("loc", ())), "msg": msg[:_MAX_MSG_CHARS], "type": e.get("type")})
    if len(errors) > _MAX_ERRORS:
        detail.append({"loc": [], "msg": f"... and {len(errors) - _MAX_ERRORS} more errors", "type": "truncated"})
    return JSONResponse({"detail": detail}, status_code=422)


@dataclass
class _Job:
    queries: list[str]
    topk: int
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)


class BatchingWorker:
    """The single thread that runs ``retriever.search``; coalesces whatever requests are queued."""

    def __init__(self, retriever: Retriever, max_batch_queries: int = 1024) -> None:
        self.retriever = retriever
        self.max_batch_queries = max_batch_queries
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self.batches = 0  # counters for /health and benchmarks
        self.requests = 0

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="retrieval-worker", daemon=True)
            self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout_s)
            self._thread = None

    def submit(self, queries: list[str], topk: int) -> concurrent.futures.Future:
        job = _Job(queries, topk)
        self._queue.put(job)
        return job.future

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            jobs, n, stop = [first], len(first.queries), False
            while n < self.max_batch_queries:
                try:
                    job = self._queue.get_nowait()
                except queue.Empty:
                    break
                if job is None:
                    stop = True
                    break
                jobs.append(job)
                n += len(job.queries)
            try:
                self._process(jobs)
            except BaseException as e:  # never leave a request waiting on a dead worker
                logger.exception("retrieval worker failed")
                for job in jobs:
                    if not job.future.done():
                        job.future.set_exception(e)
            if stop:
                return

    def _process(self, jobs: list[_Job]) -> None:
        # A request whose client went away has a cancelled future: skip its work.
        live = [j for j in jobs if j.future.set_running_or_notify_cancel()]
        by_topk: dict[int, list[_Job]] = defaultdict(list)
        for job in live:
            by_topk[job.topk].append(job)
        for topk, group in by_topk.items():
            queries = [q for job in group for q in job.queries]
            try:
                # empty queries are searched as they are, as Search-R1's server does (it embeds "")
                results = self.retriever.search(queries, topk, search_empty=True)
            except Exception as e:  # reported to each waiting request as a 500
                logger.exception("retrieval failed for a batch of %d queries", len(queries))
                for job in group:
                    job.future.set_exception(e)
                continue
            start = 0
            for job in group:
                job.future.set_result(results[start : start + len(job.queries)])
                start += len(job.queries)
        self.batches += 1
        self.requests += len(live)


def create_app(
    retriever: Retriever,
    max_topk: int = 50,
    max_queries: int = 256,
    *,
    default_topk: int = DEFAULT_TOPK,
    max_batch_queries: int = 1024,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    drain_max_bytes: int | None = None,
    drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S,
) -> FastAPI:
    """FastAPI app with ``POST /retrieve`` (Search-R1 protocol) and ``GET /health``.

    ``drain_max_bytes`` (default :func:`default_drain_max_bytes`) and ``drain_timeout_s`` bound how
    much of an over-limit body is read, and for how long, so that its client sees the 413
    (:class:`BodySizeLimit`).
    """
    if not 1 <= default_topk <= max_topk:
        raise ValueError(f"default_topk must be in [1, max_topk={max_topk}], got {default_topk}")
    if max_request_bytes < 1:
        raise ValueError(f"max_request_bytes must be >= 1, got {max_request_bytes}")
    if drain_max_bytes is not None and drain_max_bytes < 0:
        raise ValueError(f"drain_max_bytes must be >= 0, got {drain_max_bytes}")
    if not drain_timeout_s > 0:
        raise ValueError(f"drain_timeout_s must be > 0, got {drain_timeout_s}")
    worker = BatchingWorker(retriever, max_batch_queries=max_batch_queries)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        worker.start()
        try:
            yield
        finally:
            worker.stop()

    app = FastAPI(title="agentgym retrieval server", lifespan=lifespan)
    app.state.worker = worker
    app.state.retriever = retriever
    app.add_exception_handler(RequestValidationError, _validation_reply)
    app.add_middleware(BodySizeLimit, max_bytes=max_request_bytes, drain_max_bytes=drain_max_bytes,
                       drain_timeout_s=drain_timeout_s)
    limits = {"default_topk": default_topk, "max_topk": max_topk, "max_queries": max_queries,
              "max_request_bytes": max_request_bytes}
    _add_routes(app, _request_model(max_queries, max_topk), worker, retriever, limits)
    return app


def _request_model(max_queries: int, max_topk: int) -> type[BaseModel]:
    """The ``/retrieve`` body: Search-R1's ``QueryRequest``, with this server's bounds."""

    class RetrieveRequest(BaseModel):
        """Search-R1's ``QueryRequest``, with bounds."""

        model_config = ConfigDict(extra="ignore")
        queries: list[StrictStr] = Field(min_length=1, max_length=max_queries)
        topk: StrictInt | None = Field(default=None, ge=1, le=max_topk)
        return_scores: StrictBool = False

    return RetrieveRequest


def _add_routes(app: FastAPI, request_model: type[BaseModel], worker: BatchingWorker, retriever: Retriever,
                limits: dict[str, int]) -> None:
    """``POST /retrieve`` (batched through ``worker``) and ``GET /health`` (``limits`` and counters)."""
    default_topk = limits["default_topk"]

    @app.post("/retrieve")
    async def retrieve(request: request_model) -> JSONResponse:  # type: ignore[valid-type]
        topk = request.topk if request.topk is not None else default_topk
        try:
            results: list[list[Hit]] = await asyncio.wrap_future(worker.submit(request.queries, topk))
        except Exception as e:
            return JSONResponse({"detail": f"retrieval failed: {type(e).__name__}: {e}"}, status_code=500)
        with_score = request.return_scores
        # JSONResponse directly: FastAPI's jsonable_encoder pass is slow on thousands of small dicts.
        return JSONResponse({"result": [[h.to_dict(with_score) for h in hits] for hits in results]})

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {
            "status": "ok",
            "kind": retriever.kind,
            "num_docs": retriever.num_docs,
            **limits,
            "retriever": retriever.describe(),
            "batches": worker.batches,
            "requests": worker.requests,
        }


def serve(
    retriever: Retriever,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    max_topk: int = 50,
    max_queries: int = 256,
    default_topk: int = DEFAULT_TOPK,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    log_level: str = "info",
    sock: socket.socket | None = None,
) -> None:
    """Run the server in the foreground on ``sock`` (from :func:`~agentgym.http_server.bind_socket`) or on
    ``host:port``.

    Loopback by default: exposing an index to the network (e.g. ``host="0.0.0.0"`` for multi-node
    training) should be a deliberate choice. Raises :class:`~agentgym.http_server.ServerBindError` when it
    cannot bind.
    """
    app = create_app(retriever, max_topk, max_queries, default_topk=default_topk,
                     max_request_bytes=max_request_bytes)
    sock = sock if sock is not None else bind_socket(host, port)
    try:
        uvicorn.Server(uvicorn.Config(app, log_level=log_level)).run(sockets=[sock])
    finally:
        sock.close()
