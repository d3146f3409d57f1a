"""OpenEnv both ways, with real components only: ``agentgym serve`` (a real subprocess on a free loopback
port) driven by openenv-core's own ``GenericEnvClient`` and by raw WebSocket frames; ``OpenEnv-v0`` against
a server written only with openenv-core (``create_fastapi_app`` + an ``Environment`` subclass); hostile
frames, the session cap under 1 000 sessions opened at once (the server's RSS and file descriptors read
from /proc), env failures, and Ctrl-C with sessions open."""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import re
import resource
import select
import signal
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema
import pytest
from websockets.sync.client import connect

import agentgym
from agentgym import AgentEnv, Reward, Transition
from agentgym.adapters.openenv_server import BackgroundOpenEnvServer, ServeLimits, create_app
from agentgym.app.checking import MALFORMED_ACTIONS
from agentgym.errors import InfraError

from openenv.core import GenericEnvClient
from openenv.core.env_server.http_server import create_fastapi_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State

MAX_SESSIONS, MAX_TURNS = 34, 3


_LEGACY = {"legacy": True} if "legacy" in inspect.signature(connect).parameters else {}


def _ws(url: str):
    """A raw WebSocket session (websockets' sync client), to send frames no well-behaved client sends."""
    return connect(url.replace("http://", "ws://") + "/ws", open_timeout=20, proxy=None, **_LEGACY)


def _ask(ws, frame) -> dict:
    ws.send(frame if isinstance(frame, (str, bytes)) else json.dumps(frame))
    return json.loads(ws.recv(timeout=30))


@pytest.fixture(scope="module")
def served():
    """``agentgym serve Arithmetic-v0 --port 0``; the first stdout line names the URL. Stopped by SIGINT in
    :func:`test_sigint_closes_sessions_and_openenv_v0_sees_an_infra_error` (or here, as a fallback)."""
    proc = subprocess.Popen([sys.executable, "-m", "agentgym", "serve", "Arithmetic-v0", "--port", "0",
                             "--max-sessions", str(MAX_SESSIONS), f"max_turns={MAX_TURNS}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            # as from a terminal: a suite started in the background (nohup, `&`) passes SIGINT
                            # on ignored, and Python then never turns Ctrl-C into KeyboardInterrupt (exit 130)
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    ready, _, _ = select.select([proc.stdout], [], [], 120)
    line = proc.stdout.readline() if ready else ""
    m = re.search(r"http://[\d.]+:\d+", line)
    assert m, f"no URL on the first line: {line!r} {proc.poll()} {proc.stderr.read() if proc.poll() is not None else ''}"
    yield proc, m.group(0)
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)


def test_health_schema_metadata(served):
    _, url = served
    assert httpx.get(url + "/health", timeout=30).json()["status"] == "healthy"
    meta = httpx.get(url + "/metadata", timeout=30).json()
    assert meta["name"] == "agentgym/Arithmetic-v0" and meta["max_turns"] == MAX_TURNS
    schema = httpx.get(url + "/schema", timeout=30).json()
    for part in ("action", "observation", "state"):
        jsonschema.Draft202012Validator.check_schema(schema[part])
    jsonschema.validate({"message": "<answer>1</answer>"}, schema["action"])
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"msg": 1}, schema["action"])


def _episode(url: str, seed: int, schema: dict) -> dict:
    """One full episode with openenv-core's own client; what it saw."""
    with GenericEnvClient(base_url=url, message_timeout_s=60).sync() as client:
        first = client.reset(seed=seed)
        jsonschema.validate(first.observation, schema["observation"])
        eid, steps, result = first.observation["episode_id"], 0, first
        while not result.done:
            result = client.step({"message": f"not an answer {seed}"})
            jsonschema.validate(result.observation, schema["observation"])
            steps += 1
            assert result.observation["episode_id"] == eid
        return {"seed": seed, "episode_id": eid, "question": first.observation["messages"][-1]["content"],
                "steps": steps, "summary": result.observation["info"]["episode_summary"],
                "state": client.state()}


def test_32_concurrent_generic_clients_no_errors_no_leaks(served):
    _, url = served
    schema = httpx.get(url + "/schema", timeout=30).json()
    with ThreadPoolExecutor(32) as pool:
        runs = list(pool.map(lambda s: _episode(url, s, schema), range(32)))
    assert len({r["episode_id"] for r in runs}) == 32
    local = agentgym.make("Arithmetic-v0", max_turns=MAX_TURNS)
    for r in runs:  # each session saw its own seed's task, nobody else's
        obs, info = local.reset(seed=r["seed"])
        assert r["question"] == obs[-1]["content"] and r["summary"]["task_index"] == info["task_index"]
        assert r["steps"] == MAX_TURNS and r["summary"]["truncated"] and r["summary"]["invalid_actions"] == MAX_TURNS
        assert r["state"]["episode_id"] == r["episode_id"] and r["state"]["step_count"] == MAX_TURNS
    assert "privileged" not in json.dumps(runs)  # hidden state never goes over the wire


