"""Training-health diagnostics and collapse alarms (algorithms/loop/health.py), alone and inside a real run."""

from __future__ import annotations

import csv
import json
import math

import pytest

from agentgym.algorithms.loop.health import (HealthConfig, HealthMonitor, batch_health, health_section,
                                        input_response_mi)
from agentgym.trajectory import Trajectory


def _traj(prompt: list[int], response: list[int], reward: float, group: int | None, **counts: int) -> Trajectory:
    ids = prompt + response
    return Trajectory(token_ids=ids, loss_mask=[0] * len(prompt) + [1] * len(response), logprobs=[0.0] * len(ids),
                      prompt_length=len(prompt), turn_spans=[(len(prompt), len(ids))], actions=["x"],
                      finish_reasons=["stop"], step_rewards=[reward], reward_terms=[{"correct": reward}],
                      messages=[], episode={"action_counts": dict(counts)}, group_id=group)


def test_batch_health_counts_signal_diversity_and_actions():
    batch = [_traj([1, 2], [5, 6], 1.0, 0, search=2, answer=1), _traj([1, 2], [5, 7], 0.0, 0, answer=1),
             _traj([3, 4], [8], 0.0, 1, invalid=1), _traj([3, 4], [8], 0.0, 1, invalid=1)]
    h = batch_health(batch)
    assert h["health/zero_var_groups"] == 0.5            # group 1: rewards 0, 0
    assert h["health/group_diversity"] == pytest.approx((2 / 2 + 1 / 2) / 2)
    assert h["health/actions/search"] == 0.5 and h["health/actions/answer"] == 0.5 and h["health/actions/invalid"] == 0.5
    assert h["health/response_tokens"] == pytest.approx(6 / 4)
    assert "health/input_response_mi" not in h          # opt-in
    # a kind with a floor is reported as 0 when nobody used it, not left out
    assert batch_health(batch[2:])["health/actions/search"] == 0.0
    assert batch_health([]) == {}


def test_template_collapse_mi():
    # responses fixed by the prompt: MI = H(prompt) = 1 bit; the same template whatever the prompt: 0
    tied = [_traj([1], [7], 0.0, 0), _traj([1], [7], 0.0, 0), _traj([2], [9], 0.0, 1), _traj([2], [9], 0.0, 1)]
    template = [_traj([1], [7, 1], 0.0, 0), _traj([1], [7, 2], 0.0, 0), _traj([2], [7, 1], 0.0, 1),
                _traj([2], [7, 2], 0.0, 1)]
    assert input_response_mi(tied) == pytest.approx(1.0)
    assert input_response_mi(template) == pytest.approx(0.0, abs=1e-12)
    assert input_response_mi(template, tokens=1) == pytest.approx(0.0, abs=1e-12)
    assert batch_health(tied, HealthConfig(template_mi=True))["health/input_response_mi"] == pytest.approx(1.0)


def test_alarms_fire_once_clear_and_fire_again():
    mon = HealthMonitor(HealthConfig(window=3, entropy_drop=0.5))
    fired = [mon.check({"step": s, "train/entropy": e}) for s, e in enumerate([2.0, 1.8, 0.9, 0.8, 2.0, 2.0, 2.0, 0.5], 1)]
    steps = [a[0].step for a in fired if a]
    assert steps == [3, 8] and all(a[0].rule == "entropy_drop" for a in fired if a)
    assert "fell from 2 to 0.9" in fired[2][0].message and len(mon.alarms) == 2


def test_action_floor_needs_the_kind_to_have_been_used():
    mon = HealthMonitor(HealthConfig(action_floors={"search": 0.2}))
    assert mon.check({"step": 1, "health/actions/search": 0.0}) == []      # never searched: nothing collapsed
    assert mon.check({"step": 2, "health/actions/search": 0.5}) == []
    (alarm,) = mon.check({"step": 3, "health/actions/search": 0.1})
    assert alarm.rule == "action_floor:search" and "below the floor 0.2" in alarm.message


def test_no_signal_needs_consecutive_steps_and_alarms_can_be_off():
    mon = HealthMonitor(HealthConfig(no_signal_steps=2, no_signal_share=0.75))
    rows = [{"step": 1, "health/zero_var_groups": 1.0}, {"step": 2, "health/zero_var_groups": 0.5},
            {"step": 3, "health/zero_var_groups": 0.8}, {"step": 4, "health/zero_var_groups": 1.0}]
    assert [bool(mon.check(r)) for r in rows] == [False, False, False, True]
    off = HealthMonitor(HealthConfig(alarms=False))
    assert all(off.check({**r, "train/entropy": 0.0}) == [] for r in rows)


@pytest.mark.parametrize("bad", [{"window": 1}, {"entropy_drop": 0.0}, {"no_signal_share": 1.5},
                                 {"action_floors": {"search": -1}}, {"mi_tokens": 0}])
def test_bad_health_settings_are_refused(bad):
    with pytest.raises(ValueError, match="health"):
        HealthConfig(**bad)


def test_health_section_embeds_curves_and_lists_alarms(tmp_path):
    mon = HealthMonitor(HealthConfig(no_signal_steps=1))
    mon.check({"step": 1, "health/zero_var_groups": 1.0})
    name, body = health_section(tmp_path / "none.png", mon.alarms)
    assert name == "training health (1 alarm)" and "no_signal" in body and "no curves" in body


def test_a_run_logs_health_marks_alarms_and_reports_them(tmp_path):
    from agentgym.algorithms.loop.train_config import TrainConfig
    from agentgym.algorithms.loop.trainer import Trainer
    from agentgym.config import load_config

    cfg = load_config(TrainConfig, overrides=[
        "model=tiny-random", "algo=grpo", "groups_per_step=2", "group_size=2", "sampling.max_new_tokens=4",
        "eval.episodes=2", "steps=2", "learner.micro_batch_size=4", "tensorboard=false", "env=Arithmetic-v0",
        "env_kwargs={hard_fraction: 0.0, max_turns: 2}", f"output_dir={tmp_path / 'run'}",
        "health.no_signal_steps=1", "health.no_signal_share=0.5", "health.template_mi=true"])
    from agentgym.app.run_reports import TrajectoryReport
    logged: list[str] = []
    trainer = Trainer(cfg, log=logged.append, events=[TrajectoryReport()])
    trainer.train()
    out = tmp_path / "run"
    with (out / "train_log.csv").open() as f:
        rows = list(csv.DictReader(f))
    for key in ("health/zero_var_groups", "health/group_diversity", "health/response_tokens",
                "health/input_response_mi", "train/entropy", "train/grad_norm"):
        assert all(math.isfinite(float(r[key])) for r in rows), key
    alarms = json.loads((out / "alarms.json").read_text())
    zero_var = [float(r["health/zero_var_groups"]) for r in rows]
    # the rule is deterministic given the logged numbers: it fired exactly where the share was >= 0.5
    assert [a["step"] for a in alarms if a["rule"] == "no_signal"][:1] == \
        [i + 1 for i, z in enumerate(zero_var) if z >= 0.5][:1]
    assert all(any(f"WARNING step {a['step']}" in line for line in logged) for a in alarms)
    html = (out / "eval_trajectories.html").read_text()
    assert "training health" in html and "data:image/png;base64," in html


def test_a_non_numeric_action_floor_is_a_clear_config_error():
    for bad in ({"search": "x"}, {"search": None}, {"search": True}, {"search": -0.1}):
        with pytest.raises(ValueError, match="health.action_floors must map action kinds to floors >= 0"):
            HealthConfig(action_floors=bad)
