"""Issue 13 through the CLI as a user types it: one rollout config (the learner follows the sampling
temperature), runs that are never overwritten, config errors before any model loads, exit codes,
checkpoints on disk, --import from the current directory, the eval of a run with its own layout."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from agentgym.threads import choose_threads
from agentgym.app.cli import main

TINY = ["model=tiny-random", "groups_per_step=2", "group_size=2", "sampling.max_new_tokens=6", "eval.episodes=2",
        "tensorboard=false"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def _rows(out: Path) -> list[dict[str, str]]:
    with (out / "train_log.csv").open() as f:
        return list(csv.DictReader(f))


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agentgym.app.cli", *args], capture_output=True, text=True,
                          timeout=600, env=ENV, cwd=cwd)


@pytest.mark.parametrize("algo", ["grpo", "ppo", "reinforce"])
def test_learner_recomputes_logprobs_at_the_sampling_temperature(tmp_path, algo):
    """lr=0 and T=0.7: the first update's ratios are exactly 1 (the bug: the learner used T=1)."""
    out = tmp_path / algo
    assert main(["train", *TINY, f"algo={algo}", "steps=1", "optim.lr=0", "sampling.temperature=0.7",
                 f"output_dir={out}"]) == 0
    row = _rows(out)[0]
    assert float(row["train/temperature"]) == pytest.approx(0.7)
    assert abs(float(row["train/approx_kl"])) < 1e-6
    assert float(row["train/ratio_mean"]) == pytest.approx(1.0, abs=1e-5)


def test_a_second_run_never_overwrites_a_finished_one(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", *TINY, "steps=1", f"output_dir={out}"]) == 0
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert main(["train", *TINY, "steps=2", f"output_dir={out}"]) == 2
    err = capsys.readouterr().err
    assert "already holds" in err and "--resume" in err and "--overwrite" in err
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before   # nothing touched
    # --resume continues it (2 steps now), --overwrite replaces it
    assert main(["train", *TINY, "steps=2", f"output_dir={out}", "--resume"]) == 0
    assert [r["step"] for r in _rows(out)] == ["1.0", "2.0"]
    assert main(["train", *TINY, "steps=1", f"output_dir={out}", "--overwrite"]) == 0
    assert [r["step"] for r in _rows(out)] == ["1.0"]
    assert main(["train", *TINY, "steps=1", f"output_dir={out}", "--overwrite", "--resume"]) == 2


def test_a_run_directory_in_use_by_a_live_process_is_refused(tmp_path, capsys):
    """Two processes on one run directory (a second --resume / --overwrite, or two `compare --resume` on the
    same runs) would corrupt or delete the first one's run: refused while its writer lives."""
    from agentgym.runs import LOCK_NAME, _process_start, lock_holder
    out = tmp_path / "run"
    assert main(["train", *TINY, "steps=1", f"output_dir={out}"]) == 0
    assert not (out / LOCK_NAME).exists()          # released when the run finished
    writer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (out / LOCK_NAME).write_text(f"{writer.pid} {_process_start(writer.pid)}\n")
        before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
        capsys.readouterr()
        for extra in (["--overwrite"], ["--resume", "steps=2"]):
            assert main(["train", *TINY, "steps=1", f"output_dir={out}", *extra]) == 2
            err = capsys.readouterr().err
            assert f"in use by a running process (pid {writer.pid})" in err and "Traceback" not in err
        assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before   # nothing touched
        assert lock_holder(out) == writer.pid
    finally:
        writer.kill()
        writer.wait()
    assert lock_holder(out) is None                # the writer died: its lock is stale and ignored
    (out / LOCK_NAME).write_text(f"{writer.pid} 1\n")
    assert main(["train", *TINY, "steps=2", f"output_dir={out}", "--resume"]) == 0
    assert [r["step"] for r in _rows(out)] == ["1.0", "2.0"]


@pytest.mark.parametrize("override, key", [("steps=-3", "steps"), ("group_size=0", "group_size"),
                                           ("sampling.top_p=1.5", "top_p"), ("sampling.temperature=0", "temperature"),
                                           ("optim.lr=-1", "lr"), ("algo=foo", "algo"), ("env=NoSuch-v0", "env"),
                                           ("model=/no/such/model/dir", "model"), ("style=xml", "style"),
                                           ("learner.temperature=0.5", "temperature"), ("backend=tgi", "backend"),
                                           ("eval.episodes=0", "episodes")])
def test_bad_config_values_exit_2_naming_the_key_before_anything_loads(tmp_path, capsys, override, key):
    out = tmp_path / "run"
    assert main(["train", *TINY, override, f"output_dir={out}"]) == 2
    err = capsys.readouterr().err
    assert key in err and "Traceback" not in err and len(err.splitlines()) <= 2
    assert not out.exists()   # refused before the run directory (or a model) was made


def test_other_commands_refuse_a_used_output_dir(tmp_path, capsys):
    used = tmp_path / "used"
    used.mkdir()
    (used / "config.yaml").write_text("model: smollm2\n")
    for cmd in (["sft", "model=tiny-random"], ["dpo", "model=tiny-random"]):
        assert main([*cmd, f"output_dir={used}"]) == 2
        assert "already holds" in capsys.readouterr().err
    assert main(["compare", "--algos", "grpo", "--seeds", "1", "--steps", "1", "--out", str(used), *TINY]) == 2
    assert (used / "config.yaml").read_text() == "model: smollm2\n"


def test_exit_codes_in_a_real_process(tmp_path):
    r = _cli("train", "steps=-3", f"output_dir={tmp_path / 'x'}")
    assert r.returncode == 2 and "steps" in r.stderr and "Traceback" not in r.stderr
    r = _cli("eval", "Arithmetic-v0", "--policy", str(tmp_path / "missing-run"))
    assert r.returncode == 2 and "Traceback" not in r.stderr


def test_checkpoints_keep_resume_state_only_in_the_newest(tmp_path):
    out = tmp_path / "run"
    assert main(["train", *TINY, "algo=grpo", "steps=3", "checkpoint_every=1", "keep_checkpoints=2",
                 f"output_dir={out}"]) == 0
    ckpts = sorted((out / "checkpoints").glob("step_*"))
    assert [c.name for c in ckpts] == ["step_000002", "step_000003"]
    assert "learner" in torch.load(ckpts[-1] / "state.pt", weights_only=False)
    assert "learner" not in torch.load(ckpts[0] / "state.pt", weights_only=False)   # weights only
    out0 = tmp_path / "run0"
    assert main(["train", *TINY, "steps=2", "checkpoint_every=0", f"output_dir={out0}"]) == 0
    assert [c.name for c in (out0 / "checkpoints").glob("step_*")] == ["step_000002"]   # the final one only


def test_eval_of_a_run_uses_its_layout(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", *TINY, "steps=1", "max_obs_tokens=100", "sampling.max_new_tokens=5",
                 f"output_dir={out}"]) == 0
    capsys.readouterr()
    assert main(["eval", "Math-v0", "--policy", str(out), "--episodes", "1", "-e", "difficulty=0"]) == 0
    printed = capsys.readouterr().out
    assert "max_obs_tokens=100" in printed and "max_new_tokens=5" in printed
    assert main(["eval", "Math-v0", "--policy", str(out), "--episodes", "1", "--max-new-tokens", "7",
                 "-e", "difficulty=0"]) == 0
    assert "max_new_tokens=7" in capsys.readouterr().out   # flags still win


