"""Review of the modules that landed without one (issue 24, helper E): each test pins a bug found there.

Real components at tiny sizes: the Prefetcher with a blocking collect, HealthMonitor rows, a warm sandbox
whose runner speaks over an in-memory channel, a real HTTP server answering garbage to RemoteRetriever,
a ThreadGovernor with a measurement held open.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agentgym.algorithms.loop.health import Alarm, HealthConfig, HealthMonitor
from agentgym.algorithms.loop.overlap import Prefetcher
from agentgym.envs.services.retrieval.remote import RemoteRetriever
from agentgym.envs.services.sandbox.base import SandboxError
from agentgym.envs.services.sandbox.warm import Channel, Runner, WarmSandbox
from agentgym.errors import InfraError
from agentgym.threads import ThreadGovernor


# ---------------------------------------------------------------- overlap: Ctrl-C while waiting for a batch
def test_ctrl_c_while_waiting_for_the_batch_ahead_keeps_it_for_the_checkpoint():
    """A Ctrl-C in take() used to drop the batch in flight: the interrupt's checkpoint then had no
    batch_ahead.pt and --resume generated that step again with newer weights (not an exact resume)."""
    release = threading.Event()

    def collect(step: int) -> str:
        release.wait(10)
        return f"batch{step}"

    p = Prefetcher(collect)
    p.start(5, version=4)
    # Python's own Ctrl-C handler, as in a fresh `agentgym train`: an earlier test in the same process
    # (a local Ray cluster's driver) may have left its own SIGINT handler, which does not raise
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            p.take(5, version=5)
    finally:
        timer.cancel()
        release.set()
        signal.signal(signal.SIGINT, previous)
    kept = p.pending()                 # what the trainer's save_checkpoint stores as batch_ahead.pt
    assert kept is not None and (kept.step, kept.batch, kept.version) == (5, "batch5", 4)
    assert p.take(5, version=5).batch == "batch5" and p.pending() is None


# ---------------------------------------------------------------- health: alarms across --resume
def _rows(*zero_var: float, search: list[float] | None = None) -> list[dict[str, float]]:
    search = search or [1.0] * len(zero_var)
    return [{"step": float(i + 1), "health/zero_var_groups": z, "health/actions/search": s}
            for i, (z, s) in enumerate(zip(zero_var, search))]


def _resumed(rows: list[dict[str, float]], config: HealthConfig) -> HealthMonitor:
    """A monitor that saw ``rows``, restored as the trainer's load_checkpoint does it (JSON history)."""
    first = HealthMonitor(config)
    for row in rows:
        first.check(row)
    again = HealthMonitor(config)
    again.rows, again.alarms = json.loads(json.dumps(first.rows)), [Alarm(**a.__dict__) for a in first.alarms]
    return again


def test_an_alarm_on_at_the_checkpoint_does_not_fire_again_after_resume():
    config = HealthConfig(no_signal_steps=2, no_signal_share=0.9, action_floors={})
    monitor = _resumed(_rows(1.0, 1.0, 1.0), config)          # no_signal fired at step 2 and is still on
    assert [a.rule for a in monitor.alarms] == ["no_signal"]
    assert monitor.check(_rows(1.0, 1.0, 1.0, 1.0)[-1]) == []  # the same onset: no second warning
    assert monitor.check({"step": 5.0, "health/zero_var_groups": 0.0}) == []
    again = monitor.check({"step": 6.0, "health/zero_var_groups": 1.0})
    again += monitor.check({"step": 7.0, "health/zero_var_groups": 1.0})
    assert [(a.step, a.rule) for a in again] == [(7, "no_signal")]   # a new onset after it cleared


def test_an_action_floor_armed_before_the_checkpoint_stays_armed_after_resume():
    config = HealthConfig(action_floors={"search": 0.1}, no_signal_share=1.0, no_signal_steps=50)
    monitor = _resumed(_rows(0.0, 0.0, search=[0.5, 0.3]), config)   # armed: 0.5 >= 2 x 0.1
    fired = monitor.check({"step": 3.0, "health/zero_var_groups": 0.0, "health/actions/search": 0.0})
    assert [(a.step, a.rule) for a in fired] == [(3, "action_floor:search")]


