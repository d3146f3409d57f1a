"""The application's subscriber to a training run's events: the HTML trajectory report.

``agentgym train`` and ``agentgym compare`` attach :class:`TrajectoryReport` to every run, so each run
directory holds ``eval_trajectories.html`` (the final eval's episodes token by token, with the training
health section: curves and alarms). From Python, pass it yourself:
``Trainer(cfg, events=[TrajectoryReport()])``.
"""

from __future__ import annotations

from typing import Any, Sequence

from agentgym.algorithms.loop.events import TrainerEvents

__all__ = ["TrajectoryReport"]


class TrajectoryReport(TrainerEvents):
    """Writes ``<output_dir>/eval_trajectories.html`` when the run is done."""

    def run_done(self, trainer: Any, eval_trajectories: Sequence[Any]) -> None:
        from agentgym.algorithms.loop.health import health_section
        from agentgym.app.report import write_html_report
        from agentgym.rollout_metrics import summarize
        out = trainer.out
        write_html_report(out / "eval_trajectories.html", list(eval_trajectories), tokenizer=trainer.policy.tokenizer,
                          metrics=summarize(list(eval_trajectories)),
                          title=f"{trainer.cfg.env} · after {trainer.step} steps",
                          sections=[health_section(out / "curves.png", trainer.health.alarms)])