def test_import_resolves_from_the_current_directory(tmp_path):
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "envs.py").write_text(textwrap.dedent("""
        import agentgym
        from agentgym.envs.arithmetic import ArithmeticEnv
        agentgym.register("MyArith-v0", entry_point=ArithmeticEnv)
    """))
    env = {k: v for k, v in ENV.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "-m", "agentgym.app.cli", "--import", "mypkg.envs", "list"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    assert "agentgym/MyArith-v0" in r.stdout


def test_thread_choice(monkeypatch):
    assert choose_threads(3) == (3, "--threads")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert choose_threads()[0] == 1
    monkeypatch.delenv("OMP_NUM_THREADS")
    import agentgym.threads as threads   # the choice and its measure (agentgym.app.cli re-exports the choice)
    cores = len(os.sched_getaffinity(0))
    monkeypatch.setattr(threads, "busy_cores_now", lambda: 50.0)
    monkeypatch.setattr(os, "getloadavg", lambda: (50.0, 0.0, 0.0))
    assert choose_threads()[0] == 1            # every core busy: one thread
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    assert choose_threads()[0] == cores        # the load average says idle
    # right after setup.sh the 1-minute average still counts it; the cores idle *now* decide
    monkeypatch.setattr(os, "getloadavg", lambda: (float(cores), 0.0, 0.0))
    monkeypatch.setattr(threads, "busy_cores_now", lambda: 0.1)
    assert choose_threads()[0] == cores
    monkeypatch.setattr(threads, "busy_cores_now", lambda: None)    # no /proc/stat: the load average
    assert choose_threads()[0] == 1
    monkeypatch.setattr(threads, "busy_cores_now", lambda: float(cores))
    monkeypatch.setattr(os, "getloadavg", lambda: (float(cores), 0.0, 0.0))
    n, why = choose_threads()
    assert n == 1 and "busy now" in why


def test_busy_cores_now_sees_a_busy_core():
    """The real /proc/stat measure: a spinning child process shows up as (about) one busy core."""
    import subprocess
    from agentgym.threads import busy_cores_now as _busy_cores_now
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        import time
        time.sleep(0.3)
        busy = _busy_cores_now(0.5)
    finally:
        spin.kill()
        spin.wait()
    assert busy is not None and busy >= 0.7, busy


def test_default_output_dirs_are_versioned_so_the_main_command_can_run_twice(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["train", *TINY, "steps=1"]) == 0
    assert main(["train", *TINY, "steps=1"]) == 0                     # the default dir is taken: runs/train-1
    assert "runs/train-1" in capsys.readouterr().out
    assert (tmp_path / "runs/train/config.yaml").exists() and (tmp_path / "runs/train-1/config.yaml").exists()
    assert main(["train", *TINY, "steps=2", "--resume"]) == 0         # continues the newest
    assert [r["step"] for r in _rows(tmp_path / "runs/train-1")] == ["1.0", "2.0"]
    assert [r["step"] for r in _rows(tmp_path / "runs/train")] == ["1.0"]
    assert main(["train", *TINY, "steps=1", "output_dir=runs/train"]) == 2   # a chosen dir stays protected


def _agentgym(*args: str) -> list[str]:
    return [sys.executable, "-m", "agentgym.app.cli", *args]


def test_ctrl_c_says_how_to_continue_and_the_printed_command_does(tmp_path):
    """As a user types it: Ctrl-C mid-run stops at a whole step, checkpoints it and prints the exact resume
    command; a plain re-run says the run is interrupted; the printed command finishes it; running it again
    says the run is finished and changes nothing."""
    import shlex
    import signal
    import time
    env = {k: v for k, v in ENV.items() if k != "PYTHONPATH"}
    cmd = ["train", *TINY, "steps=40", "checkpoint_every=0", "--threads", "1"]
    proc = subprocess.Popen(_agentgym(*cmd), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    log = tmp_path / "runs/train/train_log.csv"
    deadline = time.monotonic() + 600
    try:
        while not (log.exists() and len(_rows(tmp_path / "runs/train")) >= 1):
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            assert time.monotonic() < deadline
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err and "Continue with:" in err, err[-2000:]
    steps_done = len(_rows(tmp_path / "runs/train"))
    ckpts = sorted((tmp_path / "runs/train/checkpoints").glob("step_*[0-9]"))
    assert [c.name for c in ckpts] == [f"step_{steps_done:06d}"]          # the last whole step, saved
    printed = err.split("Continue with:", 1)[1].strip().splitlines()[0]
    words = shlex.split(printed)
    assert words[0] == "agentgym" and "--resume" in words and "output_dir=runs/train" in words

    # a plain re-run starts afresh elsewhere, and says how to continue the interrupted one
    r = subprocess.run(_agentgym("train", *TINY, "steps=1", "--threads", "1"), cwd=tmp_path, capture_output=True,
                       text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "runs/train holds an interrupted run" in r.stdout and "--resume" in r.stdout

    # the printed command continues it (to fewer steps here, to keep the test short)
    resume = [w for w in words[1:] if not w.startswith("steps=")] + [f"steps={steps_done + 1}"]
    r = subprocess.run(_agentgym(*resume), cwd=tmp_path, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "resumed from" in r.stdout
    assert [float(x["step"]) for x in _rows(tmp_path / "runs/train")] == [float(i) for i in range(1, steps_done + 2)]

    # --resume on the finished run: says so, touches nothing
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "runs/train").rglob("*") if p.is_file()}
    r = subprocess.run(_agentgym(*resume), cwd=tmp_path, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0 and "is finished" in r.stdout and "nothing was changed" in r.stdout, r.stdout + r.stderr
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "runs/train").rglob("*") if p.is_file()} == before


def test_resume_picks_the_newest_run_that_has_a_checkpoint(tmp_path):
    from agentgym.runs import default_output_dir
    (tmp_path / "train" / "checkpoints" / "step_000002").mkdir(parents=True)
    (tmp_path / "train-1").mkdir()
    (tmp_path / "train-1" / "config.yaml").write_text("steps: 3\n")        # stopped before any checkpoint
    has_ckpt = lambda p: any((p / "checkpoints").glob("step_*"))          # noqa: E731
    assert default_output_dir(tmp_path / "train", resume=True, resumable=has_ckpt) == tmp_path / "train"
    assert default_output_dir(tmp_path / "train", resume=True) == tmp_path / "train-1"   # without: the newest
    assert default_output_dir(tmp_path / "none", resume=True, resumable=has_ckpt) == tmp_path / "none"