def test_health_state_dict_round_trips_through_json():
    config = HealthConfig(no_signal_steps=2, action_floors={"search": 0.1})
    first = HealthMonitor(config)
    for row in _rows(1.0, 1.0, search=[0.5, 0.05]):
        first.check(row)
    state = json.loads(json.dumps(first.state_dict()))
    second = HealthMonitor(config)
    second.load_state_dict(state)
    assert second.alarms == first.alarms and {a.rule for a in first.alarms} == {"no_signal", "action_floor:search"}
    row = {"step": 3.0, "health/zero_var_groups": 1.0, "health/actions/search": 0.0}
    assert second.check(dict(row)) == first.check(dict(row)) == []   # both still on: nothing new


def test_an_alarm_row_with_a_nan_step_is_numbered_by_position():
    monitor = HealthMonitor(HealthConfig(no_signal_steps=1, action_floors={}))
    assert [(a.step, a.rule) for a in monitor.check({"step": float("nan"), "health/zero_var_groups": 1.0})] == \
        [(1, "no_signal")]


# ---------------------------------------------------------------- warm sandboxes: a runner that answers garbage
def _frame(obj: object) -> bytes:
    data = json.dumps(obj).encode()
    return struct.pack(">I", len(data)) + data


_GOOD = {"results": [{"stdout": base64.b64encode(b"hi\n").decode(), "stderr": "", "returncode": 0,
                      "timed_out": False, "overflow": False, "duration_s": 0.01}]}


class _ScriptedChannel(Channel):
    """A runner's channel in memory: says ready, then answers each request with the next scripted frame."""

    def __init__(self, answers: list[object], closed: list[object]) -> None:
        self._buf = bytearray(_frame({"ready": True}))
        self._answers, self._closed = list(answers), closed

    def send(self, data: bytes) -> None:   # an answer of None: the runner died (the channel ends)
        answer = self._answers.pop(0) if self._answers else None
        self._buf += b"" if answer is None else _frame(answer)

    def recv(self, n: int, deadline: float) -> bytes:
        if len(self._buf) < n:
            raise SandboxError("runner exited (channel closed)")
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out

    def close(self) -> None:
        self._closed.append(self)


class _ScriptedSandbox(WarmSandbox):
    name = "scripted"

    def __init__(self, answers: list[object], pool_size: int = 1) -> None:
        self.answers, self.closed, self.stopped = list(answers), [], []
        super().__init__(pool_size=pool_size, acquire_timeout_s=5.0)

    def _start_runner(self) -> Runner:
        answer = self.answers.pop(0) if self.answers else _GOOD
        channel = _ScriptedChannel([answer], self.closed)
        return Runner(channel, lambda: self.stopped.append(channel))


@pytest.mark.parametrize("garbage", [
    [1, 2, 3],                                                    # a frame that is not an object
    {"results": "no"},                                            # results not a list
    {"results": [{"stdout": "!!not base64!!", "stderr": "", "returncode": 0, "timed_out": False,
                  "overflow": False, "duration_s": 0.0}]},
    {"results": [{"stdout": ""}]},                                # fields missing
    {"results": [{**_GOOD["results"][0], "returncode": "0"}]},    # a returncode that is not an int
])
def test_a_runner_answering_garbage_is_an_infra_error_and_is_recycled(garbage):
    box = _ScriptedSandbox([garbage] * 4)
    try:
        with pytest.raises(SandboxError, match="failed twice: .*runner sent (a frame|malformed|a malformed)"):
            box.run("print('hi')")
        assert isinstance(SandboxError("x"), InfraError)
        deadline = time.monotonic() + 5
        while len(box.stopped) < 2 and time.monotonic() < deadline:   # recycled in the background
            time.sleep(0.01)
        assert len(box.stopped) >= 2                  # both runners that answered garbage were stopped
        box.answers.clear()                           # runners started from now on answer properly
        assert box.run("print('hi')").stdout == "hi\n"   # and the pool still serves (its count is intact)
        assert box._pool._live == 1
    finally:
        box.close()


