"""Old import paths of the modules that moved into the ``app`` subpackage.

``cli``, ``report``, ``runs``, ``evaluation``, ``stats`` and ``checking`` are the application, not the
kernel, so they live in the ``app/`` subpackage (issue 24). Users' code written against the old paths
(``from agentgym.stats import mean_ci``, ``import agentgym.cli``, ``python -m agentgym.cli``) keeps
working: one finder, installed by ``agentgym/__init__.py``, answers ``agentgym.<old>`` with the module
``app/<old>.py`` itself — the same object under both names in ``sys.modules``, so a
``monkeypatch`` through either name reaches the code — and warns (DeprecationWarning) with the new path.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from types import CodeType, ModuleType

#: old module name -> new module name
MOVED = {f"{__package__}.{name}": f"{__package__}.app.{name}"
         for name in ("cli", "report", "runs", "evaluation", "stats", "checking")}


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``agentgym.<old>`` and loads it as the module it moved to (imported once, shared)."""

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = MOVED[spec.name]
        warnings.warn(f"{spec.name} moved to {new}; import it from there", DeprecationWarning, stacklevel=2)
        module = importlib.import_module(new)
        spec.loader_state = module.__spec__  # the import system overwrites module.__spec__ next
        return module

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run (the module ran when it was imported under its new name); give it back its own
        ``__spec__``, which the import system has just set to the alias's."""
        module.__spec__ = module.__spec__.loader_state  # type: ignore[union-attr]

    def get_code(self, fullname: str) -> CodeType | None:
        """``python -m agentgym.cli``: runpy asks for the code to run as ``__main__``: the new module's."""
        spec = importlib.util.find_spec(MOVED[fullname])
        return spec.loader.get_code(MOVED[fullname])  # type: ignore[union-attr]


def install() -> None:
    """Put the finder on ``sys.meta_path`` once (``agentgym/__init__.py`` calls this)."""
    if not any(isinstance(f, _MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.append(_MovedModuleFinder())
