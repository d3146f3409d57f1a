"""The Search-R1-protocol retrieval server on loopback, driven by RemoteRetriever and raw httpx; its
limits (413 for large bodies, 422 without echoes) and the ``agentgym retriever serve`` command."""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import numpy as np
import pytest
from fixtures_llm import single_threaded_math  # noqa: F401  (autouse: one torch/faiss thread)

from agentgym.envs.services.retrieval import (
    BM25Retriever,
    DenseRetriever,
    Hit,
    RemoteRetriever,
    Retriever,
    build_index,
    create_app,
    synthetic_corpus,
)
from agentgym.http_server import BackgroundServer, ServerBindError, bind_socket

N_DOCS = 100
MAX_TOPK, MAX_QUERIES = 20, 32



@pytest.fixture(scope="module")
def data():
    return synthetic_corpus(N_DOCS, seed=1)


@pytest.fixture(scope="module")
def dense(data):
    return DenseRetriever(index_type="flat").build(data[0])


@pytest.fixture(scope="module")
def server(dense):
    with BackgroundServer(create_app(dense, max_topk=MAX_TOPK, max_queries=MAX_QUERIES)) as srv:
        yield srv


@pytest.fixture(scope="module")
def remote(server):
    with RemoteRetriever(server.url, timeout_s=30, max_retries=0) as client:
        yield client


def ids(results: list[list[Hit]]) -> list[list[str]]:
    return [[h.doc_id for h in hits] for hits in results]


def assert_same_results(a: list[list[Hit]], b: list[list[Hit]]) -> None:
    assert ids(a) == ids(b)
    for ha, hb in zip(a, b):
        assert [h.contents for h in ha] == [h.contents for h in hb]
        # Batched on the server with other queries vs alone here: float noise only.
        np.testing.assert_allclose([h.score for h in ha], [h.score for h in hb], atol=1e-4)


def test_server_binds_loopback_only(server):
    assert server.url.startswith("http://127.0.0.1:")


def test_remote_round_trip_equals_in_process(dense, remote, data):
    _, questions = data
    queries = [q.question for q in questions[:28]] + ["", "  "]
    expected = dense.search(queries, topk=5, search_empty=True)
    got = remote.search(queries, topk=5, search_empty=True)
    assert_same_results(got, expected)
    # blank queries are searched as Search-R1's server does (issue 26); a client that skips them sends nothing
    assert len(got[-1]) == 5 and remote.search(["", "  "], topk=5) == [[], []]
    assert ids([remote.search_one(queries[0], topk=2)]) == ids([got[0][:2]])


def test_remote_chunks_requests_above_the_server_limit(dense, server, data):
    _, questions = data
    queries = [q.question for q in questions[: MAX_QUERIES * 2 + 3]]
    with RemoteRetriever(server.url + "/retrieve", max_queries_per_request=MAX_QUERIES) as client:
        assert_same_results(client.search(queries, topk=3), dense.search(queries, topk=3))


def test_wire_format_and_defaults(server, dense, data):
    """Search-R1's request/response shapes, checked on the raw JSON."""
    q = data[1][0].question
    with httpx.Client(base_url=server.url, timeout=30) as http:
        r = http.post("/retrieve", json={"queries": [q], "topk": 2, "return_scores": True})
        assert r.status_code == 200
        body = r.json()
        assert list(body) == ["result"] and len(body["result"]) == 1 and len(body["result"][0]) == 2
        item = body["result"][0][0]
        assert set(item) == {"document", "score"} and set(item["document"]) == {"id", "contents"}
        assert item["document"]["id"] == dense.search_one(q, 1)[0].doc_id
        # topk omitted -> 3 (Search-R1's default); return_scores omitted -> false -> no "score" key.
        r = http.post("/retrieve", json={"queries": [q, ""]})
        assert r.status_code == 200
        result = r.json()["result"]
        assert len(result[0]) == 3 and len(result[1]) == 3  # "" is searched, as Search-R1's server does
        assert all(set(it) == {"document"} for it in result[0])
        # Unknown fields are ignored, as a pydantic model does by default.
        assert http.post("/retrieve", json={"queries": [q], "topk": 1, "extra": 1}).status_code == 200


