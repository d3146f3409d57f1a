"""``agentgym/OpenEnv-v0``: an OpenEnv server (any of them: ``agentgym serve``, openenv-core's own, a Hugging
Face Space) as an agentgym env.

``step(text)`` sends ``{action_field: text}`` over one WebSocket session (OpenEnv's ``/ws``, protocol of
openenv-core 0.3.0: ``openenv/core/env_client.py`` and ``env_server/http_server.py``) and returns the
server's observation rendered as chat messages, its reward and its ``done``. ``reset(seed=s)`` resets the
server with seed ``s``; ``reset()`` without one sends a seed drawn from the env's ``np_random`` (so a
seeded stream continues deterministically); ``options={"task_index": i}`` sends seed ``i``, and
``options={"task": {...}}`` sends that mapping as the reset's data (``seed``, ``episode_id``, ...).

**Failures are not rewards.** A refused or lost connection, a reply slower than ``timeout_s``, an error
frame (``CAPACITY_REACHED``, ``EXECUTION_ERROR``, ...) are :class:`~agentgym.errors.InfraError`: a step
ends the episode marked ``infra_error`` (left out of the loss), a reset raises it. The next reset
reconnects.

**Rendering.** By default an observation that has ``messages`` (``agentgym serve``) gives those; else
``observation_field`` (default: the first of ``text``, ``message``, ``content``, ``prompt``, ``output``
it holds) becomes one ``user`` message; else the observation as JSON. ``render=`` takes a callable (or a
``"module:attr"`` reference) from the observation dict to a string or a message list.

**Reward.** The server's reward is the term ``remote``; an action longer than ``max_action_chars`` is
refused here without being sent (the term ``refused``, -1 weighted 0.1). ``terminated``/``truncated``
come from the observation's own flags when it has them (``agentgym serve``), else ``done`` is
``terminated``; the local ``max_turns`` (default: the server's, from ``/metadata``, else 64) truncates.

**No ``base_url``**: a loopback server in this process serves ``Arithmetic-v0`` (started once, shared
by every such env). The env is then a real, self-contained OpenEnv round trip: what ``agentgym check``,
the registry's tests and the docs run without a server of their own.
"""

from __future__ import annotations

import importlib
import json
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from agentgym import AgentEnv, EnvConfig, Reward, Transition
from agentgym.errors import InfraError
from agentgym.rewards import StepEvent

__all__ = ["OpenEnvEnv", "OpenEnvConfig", "default_server_url"]

_TEXT_FIELDS = ("text", "message", "content", "prompt", "output")
_DEFAULT_ENV = "Arithmetic-v0"
_default_lock = threading.Lock()
_default_server: Any = None


def default_server_url() -> str:
    """The URL of this process's loopback server for ``Arithmetic-v0`` (started on first use)."""
    global _default_server
    with _default_lock:
        if _default_server is None:
            from agentgym.adapters.openenv_server import BackgroundOpenEnvServer, ServeLimits, create_app
            limits = ServeLimits(max_sessions=256)
            server = BackgroundOpenEnvServer(create_app(_DEFAULT_ENV, limits=limits), limits=limits)
            server.start()
            _default_server = server
        return _default_server.url


class _RemoteReward:
    """The server's reward for the step (``info["remote_reward"]``; 0 for a step not sent)."""
    name = "remote"

    def __call__(self, event: StepEvent) -> float:
        return float(event.info.get("remote_reward", 0.0))


class _Refused:
    """-1 for an action refused here (too long) and never sent to the server."""
    name = "refused"

    def __call__(self, event: StepEvent) -> float:
        return -1.0 if event.action_type == "invalid" and "remote_reward" not in event.info else 0.0


def _resolve(ref: Callable[..., Any] | str | None) -> Callable[..., Any] | None:
    if ref is None or callable(ref):
        return ref
    module, _, attr = str(ref).partition(":")
    if not attr:
        raise ValueError(f"render must be a callable or 'module:attr', got {ref!r}")
    return getattr(importlib.import_module(module), attr)


