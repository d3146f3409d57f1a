"""Live progress on a tqdm bar while a batch generates: the one helper the trainer's eval bar and
``agentgym eval``'s bar share (the engine reports every decode step; see :class:`agentgym.rollout.RolloutProgress`)."""

from __future__ import annotations

import time
from typing import Any

__all__ = ["GeneratingPostfix"]


class GeneratingPostfix:
    """Puts a generate call's progress on ``bar``'s postfix ("generating: 3/16 answers done, 412 tokens
    generated"), redrawn at most every ``min_interval_s``: a log file should not get a line per token."""

    def __init__(self, bar: Any, min_interval_s: float = 0.5):
        self.bar, self.min_interval_s = bar, float(min_interval_s)
        self._drawn = 0.0

    def __call__(self, tokens: int, generating: tuple[int, int] | None) -> None:
        now = f"generating: {generating[0]}/{generating[1]} answers done, " if generating else ""
        self.bar.set_postfix_str(f"{now}{tokens} tokens generated", refresh=False)
        if time.monotonic() - self._drawn >= self.min_interval_s:
            self._drawn = time.monotonic()
            self.bar.refresh()
