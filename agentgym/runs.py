"""Output directories of runs: a run never overwrites another run's results.

``agentgym train``, ``sft``, ``dpo`` and ``compare`` write into ``output_dir``. As in Hugging Face's
``Trainer`` (``overwrite_output_dir``) and Lightning, a directory that already holds files is refused
unless the user says what they want:

* ``--resume`` continues the run that is there (``train``: from its last checkpoint; ``compare``:
  reusing its finished runs);
* ``--overwrite`` deletes what is there and starts afresh;
* otherwise: exit code 2 and a message naming both options and the files found — nothing is
  touched, so a typo or a second command pointed at a finished run loses nothing.

The check runs before any model is loaded, so the refusal is immediate.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from agentgym.config import ConfigError

__all__ = ["RunDirError", "prepare_output_dir"]


class RunDirError(ConfigError):
    """The output directory holds another run (a usage error: exit code 2)."""


def prepare_output_dir(path: str | Path, *, resume: bool = False, overwrite: bool = False,
                       command: str = "train") -> Path:
    """Create ``path`` for a new run, or accept it for ``resume``; refuse a non-empty one otherwise."""
    if resume and overwrite:
        raise RunDirError("--resume and --overwrite exclude each other: continue the run, or replace it")
    out = Path(path).expanduser()
    if out.exists() and not out.is_dir():
        raise RunDirError(f"output_dir {out} is a file, not a directory")
    existing = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    if resume:
        if not existing:
            raise RunDirError(f"--resume: {out} holds no run to continue")
        return out
    if existing:
        if not overwrite:
            shown = ", ".join(existing[:6]) + (", …" if len(existing) > 6 else "")
            raise RunDirError(
                f"output_dir {out} already holds files ({shown}); pick a new one (output_dir=...), "
                f"continue that run with `agentgym {command} ... --resume`, or replace it with --overwrite")
        for p in out.iterdir():
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
    out.mkdir(parents=True, exist_ok=True)
    return out
