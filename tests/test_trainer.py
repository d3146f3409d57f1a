"""The trainer: typed configs, artifacts, and resume exactness after a real kill."""

from __future__ import annotations

import csv
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentgym.algorithms.loop.train_config import TrainConfig
from agentgym.config import ConfigError, load_config

TINY = ["model=tiny-random", "algo=grpo", "groups_per_step=2", "group_size=2", "sampling.max_new_tokens=4",
        "eval.episodes=2", "learner.total_steps=4", "optim.lr=1e-3", "learner.micro_batch_size=4",
        "tensorboard=false", "env=Arithmetic-v0", "env_kwargs={hard_fraction: 0.0, max_turns: 2}"]


def _run(out: Path, *extra: str, resume: bool = False, wait_for: Path | None = None) -> subprocess.CompletedProcess | None:
    cmd = [sys.executable, "-m", "agentgym.app.cli", "train", *TINY, f"output_dir={out}", *extra]
    if resume:
        cmd.insert(4, "--resume")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    if wait_for is None:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    from helpers_processes import kill_once_written
    kill_once_written(cmd, wait_for, env, out_dir=out)   # a real kill: no clean-up runs
    return None


def _rows(out: Path) -> list[dict[str, str]]:
    with (out / "train_log.csv").open() as f:
        return list(csv.DictReader(f))


def test_config_defaults_yaml_and_overrides(tmp_path):
    cfg = load_config(TrainConfig)
    assert cfg.env == "Math-v0" and cfg.env_kwargs["difficulty"] == 0 and cfg.model == "smollm2" and cfg.algo == "grpo"
    y = tmp_path / "run.yaml"
    y.write_text("algo: ppo\nsteps: 3\noptim:\n  lr: 2.0e-5\nlearner:\n  kl_coef: 0.001\n")
    cfg = load_config(TrainConfig, y, ["optim.lr=3e-5", "sampling.temperature=0.7"])
    assert (cfg.algo, cfg.steps, cfg.optim.lr, cfg.learner.kl_coef, cfg.sampling.temperature) == ("ppo", 3, 3e-5, 0.001, 0.7)
    with pytest.raises(ConfigError, match="optim.lrr"):
        load_config(TrainConfig, overrides=["optim.lrr=1"])
    with pytest.raises(ConfigError, match="steps"):
        load_config(TrainConfig, overrides=["steps=many"])
    with pytest.raises(ConfigError, match="not found"):
        load_config(TrainConfig, tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="schedule"):
        load_config(TrainConfig, overrides=["optim.schedule=zigzag"])


def test_cli_reports_bad_config_in_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "agentgym.app.cli", "train", "learner.nope=1"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2
    assert "unknown config key" in r.stderr and "Traceback" not in r.stderr


def test_resume_after_kill_matches_uninterrupted_run(tmp_path):
    full = tmp_path / "full"
    r = _run(full, "steps=4", "checkpoint_every=2")
    assert r.returncode == 0, r.stderr[-3000:]
    for name in ("config.yaml", "train_log.csv", "curves.png", "eval_trajectories.html", "evals.json"):
        assert (full / name).stat().st_size > 0, name
    assert "success before" in r.stdout and "success after" in r.stdout

    killed = tmp_path / "killed"
    _run(killed, "steps=4", "checkpoint_every=2", wait_for=killed / "checkpoints" / "step_000002")
    r = _run(killed, "steps=4", "checkpoint_every=2", resume=True)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resumed from" in r.stdout

    a, b = _rows(full), _rows(killed)
    assert [row["step"] for row in a] == [row["step"] for row in b] == ["1.0", "2.0", "3.0", "4.0"]
    for ra, rb in zip(a, b):
        for key in ("rollout/reward_mean", "rollout/generated_tokens", "train/loss", "train/grad_norm", "train/lr"):
            assert float(ra[key]) == pytest.approx(float(rb[key]), rel=1e-5, abs=1e-7), (ra["step"], key)


def test_resume_without_checkpoint_is_a_clear_error(tmp_path):
    r = _run(tmp_path / "none", "steps=1", resume=True)
    assert r.returncode == 2 and "no checkpoint" in r.stderr


