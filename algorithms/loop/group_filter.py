"""More signal per episode: dynamic sampling (DAPO) and online difficulty filtering (``group_filter.*``).

A GRPO group whose rewards are all equal has advantages of exactly zero: its episodes cost generation
and update time and give no policy gradient (they only dilute a token-mean loss). Two remedies, both
off by default:

* **Dynamic sampling** (``group_filter.dynamic``): the rule of DAPO (Yu et al. 2025, "DAPO: an open-source
  LLM reinforcement learning system at scale", section 3.2 "dynamic sampling"; veRL's
  ``algorithm.filter_groups``). Generate groups, drop those whose rewards have zero variance, and generate
  more groups on new tasks until the batch holds ``groups_per_step`` groups with signal, in at most
  ``group_filter.max_rounds`` generation rounds. Surplus groups with signal are dropped in generation
  order, as DAPO does. When the cap binds (our choice; veRL stops the run instead): the step trains on the
  groups with signal there are (a smaller batch, undiluted); if there are none, on the first
  ``groups_per_step`` groups generated — the batch a run without dynamic sampling would have had — so the
  step still logs a real batch and ``learner.skip_no_signal`` decides whether it moves the weights. Either
  way one line says so.
* **Difficulty filtering** (``group_filter.difficulty``): tasks the run keeps solving in every episode of
  a group, or keeps failing in every episode, stop being drawn at full rate. A task whose last
  ``difficulty_after`` groups all had zero reward variance gets the sampling weight
  ``difficulty_weight`` (instead of 1) until one of its groups has signal again; it is still drawn now and
  then, so a task that becomes learnable comes back. Tasks are drawn with replacement, with probability
  proportional to their weight, by rejection from a uniform draw (exact, and needs no weight table).
  It needs an env with a finite task list (``num_tasks``; e.g. SearchQA-v0, ReAct-v0, CodeExec-v0): in a
  procedural env (Math-v0, Arithmetic-v0) tasks do not come back, and asking for it there is an error. Seeded by the step's seed, so the task sequence is
  reproducible; the per-task streaks are checkpointed (in ``state.pt``), so ``--resume`` continues
  it exactly.

"Zero variance" is ``max - min <= 1e-6`` of the group's episode returns (float rewards: ``0.1 + 0.2`` and
``0.3`` are equal here; GRPO's ``(r - mean) / (std + eps)`` is ~0 for such a group anyway). Only scored
episodes count: an episode an infrastructure failure ended says nothing about the policy
(:func:`agentgym.rollout_metrics.scored_episodes`); it stays in the batch, and the trainer leaves it out of
the baselines and the loss as before.

Every step logs (``rollout/`` prefix in the train log): ``groups_generated``, ``groups_kept``,
``signal_share`` (share of generated groups with signal), ``kept_signal_share``, ``sampling_rounds``,
``episodes_generated`` and ``episodes_generated_total`` (the run's cumulative count: the x-axis of a
comparison at equal generation cost), and with difficulty filtering ``tasks_downweighted``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from agentgym.rollout_metrics import scored_episodes, summarize

if TYPE_CHECKING:   # the config module imports this one: the engine is imported only where batches are made
    from agentgym.rollout import RolloutBatch
    from agentgym.trajectory import Trajectory

__all__ = ["GroupFilterConfig", "group_has_signal", "split_groups", "Filled", "fill_with_signal",
           "TaskDifficulty", "GroupSampler", "SIGNAL_ATOL"]

#: rewards closer than this are equal (see the module docstring)
SIGNAL_ATOL = 1e-6


@dataclass
class GroupFilterConfig:
    """``group_filter.*``: dynamic sampling and difficulty filtering (module docstring). Off by default."""
    dynamic: bool = field(default=False, metadata={
        "help": "DAPO dynamic sampling: drop groups with equal rewards, refill until groups_per_step have signal"})
    oversample: float = field(default=1.0, metadata={
        "help": "groups generated per round as a multiple of groups_per_step (>= 1); without dynamic, all trained on"})
    max_rounds: int = field(default=3, metadata={
        "help": "generation rounds per step at most (>= 1); then train on what has signal"})
    difficulty: bool = field(default=False, metadata={
        "help": "draw less often the tasks whose recent groups were all solved or all failed"})
    difficulty_after: int = field(default=2, metadata={
        "help": "groups in a row without reward variance after which a task is down-weighted (>= 1)"})
    difficulty_weight: float = field(default=0.1, metadata={
        "help": "sampling weight of a down-weighted task, in (0, 1] (others weigh 1)"})

    def __post_init__(self) -> None:
        if not (isinstance(self.oversample, (int, float)) and math.isfinite(self.oversample) and self.oversample >= 1):
            raise ValueError(f"group_filter.oversample must be a number >= 1, got {self.oversample!r}")
        for name in ("max_rounds", "difficulty_after"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"group_filter.{name} must be an integer >= 1, got {value!r}")
        if not (isinstance(self.difficulty_weight, (int, float)) and 0 < self.difficulty_weight <= 1):
            raise ValueError(f"group_filter.difficulty_weight must be in (0, 1], got {self.difficulty_weight!r}")

    def check(self, group_size: int) -> None:
        """Dynamic sampling needs groups: with one episode per task no group ever has reward variance."""
        if self.dynamic and group_size < 2:
            raise ValueError(f"group_filter.dynamic=true needs group_size >= 2 (got {group_size}): a group of one "
                             "episode never has reward variance")


# ----------------------------------------------------------------------------- pure functions

def group_has_signal(rewards: Sequence[float], atol: float = SIGNAL_ATOL) -> bool:
    """Whether a group's returns differ (by more than ``atol``): a GRPO advantage that is not all zero."""
    return len(rewards) > 1 and max(rewards) - min(rewards) > atol


