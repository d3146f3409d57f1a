"""Client of a Search-R1 retrieval server (ours in ``server.py``, or Search-R1's own).

Protocol (PeterGriffinJin/Search-R1, ``search_r1/search/retrieval_server.py`` and the client in
``search_r1/llm_agent/generation.py``): ``POST /retrieve`` with ``{"queries": [...], "topk": k,
"return_scores": true}``; the answer is ``{"result": [[{"document": {"id", "contents"}, "score"},
...], ...]}``, one list per query in request order.

Retries cover what a retry can fix (connection errors, timeouts, HTTP 5xx — e.g. a server still
loading its index); a 4xx means the request itself is wrong and fails at once.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any, ClassVar
from urllib.parse import urlsplit, urlunsplit

import httpx

from agentgym.errors import InfraError

from .base import Hit, Retriever


def _endpoint(url: str, path: str) -> str:
    """Accept a base URL or one ending in ``/retrieve`` (Search-R1 configs give the latter)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"retrieval server URL must be http(s)://host[:port][/retrieve], got {url!r}")
    base = parts.path.rstrip("/")
    if base.endswith("/retrieve"):
        base = base[: -len("/retrieve")]
    return urlunsplit((parts.scheme, parts.netloc, base + path, "", ""))


def _error_message(response: httpx.Response) -> str:
    """The server's own explanation: FastAPI's ``detail`` (string or error list), else the body."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:500]
    detail = body.get("detail", body) if isinstance(body, dict) else body
    if isinstance(detail, list):
        msgs = []
        for err in detail:
            if isinstance(err, dict):
                loc = ".".join(str(x) for x in err.get("loc", []) if x != "body")
                msgs.append(f"{loc}: {err.get('msg', err)}" if loc else str(err.get("msg", err)))
            else:
                msgs.append(str(err))
        return "; ".join(msgs)
    return detail if isinstance(detail, str) else json.dumps(detail)[:500]


def _check_options(timeout_s: float, max_retries: int, backoff_s: float, max_queries_per_request: int) -> None:
    """A clear error at construction, not a ``time.sleep`` or ``range`` error in the middle of a search."""
    for name, value, least in (("max_retries", max_retries, 0), ("max_queries_per_request", max_queries_per_request, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"{name} must be an int >= {least}, got {value!r}")
    for name, value, positive in (("timeout_s", timeout_s, True), ("backoff_s", backoff_s, False)):
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or not math.isfinite(value) or value < 0 or (positive and value == 0):
            raise ValueError(f"{name} must be a finite number {'> 0' if positive else '>= 0'}, got {value!r}")


class RetrieverUnavailable(InfraError):
    """The retrieval server timed out, refused the connection or answered 5xx on every attempt: an
    infrastructure failure, so an episode that hits it is marked and kept out of training."""


class RetrieverBadResponse(InfraError):
    """The retrieval server answered 2xx with a body that is not Search-R1's ``{"result": [...]}`` (not
    JSON, wrong shape, hits without ``document.contents``): the server's fault, not the policy's, so an
    episode that hits it is marked and kept out of training like an outage."""


class RemoteRetriever(Retriever):
    """Search through HTTP. One ``httpx.Client`` (thread-safe, pooled) is shared by all callers."""

    kind: ClassVar[str] = "remote"

    def __init__(
        self,
        url: str,
        timeout_s: float = 30.0,
        max_retries: int = 3,
        *,
        backoff_s: float = 0.5,
        max_queries_per_request: int = 256,
    ) -> None:
        _check_options(timeout_s, max_retries, backoff_s, max_queries_per_request)
        self.url = _endpoint(url, "/retrieve")
        self.health_url = _endpoint(url, "/health")
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        # Our server refuses more than max_queries (default 256) per request; chunk to stay under.
        self.max_queries_per_request = max_queries_per_request
        self._client = httpx.Client(timeout=timeout_s)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> RemoteRetriever:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, method: str, url: str, payload: dict[str, Any] | None = None) -> Any:
        attempts = self.max_retries + 1
        last = ""
        for attempt in range(attempts):
            if attempt:
                time.sleep(min(self.backoff_s * 2 ** (attempt - 1), 10.0))
            try:
                response = self._client.request(method, url, json=payload)
            except httpx.TransportError as e:  # refused, reset, timed out, ...
                last = f"{type(e).__name__}: {e}"
                continue
            if response.status_code >= 500:
                last = f"HTTP {response.status_code}: {_error_message(response)}"
                continue
            if response.status_code >= 400:
                raise RuntimeError(
                    f"retrieval server {url} rejected the request (HTTP {response.status_code}): "
                    f"{_error_message(response)}"
                )
            try:
                return response.json()
            except ValueError:
                raise RetrieverBadResponse(
                    f"retrieval server {url} answered HTTP {response.status_code} with a body that is not "
                    f"JSON: {response.text[:200]!r}"
                ) from None
        raise RetrieverUnavailable(f"retrieval server {url} failed after {attempts} attempt(s): {last}")

    def _search_batch(self, queries: list[str], topk: int) -> list[list[Hit]]:
        out: list[list[Hit]] = []
        step = self.max_queries_per_request
        for start in range(0, len(queries), step):
            chunk = queries[start : start + step]
            body = self._request("POST", self.url, {"queries": chunk, "topk": topk, "return_scores": True})
            result = body.get("result") if isinstance(body, dict) else None
            if not isinstance(result, list) or len(result) != len(chunk):
                raise RetrieverBadResponse(
                    f"malformed response from {self.url}: expected 'result' with {len(chunk)} lists, "
                    f"got {str(body)[:200]}"
                )
            try:
                out.extend([Hit.from_dict(item) for item in hits] for hits in result)
            except (ValueError, TypeError, AttributeError) as e:
                raise RetrieverBadResponse(f"malformed response from {self.url}: {e}") from None
        return out

    def health(self) -> dict[str, Any]:
        """Our server's ``GET /health`` (Search-R1's own server has none)."""
        return self._request("GET", self.health_url)

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "url": self.url, "num_docs": None}
