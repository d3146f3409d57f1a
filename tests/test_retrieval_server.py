"""The Search-R1-protocol retrieval server on loopback, driven by RemoteRetriever and raw httpx; its
limits (413 for large bodies, 422 without echoes) and the ``agentgym retriever serve`` command."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
import pytest
from fixtures_llm import single_threaded_math  # noqa: F401  (autouse: one torch/faiss thread)

from agentgym.envs.retrieval import (
    BackgroundServer,
    BM25Retriever,
    DenseRetriever,
    Hit,
    RemoteRetriever,
    Retriever,
    ServerBindError,
    bind_socket,
    build_index,
    create_app,
    synthetic_corpus,
)

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
    expected = dense.search(queries, topk=5)
    got = remote.search(queries, topk=5)
    assert_same_results(got, expected)
    assert got[-1] == [] and got[-2] == []
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
        assert len(result[0]) == 3 and result[1] == []
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
    return [sys.executable, "-m", "agentgym.cli", *args]


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
                                 "--max-request-bytes", "2048"),
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
            assert client.health()["max_request_bytes"] == 2048
        assert httpx.post(url, json={"queries": ["q" * 4096]}, timeout=30).status_code == 413
    finally:
        watchdog.cancel()
        proc.kill()  # nothing to shut down gracefully: the index is on disk
        proc.wait(timeout=30)
    res = subprocess.run(_cli("retriever", "serve", "bundled", "--max-request-bytes", "0"),
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "--max-request-bytes must be >= 1" in res.stderr and "Traceback" not in res.stderr