def split_groups(trajectories: Sequence[Trajectory]) -> list[list[Trajectory]]:
    """One collect call's trajectories (group by group, in order) as groups; no group id: one per episode."""
    groups: dict[Any, list[Trajectory]] = {}
    for i, t in enumerate(trajectories):
        groups.setdefault(t.group_id if t.group_id is not None else ("single", i), []).append(t)
    return list(groups.values())


def _has_signal(group: Sequence[Trajectory]) -> bool:
    return group_has_signal([t.total_reward for t in scored_episodes(group)])


@dataclass
class Filled:
    """What :func:`fill_with_signal` made of one step: the groups to train on and what it cost."""
    kept: list[list[Trajectory]]
    generated: list[list[Trajectory]]   # every group generated, kept or not, in generation order
    batches: list[RolloutBatch]          # one per round (their timings)
    capped: bool = False                 # the round cap bound before enough groups had signal

    @property
    def signal_generated(self) -> int:
        return sum(_has_signal(g) for g in self.generated)


def _round_size(want: int, missing: int, oversample: float, signal: int, generated: int) -> int:
    """Groups to generate next: the first round ``oversample × want``; a refill, the missing groups over the
    signal rate seen so far in this step (at most a first round's worth; a full one while none had signal)."""
    full = math.ceil(oversample * want)
    if generated == 0 or signal == 0:
        return full
    return max(1, min(full, math.ceil(oversample * missing * generated / signal)))


def fill_with_signal(generate: Callable[[int, int], RolloutBatch], want: int, *, oversample: float = 1.0,
                     max_rounds: int = 3) -> Filled:
    """DAPO's dynamic sampling: call ``generate(num_groups, round)`` until ``want`` groups have reward
    variance or ``max_rounds`` rounds ran. The kept groups: the first ``want`` with signal; when the cap
    binds, those there are, or with none at all the first ``want`` groups generated (module docstring)."""
    generated: list[list[Trajectory]] = []
    batches: list[RolloutBatch] = []
    with_signal: list[list[Trajectory]] = []
    for round_ in range(max_rounds):
        n = _round_size(want, want - len(with_signal), oversample, len(with_signal), len(generated))
        batch = generate(n, round_)
        batches.append(batch)
        groups = split_groups(batch.trajectories)
        generated.extend(groups)
        with_signal.extend(g for g in groups if _has_signal(g))
        if len(with_signal) >= want:
            return Filled(with_signal[:want], generated, batches)
    return Filled(with_signal or generated[:want], generated, batches, capped=True)


