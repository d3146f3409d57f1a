"""Generation overlapped with the update (``max_staleness``): order of events, staleness, determinism,
the first step equal to an on-policy run's, and --resume exactness after a real kill."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

from agentgym.algorithms.loop.overlap import Collected, Prefetcher
from agentgym.algorithms.loop.train_config import TrainConfig
from agentgym.algorithms.loop.trainer import Trainer
from agentgym.config import ConfigError, load_config

TINY = ["model=tiny-random", "algo=grpo", "groups_per_step=2", "group_size=2", "sampling.max_new_tokens=4",
        "eval.episodes=2", "learner.total_steps=4", "optim.lr=1e-3", "learner.micro_batch_size=4",
        "tensorboard=false", "env=Arithmetic-v0", "env_kwargs={hard_fraction: 0.0, max_turns: 2}"]


# ---------------------------------------------------------------- the prefetcher alone
def test_prefetcher_collects_ahead_on_another_thread_and_inline_otherwise():
    where: list[tuple[int, str]] = []

    def collect(step: int) -> str:
        where.append((step, threading.current_thread().name))
        return f"batch{step}"

    p = Prefetcher(collect)
    got = p.take(0, version=0)                       # nothing started: collected here
    assert (got.step, got.batch, got.version) == (0, "batch0", 0) and where[-1][1] == threading.current_thread().name
    p.start(1, version=0)
    with pytest.raises(RuntimeError, match="already"):
        p.start(2, version=0)
    with pytest.raises(RuntimeError, match="step 1's, not step 2's"):
        p.take(2, version=1)
    got = p.take(1, version=1)
    assert (got.batch, got.version) == ("batch1", 0)  # the version it was generated with, not the current one
    assert where[-1] == (1, "agentgym-sampler-1")
    assert p.pending() is None


def test_prefetcher_hands_background_errors_to_the_caller():
    def collect(step: int) -> str:
        raise ValueError(f"retriever down at step {step}")

    p = Prefetcher(collect)
    p.start(3, version=2)
    with pytest.raises(ValueError, match="retriever down at step 3"):
        p.take(3, version=3)
    p.put(Collected(4, "restored", 3, 0.0))
    assert p.pending().batch == "restored" and p.take(4, version=4).version == 3


def test_max_staleness_is_validated():
    for bad in (-1, True, 1.5, "1"):
        with pytest.raises((ValueError, ConfigError), match="max_staleness"):
            TrainConfig(max_staleness=bad)
    assert load_config(TrainConfig, overrides=["max_staleness=1"]).max_staleness == 1


# ---------------------------------------------------------------- the trainer
def _trainer(out: Path, *extra: str) -> Trainer:
    cfg = load_config(TrainConfig, overrides=[*TINY, f"output_dir={out}", *extra])
    return Trainer(cfg, log=lambda message: None)


def _record(trainer: Trainer, events: list[tuple[str, int, str, float, float]]) -> None:
    """Wrap the trainer's collection and update to record (what, step, thread, start, end)."""
    collect, update = trainer.sampling._collect, trainer.learner.update

    def timed_collect(step: int):
        t0 = time.perf_counter()
        try:
            return collect(step)
        finally:
            events.append(("collect", step, threading.current_thread().name, t0, time.perf_counter()))

    def timed_update(trajectories):
        t0, step = time.perf_counter(), trainer.step
        try:
            return update(trajectories)
        finally:
            events.append(("update", step, threading.current_thread().name, t0, time.perf_counter()))

    trainer.sampling._collect, trainer.learner.update = timed_collect, timed_update


def test_overlap_generates_the_next_batch_during_the_update(tmp_path):
    events: list[tuple[str, int, str, float, float]] = []
    trainer = _trainer(tmp_path / "ahead", "steps=3", "max_staleness=1")
    assert trainer.policy is not trainer.train_policy, "max_staleness needs a separate sampler engine"
    _record(trainer, events)
    result = trainer.train()
    collects = {step: (thread, t0) for what, step, thread, t0, _ in events if what == "collect"}
    updates = {step: (thread, t0) for what, step, thread, t0, _ in events if what == "update"}
    main = threading.main_thread().name
    assert collects[0][0] == main and sorted(collects) == [0, 1, 2] and sorted(updates) == [0, 1, 2]
    for k in (1, 2):   # batch k is generated in the background, started before update k-1 begins
        assert collects[k][0] == f"agentgym-sampler-{k}" and updates[k - 1][0] == main
        assert collects[k][1] <= updates[k - 1][1]
    rows = result["history"]
    assert [r["rollout/staleness"] for r in rows] == [0.0, 1.0, 1.0]
    assert all(r["time/rollout_wait_s"] <= r["time/step_s"] for r in rows)
    # a stale batch is recomputed by the learner: the divergence from the sampler is measured, not assumed 0
    assert all("train/sampler_logp_diff_mean" in r for r in rows)


def test_first_step_equals_on_policy_and_overlap_is_reproducible(tmp_path):
    on = _trainer(tmp_path / "on", "steps=2").train()["history"]
    a = _trainer(tmp_path / "a", "steps=2", "max_staleness=1").train()["history"]
    b = _trainer(tmp_path / "b", "steps=2", "max_staleness=1").train()["history"]
    assert [r["rollout/staleness"] for r in on] == [0.0, 0.0]
    # step 1: the same batch from the same weights (the separate sampler starts from the learner's)
    for key in ("rollout/reward_mean", "rollout/generated_tokens", "train/loss", "train/grad_norm"):
        assert a[0][key] == pytest.approx(on[0][key], rel=1e-4, abs=1e-6), key
    for ra, rb in zip(a, b):   # the order of events is fixed: two overlapped runs are the same run
        for key in ("rollout/reward_mean", "rollout/generated_tokens", "train/loss", "train/grad_norm"):
            assert ra[key] == pytest.approx(rb[key], rel=1e-5, abs=1e-7), (ra["step"], key)


# ---------------------------------------------------------------- resume after a real kill
from test_trainer import _rows, _run  # noqa: E402  (the CLI run / kill helpers of the trainer's resume test)


def test_resume_with_overlap_continues_exactly(tmp_path):
    args = ("steps=4", "checkpoint_every=2", "max_staleness=1")
    full = tmp_path / "full"
    r = _run(full, *args)
    assert r.returncode == 0, r.stderr[-3000:]
    killed = tmp_path / "killed"
    ckpt = killed / "checkpoints" / "step_000002"
    _run(killed, *args, wait_for=ckpt)
    # the batch generated ahead (by step 1's weights) is part of the checkpoint
    ahead = torch.load(ckpt / "batch_ahead.pt", weights_only=False)
    assert (ahead.step, ahead.version) == (2, 1)
    r = _run(killed, *args, resume=True)
    assert r.returncode == 0, r.stderr[-3000:]
    a, b = _rows(full), _rows(killed)
    assert [row["rollout/staleness"] for row in a] == [row["rollout/staleness"] for row in b] == ["0.0", "1.0", "1.0", "1.0"]
    for ra, rb in zip(a, b):
        for key in ("rollout/reward_mean", "rollout/generated_tokens", "train/loss", "train/grad_norm", "train/lr"):
            assert float(ra[key]) == pytest.approx(float(rb[key]), rel=1e-5, abs=1e-7), (ra["step"], key)