def test_when_every_idle_runner_died_the_retry_runs_on_a_fresh_one():
    """All warm runners dead at once (a daemon restart, the host's OOM killer): the first failure
    used to be retried on the next dead runner from the pool, so the job failed twice."""
    box = _ScriptedSandbox([None, None], pool_size=2)
    box._pool.fill()
    try:
        deadline = time.monotonic() + 5
        while box._pool._ready.qsize() < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert box.run("print('hi')").stdout == "hi\n"
        assert box.recycled.get("error") == 1
    finally:
        box.close()


# ---------------------------------------------------------------- remote retriever: a server answering garbage
class _Garbage(BaseHTTPRequestHandler):
    bodies: list[bytes] = []

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = self.bodies[0]
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize("body", [b"<html>502 Bad Gateway</html>", b'{"result": 3}', b'{"result": [[{"doc": 1}]]}',
                                  b'{"result": [["x"]]}', b"[]"])
def test_a_retrieval_server_answering_garbage_is_an_infra_error(body):
    """The policy's search must not crash the rollout when the server answers 200 with garbage: the
    env marks the episode (InfraError) instead of raising a RuntimeError out of env.step."""
    _Garbage.bodies = [body]
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Garbage)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with RemoteRetriever(f"http://127.0.0.1:{server.server_port}", timeout_s=5, max_retries=0) as r:
            with pytest.raises(InfraError, match="not JSON|malformed response"):
                r.search(["who wrote hamlet"], topk=2)
    finally:
        server.shutdown()
        server.server_close()


# ---------------------------------------------------------------- threads: two threads re-checking at once
def test_a_recheck_while_another_thread_measures_returns_at_once():
    """The trainer (between steps) and the background sampler (between turn batches) both call
    recheck(): two measures over one window would log the same change twice."""
    gov = ThreadGovernor(1, min_interval_s=0.0, log=lambda m: None)
    inside, release, measured = threading.Event(), threading.Event(), []

    def busy_since_mark():
        measured.append(threading.current_thread().name)
        inside.set()
        release.wait(5)
        return None

    gov.busy_since_mark = busy_since_mark
    first = threading.Thread(target=gov.recheck, name="sampler")
    first.start()
    assert inside.wait(5)
    assert gov.recheck() == 1            # the trainer's call does not measure the same window again
    release.set()
    first.join(5)
    assert measured == ["sampler"]


@pytest.mark.parametrize("bad, what", [
    ({"backoff_s": -1.0}, "backoff_s"), ({"timeout_s": 0}, "timeout_s"), ({"timeout_s": float("nan")}, "timeout_s"),
    ({"max_queries_per_request": 0}, "max_queries_per_request"), ({"max_retries": -1}, "max_retries"),
    ({"max_retries": 1.5}, "max_retries"),
])
def test_remote_retriever_options_are_checked_when_it_is_made(bad, what):
    """backoff_s=-1 used to fail in time.sleep at the first retry, max_queries_per_request=0 in range()
    at the first search: in the middle of a rollout, not where the option was given."""
    with pytest.raises(ValueError, match=what):
        RemoteRetriever("http://127.0.0.1:9/retrieve", **bad)


@pytest.mark.parametrize("bad, what", [({"query_prefix": None}, "query_prefix"), ({"max_length": "abc"}, "max_length"),
                                       ({"max_length": True}, "max_length")])
def test_prebuilt_index_options_are_checked_before_anything_loads(bad, what, tmp_path):
    """query_prefix=None used to pass construction and fail inside every search (None + str)."""
    from agentgym.envs.services.retrieval.prebuilt import from_spec
    with pytest.raises(ValueError, match=what):
        from_spec({"index": str(tmp_path / "e5_Flat.index"), "corpus": str(tmp_path / "c.jsonl"), **bad})


