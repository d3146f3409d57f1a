"""Serve any registered agentgym env over OpenEnv's protocol (``agentgym serve ENV_ID``).

The wire format follows openenv-core 0.3.0 (``openenv/core/env_server/http_server.py``, ``types.py`` and
``serialization.py`` in that package), so its clients (``GenericEnvClient``, TRL's OpenEnv integration)
connect unchanged:

* ``GET /health`` -> ``{"status": "healthy"}``; ``GET /metadata``; ``GET /schema`` -> the JSON Schemas of
  the action, the observation and the state.
* ``WS /ws``: one env per connection. Client frames ``{"type": "reset", "data": {seed?, episode_id?,
  options?}}``, ``{"type": "step", "data": {"message": TEXT}}``, ``{"type": "state"}``, ``{"type": "close"}``;
  replies ``{"type": "observation", "data": {"observation": {...}, "reward", "done"}}``, ``{"type": "state",
  "data": {...}}`` or ``{"type": "error", "data": {"message", "code"}}`` with OpenEnv's codes.
* ``POST /reset`` and ``POST /step``: OpenEnv's stateless simulation mode (a fresh env per request; a
  step resets it first, with the body's optional ``seed``).

The observation carries the env's new chat ``messages``, their ``text`` joined, ``terminated`` and
``truncated`` (OpenEnv has only ``done``, their OR) and the ``info`` a trainer needs (reward terms,
action type, turn, the episode summary on the last step). ``info["privileged"]`` (hidden state) is
never sent.

Why our own server rather than openenv-core's ``HTTPEnvServer``: ours does not depend on openenv-core,
bounds every frame (``max_message_bytes``) and observation (``max_observation_chars``) with an error
frame rather than a dropped connection, answers a frame at a time without pydantic on the hot path,
and shares one thread pool sized to the sessions (openenv-core makes a pool per session). Env calls
block, so they run in that pool: one slow env does not stall the event loop or the other sessions.
``benchmarks/openenv_server.py`` measures both.
"""

from __future__ import annotations

import asyncio
import json
import math
import socket
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any, Callable

from fastapi import FastAPI, HTTPException, Request, WebSocket
from pydantic import BaseModel, ConfigDict, Field

from agentgym.http_server import BackgroundServer

__all__ = ["ServeLimits", "create_app", "serve", "BackgroundOpenEnvServer", "MessageAction", "ChatObservation",
           "SessionState", "ERROR_CODES"]

#: OpenEnv's ``WSErrorCode`` values (openenv/core/env_server/types.py)
ERROR_CODES = ("INVALID_JSON", "UNKNOWN_TYPE", "VALIDATION_ERROR", "EXECUTION_ERROR", "CAPACITY_REACHED",
               "FACTORY_ERROR", "SESSION_ERROR")
_RESET_KEYS = {"seed", "episode_id", "options"}
_TRUNCATED_MARK = "\n[... {n} characters cut by the server's max_observation_chars]"


class ChatMessage(BaseModel):
    """One chat message of an observation (OpenAI / HF chat format)."""
    model_config = ConfigDict(extra="allow")
    role: str
    content: str


class MessageAction(BaseModel):
    """The action: the assistant's text for the turn (OpenEnv text envs' ``{"message": str}``)."""
    model_config = ConfigDict(extra="forbid")
    message: str = Field(description="the assistant's text for this turn")
    metadata: dict[str, Any] = Field(default_factory=dict, description="ignored; OpenEnv's Action carries it")


class ChatObservation(BaseModel):
    """What the env returns for a reset or a step (the ``observation`` of an OpenEnv reply)."""
    model_config = ConfigDict(extra="forbid")
    messages: list[ChatMessage] = Field(description="the chat messages new since the last step")
    text: str = Field(description="the messages' contents joined by blank lines")
    terminated: bool = Field(description="the task ended (an answer, a submission)")
    truncated: bool = Field(description="the env's turn limit (or an infrastructure failure) ended it")
    info: dict[str, Any] = Field(description="reward_terms, raw_reward_terms, action_type, turn; "
                                             "episode_summary on the last step")
    episode_id: str | None = Field(default=None, description="the session's current episode")
    done: bool = Field(default=False, description="terminated or truncated")
    reward: float | None = Field(default=None, description="the step's reward (None at reset)")
    metadata: dict[str, Any] = Field(default_factory=dict)


class SessionState(BaseModel):
    """The ``state`` reply: OpenEnv's ``State`` (episode_id, step_count) plus the env and whether it is done."""
    model_config = ConfigDict(extra="allow")
    episode_id: str | None = None
    step_count: int = 0
    env_id: str = ""
    done: bool = True


