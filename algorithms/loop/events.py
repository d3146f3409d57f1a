"""What a training run tells whoever listens: the trainer's events.

The trainer does the work (rollouts, updates, evals, checkpoints) and reports through these events; it
never calls the application. The app (``agentgym train`` and ``compare`` on the command line) subscribes
to write the HTML trajectory report (:class:`agentgym.app.report.TrajectoryReport`); the comparison harness
subscribes to record which tasks each step drew; a user's script subscribes the same way, e.g. to log to
their own tracker::

    class ToMyTracker(TrainerEvents):
        def step_done(self, trainer, batch, row):
            my_tracker.log({k: v for k, v in row.items() if isinstance(v, float)}, step=int(row["step"]))

    Trainer(cfg, events=[ToMyTracker()]).train()

Every method has a no-op default, so a subscriber overrides only what it needs. Events are delivered on
the process that trains (rank 0 only for ``eval_done``, ``checkpoint_saved`` and ``run_done``), in the
order they happen; an exception in a subscriber propagates (a broken logger should not go unnoticed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    from agentgym.algorithms.loop.health import Alarm
    from agentgym.algorithms.loop.trainer import Trainer

__all__ = ["TrainerEvents", "dispatch"]


class TrainerEvents:
    """A subscriber to a :class:`~agentgym.algorithms.loop.trainer.Trainer`'s events (override what you need)."""

    def step_done(self, trainer: Trainer, batch: Any, row: dict[str, float]) -> None:
        """A step's update is in: ``batch`` is its :class:`~agentgym.rollout.RolloutBatch`, ``row`` the logged
        numbers (``train_log.csv``'s row)."""

    def alarm(self, trainer: Trainer, alarm: Alarm) -> None:
        """A health rule fired (collapse, no signal, ...; :mod:`agentgym.algorithms.loop.health`)."""

    def eval_done(self, trainer: Trainer, tag: str, metrics: dict[str, Any], trajectories: Sequence[Any]) -> None:
        """A held-out eval finished (``tag``: ``before``, ``stepN`` or ``after``)."""

    def checkpoint_saved(self, trainer: Trainer, path: Any) -> None:
        """A checkpoint was written to ``path``."""

    def run_done(self, trainer: Trainer, eval_trajectories: Sequence[Any]) -> None:
        """The run finished: its files (config, log, curves, alarms, evals) are written; ``eval_trajectories``
        are the final eval's episodes."""


def dispatch(subscribers: Sequence[TrainerEvents], event: str, *args: Any) -> None:
    """Deliver ``event`` to every subscriber, in order."""
    for s in subscribers:
        getattr(s, event)(*args)
