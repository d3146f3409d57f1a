"""More signal per episode (algorithms/loop/group_filter.py): DAPO dynamic sampling and difficulty filtering.

The pure functions are driven by the real rollout engine on a real env with a scripted policy (the
policy's identity does not matter there, only which groups have reward variance); the end-to-end runs
train the tiny random model."""

from __future__ import annotations

import csv

import pytest

import agentgym
from agentgym.envs.arithmetic import ArithmeticEnv
from agentgym.policies.scripted import ScriptedPolicy
from agentgym.rollout_config import RolloutConfig
from agentgym.rollout import RolloutEngine
from agentgym.trajectory import Trajectory

from agentgym.algorithms.loop.group_filter import (GroupFilterConfig, GroupSampler, TaskDifficulty, fill_with_signal,
                                              group_has_signal, split_groups)
from fixtures_llm import cached_tokenizer

ENV_KWARGS = {"hard_fraction": 0.0, "max_turns": 1}


class FourTasks(ArithmeticEnv):
    """Arithmetic with a task list of four: tasks repeat within a few steps, so difficulty can act."""
    num_tasks = 4


agentgym.register("FourTasks-v0", FourTasks)


def odd_length(event) -> float:
    """A reward that varies with the sampled text: the tiny random model's groups then differ now and then."""
    return float(len(event.action) % 2)


def _scripted(always_right: set[int] = frozenset(), mixed: bool = True) -> ScriptedPolicy:
    """Right on the tasks in ``always_right``; elsewhere alternately right and wrong (episode by episode, so
    a group of two has reward variance) when ``mixed``, else always wrong."""
    count = [0]
    env = FourTasks(**ENV_KWARGS)
    index_of = {env.get_task(i)["question"]: i for i in range(FourTasks.num_tasks)}

    def reply(ctx) -> str:
        task = ctx["task"]
        right = f"<answer>{task['answers'][0]}</answer>"
        if index_of[task["question"]] in always_right:
            return right
        count[0] += 1
        return right if mixed and count[0] % 2 else "<answer>none</answer>"
    return ScriptedPolicy(cached_tokenizer(), reply)


def _engine(policy) -> RolloutEngine:
    return RolloutEngine(policy, RolloutConfig(mode="lockstep"))


def _traj(reward: float, group: int, infra: str | None = None) -> Trajectory:
    return Trajectory([1], [0], [0.0], 1, [], [], [], [reward], [{}], [], episode={"infra_error": infra} if infra else {},
                      group_id=group, task_index=group)


def test_zero_variance_detection_with_float_rewards():
    assert not group_has_signal([0.1 + 0.2, 0.3])          # equal up to float rounding: no GRPO gradient
    assert not group_has_signal([1.1, 1.1, 1.1]) and not group_has_signal([0.7])
    assert group_has_signal([0.3, 0.301]) and group_has_signal([0.0, 0.0, 1.0])


def test_infra_error_episodes_do_not_count_as_signal():
    # group 0: 1.0 and an infrastructure failure's 0.0 -> one scored episode, no signal; group 1: real variance
    trajs = [_traj(1.0, 0), _traj(0.0, 0, infra="retriever timeout"), _traj(1.0, 1), _traj(0.0, 1)]
    groups = split_groups(trajs)
    assert [len(g) for g in groups] == [2, 2]
    from agentgym.rollout import RolloutBatch
    filled = fill_with_signal(lambda n, r: RolloutBatch(trajs, {}), want=1, max_rounds=1)
    assert filled.kept == [groups[1]] and not filled.capped
    diff = TaskDifficulty(after=1, weight=0.5)
    diff.record(groups)
    assert diff.streak == {1: 0}        # group 0 holds one scored episode: it says nothing about task 0


def test_refill_stops_once_enough_groups_have_signal():
    engine = _engine(_scripted(always_right={0, 2}))   # tasks 0 and 2 never have signal, 1 and 3 always do
    sizes = []

    def generate(n, round_):
        sizes.append(n)
        return engine.collect("FourTasks-v0", num_groups=n, group_size=2, seed=100 + round_, env_kwargs=ENV_KWARGS)
    filled = fill_with_signal(generate, want=4, max_rounds=10)
    assert len(filled.kept) == 4 and all(group_has_signal([t.total_reward for t in g]) for g in filled.kept)
    assert {g[0].task_index for g in filled.kept} <= {1, 3}
    # it stopped in the first round that completed the batch, not later
    signal_before_last = sum(group_has_signal([t.total_reward for t in g]) for g in filled.generated[:-len(
        split_groups(filled.batches[-1].trajectories))])
    assert signal_before_last < 4 <= filled.signal_generated and len(sizes) > 1 and sizes[0] == 4