class ServeLimits(BaseModel):
    """The server's bounds (all checked per frame; violations are error frames, the session lives on)."""
    max_sessions: int = Field(default=64, ge=1, description="WebSocket sessions at once; more get CAPACITY_REACHED")
    max_message_bytes: int = Field(default=1 << 20, ge=1024, description="largest client frame or HTTP body")
    max_observation_chars: int = Field(default=1_000_000, ge=100, description="message text per reply, beyond cut")
    ws_hard_limit_bytes: int = Field(default=16 << 20, description="uvicorn closes a connection (1009) beyond this")


class FrameError(Exception):
    """A bad client frame: answered with an error frame of ``code``; the session continues."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


def _jsonable(value: Any) -> Any:
    """``json.dumps`` fallback for what infos hold: numpy scalars and arrays, tuples/sets, anything else as str."""
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 1) == 0:
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=str)
    return str(value)


def _finite(x: Any) -> float | None:
    """A reward as JSON can carry it (NaN/inf are not JSON)."""
    return None if x is None or not math.isfinite(float(x)) else float(x)


class EnvSession:
    """One WebSocket session: its own env instance, episode id and step count. Env calls go through
    ``run`` (the shared pool), one at a time, because the session loop awaits each."""

    def __init__(self, env: Any, env_id: str, limits: ServeLimits, run: Callable[..., Any]):
        self.env, self.env_id, self.limits, self.run = env, env_id, limits, run
        self.episode_id: str | None = None
        self.step_count = 0
        self.done = True

    def observation(self, messages: list[dict], reward: float | None, terminated: bool, truncated: bool,
                    info: dict[str, Any]) -> dict[str, Any]:
        """An OpenEnv reply's ``data``: ``{"observation": ..., "reward", "done"}``, messages cut to the bound."""
        budget, out = self.limits.max_observation_chars, []
        for m in messages:
            content = str(m.get("content", ""))
            if len(content) > budget:
                content = content[:budget] + _TRUNCATED_MARK.format(n=len(content) - budget)
            budget = max(0, budget - len(content))
            out.append({**{k: v for k, v in m.items() if isinstance(v, str)}, "content": content})
        public = {k: v for k, v in info.items() if k != "privileged"}
        obs = {"messages": out, "text": "\n\n".join(m["content"] for m in out), "terminated": terminated,
               "truncated": truncated, "info": public, "episode_id": self.episode_id}
        return {"observation": obs, "reward": _finite(reward), "done": bool(terminated or truncated)}

    async def reset(self, data: Any) -> dict[str, Any]:
        if not isinstance(data, dict) or set(data) - _RESET_KEYS:
            raise FrameError("VALIDATION_ERROR", f"reset data must be an object with keys among {sorted(_RESET_KEYS)}")
        seed, options = data.get("seed"), data.get("options")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise FrameError("VALIDATION_ERROR", f"seed must be a non-negative integer, got {seed!r}")
        if options is not None and not isinstance(options, dict):
            raise FrameError("VALIDATION_ERROR", "options must be an object ({'task_index': i} or {'task': {...}})")
        episode_id = data.get("episode_id")
        if episode_id is not None and (not isinstance(episode_id, str) or len(episode_id) > 255):
            raise FrameError("VALIDATION_ERROR", "episode_id must be a string of at most 255 characters")
        self.done = True
        try:
            obs, info = await self.run(self.env.reset, seed=seed, options=options)
        except ValueError as e:  # a bad task option: the client's mistake
            raise FrameError("VALIDATION_ERROR", f"reset: {e}") from None
        self.episode_id, self.step_count, self.done = episode_id or str(uuid.uuid4()), 0, False
        return self.observation(obs, None, False, False, info)

    async def step(self, data: Any) -> dict[str, Any]:
        if not isinstance(data, dict) or not isinstance(data.get("message"), str) or set(data) - {"message", "metadata"}:
            raise FrameError("VALIDATION_ERROR", 'step data must be {"message": "<the assistant\'s text>"}')
        if self.done:
            raise FrameError("VALIDATION_ERROR", "no episode is running: send a reset first"
                             if self.episode_id is None else "the episode is over: send a reset")
        try:
            obs, reward, terminated, truncated, info = await self.run(self.env.step, data["message"])
        except Exception:
            self.done = True  # the env is in doubt: the client must reset
            raise
        self.step_count += 1
        self.done = bool(terminated or truncated)
        return self.observation(obs, reward, bool(terminated), bool(truncated), info)

    def state(self) -> dict[str, Any]:
        return {"episode_id": self.episode_id, "step_count": self.step_count, "env_id": self.env_id, "done": self.done}


def _error(code: str, message: str, **extra: Any) -> str:
    return json.dumps({"type": "error", "data": {"message": message, "code": code, **extra}})


