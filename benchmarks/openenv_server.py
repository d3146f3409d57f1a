"""Env steps per second over OpenEnv's WebSocket protocol on loopback: ``agentgym serve``'s server vs
openenv-core's own ``create_fastapi_app`` serving the same agentgym env, side by side in one run.

Each server runs in its own subprocess (this script with ``--serve ours|openenv``), so the client's threads
do not share a GIL with it. The client is the same for both: ``--sessions`` threads (default 32), each with
one WebSocket session (websockets' sync client) that resets and steps ``Arithmetic-v0`` with an invalid
action (the env's cheapest full step) for ``--seconds``. A reply that is an error frame counts as an error.

    python benchmarks/openenv_server.py --seconds 10 --rounds 5

On a shared machine one measurement of each says little (two single runs at load 10 disagreed in
direction), so both servers are started once and measured in ``--rounds`` alternating rounds, the order
swapped every round (ours, openenv; openenv, ours; ...) so a drift in the machine's load favours neither.
The report gives every round, the median steps/s of each server and the median of the per-round ratios
ours / openenv-core (each ratio compares two measurements taken back to back, under about the same load).

For openenv-core's side the agentgym env is wrapped in an ``Environment`` subclass (its action
``{"message": str}``, its observation the new messages and their text), as a user of openenv-core would.
OpenEnv's published figure (its README, 2025) is 932 env requests/s on 8 cores.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import re
import select
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

ENV_ID = "Arithmetic-v0"
SERVERS = ("ours", "openenv")


def openenv_core_app(max_sessions: int) -> Any:
    """openenv-core's own server (``create_fastapi_app``) around an agentgym env."""
    from openenv.core.env_server.http_server import create_fastapi_app
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, Observation, State

    import agentgym

    class TextAction(Action):
        message: str

    class TextObservation(Observation):
        messages: list[dict[str, str]] = []
        text: str = ""

    class AgentgymEnvironment(Environment):
        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self) -> None:
            super().__init__()
            self.env = agentgym.make(ENV_ID)
            self._state = State()

        def reset(self, seed=None, episode_id=None, **kwargs):
            obs, _ = self.env.reset(seed=seed)
            self._state = State(episode_id=episode_id, step_count=0)
            return TextObservation(messages=obs, text="\n\n".join(m["content"] for m in obs))

        def step(self, action, timeout_s=None, **kwargs):
            obs, reward, terminated, truncated, _ = self.env.step(action.message)
            self._state.step_count += 1
            return TextObservation(messages=obs, text="\n\n".join(m["content"] for m in obs), reward=reward,
                                   done=terminated or truncated)

        @property
        def state(self):
            return self._state

        def close(self) -> None:
            self.env.close()

    return create_fastapi_app(AgentgymEnvironment, TextAction, TextObservation, max_concurrent_envs=max_sessions)


