"""Output directories of runs: a run never overwrites another run's results.

``agentgym train``, ``sft``, ``dpo`` and ``compare`` write into ``output_dir``. As in Hugging Face's
``Trainer`` (``overwrite_output_dir``) and Lightning, a directory that already holds files is refused
unless the user says what they want:

* ``--resume`` continues the run that is there (``train``: from its last checkpoint; ``compare``:
  reusing its finished runs);
* ``--overwrite`` deletes what is there and starts afresh;
* otherwise: exit code 2 and a message naming both options and the files found — nothing is
  touched, so a typo or a second command pointed at a finished run loses nothing.

When the user did not choose the directory (the command's default, e.g. ``runs/train``), a new run
goes to the next free version instead, as Lightning's ``version_N`` does: ``runs/train``, then
``runs/train-1``, ``runs/train-2``, … (:func:`default_output_dir`), and ``--resume`` continues the
newest of them. So the README's main command can be run twice.

The check runs before any model is loaded, so the refusal is immediate. A run that stops before its
first step (a late error, Ctrl-C in the first eval) leaves its folder empty (:func:`discard_unstarted_run`):
nothing there to keep, and nothing that refuses the corrected re-run.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Callable

from agentgym.config import ConfigError

__all__ = ["RunDirError", "prepare_output_dir", "check_output_dir", "default_output_dir", "output_dir_was_given",
           "discard_unstarted_run"]


class RunDirError(ConfigError):
    """The output directory holds another run (a usage error: exit code 2)."""


LOCK_NAME = ".agentgym.lock"
#: the commands that can continue a run in place (``sft`` and ``dpo`` start over: TRL's trainers run whole)
RESUMABLE = ("train", "compare")


def _process_start(pid: int) -> str | None:
    """The start time of ``pid`` (``/proc/PID/stat`` field 22), to tell a live holder from a reused pid."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def lock_holder(path: str | Path) -> int | None:
    """The pid of another live process writing the run in ``path`` (its lock file), else None."""
    try:
        pid_text, _, start = (Path(path) / LOCK_NAME).read_text().strip().partition(" ")
        pid = int(pid_text)
    except (OSError, ValueError):
        return None
    if pid == os.getpid():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None                  # stale: the writer is gone
    except PermissionError:
        pass                         # alive, another user's
    if start and _process_start(pid) not in (None, start):
        return None                  # the pid was reused by an unrelated process
    return pid


def release_output_dir(path: str | Path) -> None:
    """Remove this process's lock from ``path`` (a no-op when another process or nobody holds it)."""
    lock = Path(path) / LOCK_NAME
    try:
        if lock.read_text().split()[0] == str(os.getpid()):
            lock.unlink()
    except (OSError, IndexError):
        pass


def check_output_dir(path: str | Path, *, resume: bool = False, overwrite: bool = False,
                     command: str = "train") -> Path:
    """Raise what :func:`prepare_output_dir` would refuse, touching nothing: for a command to fail fast,
    before the slow model load, when the directory is prepared later by the code it calls."""
    if resume and overwrite:
        raise RunDirError("--resume and --overwrite exclude each other: continue the run, or replace it")
    out = Path(path).expanduser()
    if out.exists() and not out.is_dir():
        raise RunDirError(f"output_dir {out} is a file, not a directory")
    if not out.exists():   # the nearest folder that exists must take a new one
        above = next(p for p in out.absolute().parents if p.exists())
        if not above.is_dir():
            raise RunDirError(f"output_dir {out} cannot be made: {above} is a file, not a directory")
        if not os.access(above, os.W_OK | os.X_OK):
            raise RunDirError(f"output_dir {out} cannot be made: {above} is not writable")
    holder = lock_holder(out) if out.is_dir() else None
    if holder is not None:
        raise RunDirError(f"output_dir {out} is in use by a running process (pid {holder}); wait for it to "
                          "finish or stop it, or pick another output_dir")
    existing = _run_files(out)
    if resume and not existing:
        raise RunDirError(f"--resume: {out} holds no run to continue (no checkpoint to resume from)")
    if existing and not resume and not overwrite:
        shown = ", ".join(existing[:6]) + (", …" if len(existing) > 6 else "")
        how = f"continue that run with `agentgym {command} ... --resume`, " if command in RESUMABLE else ""
        raise RunDirError(f"output_dir {out} already holds files ({shown}); pick a new one (output_dir=...), "
                          f"{how}or replace it with --overwrite")
    return out