def _parse_frame(raw: str | bytes | None, limit: int) -> dict[str, Any]:
    """A client frame as a dict with a ``type``, or :class:`FrameError`."""
    if raw is None:
        raise FrameError("INVALID_JSON", "empty frame")
    if len(raw) > limit:  # len(str) <= its UTF-8 size: a cheap pre-check, then the exact one
        if len(raw if isinstance(raw, bytes) else raw.encode("utf-8", "surrogatepass")) > limit:
            raise FrameError("VALIDATION_ERROR", f"frame of more than {limit} bytes (the server's max_message_bytes)")
    try:
        msg = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise FrameError("INVALID_JSON", f"Invalid JSON: {e}") from None
    if not isinstance(msg, dict) or not isinstance(msg.get("type"), str):
        raise FrameError("VALIDATION_ERROR", 'a frame is a JSON object with a "type": reset, step, state or close')
    return msg


class _Sessions:
    """The live sessions (for the cap, and closing them all on shutdown) and the shared env thread pool."""

    def __init__(self, env_id: str, env_kwargs: dict[str, Any], limits: ServeLimits):
        self.env_id, self.env_kwargs, self.limits = env_id, dict(env_kwargs), limits
        self.pool = ThreadPoolExecutor(max_workers=limits.max_sessions, thread_name_prefix="openenv-env")
        self.live: dict[str, EnvSession] = {}
        self.reserved = 0

    def make_env(self) -> Any:
        import agentgym
        return agentgym.make(self.env_id, **self.env_kwargs)

    async def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.pool, lambda: fn(*args, **kwargs))

    async def close_env(self, env: Any) -> None:
        """Close one env in the pool (inline once the pool is shut down, at the end of a shutdown)."""
        try:
            await asyncio.shield(self.run(env.close))
        except RuntimeError:
            env.close()

    def close_all(self) -> None:
        for s in list(self.live.values()):
            s.env.close()
        self.live.clear()
        self.pool.shutdown(wait=True, cancel_futures=True)


async def _serve_session(ws: Any, sessions: _Sessions) -> None:
    """One WebSocket connection, from accept to close (see the module docstring for the frames)."""
    await ws.accept()
    if sessions.reserved >= sessions.limits.max_sessions:
        await ws.send_text(_error("CAPACITY_REACHED", f"server at capacity ({sessions.limits.max_sessions} sessions)",
                                  active_sessions=sessions.reserved, max_sessions=sessions.limits.max_sessions))
        await ws.close()
        return
    sessions.reserved += 1
    sid, session = str(uuid.uuid4()), None
    try:
        try:
            env = await sessions.run(sessions.make_env)
        except Exception as e:
            await ws.send_text(_error("FACTORY_ERROR", f"cannot make {sessions.env_id}: {type(e).__name__}: {e}"))
            return
        session = EnvSession(env, sessions.env_id, sessions.limits, sessions.run)
        sessions.live[sid] = session
        await _frame_loop(ws, session, sessions.limits.max_message_bytes)
    except Exception as e:  # the client went away mid-send (starlette's WebSocketDisconnect, a closed socket)
        if type(e).__name__ not in ("WebSocketDisconnect", "ClientDisconnected", "ConnectionClosed"):
            raise
    finally:
        sessions.reserved -= 1
        if sessions.live.pop(sid, None) is not None and session is not None:
            await sessions.close_env(session.env)
        try:
            await ws.close()
        except Exception:  # already closed by the client or the server's shutdown
            pass


async def _frame_loop(ws: Any, session: EnvSession, limit: int) -> None:
    """Answer frames until the client sends close or disconnects."""
    while True:
        message = await ws.receive()
        if message["type"] == "websocket.disconnect":
            return
        try:
            frame = _parse_frame(message.get("text", message.get("bytes")), limit)
            kind = frame["type"]
            if kind == "close":
                return
            if kind == "reset":
                reply = {"type": "observation", "data": await session.reset(frame.get("data", {}))}
            elif kind == "step":
                reply = {"type": "observation", "data": await session.step(frame.get("data"))}
            elif kind == "state":
                reply = {"type": "state", "data": session.state()}
            else:
                raise FrameError("UNKNOWN_TYPE", f"Unknown message type: {kind[:64]}")
            text = json.dumps(reply, default=_jsonable)
        except FrameError as e:
            text = _error(e.code, str(e))
        except Exception as e:  # the env failed (an InfraError under it, a bug): say so, keep the session
            text = _error("EXECUTION_ERROR", f"{type(e).__name__}: {e}")
        await ws.send_text(text)


async def _read_body(request: Any, limit: int) -> Any:
    """The JSON body of a simulation-mode request, at most ``limit`` bytes (else HTTP 413)."""
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise HTTPException(413, f"request body over the server's limit of {limit} bytes")
    if not body:
        return {}
    try:
        return json.loads(body)
    except ValueError as e:
        raise HTTPException(422, f"Invalid JSON: {e}") from None