def test_health(server, remote):
    health = remote.health()
    assert health["status"] == "ok" and health["kind"] == "dense" and health["num_docs"] == N_DOCS
    assert health["max_topk"] == MAX_TOPK and health["max_queries"] == MAX_QUERIES and health["default_topk"] == 3
    assert health["retriever"]["index_type"] == "flat" and health["retriever"]["dim"] == 384


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({}, "queries"),
        ({"topk": 3}, "queries"),
        ({"queries": []}, "queries"),
        ({"queries": "one string"}, "queries"),
        ({"queries": ["ok", 7]}, "queries"),
        ({"queries": [None]}, "queries"),
        ({"queries": ["q"], "topk": 0}, "topk"),
        ({"queries": ["q"], "topk": MAX_TOPK + 1}, "topk"),
        ({"queries": ["q"], "topk": "3"}, "topk"),
        ({"queries": ["q"], "topk": 2.5}, "topk"),
        ({"queries": ["q"], "return_scores": "yes"}, "return_scores"),
        ({"queries": ["q"] * (MAX_QUERIES + 1)}, "queries"),
        (["q"], "dict"),
    ],
)
def test_invalid_requests_get_422_with_a_message(server, body, needle):
    r = httpx.post(server.url + "/retrieve", json=body, timeout=30)
    assert r.status_code == 422, r.text
    assert needle in r.text


@pytest.mark.parametrize("raw", [b"{not json", b"", b'{"queries": ["a"]'])
def test_malformed_json_gets_4xx(server, raw):
    r = httpx.post(server.url + "/retrieve", content=raw, headers={"content-type": "application/json"}, timeout=30)
    assert 400 <= r.status_code < 500, r.text
    assert "detail" in r.json()


def test_unknown_route_and_method(server):
    assert httpx.get(server.url + "/retrieve", timeout=30).status_code == 405
    assert httpx.get(server.url + "/nope", timeout=30).status_code == 404


def test_remote_reports_4xx_without_retrying(remote):
    t0 = time.perf_counter()
    with pytest.raises(RuntimeError, match=r"HTTP 422.*topk") as err:
        remote.search(["q"], topk=MAX_TOPK + 1)
    assert remote.url in str(err.value)
    assert time.perf_counter() - t0 < 10


def test_concurrent_clients_get_their_own_answers(server, dense, data):
    """8 threads x 10 requests, one shared client; every answer matches in-process search."""
    _, questions = data
    queries = [q.question for q in questions[:80]]
    expected = dense.search(queries, topk=3)
    health_before = httpx.get(server.url + "/health", timeout=30).json()
    client = RemoteRetriever(server.url, timeout_s=60, max_retries=0)
    got: dict[int, list[Hit]] = {}
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            for j in range(10):
                i = t * 10 + j
                # Vary topk across threads so the server's per-topk grouping is exercised.
                got[i] = client.search_one(queries[i], topk=3 if t % 2 else 2)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    deadline = time.monotonic() + 120
    for th in threads:
        th.join(max(0.0, deadline - time.monotonic()))
    client.close()
    assert not any(th.is_alive() for th in threads), "clients did not finish in 120 s"
    assert not errors, errors
    for i in range(80):
        k = 3 if (i // 10) % 2 else 2
        assert ids([got[i]]) == ids([expected[i][:k]])
    health = httpx.get(server.url + "/health", timeout=30).json()
    assert health["requests"] - health_before["requests"] == 80
    # Coalescing happened or not depending on timing; at most one batch per request either way.
    assert 1 <= health["batches"] - health_before["batches"] <= 80


class FlakyRetriever(Retriever):
    """A real retriever that fails its first ``failures`` calls: a server still warming up."""

    kind = "flaky"

    def __init__(self, inner: Retriever, failures: int) -> None:
        self.inner, self.failures, self.calls = inner, failures, 0

    def _search_batch(self, queries: list[str], topk: int) -> list[list[Hit]]:
        self.calls += 1
        if self.calls <= self.failures:
            raise RuntimeError("index still loading")
        return self.inner.search(queries, topk)

    @property
    def num_docs(self) -> int | None:
        return self.inner.num_docs


def test_remote_retries_5xx_then_succeeds_or_reports(data):
    docs, questions = data
    bm25 = BM25Retriever().build(docs)
    flaky = FlakyRetriever(bm25, failures=2)
    q = questions[0].question
    with BackgroundServer(create_app(flaky)) as srv:
        with RemoteRetriever(srv.url, max_retries=3, backoff_s=0.01) as client:
            assert ids(client.search([q], 3)) == ids(bm25.search([q], 3))
        assert flaky.calls == 3
        flaky.failures, flaky.calls = 10, 0
        with RemoteRetriever(srv.url, max_retries=1, backoff_s=0.01) as client:
            with pytest.raises(RuntimeError, match=r"failed after 2 attempt\(s\): HTTP 500.*index still loading"):
                client.search([q], 3)
        assert flaky.calls == 2
        health = httpx.get(srv.url + "/health", timeout=30).json()
        assert health["kind"] == "flaky" and health["num_docs"] == N_DOCS


def test_remote_connection_refused_names_the_url():
    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with RemoteRetriever(f"http://127.0.0.1:{port}/retrieve", timeout_s=5, max_retries=2, backoff_s=0.01) as client:
        t0 = time.perf_counter()
        with pytest.raises(RuntimeError, match=rf"127\.0\.0\.1:{port}/retrieve failed after 3 attempt\(s\): ConnectError"):
            client.search(["q"])
        assert time.perf_counter() - t0 < 10
        assert client.search([""]) == [[]]  # nothing to ask: no request at all
    with pytest.raises(ValueError, match="URL"):
        RemoteRetriever("localhost:8000")


def test_bm25_server_and_stop_releases_the_port(data):
    docs, questions = data
    bm25 = BM25Retriever().build(docs)
    srv = BackgroundServer(create_app(bm25))
    url = srv.start()
    port = srv.port
    try:
        with RemoteRetriever(url) as client:
            assert client.health()["kind"] == "bm25"
            queries = [q.question for q in questions[:20]]
            assert ids(client.search(queries, 4)) == ids(bm25.search(queries, 4))
    finally:
        srv.stop()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)


