"""The Search-R1-protocol retrieval server on loopback, driven by RemoteRetriever and raw httpx."""

from __future__ import annotations

import socket
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