def create_app(env_id: str, env_kwargs: dict[str, Any] | None = None, limits: ServeLimits | None = None) -> FastAPI:
    """The FastAPI app serving ``env_id`` (made with ``env_kwargs``) over OpenEnv's protocol.

    One env is made and closed here first, so a bad id or bad kwargs fail now rather than per session.
    """
    import agentgym
    limits = limits or ServeLimits()
    sessions = _Sessions(agentgym.registry.full_id(env_id), env_kwargs or {}, limits)
    probe = sessions.make_env()
    base = probe.unwrapped
    meta = {"name": sessions.env_id, "description": (type(base).__doc__ or "").strip().split("\n")[0],
            "version": getattr(agentgym, "__version__", None), "author": "agentgym",
            "documentation_url": None, "readme_content": None,
            "max_turns": base.max_turns, "max_action_chars": base.max_action_chars,
            "max_sessions": limits.max_sessions, "max_message_bytes": limits.max_message_bytes}
    probe.close()

    @asynccontextmanager
    async def lifespan(app: Any):
        yield
        await asyncio.get_running_loop().run_in_executor(None, sessions.close_all)

    app = FastAPI(title=f"agentgym {sessions.env_id} (OpenEnv protocol)", lifespan=lifespan)
    app.state.sessions = sessions
    schema = {"action": MessageAction.model_json_schema(), "observation": ChatObservation.model_json_schema(),
              "state": SessionState.model_json_schema()}
    app.get("/health")(lambda: {"status": "healthy", "active_sessions": len(sessions.live),
                                "max_sessions": limits.max_sessions})
    app.get("/metadata")(lambda: meta)
    app.get("/schema")(lambda: schema)
    app.get("/state")(lambda: SessionState(env_id=sessions.env_id).model_dump())

    @app.websocket("/ws")
    async def ws_endpoint(ws: WebSocket) -> None:
        await _serve_session(ws, sessions)

    _add_simulation_routes(app, sessions)
    return app


def _add_simulation_routes(app: Any, sessions: _Sessions) -> None:
    """``POST /reset`` and ``POST /step``: a fresh env per request, closed after it (OpenEnv's simulation mode)."""

    async def one_shot(body: Any, action: str | None) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise HTTPException(422, "the body must be a JSON object")
        env = await sessions.run(sessions.make_env)
        session = EnvSession(env, sessions.env_id, sessions.limits, sessions.run)
        try:
            reset = {k: body[k] for k in _RESET_KEYS if k in body}
            data = await session.reset(reset)
            if action is not None:
                data = await session.step({"message": action})
            return data
        except FrameError as e:
            raise HTTPException(422, str(e)) from None
        finally:
            await sessions.run(env.close)

    @app.post("/reset")
    async def http_reset(request: Request) -> dict[str, Any]:
        return await one_shot(await _read_body(request, sessions.limits.max_message_bytes), None)

    @app.post("/step")
    async def http_step(request: Request) -> dict[str, Any]:
        body = await _read_body(request, sessions.limits.max_message_bytes)
        action = body.get("action") if isinstance(body, dict) else None
        if not isinstance(action, dict) or not isinstance(action.get("message"), str):
            raise HTTPException(422, 'the body must be {"action": {"message": "<text>"}, "seed"?: int}')
        return await one_shot(body, action["message"])


def _uvicorn_server(app: Any, limits: ServeLimits, log_level: str) -> Any:
    import uvicorn
    config = uvicorn.Config(app, log_level=log_level, ws_max_size=limits.ws_hard_limit_bytes, lifespan="on",
                            timeout_graceful_shutdown=10)
    return uvicorn.Server(config)


def serve(app: Any, sock: socket.socket, limits: ServeLimits | None = None, log_level: str = "warning") -> None:
    """Run ``app`` in the foreground on a bound ``sock``. uvicorn turns SIGINT/SIGTERM into a graceful
    shutdown: open WebSockets are closed, then the lifespan closes every session's env."""
    try:
        _uvicorn_server(app, limits or ServeLimits(), log_level).run(sockets=[sock])
    finally:
        sock.close()


class BackgroundOpenEnvServer(BackgroundServer):
    """``agentgym serve``'s server (its :class:`ServeLimits`, graceful shutdown) in a background thread on a
    pre-bound loopback port: for tests, benchmarks and ``OpenEnv-v0``'s self-contained default. Starting,
    stopping and their bounds are the kernel's :class:`~agentgym.http_server.BackgroundServer`."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, limits: ServeLimits | None = None):
        super().__init__(app, host, port, name="OpenEnv server")
        self.limits = limits or ServeLimits()

    def make_server(self) -> Any:
        return _uvicorn_server(self.app, self.limits, "warning")