def test_malformed_actions_through_the_server(served):
    _, url = served
    with GenericEnvClient(base_url=url).sync() as client:
        result = client.reset(seed=0)
        for action in MALFORMED_ACTIONS[:14] + MALFORMED_ACTIONS[-1:]:
            if result.done:
                result = client.reset(seed=1)
            result = client.step({"message": action})
            info = result.observation["info"]
            assert info["action_type"] and isinstance(result.reward, float)
            if info["action_type"] == "invalid":
                assert result.observation["text"].strip() and info["raw_reward_terms"]["invalid"] < 0


def test_hostile_frames_get_error_frames_and_the_session_lives_on(served):
    _, url = served
    with _ws(url) as ws:
        assert _ask(ws, "{not json")["data"]["code"] == "INVALID_JSON"
        assert _ask(ws, "[1, 2]")["data"]["code"] == "VALIDATION_ERROR"
        assert _ask(ws, {"type": "dance"})["data"]["code"] == "UNKNOWN_TYPE"
        assert _ask(ws, {"type": "step", "data": {"message": "hi"}})["data"]["code"] == "VALIDATION_ERROR"  # no reset
        huge = _ask(ws, {"type": "step", "data": {"message": "x" * (2 << 20)}})
        assert huge["data"]["code"] == "VALIDATION_ERROR" and "bytes" in huge["data"]["message"]
        assert _ask(ws, {"type": "reset", "data": {"seed": -1}})["data"]["code"] == "VALIDATION_ERROR"
        assert _ask(ws, {"type": "reset", "data": {"bogus": 1}})["data"]["code"] == "VALIDATION_ERROR"
        reply = _ask(ws, {"type": "reset", "data": {"seed": 3, "episode_id": "mine"}})
        assert reply["type"] == "observation" and reply["data"]["observation"]["episode_id"] == "mine"
        assert _ask(ws, {"type": "step", "data": {"text": "hi"}})["data"]["code"] == "VALIDATION_ERROR"
        reply = _ask(ws, {"type": "step", "data": {"message": "<answer>0</answer>"}})
        assert reply["type"] == "observation" and reply["data"]["done"] is True
        assert _ask(ws, {"type": "step", "data": {"message": "again"}})["data"]["code"] == "VALIDATION_ERROR"
        assert _ask(ws, {"type": "state"})["data"]["step_count"] == 1


def test_simulation_mode_routes(served):
    _, url = served
    with httpx.Client(base_url=url, timeout=30) as http:
        first = http.post("/reset", json={"seed": 4}).json()
        assert first["done"] is False and first["observation"]["messages"]
        step = http.post("/step", json={"action": {"message": "<answer>1</answer>"}, "seed": 4}).json()
        assert step["done"] is True and step["observation"]["info"]["action_type"] == "answer"
        assert http.post("/step", json={"action": {"text": "x"}}).status_code == 422
        assert http.post("/reset", content=b"{oops").status_code == 422
        assert http.post("/reset", content=b"x" * (2 << 20)).status_code == 413


def _proc_usage(pid: int) -> tuple[int, int]:
    """The server process's resident memory (bytes, /proc VmRSS) and its open file descriptors."""
    with open(f"/proc/{pid}/status") as f:
        rss = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


async def _storm(url: str, n: int) -> list[tuple[str, object]]:
    """``n`` WebSocket sessions opened at once (all in flight before any is closed by us): each connects,
    asks for its state and reads one reply. What each got: ("state"|"error"|"failed", detail)."""
    from websockets.asyncio.client import connect as aconnect
    from websockets.exceptions import ConnectionClosed
    go = asyncio.Event()

    async def one(ws):
        await go.wait()  # every connection is open (or refused) before any frame is sent
        try:
            await ws.send(json.dumps({"type": "state"}))
        except ConnectionClosed:
            pass  # a refused session: the server has already sent its error frame and closed
        reply = json.loads(await asyncio.wait_for(ws.recv(), 60))
        return reply["type"], reply["data"].get("code", reply["data"].get("step_count"))

    async def opened():
        try:
            return await aconnect(url.replace("http://", "ws://") + "/ws", open_timeout=60, proxy=None,
                                  compression=None, ping_interval=None)
        except Exception as e:  # a reset or a refused handshake: what the test forbids
            return e

    sockets = await asyncio.gather(*(opened() for _ in range(n)))
    try:
        live = [ws for ws in sockets if not isinstance(ws, Exception)]
        go.set()
        replies = await asyncio.gather(*(one(ws) for ws in live), return_exceptions=True)
        failed = [("failed", repr(e)) for e in sockets if isinstance(e, Exception)]
        return [("failed", repr(r)) if isinstance(r, BaseException) else r for r in replies] + failed
    finally:
        await asyncio.gather(*(ws.close() for ws in sockets if not isinstance(ws, Exception)))