def test_groups_from_several_rounds_keep_one_group_id_each():
    """Every round numbers its groups from 0; the learner normalises advantages per group id."""
    engine = _engine(_scripted(always_right={0, 2}))
    sampler = GroupSampler(GroupFilterConfig(dynamic=True, max_rounds=10), groups_per_step=4, group_size=2)
    batch = sampler.collect(0, 0, lambda n, seed, tasks: engine.collect(      # seed 0: 3 of 4 groups with signal
        "FourTasks-v0", num_groups=n, group_size=2, seed=seed, env_kwargs=ENV_KWARGS))
    assert batch.metrics["sampling_rounds"] > 1 and batch.metrics["groups_kept"] == 4
    ids = [t.group_id for t in batch.trajectories]
    assert ids == [0, 0, 1, 1, 2, 2, 3, 3]


def test_cap_binds_then_trains_on_what_has_signal_and_says_so():
    lines: list[str] = []
    sampler = GroupSampler(GroupFilterConfig(dynamic=True, max_rounds=1), groups_per_step=4, group_size=2,
                           log=lines.append)
    engine = _engine(_scripted(always_right={0, 2}))

    def generate(n, seed, tasks):
        return engine.collect("FourTasks-v0", num_groups=n, group_size=2, seed=seed, task_indices=tasks,
                              env_kwargs=ENV_KWARGS)
    batch = sampler.collect(0, 0, generate)   # seed 0 draws tasks 3, 1, 0, 3: three groups with signal
    m = batch.metrics
    assert m["groups_kept"] == 3 and m["groups_generated"] == 4 and m["sampling_rounds"] == 1
    assert m["kept_signal_share"] == 1.0 and len(batch.trajectories) == 2 * m["groups_kept"]
    assert len(lines) == 1 and "max_rounds=1" in lines[0] and f"training on those {int(m['groups_kept'])}" in lines[0]


def test_cap_binds_with_no_signal_at_all_keeps_the_first_groups():
    lines: list[str] = []
    sampler = GroupSampler(GroupFilterConfig(dynamic=True, max_rounds=2), groups_per_step=3, group_size=2,
                           log=lines.append)
    engine = _engine(_scripted(always_right={0, 1, 2, 3}))

    def generate(n, seed, tasks):
        return engine.collect("FourTasks-v0", num_groups=n, group_size=2, seed=seed, env_kwargs=ENV_KWARGS)
    m = sampler.collect(0, 3, generate).metrics
    assert (m["groups_generated"], m["groups_kept"], m["sampling_rounds"], m["signal_share"]) == (6, 3, 2, 0.0)
    assert m["episodes_generated"] == 12 == m["episodes_generated_total"]
    assert len(lines) == 1 and "training on the first 3 groups generated" in lines[0]


def test_bad_knobs_are_one_clear_error():
    with pytest.raises(ValueError, match="group_filter.max_rounds must be an integer >= 1"):
        GroupFilterConfig(max_rounds=0)
    with pytest.raises(ValueError, match="group_filter.oversample must be a number >= 1"):
        GroupFilterConfig(oversample=0.5)
    with pytest.raises(ValueError, match="group_filter.difficulty_weight must be in"):
        GroupFilterConfig(difficulty_weight=0.0)
    with pytest.raises(ValueError, match="needs group_size >= 2"):
        GroupSampler(GroupFilterConfig(dynamic=True), groups_per_step=2, group_size=1)
    procedural = GroupSampler(GroupFilterConfig(difficulty=True), groups_per_step=2, group_size=2)
    with pytest.raises(ValueError, match="needs an env with a finite task list"):
        procedural.collect(0, 0, lambda n, seed, tasks: None, num_tasks=lambda: None)


def test_oversample_without_the_filter_trains_on_every_group_generated():
    """The baseline at equal episodes generated: dynamic=false, oversample=2 generates and keeps 2x the groups."""
    engine = _engine(_scripted(always_right={0, 2}))
    sampler = GroupSampler(GroupFilterConfig(oversample=2.0), groups_per_step=2, group_size=2)
    batch = sampler.collect(0, 0, lambda n, seed, tasks: engine.collect("FourTasks-v0", num_groups=n, group_size=2,
                                                                        seed=seed, env_kwargs=ENV_KWARGS))
    m = batch.metrics
    assert (m["groups_generated"], m["groups_kept"], len(batch.trajectories), m["signal_share"]) == (4, 4, 8, 0.75)