# ----------------------------------------------------------------------------- difficulty

class TaskDifficulty:
    """Per-task streaks of groups without reward variance, and the seeded weighted draw of task indices."""

    def __init__(self, after: int, weight: float):
        self.after, self.weight_low = after, weight
        self.streak: dict[int, int] = {}

    def weight(self, index: int) -> float:
        return self.weight_low if self.streak.get(index, 0) >= self.after else 1.0

    def record(self, groups: Sequence[Sequence[Trajectory]]) -> None:
        """Update the streaks from finished groups (scored episodes only; a group of < 2 says nothing)."""
        for g in groups:
            scored = scored_episodes(g)
            index = scored[0].task_index if scored else None
            if index is None or len(scored) < 2:
                continue
            self.streak[int(index)] = 0 if _has_signal(scored) else self.streak.get(int(index), 0) + 1

    def draw(self, n: int, seed: int, num_tasks: int) -> list[int]:
        """``n`` task indices, with replacement, with probability proportional to :meth:`weight`: uniform
        proposals accepted with probability ``weight`` (exact; ``1 / weight`` proposals per task on average
        even if every task is down-weighted)."""
        rng = np.random.default_rng([seed, 0x6466])
        out: list[int] = []
        while len(out) < n:
            index = int(rng.integers(num_tasks))
            if self.weight(index) >= 1.0 or rng.random() < self.weight(index):
                out.append(index)
        return out

    def downweighted(self) -> int:
        return sum(s >= self.after for s in self.streak.values())

    def state_dict(self) -> dict[str, Any]:
        return {"streak": {str(k): v for k, v in self.streak.items() if v}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.streak = {int(k): int(v) for k, v in state.get("streak", {}).items()}


# ----------------------------------------------------------------------------- the trainer's sampler

def _round_seed(seed: int, round_: int) -> int:
    """Round 0 uses the step's seed (the batch of a run without the filter); refills derive new ones."""
    return seed if round_ == 0 else (seed * 31 + round_ * 1_000_033) % 2**31


class GroupSampler:
    """The trainer's step batches under ``group_filter``: draws tasks (difficulty), runs the refill loop
    (dynamic sampling), keeps the run's counters and checkpoints them. With both off a step is exactly one
    ``generate`` call of ``groups_per_step`` groups on the engine's own task draw, as before."""

    def __init__(self, config: GroupFilterConfig, groups_per_step: int, group_size: int,
                 log: Callable[[str], None] = print):
        config.check(group_size)
        self.config, self.want, self.log = config, groups_per_step, log
        self.difficulty = TaskDifficulty(config.difficulty_after, config.difficulty_weight) if config.difficulty else None
        self.episodes_total = 0
        self._after: dict[int, dict[str, Any]] = {-1: self.state_dict()}   # state after collecting step s

    def collect(self, step: int, seed: int, generate: Callable[[int, int, list[int] | None], RolloutBatch],
                world: int = 1, num_tasks: Callable[[], int | None] = lambda: None) -> RolloutBatch:
        """``step``'s batch. ``generate(groups_on_this_rank, seed, task_indices_or_None)`` collects (and under
        torchrun gathers) one round; ``world`` ranks share each round's groups."""
        cfg = self.config

        def one_round(n: int, round_: int) -> RolloutBatch:
            per_rank, s = -(-n // world), _round_seed(seed, round_)
            tasks = self.difficulty.draw(per_rank, s, self._task_count(num_tasks)) if self.difficulty else None
            return generate(per_rank, s, tasks)

        if cfg.dynamic:
            filled = fill_with_signal(one_round, self.want, oversample=cfg.oversample, max_rounds=cfg.max_rounds)
        else:   # oversample > 1 without the filter: the baseline that trains on every group it generated
            batch = one_round(math.ceil(cfg.oversample * self.want), 0)
            groups = split_groups(batch.trajectories)
            filled = Filled(groups, groups, [batch])
        if filled.capped:
            self._say_capped(step, filled)
        if self.difficulty is not None:
            self.difficulty.record(filled.generated)
        episodes = sum(len(g) for g in filled.generated)
        self.episodes_total += episodes
        self._after[step] = self.state_dict()
        for old in [s for s in self._after if s < step - 3]:
            del self._after[old]
        return self._batch(filled, episodes)

    @staticmethod
    def _task_count(num_tasks: Callable[[], int | None]) -> int:
        """The env's task count; difficulty filtering needs one: in a procedural env tasks do not repeat."""
        n = num_tasks()
        if n is None:
            raise ValueError("group_filter.difficulty=true needs an env with a finite task list (num_tasks); this "
                             "env generates its tasks procedurally, so no task comes back to be down-weighted")
        return n

    def _batch(self, filled: Filled, episodes: int) -> RolloutBatch:
        """The kept groups as one batch: their summary, the rounds' timings summed, the filter's counters."""
        from agentgym.rollout import RolloutBatch
        if len(filled.batches) == 1 and len(filled.kept) == len(filled.generated):
            trajectories, metrics = filled.batches[0].trajectories, dict(filled.batches[0].metrics)
        else:
            for i, group in enumerate(filled.kept):   # each round numbers its groups from 0: one id per group
                for t in group:
                    t.group_id = i
            trajectories = [t for g in filled.kept for t in g]
            metrics = summarize(trajectories)
            for b in filled.batches:
                for k, v in b.metrics.items():
                    if k.startswith("time/") or k == "rollout/generate_calls":
                        metrics[k] = metrics.get(k, 0.0) + v
        n_gen = max(1, len(filled.generated))
        metrics.update({
            "groups_generated": float(len(filled.generated)), "groups_kept": float(len(filled.kept)),
            "signal_share": filled.signal_generated / n_gen,
            "kept_signal_share": sum(_has_signal(g) for g in filled.kept) / max(1, len(filled.kept)),
            "sampling_rounds": float(len(filled.batches)), "episodes_generated": float(episodes),
            "episodes_generated_total": float(self.episodes_total)})
        if self.difficulty is not None:
            metrics["tasks_downweighted"] = float(self.difficulty.downweighted())
        return RolloutBatch(trajectories, metrics)

    def _say_capped(self, step: int, filled: Filled) -> None:
        k = filled.signal_generated
        what = (f"training on those {k} groups" if k else
                f"training on the first {len(filled.kept)} groups generated (no advantage under group normalisation)")
        self.log(f"[train] step {step + 1}: dynamic sampling hit group_filter.max_rounds={self.config.max_rounds}: "
                 f"{len(filled.generated)} groups generated, {k} with reward variance (wanted {self.want}); {what}")

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict[str, Any]:
        return {"episodes_total": self.episodes_total,
                "difficulty": self.difficulty.state_dict() if self.difficulty is not None else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.episodes_total = int(state.get("episodes_total", 0))
        if self.difficulty is not None and state.get("difficulty") is not None:
            self.difficulty.load_state_dict(state["difficulty"])

    def state_after(self, step: int) -> dict[str, Any]:
        """The state right after collecting ``step``'s batch (kept for the last few steps), for a checkpoint:
        the newest batch a resumed run will not generate again is the last trained one, or the one generated
        ahead and saved with it."""
        return self._after.get(step, self.state_dict())
