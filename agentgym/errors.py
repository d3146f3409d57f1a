"""Errors that say whose fault a failure was.

:class:`InfraError` marks a failure of the *infrastructure* an episode runs on — a sandbox or its daemon, a
retrieval server that timed out or answered 5xx, a tool's backend — as opposed to the policy's own
mistakes (a malformed action, a wrong answer), which are observations and rewards. An env whose step hits
one ends the episode there and marks it (``info["infra_error"]`` and the episode summary's
``infra_error``); the trainer leaves marked episodes out of the group baselines and the loss and counts them
(``rollout/infra_errors``), so an outage does not teach the policy that its actions earned a zero reward.
Raise it (or a subclass) from a tool or an env for failures that are not the policy's.
"""

from __future__ import annotations

__all__ = ["InfraError"]


class InfraError(RuntimeError):
    """The infrastructure failed, not the policy: the episode is marked and kept out of training."""