def _task_draws(difficulty: bool, steps: int = 6) -> tuple[list[int], GroupSampler]:
    sampler = GroupSampler(GroupFilterConfig(difficulty=difficulty, difficulty_after=2, difficulty_weight=0.05),
                           groups_per_step=4, group_size=2)
    engine = _engine(_scripted(always_right={0}))      # task 0 always solved, the others mixed
    drawn: list[int] = []

    def generate(n, seed, tasks):
        return engine.collect("FourTasks-v0", num_groups=n, group_size=2, seed=seed, task_indices=tasks,
                              env_kwargs=ENV_KWARGS)
    for step in range(steps):
        batch = sampler.collect(step, 1000 + step, generate, num_tasks=lambda: 4)
        drawn += [t.task_index for t in batch.trajectories[::2]]
    return drawn, sampler


def test_difficulty_filtering_draws_an_always_solved_task_less():
    on, sampler = _task_draws(True)
    again, _ = _task_draws(True)
    off, _ = _task_draws(False)
    assert on == again                                  # seeded: the same task sequence
    assert sampler.difficulty.weight(0) == 0.05 and all(sampler.difficulty.weight(i) == 1.0 for i in (1, 2, 3))
    late = slice(8, None)                               # once task 0 has had two groups without variance
    assert on[late].count(0) < off[late].count(0), (on, off)


TINY = ["model=tiny-random", "algo=grpo", "groups_per_step=2", "group_size=2", "sampling.max_new_tokens=4",
        "eval.episodes=1", "learner.micro_batch_size=4", "tensorboard=false", "optim.lr=1e-3"]


def _trainer(tmp_path, name: str, *extra: str):
    from agentgym.algorithms.loop.train_config import TrainConfig
    from agentgym.algorithms.loop.trainer import Trainer
    from agentgym.config import load_config
    cfg = load_config(TrainConfig, overrides=[*TINY, f"output_dir={tmp_path / name}", *extra])
    lines: list[str] = []
    return Trainer(cfg, log=lines.append), lines


def test_a_run_with_dynamic_sampling_trains_only_on_groups_with_signal(tmp_path):
    trainer, lines = _trainer(tmp_path, "run", "steps=3", "env=Arithmetic-v0", "group_filter.dynamic=true",
                              "group_filter.max_rounds=4", "checkpoint_every=0",
                              "env_kwargs={hard_fraction: 0.0, max_turns: 1, reward: {'test_group_filter:odd_length': 1.0}}")
    trainer.train()
    with (tmp_path / "run" / "train_log.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 3
    uncapped = [r for r in rows if float(r["rollout/groups_kept"]) == 2.0]
    assert uncapped, lines
    for r in uncapped:
        assert float(r["rollout/kept_signal_share"]) == 1.0 and float(r["health/zero_var_groups"]) == 0.0
    # some groups had no signal and were replaced: the filter did something
    assert any(float(r["rollout/signal_share"]) < 1.0 for r in rows)
    assert float(rows[-1]["rollout/episodes_generated_total"]) == sum(float(r["rollout/episodes_generated"]) for r in rows)


def test_resumed_run_draws_the_same_tasks(tmp_path):
    """The difficulty filter's state is in the checkpoint: steps after a resume draw the tasks the
    uninterrupted run drew (without it, the resumed run would weigh every task 1 again)."""
    extra = ["env=FourTasks-v0", "env_kwargs={hard_fraction: 0.0, max_turns: 1}", "group_filter.difficulty=true",
             "group_filter.difficulty_after=1", "group_filter.difficulty_weight=0.05", "checkpoint_every=2"]
    full, _ = _trainer(tmp_path, "full", "steps=2", *extra)
    full.train()
    tasks = [[t.task_index for t in full._collect(step).trajectories] for step in (2, 3)]
    resumed, _ = _trainer(tmp_path, "resumed", "steps=2", *extra)
    resumed.load_checkpoint(full.latest_checkpoint())
    resumed.sampler_version = -1
    resumed._sync_sampler()
    assert [[t.task_index for t in resumed._collect(step).trajectories] for step in (2, 3)] == tasks
    assert resumed.groups.difficulty.downweighted() > 0