def test_backend_options_reach_the_sampler_and_bad_ones_are_refused(tmp_path):
    from agentgym.algorithms.loop.trainer import Trainer
    from agentgym.algorithms.loop.train_config import TrainConfig
    cfg = load_config(TrainConfig, overrides=["model=tiny-random", "backend=hf", f"output_dir={tmp_path / 'a'}",
                                              "tensorboard=false", "backend_options.kv_cache_tokens=256",
                                              "backend_options.reuse_kv=false"])
    trainer = Trainer(cfg)
    assert trainer.colocated and (trainer.policy.kv_cache_tokens, trainer.policy.reuse_kv) == (256, False)
    with pytest.raises(ValueError, match="unknown hf backend option"):
        Trainer(TrainConfig(model="tiny-random", backend="hf", backend_options={"gpu_memory_utilization": 0.3},
                            output_dir=str(tmp_path / "b"), tensorboard=False))


def test_sampled_held_out_eval_scores_each_task_by_the_mean_of_its_samples(tmp_path):
    """eval.samples=k: k episodes per held-out task, sampled as in training; a task's success is their mean."""
    from types import SimpleNamespace

    from agentgym.algorithms.loop.trainer import Trainer
    from agentgym.algorithms.loop.held_out import eval_rollout_config, task_successes
    base = ["model=tiny-random", "env=Arithmetic-v0", "env_kwargs={hard_fraction: 0.0, max_turns: 2}",
            "eval.episodes=2", "sampling.max_new_tokens=4", "tensorboard=false"]
    greedy = load_config(TrainConfig, overrides=base)
    cfg = load_config(TrainConfig, overrides=[*base, "eval.samples=3", f"output_dir={tmp_path / 'a'}"])
    assert eval_rollout_config(greedy).sampling.greedy and greedy.eval.describe() == "greedy"
    assert not eval_rollout_config(cfg).sampling.greedy and cfg.eval.describe() == "mean of 3 samples"
    assert eval_rollout_config(cfg).sampling.temperature == cfg.sampling.temperature
    assert eval_rollout_config(cfg).sampling.seed == cfg.seed and cfg.sampling.seed is None   # same draws every eval

    trainer = Trainer(cfg)
    m, trajectories = trainer.evaluate("before")
    import torch
    torch.rand(1000)                                  # whatever ran in between, the next eval draws the same
    again, again_trajectories = trainer.evaluate("again")
    assert again["successes"] == m["successes"]
    assert [t.token_ids for t in again_trajectories] == [t.token_ids for t in trajectories]
    assert [t.task_index for t in trajectories] == [0, 0, 0, 1, 1, 1]   # the same tasks as greedy, 3 each
    assert len({tuple(t.token_ids) for t in trajectories[:3]}) > 1       # sampled, not 3 copies of greedy
    ok = [float(bool(t.episode["success"])) for t in trajectories]
    assert m["successes"] == [sum(ok[:3]) / 3, sum(ok[3:]) / 3]
    assert m["eval/success_rate"] == pytest.approx(sum(ok) / 6)

    def traj(task, success):
        return SimpleNamespace(task_index=task, episode={"success": success})
    assert task_successes(cfg, [traj(0, True), traj(0, False), traj(0, True),
                                traj(1, False), traj(1, False), traj(1, True)]) == [2 / 3, 1 / 3]
    # an episode a service failure ended is neither success nor failure (as in eval/success_rate)
    broken = SimpleNamespace(task_index=0, episode={"success": False, "infra_error": "retriever: 503"})
    assert task_successes(cfg, [traj(0, True), broken, traj(0, False),
                                traj(1, True), traj(1, True), traj(1, False)]) == [1 / 2, 2 / 3]
    unscored = task_successes(cfg, [broken] * 3 + [traj(1, True)] * 3)
    assert math.isnan(unscored[0]) and unscored[1] == 1.0
    with pytest.raises(ValueError, match="expected eval.episodes x"):
        task_successes(cfg, [traj(0, True)] * 5)
    with pytest.raises(ValueError, match="task by task"):
        task_successes(cfg, [traj(0, True), traj(1, True), traj(0, True)] * 2)
    with pytest.raises(ConfigError, match="eval.samples"):
        load_config(TrainConfig, overrides=[*base, "eval.samples=-1"])


def test_held_out_gain_leaves_out_tasks_a_service_failure_left_unscored():
    """A run's held-out gain (curves.held_out_gain, the "gain" entry of evals.json): on the tasks scored before and after."""
    from agentgym.algorithms.loop.curves import held_out_gain
    gain = held_out_gain({"successes": [0.0, 0.0, math.nan, 1.0]}, {"successes": [1.0, 0.0, 1.0, 1.0]})
    assert gain["tasks"] == 3.0 and gain["success_gain"] == pytest.approx(1 / 3)
    assert held_out_gain({"successes": [0.0]}, {"successes": [0.0, 1.0]}) is None   # not the same tasks
