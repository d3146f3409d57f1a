"""A chat-only policy served by any OpenAI-compatible ``/chat/completions`` endpoint.

Works with vLLM, SGLang, llama.cpp's server and OpenAI itself, through plain ``httpx`` (no
``openai`` package: one dependency less, and every wire detail below is visible and testable).
Hosted tokens are not ours, so this policy evaluates and collects demonstrations; it does not train.

Three wire details make replies match what a token-level policy would have produced:

* **Stop strings are kept.** OpenAI-style servers drop the stop string from the reply and accept at
  most 4. We send the first 4, put back the one the server matched (vLLM's ``stop_reason``,
  SGLang's ``matched_stop``; for servers that say nothing, a closing-tag stop such as
  ``</answer>`` whose opening tag is left unclosed), then cut client-side at the earliest of *all*
  stop strings, keeping it — the token policies' rule.
* **Native tool calls become text.** A reply whose ``tool_calls`` replace text content is rendered
  as Hermes-style ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks, which the
  envs parse. On later turns the reverse happens: an assistant turn whose ``<tool_call>`` blocks
  are answered by ``tool`` messages is sent as structured ``tool_calls`` with matching
  ``tool_call_id`` s, which strict servers (OpenAI) require and chat templates render natively.
* **Per-conversation seeds.** With ``sampling.seed = s`` conversation ``i`` of a call gets seed
  ``s + i``: reproducible, yet the copies of one task in a GRPO group still sample differently.

A failing endpoint is an operator problem, not a model action: HTTP errors, malformed replies and
timeouts (after retries) raise :class:`RuntimeError` naming the URL, the status and the server's
message, instead of becoming an observation the agent is scored on.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import random
import re
import threading
import time
from typing import Any, Mapping, Sequence

import httpx

from agentgym.parsing import parse_tool_calls, truncate_after_stop
from agentgym.backend import ChatBackend
from agentgym.policy import Generation, SamplingParams

__all__ = ["OpenAIChatPolicy"]

MAX_SERVER_STOPS = 4  # OpenAI's limit on ``stop``; vLLM and SGLang accept more, but we stay portable
RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
_TOOL_BLOCK = re.compile(r"<tool_call>.*?</tool_call>", flags=re.DOTALL)
_CLOSING_TAG = re.compile(r"</([A-Za-z_][\w\-]*)>")


class OpenAIChatPolicy(ChatBackend):
    """One reply per conversation from ``POST {base_url}/chat/completions``, requests in parallel.

    Args:
        base_url: the API root, e.g. ``http://127.0.0.1:8000/v1`` (vLLM) or ``https://api.openai.com/v1``.
        model: the ``model`` field of every request.
        api_key: sent as ``Authorization: Bearer ...``; default ``$OPENAI_API_KEY``; none for local servers.
        timeout_s: per-request connect / read / write timeout.
        max_retries: further attempts after a 408/429/5xx reply, a timeout or a connection error,
            with exponential backoff (``backoff_s · 2^k``, jittered, capped at ``max_backoff_s``;
            a ``Retry-After`` header is honoured up to the cap).
        concurrency: requests in flight at once (conversations are independent).
        extra_body: merged into every request last (server-specific fields such as ``top_k``,
            ``include_stop_str_in_output`` or ``max_completion_tokens``); a ``None`` value removes
            a field we would otherwise send (``{"max_tokens": None}``).
        send_tools: pass the env's tool specs as ``tools`` (turn off for servers without tool support).
        structured_tool_history: send earlier ``<tool_call>`` turns back as ``tool_calls`` messages
            (see the module docstring); off sends every message as plain text.
    """

    # a ChatBackend: chat only (no tokenizer, no generate): its tokens are not ours, so it evaluates but cannot train

    @classmethod
    def from_spec(cls, spec: str, *, env_id: str | None = None, **_: Any) -> "OpenAIChatPolicy":
        """``openai:MODEL@BASE_URL`` (registered as that spec prefix)."""
        model, sep, url = spec[len("openai:"):].partition("@")
        if not sep or not model or not url:
            raise ValueError("use openai:MODEL@BASE_URL (e.g. openai:qwen@http://127.0.0.1:8000/v1)")
        return cls(base_url=url, model=model)

    def __init__(self, base_url: str, model: str, *, api_key: str | None = None, timeout_s: float = 60.0,
                 max_retries: int = 3, concurrency: int = 8, extra_body: Mapping[str, Any] | None = None,
                 backoff_s: float = 0.5, max_backoff_s: float = 30.0, send_tools: bool = True,
                 structured_tool_history: bool = True):
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        if not re.match(r"https?://[^/\s]+", base_url or ""):
            raise ValueError(f"base_url must start with http:// or https:// and a host, got {base_url!r} "
                             "(e.g. http://127.0.0.1:8000/v1)")
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.base_url = base_url.rstrip("/")
        self.url = f"{self.base_url}/chat/completions"
        self.model = model
        self.name = model
        self.timeout_s = float(timeout_s)
        self.max_retries = int(max_retries)
        self.concurrency = int(concurrency)
        self.extra_body = dict(extra_body or {})
        self.backoff_s, self.max_backoff_s = float(backoff_s), float(max_backoff_s)
        self.send_tools = send_tools
        self.structured_tool_history = structured_tool_history
        key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        self._client = httpx.Client(headers=headers, timeout=httpx.Timeout(self.timeout_s),
                                    limits=httpx.Limits(max_connections=self.concurrency,
                                                        max_keepalive_connections=self.concurrency))
        self._pool = cf.ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="agentgym-openai")
        self._jitter = random.Random()
        self._jitter_lock = threading.Lock()

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._client.close()

    def __enter__(self) -> "OpenAIChatPolicy":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"OpenAIChatPolicy(url={self.url!r}, model={self.model!r})"

    # ------------------------------------------------------------------ the ChatPolicy contract
    def respond(self, conversations: Sequence[Sequence[dict[str, str]]], sampling: SamplingParams,
                tools: Sequence[dict[str, Any]] | None = None) -> list[Generation]:
        """One :class:`Generation` per conversation, in order (``token_ids`` / ``logprobs`` empty).

        Raises RuntimeError on the first request that fails for good; requests not yet sent are cancelled.
        """
        if not conversations:
            return []
        bodies = [self.request_body(conv, sampling, tools, index=i) for i, conv in enumerate(conversations)]
        futures = [self._pool.submit(self._complete, body, sampling.stop) for body in bodies]
        try:
            return [f.result() for f in futures]
        except BaseException:
            for f in futures:
                f.cancel()
            raise

    def request_body(self, conversation: Sequence[Mapping[str, Any]], sampling: SamplingParams,
                     tools: Sequence[dict[str, Any]] | None = None, index: int = 0) -> dict[str, Any]:
        """The JSON body for one conversation (public so the mapping can be inspected)."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": self.wire_messages(conversation),
            "max_tokens": sampling.max_new_tokens,
            "temperature": 0.0 if sampling.greedy else sampling.temperature,
            "top_p": 1.0 if sampling.greedy else sampling.top_p,
        }
        if sampling.top_k > 0 and not sampling.greedy:
            body["top_k"] = sampling.top_k  # not in OpenAI's API; vLLM / SGLang / llama.cpp accept it
        if sampling.stop:
            body["stop"] = list(sampling.stop[:MAX_SERVER_STOPS])
        if sampling.seed is not None:
            body["seed"] = int(sampling.seed) + index
        if tools and self.send_tools:
            body["tools"] = [dict(t) for t in tools]
        for k, v in self.extra_body.items():
            if v is None:
                body.pop(k, None)
            else:
                body[k] = v
        return body

    def wire_messages(self, conversation: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Env messages → API messages; ``<tool_call>`` turns answered by tool messages become ``tool_calls``."""
        msgs = [dict(m) for m in conversation]
        out: list[dict[str, Any]] = []
        i = 0
        while i < len(msgs):
            m = msgs[i]
            answers = 0
            while i + 1 + answers < len(msgs) and msgs[i + 1 + answers].get("role") == "tool":
                answers += 1
            structured = None
            if self.structured_tool_history and m.get("role") == "assistant" and answers:
                structured = _as_tool_call_message(str(m.get("content") or ""), answers, turn=i)
            if structured is None:
                out.append(_plain_message(m))
                i += 1
                continue
            out.append(structured)
            for call, tool_msg in zip(structured["tool_calls"], msgs[i + 1: i + 1 + answers]):
                out.append({"role": "tool", "tool_call_id": tool_msg.get("tool_call_id") or call["id"],
                            "content": str(tool_msg.get("content") or "")})
            i += 1 + answers
        return out

    # ------------------------------------------------------------------ one request
    def _complete(self, body: dict[str, Any], stop: Sequence[str]) -> Generation:
        t0 = time.perf_counter()
        data, attempts = self._post(body)
        gen = self._to_generation(data, stop, sent_stops=body.get("stop") or [])
        gen.meta.update(latency_s=time.perf_counter() - t0, attempts=attempts)
        return gen

    def _post(self, body: dict[str, Any]) -> tuple[dict[str, Any], int]:
        last = ""
        for attempt in range(self.max_retries + 1):
            retry_after: float | None = None
            try:
                resp = self._client.post(self.url, json=body)
            except httpx.TimeoutException as e:
                last = f"timed out after {self.timeout_s:g} s ({type(e).__name__})"
            except httpx.TransportError as e:
                last = f"connection error: {type(e).__name__}: {e}"
            else:
                if resp.status_code == 200:
                    return self._parse_json(resp), attempt + 1
                last = f"HTTP {resp.status_code}: {_server_message(resp)}"
                if resp.status_code not in RETRY_STATUSES:
                    raise RuntimeError(f"POST {self.url} failed with {last}")
                retry_after = _retry_after_s(resp)
            if attempt < self.max_retries:
                time.sleep(self._backoff(attempt, retry_after))
        raise RuntimeError(f"POST {self.url} failed after {self.max_retries + 1} attempt(s); last error: {last}")

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(self.max_backoff_s, retry_after)
        with self._jitter_lock:
            u = self._jitter.random()
        return min(self.max_backoff_s, self.backoff_s * 2 ** attempt) * (0.5 + 0.5 * u)

    def _parse_json(self, resp: httpx.Response) -> dict[str, Any]:
        try:
            data = resp.json()
        except ValueError:
            raise RuntimeError(f"POST {self.url} returned HTTP 200 with a body that is not JSON: "
                               f"{_clip(resp.text)!r}") from None
        choices = data.get("choices") if isinstance(data, dict) else None
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict) \
                or not isinstance(choices[0].get("message"), dict):
            raise RuntimeError(f"POST {self.url} returned HTTP 200 without choices[0].message: {_clip(resp.text)!r}")
        return data

    def _to_generation(self, data: dict[str, Any], stop: Sequence[str], sent_stops: Sequence[str]) -> Generation:
        choice = data["choices"][0]
        message = choice["message"]
        raw_reason = choice.get("finish_reason")
        text = message.get("content") or ""
        if not isinstance(text, str):  # a list of content parts (rare in replies)
            text = "".join(p.get("text", "") for p in text if isinstance(p, dict))
        calls = message.get("tool_calls") or []
        if calls:
            rendered = "\n".join(_render_tool_call(c) for c in calls)
            text = f"{text}\n{rendered}" if text.strip() else rendered
        elif raw_reason == "stop" and sent_stops:
            text += _matched_server_stop(choice, text, sent_stops)

        cut = truncate_after_stop(text, stop) if stop else text
        if len(cut) < len(text) or (stop and any(cut.endswith(s) for s in stop)):
            reason = "stop"
        elif raw_reason == "length":
            reason = "length"
        else:
            reason = "eos"  # the model ended its turn ("stop" without a stop string, "tool_calls", …)
        meta: dict[str, Any] = {"finish_reason_raw": raw_reason}
        for key in ("usage", "model", "id", "system_fingerprint"):
            if data.get(key) is not None:
                meta[key] = data[key]
        for key in ("stop_reason", "matched_stop"):
            if key in choice:
                meta[key] = choice[key]
        if message.get("reasoning_content"):
            meta["reasoning_content"] = message["reasoning_content"]
        if calls:
            meta["tool_calls"] = calls
        return Generation([], [], cut, reason, meta)


# ---------------------------------------------------------------------- helpers (pure)
def _plain_message(m: Mapping[str, Any]) -> dict[str, Any]:
    out = {"role": m.get("role"), "content": m.get("content")}
    for key in ("name", "tool_call_id", "tool_calls"):
        if m.get(key) is not None:
            out[key] = m[key]
    return out


def _as_tool_call_message(text: str, answers: int, turn: int) -> dict[str, Any] | None:
    """The assistant message with its ``<tool_call>`` blocks as ``tool_calls``, or None when the
    blocks do not parse or do not pair one-to-one with the ``answers`` tool messages that follow."""
    parsed = parse_tool_calls(text)
    if parsed.errors or len(parsed.calls) != answers:
        return None
    rest = _TOOL_BLOCK.sub("", text).strip()
    calls = [{"id": f"call_{turn}_{k}", "type": "function",
              "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}}
             for k, c in enumerate(parsed.calls)]
    return {"role": "assistant", "content": rest or None, "tool_calls": calls}


def _render_tool_call(call: Mapping[str, Any]) -> str:
    """A native tool call as the Hermes text block the envs parse; broken argument JSON is kept as a
    string so the env reports it to the model (the model's mistake, not ours)."""
    fn = call.get("function") or {}
    args: Any = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            pass
    return "<tool_call>" + json.dumps({"name": fn.get("name"), "arguments": args}, ensure_ascii=False) + "</tool_call>"


def _matched_server_stop(choice: Mapping[str, Any], text: str, sent: Sequence[str]) -> str:
    """The stop string the server matched and removed ("" for an EOS or when it is already kept)."""
    if any(text.endswith(s) for s in sent):
        return ""  # include_stop_str_in_output (vLLM) or a server that keeps it
    for key in ("stop_reason", "matched_stop"):  # vLLM, SGLang: the string, or a token id / None for EOS
        if key in choice:
            value = choice[key]
            return value if isinstance(value, str) and value in sent else ""
    # the server does not say (OpenAI, llama.cpp): a closing tag whose opener is left open ended it
    for s in sent:
        m = _CLOSING_TAG.fullmatch(s)
        if m and text.rfind(f"<{m.group(1)}>") > text.rfind(s):
            return s
    return ""


def _server_message(resp: httpx.Response) -> str:
    try:
        data = resp.json()
    except ValueError:
        return _clip(resp.text) or resp.reason_phrase
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and err.get("message"):
            return _clip(str(err["message"]))
        for key in ("error", "detail", "message"):
            if data.get(key):
                return _clip(data[key] if isinstance(data[key], str) else json.dumps(data[key]))
    return _clip(json.dumps(data))


def _retry_after_s(resp: httpx.Response) -> float | None:
    value = resp.headers.get("retry-after")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None  # an HTTP date: fall back to our own backoff


def _clip(s: str, n: int = 500) -> str:
    s = s.strip()
    return s if len(s) <= n else s[:n] + "…"