@dataclass
class OpenEnvConfig(EnvConfig):
    """The settings of ``OpenEnv-v0``."""
    base_url: str | None = field(default=None, metadata={
        "help": "http(s):// or ws(s):// address of the server; null: the loopback Arithmetic server"})
    action_field: str = field(default="message", metadata={"help": "the action's key (OpenEnv text envs: message)"})
    observation_field: str | None = field(default=None, metadata={
        "help": "which observation key holds the text; null: see the module docstring"})
    render: Callable[..., Any] | str | None = field(default=None, metadata={
        "help": "a callable or 'module:attr': observation dict -> str or chat messages"})
    role: str = field(default="user", metadata={"help": "the role of a rendered text message"})
    timeout_s: float = field(default=60.0, metadata={"help": "wait for one reply"})
    connect_timeout_s: float = field(default=10.0, metadata={"help": "wait to open the session"})
    max_turns: int | None = field(default=None, metadata={
        "help": "local turn limit; null: the server's /metadata max_turns, else 64"})
    max_message_bytes: int = field(default=16 << 20, metadata={"help": "largest reply accepted"})


class OpenEnvEnv(AgentEnv):
    """An OpenEnv server's env, one WebSocket session per instance; settings: :class:`OpenEnvConfig`."""

    config_class = OpenEnvConfig

    def __init__(self, config: OpenEnvConfig | None = None, **settings: Any):
        c = self.config = self.config_class.build(config, settings)
        self.base_url = (c.base_url or default_server_url()).rstrip("/")
        self.action_field, self.observation_field, self.role = c.action_field, c.observation_field, c.role
        self.render_fn = _resolve(c.render)
        self.timeout_s, self.connect_timeout_s = c.timeout_s, c.connect_timeout_s
        self.max_message_bytes = c.max_message_bytes
        self._ws: Any = None
        self._first: tuple[dict[str, Any], list[dict[str, str]]] | None = None  # (reset data, first messages)
        self._remote_summary: dict[str, Any] = {}
        max_turns = c.max_turns
        if max_turns is None:
            max_turns = int(self._server_metadata().get("max_turns") or 64)
        super().__init__(reward=c.reward, max_turns=max_turns, max_action_chars=c.max_action_chars,
                         render_mode=c.render_mode, group_reward=c.group_reward)

    # ------------------------------------------------------------------ the connection
    def _server_metadata(self) -> dict[str, Any]:
        """``GET /metadata`` ({} when the server has none or cannot be reached now: the env still works)."""
        import httpx
        http = self.base_url.replace("ws://", "http://", 1).replace("wss://", "https://", 1)
        try:
            reply = httpx.get(http + "/metadata", timeout=self.connect_timeout_s)
            return reply.json() if reply.status_code == 200 and isinstance(reply.json(), dict) else {}
        except (httpx.HTTPError, ValueError):
            return {}

    def _connect(self) -> Any:
        if self._ws is None:
            import inspect

            from websockets.sync.client import connect
            # websockets >= 16 wants legacy=True to hand over a connection held across calls, not in a `with`
            legacy = {"legacy": True} if "legacy" in inspect.signature(connect).parameters else {}
            url = self.base_url.replace("http://", "ws://", 1).replace("https://", "wss://", 1) + "/ws"
            try:
                self._ws = connect(url, open_timeout=self.connect_timeout_s, close_timeout=2,
                                   max_size=self.max_message_bytes, proxy=None, compression=None, **legacy)
            except Exception as e:  # refused, timed out, handshake failed
                raise InfraError(f"OpenEnv server {url}: cannot connect: {type(e).__name__}: {e}") from e
        return self._ws

    def _drop(self) -> None:
        ws, self._ws = self._ws, None
        if ws is not None:
            try:
                ws.close()
            except Exception:
                pass

    def _call(self, frame: dict[str, Any]) -> dict[str, Any]:
        """Send one frame, return the reply's ``data``; any failure is an InfraError (and drops the session)."""
        ws = self._connect()
        try:
            try:
                ws.send(json.dumps(frame))
            except Exception:  # a server that refused the session (capacity) sent why before closing: read it
                reply = json.loads(ws.recv(timeout=1.0))
            else:
                reply = json.loads(ws.recv(timeout=self.timeout_s))
        except Exception as e:  # closed, reset, timed out, not JSON: the session is in doubt
            self._drop()
            raise InfraError(f"OpenEnv server {self.base_url}: {frame['type']} failed: {type(e).__name__}: {e}") from e
        data = reply.get("data") if isinstance(reply, dict) else None
        if not isinstance(data, dict) or reply.get("type") == "error":
            self._drop()
            what = f"{data.get('code', '?')}: {data.get('message', '')}" if isinstance(data, dict) else repr(reply)[:200]
            raise InfraError(f"OpenEnv server {self.base_url}: {frame['type']} answered {what}")
        return data

    def close(self) -> None:
        if self._ws is not None:
            try:
                self._ws.send(json.dumps({"type": "close"}))
            except Exception:
                pass
        self._drop()
        super().close()

    def __del__(self) -> None:  # an env nobody closed must not hold a server session
        try:
            self._drop()
        except Exception:
            pass

    # ------------------------------------------------------------------ rendering
    def to_messages(self, observation: Mapping[str, Any]) -> list[dict[str, str]]:
        """The server's observation as chat messages (see the module docstring)."""
        if self.render_fn is not None:
            out = self.render_fn(observation)
            return [{"role": self.role, "content": out}] if isinstance(out, str) else [dict(m) for m in out]
        messages = observation.get("messages")
        if self.observation_field is None and isinstance(messages, list) and all(
                isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages):
            return [{k: v for k, v in m.items() if isinstance(v, str)} for m in messages]
        field = self.observation_field or next((f for f in _TEXT_FIELDS if f in observation), None)
        if field is not None:
            value = observation.get(field)
            return [{"role": self.role, "content": value if isinstance(value, str) else json.dumps(value)}]
        return [{"role": self.role, "content": json.dumps(observation, sort_keys=True, default=str)}]

    # ------------------------------------------------------------------ the AgentEnv API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        if seed is not None and not (options and ("task" in options or "task_index" in options)):
            options = {**(options or {}), "task_index": int(seed)}  # forward the seed itself
        return super().reset(seed=seed, options=options)

    def get_task(self, index: int) -> dict[str, Any]:
        return {"seed": int(index)}

    def on_reset(self, task: Mapping[str, Any]) -> None:
        data = self._call({"type": "reset", "data": dict(task)})
        self._first = (dict(task), self.to_messages(data.get("observation") or {}))
        self._remote_summary = {}

    def initial_messages(self, task: Mapping[str, Any]) -> list[dict[str, str]]:
        """The reset's observation; for another task than the current one, the server is reset to it."""
        if self._first is None or self._first[0] != dict(task):
            self.on_reset(task)
        return [dict(m) for m in self._first[1]]

    def default_reward(self) -> Reward:
        return Reward([_RemoteReward(), (_Refused(), 0.1)])

    def transition(self, action: str) -> Transition:
        data = self._call({"type": "step", "data": {self.action_field: action}})
        obs = data.get("observation") or {}
        remote_info = obs.get("info") if isinstance(obs.get("info"), dict) else {}
        reward = data.get("reward")
        done = bool(data.get("done"))
        # the server's own truncation is truncation here when it falls on the local turn limit too; earlier
        # (a larger local max_turns), the episode must still end here: terminated, with remote_truncated set
        terminated = done and (bool(obs.get("terminated")) or not obs.get("truncated", False)
                               or self.turn + 1 < self.max_turns)
        if "episode_summary" in remote_info:
            self._remote_summary = remote_info["episode_summary"]
        info = {"remote_reward": float(reward) if isinstance(reward, (int, float)) else 0.0,
                "remote_done": done, "remote_truncated": bool(done and obs.get("truncated", False)),
                "remote_info": remote_info}
        return Transition(self.to_messages(obs), str(remote_info.get("action_type") or "remote"),
                          terminated=terminated, answer=remote_info.get("answer"), info=info)

    def episode_success(self) -> bool:
        return bool(self._remote_summary.get("success", False))

    def episode_metrics(self) -> dict[str, Any]:
        return {"remote_summary": self._remote_summary} if self._remote_summary else {}
