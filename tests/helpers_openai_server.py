"""A real OpenAI-compatible HTTP server on loopback whose "model" is a deterministic script.

The reply is a pure function of the request, chosen by the request's ``model``:

* ``echo`` — repeats the last user message, behaving like vLLM: ``max_tokens`` counts
  whitespace-separated words (``finish_reason`` "length"), stop strings are applied server-side and
  removed from the reply, and ``stop_reason`` names the one that matched (``None`` for an EOS).
* ``echo-openai`` — the same, but like OpenAI it does not say which stop string matched.
* ``arithmetic`` — solves ``agentgym/Arithmetic-v0``: easy questions answered directly, hard ones
  (an operand ≥ 1000) through a native ``tool_calls`` call of ``calculator`` when tools are offered,
  then answered from the tool's reply. Stops are applied as in ``echo``.
* ``tools`` — always replies with two native tool calls and no text content.
* ``flaky`` — the first ``fail_times`` requests carrying ``fail_key`` get HTTP ``fail_status``; then echo.
* ``malformed`` — HTTP 200 with a body that is not JSON.
* anything else — HTTP 400 with an OpenAI-style error body.

Like OpenAI the server is strict about tool messages: each needs a ``tool_call_id`` issued by an
earlier assistant ``tool_calls`` entry (HTTP 400 otherwise). A user message starting with
``[delay=S]`` makes the reply wait ``S`` seconds (for timeouts and out-of-order completion).
Every request body and its headers are recorded, and the peak number of requests in flight is kept.
"""

from __future__ import annotations

import asyncio
import re
import socket
import threading
import time
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse

_QUESTION = re.compile(r"What is (-?\d+) ([-+*]) (-?\d+)\?")
_DELAY = re.compile(r"^\[delay=([0-9.]+)\]\s*")


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "invalid_request_error", "code": status}},
                        status_code=status)


def _apply_stops(text: str, stops: list[str]) -> tuple[str, str | None]:
    """Cut before the earliest stop string (server-side stop, string removed) and name it."""
    best: tuple[int, str] | None = None
    for s in stops:
        i = text.find(s)
        if i >= 0 and (best is None or i < best[0]):
            best = (i, s)
    return (text, None) if best is None else (text[:best[0]], best[1])