def run_server(which: str, max_sessions: int) -> None:
    """Serve on a free loopback port; the first stdout line is the URL. openenv-core's endpoint logs a
    traceback for every client that closes its session (it closes an already closed socket), so its
    server logs only critical errors; ours logs warnings."""
    from agentgym.adapters.openenv_server import ServeLimits, create_app, serve
    from agentgym.http_server import bind_socket
    limits = ServeLimits(max_sessions=max_sessions)
    app = create_app(ENV_ID, limits=limits) if which == "ours" else openenv_core_app(max_sessions)
    sock = bind_socket("127.0.0.1", 0)
    print(f"http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
    serve(app, sock, limits, log_level="warning" if which == "ours" else "critical")


def _session(url: str, stop: float, counts: dict[str, int], lock: threading.Lock) -> None:
    from websockets.sync.client import connect
    legacy = {"legacy": True} if "legacy" in inspect.signature(connect).parameters else {}
    steps = errors = 0
    with connect(url.replace("http://", "ws://") + "/ws", open_timeout=60, proxy=None, **legacy) as ws:
        done = True
        while time.monotonic() < stop:
            frame = {"type": "reset", "data": {}} if done else {"type": "step", "data": {"message": "not an answer"}}
            ws.send(json.dumps(frame))
            reply = json.loads(ws.recv(timeout=60))
            if reply["type"] == "error":
                errors += 1
                done = True
                continue
            steps += frame["type"] == "step"
            done = reply["data"]["done"]
    with lock:
        counts["steps"] += steps
        counts["errors"] += errors


def start_server(which: str, sessions: int) -> tuple[subprocess.Popen, str]:
    """The ``which`` server in a subprocess, and its URL once it listens."""
    proc = subprocess.Popen([sys.executable, __file__, "--serve", which, "--sessions", str(sessions)],
                            stdout=subprocess.PIPE, text=True)
    ready, _, _ = select.select([proc.stdout], [], [], 180)
    url = re.search(r"http://\S+", proc.stdout.readline() if ready else "")
    if url is None:
        proc.kill()
        raise RuntimeError(f"the {which} server did not start")
    return proc, url.group(0)


def measure(url: str, sessions: int, seconds: float) -> dict[str, Any]:
    """Drive the server at ``url`` with ``sessions`` threads for ``seconds``: steps, errors, steps/s."""
    counts, lock = {"steps": 0, "errors": 0}, threading.Lock()
    t0 = time.monotonic()
    threads = [threading.Thread(target=_session, args=(url, t0 + seconds, counts, lock)) for _ in range(sessions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 120)
    elapsed = time.monotonic() - t0
    return {"seconds": round(elapsed, 1), **counts, "steps_per_s": round(counts["steps"] / elapsed, 1)}


def run_rounds(sessions: int, seconds: float, rounds: int) -> list[dict[str, Any]]:
    """Both servers up at once, measured one at a time in alternating order, ``rounds`` times each."""
    servers: dict[str, tuple[subprocess.Popen, str]] = {}
    try:
        for which in SERVERS:
            servers[which] = start_server(which, sessions)
        rows = []
        for r in range(rounds):
            for which in (SERVERS if r % 2 == 0 else SERVERS[::-1]):
                rows.append({"round": r + 1, "server": which, "sessions": sessions,
                             **measure(servers[which][1], sessions, seconds)})
        return rows
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(30)


def report(rows: list[dict[str, Any]]) -> None:
    """Every round, then the medians and the median of the per-round ratios ours / openenv-core."""
    print(f"{'round':>5s} {'server':10s} {'sessions':>8s} {'seconds':>8s} {'steps':>8s} {'errors':>7s} {'steps/s':>9s}")
    for r in rows:
        print(f"{r['round']:5d} {r['server']:10s} {r['sessions']:8d} {r['seconds']:8.1f} {r['steps']:8d} "
              f"{r['errors']:7d} {r['steps_per_s']:9.1f}")
    rate = {(r["round"], r["server"]): r["steps_per_s"] for r in rows}
    rounds = sorted({r["round"] for r in rows})
    ratios = [rate[n, "ours"] / rate[n, "openenv"] for n in rounds if rate[n, "openenv"] > 0]
    for which in SERVERS:
        print(f"median steps/s {which:8s} {statistics.median(rate[n, which] for n in rounds):9.1f}")
    print("ratio ours/openenv per round: " + " ".join(f"{x:.2f}" for x in ratios))
    if ratios:
        print(f"median ratio ours/openenv: {statistics.median(ratios):.2f} over {len(ratios)} rounds")
    print(f"cpu: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} (shared machine: others may be running)")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sessions", type=int, default=32, help="concurrent WebSocket sessions (client threads)")
    p.add_argument("--seconds", type=float, default=10.0, help="measuring time per server per round")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds (each measures both servers)")
    p.add_argument("--serve", choices=SERVERS, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        run_server(args.serve, args.sessions)
        return 0
    if args.rounds < 1 or args.sessions < 1 or args.seconds <= 0:
        p.error("--rounds and --sessions must be at least 1, --seconds positive")
    report(run_rounds(args.sessions, args.seconds, args.rounds))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _common import run_interruptible
    sys.exit(run_interruptible(main))
