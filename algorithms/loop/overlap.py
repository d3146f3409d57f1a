"""Generation overlapped with the update: bounded-staleness training (``TrainConfig.max_staleness``).

With ``max_staleness=0`` a step generates its batch, then updates on it (on-policy). With
``max_staleness >= 1`` the trainer hands batch collection to one background thread, one batch ahead:

    step k:  take batch k (generated with the weights of step k-1)
             push the learner's newest weights (step k) to the sampler, which is idle now
             start generating batch k+1 in the background          ─┐ run at the same time,
             update on batch k                                      ─┘ on separate cores

so each batch the learner trains on was sampled by weights exactly one update old (the first one by
the initial weights: staleness 0). The learner corrects for it with what already exists: the old
log-probs are recomputed by the learner (a separate sampler implies ``learner.old_logprobs=auto`` →
recompute) and ``learner.tis_cap`` truncates the importance weight learner/sampler per token. Every
logged row carries ``rollout/staleness`` (learner version − sampler version of that batch).

One sampler holds one set of weights, so the pipeline is one batch deep: staleness is 0 or 1 whatever
bound above 1 is set (a deeper queue would only add staleness, not overlap). The order of events is
fixed, so a run is as reproducible as an on-policy one, and a checkpoint stores the batch generated
ahead, so ``--resume`` continues exactly (see :class:`Prefetcher` and the trainer's checkpoints).

The background work runs in a daemon thread: torch releases the GIL inside its kernels, so the
sampler's forward passes and the learner's update use different cores. The torch thread budget is
shared between the two (:meth:`agentgym.threads.ThreadGovernor.set_lanes`).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["Collected", "Prefetcher"]


@dataclass
class Collected:
    """One step's rollout batch and where it came from."""
    step: int               # the training step whose batch it is (its seed and tasks)
    batch: Any              # the RolloutBatch
    version: int            # the learner step whose weights the sampler held while generating it
    seconds: float          # wall time of the collection itself (in the background when overlapped)


class Prefetcher:
    """Collects the next step's batch on a background thread while the caller updates.

    ``collect(step)`` returns that step's batch (it is the trainer's seeded collection). ``start(step,
    version)`` begins it in the background; ``take(step)`` waits for it (or collects it in the calling
    thread when nothing was started for that step). Errors in the background are raised by ``take``.
    """

    def __init__(self, collect: Callable[[int], Any]) -> None:
        self._collect = collect
        self._future: Future[Collected] | None = None
        self._step: int | None = None

    def _run(self, step: int, version: int, future: Future[Collected]) -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            t0 = time.perf_counter()
            batch = self._collect(step)
            future.set_result(Collected(step, batch, version, time.perf_counter() - t0))
        except BaseException as e:   # handed to the caller by take()
            future.set_exception(e)

    def start(self, step: int, version: int) -> None:
        """Begin collecting ``step``'s batch in the background with the sampler's weights of ``version``."""
        if self._future is not None:
            raise RuntimeError(f"a batch (step {self._step}) is already being generated")
        future: Future[Collected] = Future()
        self._future, self._step = future, step
        # a daemon thread: a Ctrl-C that stops the run at once does not wait for the batch in flight
        threading.Thread(target=self._run, args=(step, version, future), name=f"agentgym-sampler-{step}",
                         daemon=True).start()

    def put(self, collected: Collected) -> None:
        """A batch generated ahead by an earlier process (restored from a checkpoint)."""
        if self._future is not None:
            raise RuntimeError("a batch is already pending")
        future: Future[Collected] = Future()
        future.set_result(collected)
        self._future, self._step = future, collected.step

    @property
    def busy(self) -> bool:
        """A batch is being generated right now (the sampler is in use)."""
        return self._future is not None and not self._future.done()

    def pending(self) -> Collected | None:
        """The batch generated ahead, waiting for it if it is still in flight; None when there is none."""
        if self._future is None:
            return None
        return self._future.result()

    def take(self, step: int, version: int) -> Collected:
        """``step``'s batch: the one generated ahead, or collected now (with weights ``version``)."""
        if self._future is None:
            t0 = time.perf_counter()
            batch = self._collect(step)
            return Collected(step, batch, version, time.perf_counter() - t0)
        if self._step != step:
            raise RuntimeError(f"the batch generated ahead is step {self._step}'s, not step {step}'s")
        try:
            return self._future.result()
        finally:
            # handed over (or its error raised) only once it is done: a Ctrl-C while waiting keeps the
            # batch in flight, so the interrupt's checkpoint still saves it (pending()) for --resume
            if self._future.done():
                self._future, self._step = None, None
