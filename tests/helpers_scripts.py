"""Scripts outside the package (``benchmarks/...``) imported in tests as modules, for their functions."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType


def load_script(path: Path, name: str | None = None) -> ModuleType:
    """The script at ``path`` executed as a module named ``name`` (default: its file stem); not registered in
    ``sys.modules``, so each call gives a fresh module."""
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