def prepare_output_dir(path: str | Path, *, resume: bool = False, overwrite: bool = False,
                       command: str = "train") -> Path:
    """Create ``path`` for a new run, or accept it for ``resume``; refuse a non-empty one otherwise.

    The directory is then locked for this process (``.agentgym.lock``: pid and start time, removed when
    the process ends): a second process pointed at it — ``--resume``, ``--overwrite`` or a second
    ``agentgym compare --resume`` on the same runs — is refused while the first one lives, instead of
    both writing (or one deleting) the same run. A lock left by a process that died is ignored."""
    out = check_output_dir(path, resume=resume, overwrite=overwrite, command=command)
    if not resume:
        for p in (out.iterdir() if _run_files(out) else []):   # --overwrite: empty it
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise RunDirError(f"output_dir {out} cannot be made: {e.strerror or e}") from None
    _lock(out)
    return out


def discard_unstarted_run(path: str | Path) -> list[str]:
    """Empty the run directory ``path`` of a run that stopped before its first step (a late error in the
    before-eval, Ctrl-C there): its ``config.yaml``, ``provenance.json`` and partial logs hold nothing to keep
    or continue, and left there they would refuse the corrected re-run ("already holds files") or push a
    default-folder run to ``runs/train-1``. The folder and this process's lock stay (the lock goes when
    the process ends), so the same command can run again in the same place. Returns the names removed."""
    out = Path(path)
    removed = _run_files(out)
    for name in removed:
        p = out / name
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
    return removed


def _run_files(out: Path) -> list[str]:
    """The names in a run directory, its lock file aside."""
    return sorted(p.name for p in out.iterdir() if p.name != LOCK_NAME) if out.is_dir() else []


def _lock(out: Path) -> None:
    import atexit
    (out / LOCK_NAME).write_text(f"{os.getpid()} {_process_start(os.getpid()) or ''}\n")
    atexit.register(release_output_dir, out)


def _versions(base: Path) -> list[Path]:
    out = [base] if base.exists() else []
    out += sorted((p for p in base.parent.glob(base.name + "-*") if p.name[len(base.name) + 1:].isdigit()),
                  key=lambda p: int(p.name[len(base.name) + 1:]))
    return out


def default_output_dir(base: str | Path, *, resume: bool = False, overwrite: bool = False,
                       resumable: Callable[[Path], bool] | None = None) -> Path:
    """The directory for a run whose user did not choose one: ``base`` while it is free (or for
    ``overwrite``), else the next free ``base-N``; with ``resume`` the newest existing version — with
    ``resumable``, the newest one it accepts (e.g. that has a checkpoint), else the newest."""
    base = Path(base).expanduser()
    versions = _versions(base)
    if resume and resumable is not None:
        usable = [p for p in versions if p.is_dir() and resumable(p)]
        if usable:
            return usable[-1]
    if resume or overwrite:
        return versions[-1] if versions else base
    for p in versions:
        if p.is_dir() and not any(p.iterdir()):
            return p
    if not versions:
        return base
    last = versions[-1]
    n = int(last.name[len(base.name) + 1:]) + 1 if last != base else 1
    return base.parent / f"{base.name}-{n}"


def output_dir_was_given(config_path: str | Path | None, overrides: list[str] | tuple[str, ...],
                         key: str = "output_dir") -> bool:
    """Whether the user named the output directory (an override or the YAML file), not the default."""
    if any(o.partition("=")[0].strip() == key for o in overrides):
        return True
    if config_path is not None:
        import yaml
        try:
            data = yaml.safe_load(Path(config_path).read_text()) or {}
        except (OSError, yaml.YAMLError):
            return False
        return isinstance(data, dict) and key in data
    return False