def test_create_app_validates_its_limits(dense):
    with pytest.raises(ValueError, match="default_topk"):
        create_app(dense, max_topk=2, default_topk=3)
    with pytest.raises(ValueError, match="max_request_bytes"):
        create_app(dense, max_request_bytes=0)
    with pytest.raises(ValueError, match="drain_max_bytes"):
        create_app(dense, drain_max_bytes=-1)
    with pytest.raises(ValueError, match="drain_timeout_s"):
        create_app(dense, drain_timeout_s=0)


# --------------------------------------------------------------------------- limits
def test_request_bodies_over_the_limit_get_413_and_the_server_keeps_serving(data):
    docs, questions = data
    bm25 = BM25Retriever().build(docs)
    q = questions[0].question
    with BackgroundServer(create_app(bm25, max_request_bytes=4096)) as srv, \
            httpx.Client(base_url=srv.url, timeout=30) as http:
        assert http.get("/health").json()["max_request_bytes"] == 4096
        t0 = time.perf_counter()
        r = http.post("/retrieve", json={"queries": ["x" * 10_000_000]})  # 10 MB, declared length
        assert r.status_code == 413 and time.perf_counter() - t0 < 5
        detail = r.json()["detail"]
        assert "too large" in detail and "10000016 bytes" in detail and "4096" in detail and len(r.text) < 400

        def chunks():  # no Content-Length: counted while it arrives
            yield b'{"queries": ["'
            for _ in range(50):
                yield b"y" * 1000
            yield b'"]}'

        r = http.post("/retrieve", content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413 and "over the server's limit of 4096 bytes" in r.json()["detail"]

        def small():
            yield b'{"queries": '
            yield json.dumps([q]).encode() + b"}"

        r = http.post("/retrieve", content=small(), headers={"content-type": "application/json"})
        assert r.status_code == 200 and ids(
            [[Hit.from_dict(h) for h in r.json()["result"][0]]]) == ids(bm25.search([q], 3))
        assert http.post("/retrieve", json={"queries": [q] * 100}).status_code == 200  # ~4 KB: under


def test_the_default_limit_is_one_mebibyte(server):
    with httpx.Client(base_url=server.url, timeout=30) as http:
        assert http.get("/health").json()["max_request_bytes"] == 1 << 20
        assert http.post("/retrieve", json={"queries": ["q" * (1 << 20)]}).status_code == 413
        assert http.post("/retrieve", json={"queries": ["q" * 1000]}).status_code == 200


# Oversized bodies must not make the server close on a client that is still sending: the kernel then
# answers the unread bytes with a reset, and a client (httpx sends the whole body before it reads)
# may see "connection reset" instead of the 413. Linux usually keeps a 413 that arrived before the
# reset readable, so the reported errors need a loaded machine to show; these tests therefore watch
# for the reset itself: httpcore reports a failed body write through its ``trace`` extension even
# when it then manages to read a reply.
LIMIT = 4096
BIG = 8 << 20  # larger than loopback's socket buffers, so the client is still sending when refused


def _big_json() -> bytes:
    return b'{"queries": ["' + b"x" * (BIG - 17) + b'"]}'


def _big_chunks(n: int = BIG, size: int = 1 << 16) -> Iterator[bytes]:
    """A body without Content-Length (httpx sends it chunked), ``n`` bytes in ``size`` pieces."""
    yield b'{"queries": ["'
    piece = b"y" * size
    for _ in range(n // size):
        yield piece
    yield b'"]}'


class ResetWatch:
    """An httpx ``trace`` hook that records the request-body writes that failed (a reset mid-send)."""

    def __init__(self) -> None:
        self.failed: list[str] = []

    def __call__(self, event: str, info: dict) -> None:
        if event.endswith("send_request_body.failed"):
            self.failed.append(repr(info.get("exception")))


def _post_big(http: httpx.Client, chunked: bool, watch: ResetWatch) -> httpx.Response:
    if chunked:
        return http.post("/retrieve", content=_big_chunks(), headers={"content-type": "application/json"},
                         extensions={"trace": watch})
    return http.post("/retrieve", content=_big_json(), headers={"content-type": "application/json"},
                     extensions={"trace": watch})


def _assert_clean_413(r: httpx.Response, chunked: bool) -> None:
    assert r.status_code == 413, r.text[:200]
    detail = r.json()["detail"]
    if chunked:
        assert f"over the server's limit of {LIMIT} bytes" in detail, detail
    else:
        assert f"{BIG} bytes > the server's limit of {LIMIT} bytes" in detail, detail


def _run_threads(targets: list[Callable[[], None]], budget_s: float) -> None:
    """Run ``targets`` in threads at once and wait for them, ``budget_s`` in all."""
    threads = [threading.Thread(target=t, daemon=True) for t in targets]
    for th in threads:
        th.start()
    deadline = time.monotonic() + budget_s
    for th in threads:
        th.join(max(0.0, deadline - time.monotonic()))
    assert not any(th.is_alive() for th in threads), f"clients did not finish in {budget_s} s"


def test_oversized_posts_under_load_get_413_while_other_clients_are_served(data):
    """4 threads x 3 oversized posts (declared length and chunked, 8 MiB each) at the same time as
    2 threads x 15 normal searches: every oversized post reads a 413 with its JSON detail after
    sending its whole body (no reset), every search gets its right answer."""
    docs, questions = data
    bm25 = BM25Retriever().build(docs)
    queries = [q.question for q in questions[:30]]
    expected = ids(bm25.search(queries, 3))
    errors: list[str] = []
    refused: list[int] = []
    answered: dict[int, list[str]] = {}
    watch = ResetWatch()
    with BackgroundServer(create_app(bm25, max_request_bytes=LIMIT)) as srv:

        def oversized(t: int) -> None:
            with httpx.Client(base_url=srv.url, timeout=30) as http:
                for j in range(3):
                    chunked = (t + j) % 2 == 1
                    try:
                        r = _post_big(http, chunked, watch)
                        _assert_clean_413(r, chunked)
                        assert r.headers.get("connection") != "close"  # read in full: the connection stays usable
                        refused.append(t)
                    except BaseException as e:  # noqa: BLE001  (reported below, with the others)
                        errors.append(f"oversized {'chunked' if chunked else 'declared'}: {e!r}"[:300])

        def normal(t: int) -> None:
            with httpx.Client(base_url=srv.url, timeout=30) as http:
                for i in range(t * 15, t * 15 + 15):
                    try:
                        r = http.post("/retrieve", json={"queries": [queries[i]], "topk": 3})
                        assert r.status_code == 200, r.text[:200]
                        answered[i] = [h["document"]["id"] for h in r.json()["result"][0]]
                    except BaseException as e:  # noqa: BLE001
                        errors.append(f"normal: {e!r}"[:300])

        _run_threads([lambda t=t: oversized(t) for t in range(4)] + [lambda t=t: normal(t) for t in range(2)],
                     budget_s=120)
        health = httpx.get(srv.url + "/health", timeout=30).json()
    assert not watch.failed, f"{len(watch.failed)} oversized posts were reset mid-send: {watch.failed[:3]}"
    assert not errors, errors
    assert len(refused) == 12
    assert [answered[i] for i in range(30)] == expected
    assert health["requests"] == 30  # the refused posts never reached the retriever


@pytest.mark.parametrize("chunked", [False, True], ids=["declared", "chunked"])
def test_a_body_beyond_the_drain_cap_is_refused_or_closed_in_bounded_time(data, chunked):
    """The server reads at most ``drain_max_bytes`` of a refused body; beyond that it replies and
    closes. The client then gets the 413 or a transport error (a reset), never a hang, and the
    server keeps serving."""
    docs, questions = data
    bm25 = BM25Retriever().build(docs)
    q = questions[0].question
    with BackgroundServer(create_app(bm25, max_request_bytes=LIMIT, drain_max_bytes=256 << 10)) as srv, \
            httpx.Client(base_url=srv.url, timeout=30) as http:
        t0 = time.perf_counter()
        try:
            r = _post_big(http, chunked, ResetWatch())
        except httpx.TransportError:
            pass  # the connection was closed on a client still sending: allowed beyond the cap
        else:
            _assert_clean_413(r, chunked)
            assert r.headers.get("connection") == "close"
        assert time.perf_counter() - t0 < 20
        assert http.post("/retrieve", json={"queries": [q], "topk": 2}).status_code == 200
        assert http.get("/health").json()["status"] == "ok"


def _raw_request(port: int, head: str) -> socket.socket:
    """A loopback connection that has sent ``head``: for what httpx cannot do (stall mid-body)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(head.encode())
    return sock


def _read_until_closed(sock: socket.socket) -> bytes:
    reply = b""
    while chunk := sock.recv(65536):
        reply += chunk
    return reply


@pytest.mark.parametrize("chunked", [False, True], ids=["declared", "chunked"])
def test_a_slow_sender_is_cut_off_after_the_drain_timeout_and_others_are_served(data, chunked):
    """A client that stops sending an oversized body holds its connection for ``drain_timeout_s``,
    then gets the 413 and a close; meanwhile the event loop serves everyone else."""
    docs, _ = data
    with BackgroundServer(create_app(BM25Retriever().build(docs), max_request_bytes=LIMIT,
                                     drain_timeout_s=3.0)) as srv:
        length = "Transfer-Encoding: chunked" if chunked else "Content-Length: 100000"
        sock = _raw_request(srv.port, f"POST /retrieve HTTP/1.1\r\nHost: x\r\n{length}\r\n\r\n")
        with sock:
            first = b"x" * (2 * LIMIT)
            sock.sendall(b"%x\r\n%s\r\n" % (len(first), first) if chunked else first)  # then nothing more
            t0 = time.perf_counter()
            for _ in range(3):  # served while that connection is being drained: the loop is not blocked
                assert httpx.get(srv.url + "/health", timeout=30).status_code == 200
            assert time.perf_counter() - t0 < 2.5
            assert select.select([sock], [], [], 0)[0] == []  # ... and the slow client has no reply yet
            reply = _read_until_closed(sock)
            waited = time.perf_counter() - t0
    assert reply.startswith(b"HTTP/1.1 413 "), reply[:200]
    assert b"connection: close" in reply.lower() and b"limit of 4096 bytes" in reply
    assert 2.5 < waited < 15, waited


def test_an_oversized_expect_100_continue_request_is_refused_before_its_body(server):
    """``Expect: 100-continue`` (curl sends it for large bodies): the 413 comes instead of the
    100, so the client never sends the body."""
    sock = _raw_request(server.port, "POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                     "Content-Length: 10000000\r\nExpect: 100-continue\r\n\r\n")
    with sock:
        reply = _read_until_closed(sock)
    assert reply.startswith(b"HTTP/1.1 413 "), reply[:200]
    assert b"100 Continue" not in reply and b"10000000 bytes > " in reply


def test_422_replies_do_not_echo_the_input(server):
    with httpx.Client(base_url=server.url, timeout=30) as http:
        r = http.post("/retrieve", json={"queries": ["x" * 55_000, 7]})  # 55 KB, one bad item
        assert r.status_code == 422 and len(r.text) < 500 and "xxxxxxxxxx" not in r.text
        assert r.json()["detail"] == [{"loc": ["body", "queries", 1], "msg": "Input should be a valid string",
                                       "type": "string_type"}]
        r = http.post("/retrieve", json={"queries": list(range(MAX_QUERIES))})  # one error per item
        detail = r.json()["detail"]
        assert r.status_code == 422 and len(detail) == 11 and all("input" not in e for e in detail)
        assert detail[-1]["msg"] == f"... and {MAX_QUERIES - 10} more errors"
        r = http.post("/retrieve", content=b'{"queries": ["a", ' + b"z" * 20_000,
                      headers={"content-type": "application/json"})
        assert r.status_code == 422 and len(r.text) < 500 and "JSON decode error" in r.text


# --------------------------------------------------------------------------- the serve command
def test_bind_socket_reports_a_port_in_use():
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(ServerBindError, match=rf"cannot serve on 127\.0\.0\.1:{port}: the port is in use"):
            bind_socket("127.0.0.1", port)
    with bind_socket("127.0.0.1", 0) as free:
        assert free.getsockname()[1] > 0


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "agentgym.app.cli", *args]


def test_serve_command_port_in_use_is_one_clear_error():
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        res = subprocess.run(_cli("retriever", "serve", "bundled", "--port", str(port)),
                             capture_output=True, text=True, timeout=120)
    assert res.returncode == 1 and res.stdout == ""  # no "serving on ..." line first
    assert res.stderr.strip().splitlines() == [
        f"error: cannot serve on 127.0.0.1:{port}: the port is in use; stop the other server or choose "
        f"another port (--port)"]


def test_serve_command_serves_with_its_request_limit(tmp_path, data):
    docs, questions = data
    build_index(docs, tmp_path / "bm25", kind="bm25")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(_cli("retriever", "serve", str(tmp_path / "bm25"), "--port", "0",
                                 "--max-request-bytes", "2048", "--max-topk", "2"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    watchdog = threading.Timer(120, proc.kill)  # a hung start ends the test instead of blocking it
    watchdog.start()
    try:
        line = proc.stdout.readline()  # the first line, printed once the port is bound
        watchdog.cancel()
        assert line.startswith(f"serving {tmp_path / 'bm25'} on http://127.0.0.1:"), (line, proc.stderr.read())
        url = line.split(" on ", 1)[1].split()[0]
        with RemoteRetriever(url, timeout_s=30, max_retries=5, backoff_s=0.2) as client:
            q = questions[0].question
            assert ids(client.search([q], 2)) == ids(BM25Retriever().build(docs).search([q], 2))
            health = client.health()
            assert health["max_request_bytes"] == 2048
            # a --max-topk below the default topk (3) lowers the default with it instead of refusing to start
            assert (health["max_topk"], health["default_topk"]) == (2, 2)
            assert len(httpx.post(url, json={"queries": [q]}, timeout=30).json()["result"][0]) == 2
        assert httpx.post(url, json={"queries": ["q" * 4096]}, timeout=30).status_code == 413
    finally:
        watchdog.cancel()
        proc.kill()  # nothing to shut down gracefully: the index is on disk
        proc.wait(timeout=30)



@pytest.mark.parametrize("flags, message", [
    (["--max-request-bytes", "0"], "--max-request-bytes must be >= 1, got 0"),
    (["--max-topk", "0"], "--max-topk must be >= 1, got 0"),
    (["--port", "99999"], "--port must be in 0..65535 (0: any free port), got 99999"),
    (["--port", "-1"], "--port must be in 0..65535 (0: any free port), got -1"),
])
def test_serve_command_refuses_bad_limits_before_serving(flags, message):
    res = subprocess.run(_cli("retriever", "serve", "bundled", *flags), capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and res.stdout == "", (res.stdout, res.stderr[-500:])  # nothing served first
    assert res.stderr.strip().splitlines() == [f"error: ValueError: {message}"]
