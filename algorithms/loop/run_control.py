"""Stopping and resuming a training run: checkpoints on disk, finished vs interrupted runs, and Ctrl-C at a whole step."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

__all__ = ["prune_checkpoints", "rng_state", "set_rng_state", "save_model_quietly", "latest_checkpoint", "checkpoint_step", "finished_run", "interrupted_run", "discard_unstarted",
           "TrainingInterrupted", "WholeSteps", "release_memory", "rss_bytes"]


def latest_checkpoint(out: str | Path) -> Path | None:
    """The newest ``checkpoints/step_N`` of a run directory, or None."""
    ckpts = sorted((Path(out) / "checkpoints").glob("step_*[0-9]"))
    return ckpts[-1] if ckpts else None


def prune_checkpoints(out: str | Path, keep: int) -> None:
    """Keep the newest ``keep`` checkpoints of a run; of those, only the newest keeps its optimizer state
    (the bulk of a checkpoint; resuming needs only the newest), the older ones weights only."""
    import shutil

    import torch
    ckpts = sorted((Path(out) / "checkpoints").glob("step_*[0-9]"))
    for old in ckpts[: max(0, len(ckpts) - keep)]:
        shutil.rmtree(old)
    for old in ckpts[max(0, len(ckpts) - keep):-1]:
        state = old / "state.pt"
        if state.exists():
            light = torch.load(state, weights_only=False)
            if "learner" in light:
                torch.save({"step": light["step"], "resumable": False}, state)


def rng_state() -> dict[str, Any]:
    """torch's, numpy's and Python's global RNG states, for a checkpoint (a resumed run draws the same)."""
    import random

    import numpy as np
    import torch
    return {"torch_rng": torch.get_rng_state(), "numpy_rng": np.random.get_state(), "python_rng": random.getstate()}


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` saved."""
    import random

    import numpy as np
    import torch
    torch.set_rng_state(state["torch_rng"])
    np.random.set_state(state["numpy_rng"])
    random.setstate(state["python_rng"])


def save_model_quietly(model: Any, path: Path, state_dict: Any = None) -> None:
    """``model.save_pretrained(path)`` (with ``state_dict`` when given: FSDP's gathered weights) without
    transformers' shard progress bar, which would break the training bar."""
    from transformers.utils import logging as hf_logging
    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(path, **({"state_dict": state_dict} if state_dict is not None else {}))
    finally:
        if shown:
            hf_logging.enable_progress_bar()


def checkpoint_step(ckpt: Path | None) -> int:
    return int(ckpt.name.split("_", 1)[1]) if ckpt is not None else 0


def finished_run(out: str | Path, steps: int) -> dict[str, Any] | None:
    """The final evals of a run in ``out`` that already trained ``steps`` steps and wrote its final
    eval (``evals.json``), else None — ``--resume`` on such a run has nothing left to do."""
    evals_path = Path(out) / "evals.json"
    if checkpoint_step(latest_checkpoint(out)) < steps or not evals_path.is_file():
        return None
    try:
        evals = json.loads(evals_path.read_text())
    except (OSError, ValueError):
        return None
    tags = {e.get("tag"): e for e in evals if isinstance(e, dict)}
    return tags if "after" in tags and "before" in tags else None


def interrupted_run(out: str | Path) -> bool:
    """Whether ``out`` holds a run that checkpointed but stopped before the steps its config asked for."""
    import yaml
    try:
        steps = int((yaml.safe_load((Path(out) / "config.yaml").read_text()) or {})["steps"])
    except (OSError, ValueError, TypeError, KeyError, yaml.YAMLError):
        return False
    return latest_checkpoint(out) is not None and finished_run(out, steps) is None


def discard_unstarted(out: str | Path, step: int, resume: bool, log: Callable[[str], None]) -> None:
    """A new run (not a resumed one) that stopped before its first step — a late error in the first eval or
    rollout, Ctrl-C there — has nothing to keep or continue: its folder is emptied
    (:func:`agentgym.runs.discard_unstarted_run`), so the corrected command runs again in the same
    ``output_dir`` instead of being refused, or moved to ``runs/train-1``. Says what it removed."""
    if step or resume:
        return
    from agentgym.runs import discard_unstarted_run
    removed = discard_unstarted_run(out)
    if removed:
        log(f"[train] stopped before its first step: removed {', '.join(removed)} from {out}, so the same "
            "command can run there again")


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped a run; ``checkpoint`` is what ``--resume`` continues from (None: nothing saved)."""

    def __init__(self, step: int, checkpoint: Path | None) -> None:
        super().__init__(f"interrupted at step {step}")
        self.step, self.checkpoint = step, checkpoint


class ServiceOutage(RuntimeError):
    """A service the episodes need (a retrieval server, a sandbox) failed every episode of
    ``health.max_outage_steps`` steps in a row, so the run stopped instead of spending its budget on steps
    that train nothing; ``checkpoint`` is what ``--resume`` continues from once the service is back."""

    def __init__(self, message: str, step: int, checkpoint: Path | None = None) -> None:
        super().__init__(message)
        self.step, self.checkpoint = step, checkpoint


class WholeSteps:
    """SIGINT handling for a training loop: a Ctrl-C that arrives while an update is being applied (learner
    step, weight sync, step counter, log row) is held until that update is complete, so an interrupted run
    stops at a whole step and can be checkpointed there; a second Ctrl-C stops at once (``torn``: the state
    may then be half-updated and must not be saved). Elsewhere (rollouts, evals) Ctrl-C stops at once —
    nothing is lost there but the current step's episodes."""

    def __init__(self) -> None:
        self.critical = self.pending = self.torn = False
        self._previous: Any = None

    def _handler(self, signum: int, frame: Any) -> None:
        if self.critical and not self.pending:
            self.pending = True
            print("\n[train] Ctrl-C: finishing this update so the run can stop at a whole step "
                  "(Ctrl-C again to stop now)", file=sys.stderr, flush=True)
            return
        self.torn = self.critical
        raise KeyboardInterrupt

    def __enter__(self) -> "WholeSteps":
        import signal
        import threading
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handler)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._previous is not None:
            import signal
            signal.signal(signal.SIGINT, self._previous)

    @contextlib.contextmanager
    def update(self) -> Iterator[None]:
        """The section a Ctrl-C waits for; raises the held KeyboardInterrupt once the update is in."""
        self.critical = True
        try:
            yield
        finally:
            self.critical = False
        if self.pending:
            raise KeyboardInterrupt


def rss_bytes() -> int | None:
    """This process's resident memory (Linux ``/proc``), or None where it cannot be read."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
    except (OSError, StopIteration, ValueError):
        return None


def release_memory() -> tuple[int | None, int | None]:
    """Between runs in one process (a comparison, a study): collect garbage, give CUDA's cached blocks back
    and, with glibc, the heap's freed pages to the system (``malloc_trim``). Best-effort, never raises;
    returns the resident memory before and after (None where unknown).

    A run frees its models, optimizer and batches when it ends, but glibc keeps most of that heap mapped:
    a Math-v0 comparison's process grew from ~4 to ~7 GB over six SmolLM2 runs with no tensor left alive
    from one run to the next: memory that two studies sharing a 23 GB machine need back."""
    import ctypes
    import gc
    before = rss_bytes()
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):   # not glibc (macOS, musl): nothing to trim this way
        pass
    return before, rss_bytes()