def test_1000_sessions_at_once_capacity_frames_server_alive_memory_and_fds_bounded(served):
    """1 000 sessions opened at once against a cap of MAX_SESSIONS: the cap's worth are served, every other
    one gets a CAPACITY_REACHED error frame (none hangs, none is reset), the server stays up, and its memory
    and file descriptors come back to bounds once the clients have gone."""
    proc, url = served
    n = 1000
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n + 200:  # the client holds all n sockets at once
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, n + 1000), hard))
    with _ws(url) as ws:  # warm: a session made, an episode played, so the baseline includes a session's cost
        _ask(ws, {"type": "reset", "data": {"seed": 0}})
        _ask(ws, {"type": "step", "data": {"message": "<answer>1</answer>"}})
    _wait_idle(url)
    rss0, fds0 = _proc_usage(proc.pid)
    t0 = time.monotonic()
    outcomes = asyncio.run(_storm(url, n))
    elapsed = time.monotonic() - t0
    kinds = Counter(kind for kind, _ in outcomes)
    assert kinds["failed"] == 0, [o for o in outcomes if o[0] == "failed"][:3]
    assert kinds == {"state": MAX_SESSIONS, "error": n - MAX_SESSIONS}, kinds
    assert {detail for kind, detail in outcomes if kind == "error"} == {"CAPACITY_REACHED"}
    assert elapsed < 120, f"the storm took {elapsed:.0f}s"  # it takes ~2 s; this bound only catches a stall
    assert proc.poll() is None and httpx.get(url + "/health", timeout=30).json()["status"] == "healthy"
    _wait_idle(url)
    deadline = time.monotonic() + 30
    while (usage := _proc_usage(proc.pid))[1] > fds0 + 2 and time.monotonic() < deadline:
        time.sleep(0.1)  # the server closes its side of the sockets as the clients' closes arrive
    rss1, fds1 = usage
    assert fds1 <= fds0 + 2, f"file descriptors {fds0} -> {fds1}: sockets not released"
    assert rss1 - rss0 < 100 << 20, f"server RSS grew {(rss1 - rss0) >> 20} MiB over the storm"
    with _ws(url) as ws:  # and it serves a normal episode after
        assert _ask(ws, {"type": "reset", "data": {"seed": 1}})["type"] == "observation"
        assert _ask(ws, {"type": "step", "data": {"message": "<answer>1</answer>"}})["data"]["done"] is True


def _wait_idle(url: str, timeout_s: float = 30) -> None:
    """Until the server reports no active session (closed sessions are released asynchronously)."""
    deadline = time.monotonic() + timeout_s
    while httpx.get(url + "/health", timeout=30).json()["active_sessions"]:
        assert time.monotonic() < deadline, "sessions still active after their clients closed"
        time.sleep(0.1)


# --------------------------------------------------------------------------- env failures, slow envs (in-thread)
class _Moody(AgentEnv):
    """``boom`` raises (a bug), ``outage`` raises InfraError, ``sleep`` blocks for a second."""

    def get_task(self, index):
        return {"question": f"task {index}"}

    def initial_messages(self, task):
        return [{"role": "user", "content": task["question"]}]

    def default_reward(self):
        return Reward([])

    def transition(self, action):
        if action == "boom":
            raise RuntimeError("a bug in the env")
        if action == "outage":
            raise InfraError("the sandbox died")
        if action == "sleep":
            time.sleep(1.0)
        return Transition([{"role": "user", "content": f"got {action}"}], "text")


@pytest.fixture(scope="module")
def moody():
    agentgym.register("Moody-v0", _Moody)
    limits = ServeLimits(max_sessions=4)
    with BackgroundOpenEnvServer(create_app("Moody-v0", limits=limits), limits=limits) as server:
        yield server.url


def test_env_exceptions_are_error_frames_and_reset_recovers(moody):
    with _ws(moody) as ws:
        _ask(ws, {"type": "reset", "data": {"seed": 0}})
        bug = _ask(ws, {"type": "step", "data": {"message": "boom"}})
        assert bug["data"]["code"] == "EXECUTION_ERROR" and "a bug in the env" in bug["data"]["message"]
        assert _ask(ws, {"type": "step", "data": {"message": "x"}})["data"]["code"] == "VALIDATION_ERROR"
        _ask(ws, {"type": "reset", "data": {"seed": 0}})
        outage = _ask(ws, {"type": "step", "data": {"message": "outage"}})["data"]
        assert outage["done"] and outage["observation"]["truncated"] and outage["observation"]["info"]["infra_error"]


