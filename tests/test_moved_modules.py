"""The application moved to ``agentgym/app/`` (issue 24); its old import paths keep working.

``agentgym.<old>`` is the very module ``agentgym.app.<old>`` (one object, so state and monkeypatches are
shared), importing it by the old name warns with the new path, and the kernel never imports the app."""

import importlib
import pathlib
import subprocess
import sys

import pytest

import agentgym
from agentgym._moved import MOVED

OLD_NAMES = sorted(MOVED)


@pytest.mark.parametrize("old", OLD_NAMES)
def test_old_path_is_the_new_module_and_warns(old, monkeypatch):
    new = importlib.import_module(MOVED[old])
    monkeypatch.delitem(sys.modules, old, raising=False)   # import it afresh under the old name
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {MOVED[old]}"):
        module = importlib.import_module(old)
    assert module is new and sys.modules[old] is new
    assert module.__spec__.name == MOVED[old]            # its own spec, not the alias's
    assert getattr(agentgym, old.rsplit(".", 1)[1]) is new


def test_from_old_path_import_names(monkeypatch):
    monkeypatch.delitem(sys.modules, "agentgym.stats", raising=False)
    with pytest.warns(DeprecationWarning, match="agentgym.app.stats"):
        from agentgym.stats import mean_ci
    from agentgym.app.stats import mean_ci as new_mean_ci
    assert mean_ci is new_mean_ci


@pytest.mark.parametrize("module", ["agentgym", "agentgym.cli", "agentgym.app.cli"])
def test_command_runs_under_every_module_name(module, tmp_path):
    r = subprocess.run([sys.executable, "-m", module, "list"], capture_output=True, text=True, timeout=120,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "agentgym/Arithmetic-v0" in r.stdout


def test_kernel_does_not_import_the_app():
    kernel = pathlib.Path(agentgym.__file__).parent
    for path in kernel.glob("*.py"):
        if path.name in ("_moved.py", "__main__.py"):    # the old-path aliases and `python -m agentgym`
            continue
        text = path.read_text()
        assert "agentgym.app" not in text and "from .app" not in text, path.name
