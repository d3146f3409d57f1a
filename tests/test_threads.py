"""Torch threads that follow the load during a run (agentgym.threads): real processes, real /proc/stat."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import torch
from fixtures_llm import tok  # noqa: F401  (a real tokenizer)

from agentgym import threads
from agentgym.threads import ThreadGovernor

pytestmark = pytest.mark.skipif(threads.machine_cpu_times() is None, reason="needs /proc/stat (Linux)")


@pytest.fixture(autouse=True)
def _restore_threads():
    before = torch.get_num_threads()
    yield
    threads.install(None)
    torch.set_num_threads(before)


def _spin_here(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def test_another_process_takes_a_thread_and_our_own_work_does_not():
    logged: list[str] = []
    gov = ThreadGovernor(threads._cores(), log=logged.append, min_interval_s=0.5)
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(1.5)                           # we sleep; the other process keeps a core busy
        others = gov.others_busy()
    finally:
        spin.kill()
        spin.wait()
    assert others is not None and others >= 0.7, others
    gov._mark = gov._sample()
    _spin_here(1.0)                              # now we are busy: that is not "other work"
    machine, own = gov.busy_since_mark()
    # our time is inside the machine's (so others = machine − own never counts us); on a loaded box we
    # get less than a core, hence no bound on `own` itself beyond "it ran"
    assert own >= 0.1 and machine >= own - 0.15, (machine, own)


def test_recheck_moves_the_count_logs_it_and_comes_back(monkeypatch):
    cores = threads._cores()
    if cores < 2:
        pytest.skip("needs 2 cores to have a thread to give back")
    logged: list[str] = []
    gov = ThreadGovernor(cores, log=logged.append, min_interval_s=0.0)
    monkeypatch.setattr(gov, "others_busy", lambda: 1.2)
    assert gov.recheck() == cores - 1 and torch.get_num_threads() == cores - 1
    assert len(logged) == 1 and f"{cores} -> {cores - 1}" in logged[0] and "--threads" in logged[0]
    monkeypatch.setattr(gov, "others_busy", lambda: 0.1)
    assert gov.recheck() == cores and torch.get_num_threads() == cores
    monkeypatch.setattr(gov, "others_busy", lambda: 50.0)
    assert gov.recheck() == 1                    # never below one thread
    assert [c[:2] for c in gov.changes] == [(cores, cores - 1), (cores - 1, cores), (cores, 1)]


def test_a_count_the_user_chose_is_never_changed(monkeypatch):
    gov = ThreadGovernor(1, fixed=True, log=pytest.fail, min_interval_s=0.0)
    monkeypatch.setattr(gov, "others_busy", lambda: 0.0)
    assert gov.recheck() == 1 and torch.get_num_threads() == 1


def test_overlapped_lanes_share_the_budget(monkeypatch):
    """Generation overlapping the update: two computations at once share the thread budget (torch's count
    is one per process), the user's fixed count too; the governor keeps following the load per lane."""
    logged: list[str] = []
    gov = ThreadGovernor(4, log=logged.append, min_interval_s=0.0)
    gov.cores = 4
    gov.set_lanes(2)
    assert torch.get_num_threads() == 2 and gov.threads == 4 and "2 torch thread(s) each out of 4" in logged[-1]
    monkeypatch.setattr(gov, "others_busy", lambda: 1.0)
    assert gov.recheck() == 3 and torch.get_num_threads() == 1     # budget 3, two lanes: 1 each
    gov.set_lanes(1)
    assert torch.get_num_threads() == 3
    fixed = ThreadGovernor(2, fixed=True, log=logged.append, min_interval_s=0.0)
    fixed.set_lanes(2)
    assert torch.get_num_threads() == 1
    fixed.set_lanes(1)
    assert torch.get_num_threads() == 2


def test_short_windows_are_not_measured():
    gov = ThreadGovernor(1, min_interval_s=60.0)
    assert gov.others_busy() is None and gov.recheck() == 1


def test_the_installed_governor_is_consulted_by_the_rollout_engine(monkeypatch, tok):
    """`recheck` is a no-op without a governor; with one, every turn batch of a rollout consults it."""
    from agentgym.policies.scripted import ScriptedPolicy
    from agentgym.rollout_config import RolloutConfig
    from agentgym.rollout import RolloutEngine
    threads.install(None)
    threads.recheck()                            # library use: nothing happens, nothing fails
    calls: list[int] = []
    gov = ThreadGovernor(1, min_interval_s=0.0)
    monkeypatch.setattr(gov, "recheck", lambda: calls.append(1) or 1)
    threads.install(gov)
    engine = RolloutEngine(ScriptedPolicy(tok, lambda ctx: "<answer>7</answer>"),
                           RolloutConfig(mode="lockstep"))
    try:
        engine.collect("Arithmetic-v0", num_groups=2, group_size=1, seed=0)
    finally:
        engine.close()
    assert len(calls) >= 2                       # after the resets and after the turn