def test_a_slow_env_does_not_stall_other_sessions(moody):
    with _ws(moody) as slow, _ws(moody) as fast:
        _ask(slow, {"type": "reset", "data": {}})
        _ask(fast, {"type": "reset", "data": {}})
        slow.send(json.dumps({"type": "step", "data": {"message": "sleep"}}))
        t0 = time.monotonic()
        assert _ask(fast, {"type": "step", "data": {"message": "quick"}})["data"]["observation"]["text"] == "got quick"
        assert time.monotonic() - t0 < 0.9
        assert json.loads(slow.recv(timeout=30))["data"]["observation"]["text"] == "got sleep"


# --------------------------------------------------------------------------- OpenEnv-v0 against openenv-core's server
class EchoAction(Action):
    message: str


class EchoObservation(Observation):
    echoed: str = ""


class EchoEnvironment(Environment):
    """Written only with openenv-core: echoes the message upper-cased, reward = its length, done after 3 steps."""
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self._state = State(episode_id=None, step_count=0)

    def reset(self, seed=None, episode_id=None, **kwargs):
        self._state = State(episode_id=episode_id or f"ep-{seed}", step_count=0)
        return EchoObservation(echoed=f"seed {seed}")

    def step(self, action, timeout_s=None, **kwargs):
        self._state.step_count += 1
        return EchoObservation(echoed=action.message.upper(), reward=float(len(action.message)),
                               done=self._state.step_count >= 3)

    @property
    def state(self):
        return self._state


@pytest.fixture(scope="module")
def openenv_core_server():
    app = create_fastapi_app(EchoEnvironment, EchoAction, EchoObservation, max_concurrent_envs=4)
    with BackgroundOpenEnvServer(app) as server:
        yield server.url


def test_openenv_v0_against_an_openenv_core_server(openenv_core_server):
    env = agentgym.make("OpenEnv-v0", base_url=openenv_core_server, observation_field="echoed", max_turns=10)
    obs, info = env.reset(seed=5)
    assert obs == [{"role": "user", "content": "seed 5"}] and info["privileged"]["task"] == {"seed": 5}
    obs, reward, terminated, truncated, info = env.step("hi")
    assert obs == [{"role": "user", "content": "HI"}] and reward == 2.0 and not (terminated or truncated)
    env.step("abc")
    obs, reward, terminated, truncated, info = env.step("done!")
    assert terminated and not truncated and reward == 5.0 and info["episode_summary"]["return"] == 10.0
    env.close()
    shouted = agentgym.make("OpenEnv-v0", base_url=openenv_core_server, render=lambda o: f"<{o['echoed']}>")
    assert shouted.reset(seed=1)[0] == [{"role": "user", "content": "<seed 1>"}]
    shouted.close()


def test_openenv_v0_capacity_and_refused_connections_are_infra_errors(openenv_core_server):
    envs = [agentgym.make("OpenEnv-v0", base_url=openenv_core_server, observation_field="echoed") for _ in range(5)]
    try:
        for e in envs[:4]:
            e.reset(seed=0)
        with pytest.raises(InfraError, match="CAPACITY_REACHED"):
            envs[4].reset(seed=0)
    finally:
        for e in envs:
            e.close()
    with pytest.raises(InfraError, match="cannot connect"):
        agentgym.make("OpenEnv-v0", base_url="http://127.0.0.1:9", max_turns=2).reset(seed=0)


def test_train_takes_openenv_v0_with_its_kwargs():
    from agentgym.algorithms.loop.train_config import TrainConfig
    from agentgym.config import load_config
    cfg = load_config(TrainConfig, None, ["env=OpenEnv-v0", "env_kwargs.base_url=http://127.0.0.1:8000",
                                          "env_kwargs.observation_field=text"])
    assert cfg.env_kwargs == {"base_url": "http://127.0.0.1:8000", "observation_field": "text"}


def test_sigint_closes_sessions_and_openenv_v0_sees_an_infra_error(served):
    """Last: Ctrl-C stops ``agentgym serve`` cleanly with sessions open; a step after is an infra error."""
    proc, url = served
    env = agentgym.make("OpenEnv-v0", base_url=url, timeout_s=10)
    env.reset(seed=0)
    env.step("")
    proc.send_signal(signal.SIGINT)
    assert proc.wait(30) == 130  # the CLI's code for Ctrl-C, after uvicorn's graceful shutdown
    assert "Traceback" not in proc.stderr.read()
    t0 = time.monotonic()
    obs, reward, terminated, truncated, info = env.step("")
    assert truncated and info["infra_error"] and info["episode_summary"]["infra_error"]
    assert time.monotonic() - t0 < 10
    with pytest.raises(InfraError):
        env.reset(seed=1)
    env.close()