class ScriptedChatServer:
    """The FastAPI app and its recorded state."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.failures: dict[str, int] = {}
        self.in_flight = 0
        self.peak_in_flight = 0
        self._lock = threading.Lock()
        self.app = FastAPI()
        self.app.post("/v1/chat/completions")(self.chat_completions)

    def reset_peak(self) -> None:
        with self._lock:
            self.peak_in_flight = 0

    def requests_for(self, model: str) -> list[dict[str, Any]]:
        with self._lock:
            return [r for r in self.requests if r["body"].get("model") == model]

    async def chat_completions(self, request: Request) -> Any:
        body = await request.json()
        with self._lock:
            self.requests.append({"body": body, "headers": dict(request.headers)})
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            return await self._reply(body)
        finally:
            with self._lock:
                self.in_flight -= 1

    async def _reply(self, body: dict[str, Any]) -> Any:
        model = body.get("model")
        messages = body.get("messages") or []
        if not messages or any("role" not in m or "content" not in m for m in messages):
            return _error(400, "every message needs 'role' and 'content'")
        issued: set[str] = set()
        for m in messages:
            for call in m.get("tool_calls") or []:
                issued.add(call["id"])
            if m["role"] == "tool" and m.get("tool_call_id") not in issued:
                return _error(400, "messages with role 'tool' must be a response to a preceding message with 'tool_calls'")
        last_user = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "") or ""
        delay = _DELAY.match(last_user)
        if delay:
            await asyncio.sleep(float(delay.group(1)))
            last_user = last_user[delay.end():]

        if model == "flaky":
            key = body["fail_key"]
            with self._lock:
                seen = self.failures.get(key, 0)
                self.failures[key] = seen + 1
            if seen < int(body["fail_times"]):
                status = int(body["fail_status"])
                return JSONResponse({"error": {"message": f"overloaded (attempt {seen + 1})"}}, status_code=status,
                                    headers={"Retry-After": "0"} if status == 429 else None)
            return self._text_reply(body, last_user, report_stop=True)
        if model in ("echo", "echo-openai"):
            return self._text_reply(body, last_user, report_stop=model == "echo")
        if model == "arithmetic":
            return self._arithmetic(body, messages)
        if model == "tools":
            calls = [{"id": "call_a", "type": "function",
                      "function": {"name": "calculator", "arguments": '{"expression": "6*7"}'}},
                     {"id": "call_b", "type": "function", "function": {"name": "lookup", "arguments": "{not json"}}]
            return self._completion(body, {"role": "assistant", "content": None, "tool_calls": calls},
                                    "tool_calls", completion_tokens=7)
        if model == "malformed":
            return PlainTextResponse("<html>502 Bad Gateway</html>", status_code=200)
        return _error(400, f"The model `{model}` does not exist.")

    def _arithmetic(self, body: dict[str, Any], messages: list[dict[str, Any]]) -> JSONResponse:
        last = messages[-1]
        if last["role"] == "tool":
            return self._text_reply(body, f"<answer>{last['content'].strip()}</answer>", report_stop=True)
        q = _QUESTION.search(last["content"] or "")
        if q is None:
            return self._text_reply(body, "I cannot parse the question.", report_stop=True)
        a, op, b = int(q.group(1)), q.group(2), int(q.group(3))
        if body.get("tools") and max(abs(a), abs(b)) >= 1000:
            call = {"id": f"call_{len(messages)}", "type": "function",
                    "function": {"name": "calculator", "arguments": f'{{"expression": "{a} {op} {b}"}}'}}
            return self._completion(body, {"role": "assistant", "content": None, "tool_calls": [call]},
                                    "tool_calls", completion_tokens=12)
        value = {"+": a + b, "-": a - b, "*": a * b}[op]
        return self._text_reply(body, f"Easy. <answer>{value}</answer> done", report_stop=True)

    def _text_reply(self, body: dict[str, Any], text: str, *, report_stop: bool) -> JSONResponse:
        words = text.split(" ")
        limit = int(body.get("max_tokens") or 10**9)
        reason, stop_reason = "stop", None
        if len(words) > limit:
            text, reason = " ".join(words[:limit]), "length"
        cut, matched = _apply_stops(text, list(body.get("stop") or []))
        if matched is not None:
            text, reason, stop_reason = cut, "stop", matched
        choice_extra = {"stop_reason": stop_reason} if report_stop else {}
        return self._completion(body, {"role": "assistant", "content": text}, reason,
                                completion_tokens=len(text.split()), **choice_extra)

    @staticmethod
    def _completion(body: dict[str, Any], message: dict[str, Any], finish_reason: str, *,
                    completion_tokens: int, **choice_extra: Any) -> JSONResponse:
        prompt_tokens = sum(len(str(m.get("content") or "").split()) for m in body["messages"])
        return JSONResponse({
            "id": f"chatcmpl-{int(time.time() * 1e6)}", "object": "chat.completion", "created": int(time.time()),
            "model": body["model"],
            "choices": [{"index": 0, "message": message, "finish_reason": finish_reason, **choice_extra}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens},
        })


class LoopbackServer:
    """Runs an ASGI app with uvicorn in a daemon thread on 127.0.0.1 and a free port."""

    def __init__(self, app: Any) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, log_level="warning", lifespan="off", timeout_graceful_shutdown=2,
                                access_log=False)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]},
                                        name="loopback-uvicorn", daemon=True)

    def start(self, timeout_s: float = 10.0) -> "LoopbackServer":
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"uvicorn did not start on {self.url} within {timeout_s} s")
            time.sleep(0.01)
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=timeout_s)
        self._sock.close()
        if self._thread.is_alive():
            raise RuntimeError(f"uvicorn on {self.url} did not stop within {timeout_s} s")
