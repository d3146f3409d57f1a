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
blank query strings are valid and get ``[]``, as in ``Retriever.search`` (Search-R1 would embed
the empty string and return its nearest passages).

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
import logging
import queue
import socket
import threading
import time
from collections import defaultdict
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from .base import DEFAULT_TOPK, Hit, Retriever

logger = logging.getLogger(__name__)


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
                results = self.retriever.search(queries, topk)
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
) -> FastAPI:
    """FastAPI app with ``POST /retrieve`` (Search-R1 protocol) and ``GET /health``."""
    if not 1 <= default_topk <= max_topk:
        raise ValueError(f"default_topk must be in [1, max_topk={max_topk}], got {default_topk}")

    class RetrieveRequest(BaseModel):
        """Search-R1's ``QueryRequest``, with bounds."""

        model_config = ConfigDict(extra="ignore")
        queries: list[StrictStr] = Field(min_length=1, max_length=max_queries)
        topk: StrictInt | None = Field(default=None, ge=1, le=max_topk)
        return_scores: StrictBool = False

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

    @app.post("/retrieve")
    async def retrieve(request: RetrieveRequest) -> JSONResponse:
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
            "default_topk": default_topk,
            "max_topk": max_topk,
            "max_queries": max_queries,
            "retriever": retriever.describe(),
            "batches": worker.batches,
            "requests": worker.requests,
        }

    return app


def serve(
    retriever: Retriever,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    max_topk: int = 50,
    max_queries: int = 256,
    default_topk: int = DEFAULT_TOPK,
    log_level: str = "info",
) -> None:
    """Run the server in the foreground. Loopback by default: exposing an index to the network
    (e.g. ``host="0.0.0.0"`` for multi-node training) should be a deliberate choice."""
    app = create_app(retriever, max_topk, max_queries, default_topk=default_topk)
    uvicorn.run(app, host=host, port=port, log_level=log_level)


class BackgroundServer:
    """uvicorn in a daemon thread on a pre-bound socket (``port=0`` = a free port, no race).

    For tests, benchmarks and single-process training runs that want a real HTTP retriever.
    ``start``/``stop`` are bounded by timeouts and raise rather than hang.
    """

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0, start_timeout_s: float = 30.0) -> None:
        self.app = app
        self.host = host
        self.port = port
        self.start_timeout_s = start_timeout_s
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> str:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self.app, log_level="warning", lifespan="on")
        self._server, self._sock = uvicorn.Server(config), sock
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + self.start_timeout_s
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError(f"retrieval server on {self.url} exited during start-up")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"retrieval server on {self.url} did not start in {self.start_timeout_s}s")
            time.sleep(0.01)
        return self.url

    def stop(self, timeout_s: float = 10.0) -> None:
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
            raise TimeoutError(f"retrieval server on {self.url} did not stop in {2 * timeout_s}s")

    def __enter__(self) -> "BackgroundServer":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
