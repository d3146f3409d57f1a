"""The test helper that kills a run once it has written a checkpoint: it kills for real, and a run that
ends on its own first fails the test with what the run printed."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from helpers_processes import kill_once_written


def test_kill_once_written_kills_the_whole_group_once_the_file_exists(tmp_path):
    flag, pidfile = tmp_path / "written", tmp_path / "pid"
    script = ("import os, pathlib, subprocess, sys, time\n"
              "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
              f"pathlib.Path({str(pidfile)!r}).write_text(str(child.pid))\n"
              f"pathlib.Path({str(flag)!r}).write_text('x')\n"
              "time.sleep(120)\n")
    start = time.monotonic()
    kill_once_written([sys.executable, "-c", script], flag, os.environ)
    assert time.monotonic() - start < 60
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:          # the grandchild (another process of the group) is gone too
        stat = Path(f"/proc/{child}/stat")
        if not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":   # gone, or dead and unreaped
            break
        time.sleep(0.05)
    else:
        pytest.fail("the run's child process outlived the kill")


def test_a_run_that_ends_before_the_file_fails_with_its_output(tmp_path):
    script = "import sys; print('loading the model'); sys.exit('RuntimeError: gloo connect failed')"
    with pytest.raises(AssertionError) as e:
        kill_once_written([sys.executable, "-c", script], tmp_path / "never", os.environ)
    msg = str(e.value)
    assert "exit code 1" in msg and "loading the model" in msg and "gloo connect failed" in msg


def test_a_run_that_ended_early_once_is_started_again_in_an_emptied_folder_with_a_warning(tmp_path):
    out, flag, tries = tmp_path / "run", tmp_path / "run" / "written", tmp_path / "tries"
    script = ("import pathlib, sys, time\n"
              f"tries = pathlib.Path({str(tries)!r}); n = int(tries.read_text()) if tries.exists() else 0\n"
              "tries.write_text(str(n + 1))\n"
              f"out = pathlib.Path({str(out)!r})\n"
              "if n == 0:\n"
              "    out.mkdir(); (out / 'partial').write_text('x'); sys.exit('first try: Connection reset by peer')\n"
              "assert not out.exists(), 'the folder was not emptied'\n"
              "out.mkdir(); (out / 'written').write_text('x'); time.sleep(120)\n")
    with pytest.warns(RuntimeWarning, match=r"(?s)started again: the run ended .*Connection reset by peer"):
        kill_once_written([sys.executable, "-c", script], flag, os.environ, out_dir=out)
    assert tries.read_text() == "2" and flag.exists() and not (out / "partial").exists()


def test_a_run_that_ends_early_twice_fails_the_test(tmp_path):
    script = "import sys; sys.exit('RuntimeError: broken every time')"
    with pytest.warns(RuntimeWarning), pytest.raises(AssertionError, match="broken every time"):
        kill_once_written([sys.executable, "-c", script], tmp_path / "never", os.environ, out_dir=tmp_path / "run")