@pytest.mark.parametrize("backend", ["bwrap", "docker"])
def test_a_warm_pool_whose_runners_were_all_killed_still_runs_the_next_job(backend):
    """Real runners: both warm runners killed from outside (as a daemon restart or the host's OOM
    killer would) -- the next job runs on a fresh one instead of failing twice."""
    from agentgym.envs.services.sandbox import available_backends, make_sandbox
    status = available_backends()[backend]
    if status != "ok":
        pytest.skip(f"{backend} sandbox unavailable here: {status}")
    with make_sandbox(backend, pool_size=2) as sb:
        assert sb.run("print(1)").stdout == "1\n"
        deadline = time.monotonic() + 60
        while sb._pool._ready.qsize() < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        for runner in list(sb._pool._ready.queue):
            if backend == "bwrap":
                os.killpg(runner.channel.proc.pid, signal.SIGKILL)
                runner.channel.proc.wait()
            else:
                sb._client.api.kill(runner.container_id)
        assert sb.run("print(2)").stdout == "2\n"


@pytest.mark.parametrize("scorer", ["em", "subem", "qa_em", "qa_subem"])
def test_one_gold_answer_given_as_a_string_is_one_answer_not_its_letters(scorer):
    """Search-R1's em_check/subem_check take a bare string as one gold answer; iterating it as a
    list of golds judged "paris" against "P", "a", ... (em 0; subem 1 for any answer holding an 'a')."""
    from agentgym.envs.searchqa.scoring import score_search_r1
    sequence = "<answer> and </answer> ... <answer> Paris </answer>"
    assert score_search_r1(scorer, "Paris", sequence, "Paris") == 1.0
    wrong = sequence.replace("Paris", "Madrid")
    assert score_search_r1(scorer, "Madrid", wrong, "Paris") == 0.0


def test_a_caller_waiting_for_a_runner_is_told_at_once_when_the_sandbox_closes():
    """close() from another thread (the env pool shutting down) left a caller waiting for a runner
    until acquire_timeout_s (120 s by default) for one that would never come."""
    from agentgym.envs.services.sandbox.warm import RunnerPool
    starting, finish = threading.Event(), threading.Event()
    closed: list[object] = []

    def start() -> Runner:
        starting.set()
        finish.wait(5)
        return Runner(_ScriptedChannel([], closed), lambda: None)

    pool = RunnerPool(start, 1)
    outcome: list[object] = []

    def wait_for_one() -> None:
        t0 = time.monotonic()
        try:
            pool.acquire(30)
        except SandboxError as e:
            outcome.append((str(e), time.monotonic() - t0))

    waiter = threading.Thread(target=wait_for_one)
    waiter.start()
    assert starting.wait(5)
    closer = threading.Thread(target=pool.close)
    closer.start()
    time.sleep(0.1)
    finish.set()
    closer.join(5)
    waiter.join(10)
    assert outcome and "closed" in outcome[0][0] and outcome[0][1] < 5
    assert len(closed) == 1          # the runner that finished starting after close() was closed


def test_a_failed_runners_stderr_is_read_before_it_is_closed():
    """The error message read the runner's stderr after handing the runner to the background close:
    the descriptor could be closed and reused by the replacement runner's pipe meanwhile, and the read
    then blocked for good (seen as a hung test with real bwrap runners)."""
    reads: list[bool] = []

    class _Channel(_ScriptedChannel):
        def diagnostics(self) -> str:
            time.sleep(0.2)                      # room for a background close to run first
            reads.append(self in self._closed)   # True: read after close
            return "runner stderr"

    class _Box(_ScriptedSandbox):
        def _start_runner(self) -> Runner:
            return Runner(_Channel([self.answers.pop(0)] if self.answers else [_GOOD], self.closed), lambda: None)

    box = _Box([None])
    try:
        assert box.run("print('hi')").stdout == "hi\n"
        assert reads == [False]
    finally:
        box.close()
