"""What a new user on a fresh clone ran into (issue 48, item 6), each pinned as the user meets it: the
``agentgym`` command in a subprocess, a real (tiny-random) model where one is needed. And the old import
paths of the app modules (issue 48, item 3) are gone: one path per module."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

import agentgym
from agentgym.app.cli import main
from agentgym.app.cli_support import parse_kv
from agentgym.config import apply_overrides, load_config

TINY = ["model=tiny-random", "steps=1", "groups_per_step=2", "group_size=2", "sampling.max_new_tokens=6",
        "eval.episodes=2", "tensorboard=false"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "COLUMNS": "200", "NO_COLOR": "1"}
ENV.pop("PYTHONPATH", None)

SHAPERS = textwrap.dedent('''
    from agentgym.rewards import shaper


    @shaper("brevity", terminal=True)
    def brevity(event):
        return 1.0 if 0 < len((event.final_answer or "").split()) <= 3 else 0.0


    @shaper("broken")
    def broken(event):          # passes every check a config can make; fails on the first step it scores
        return "not a number"
''')


def agentgym_cli(*args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agentgym", *args], capture_output=True, text=True, env=ENV,
                          cwd=cwd, timeout=timeout, stdin=subprocess.DEVNULL)


def last_line(r: subprocess.CompletedProcess) -> str:
    return r.stderr.strip().splitlines()[-1]


@pytest.fixture
def user_dir(tmp_path: Path) -> Path:
    """A user's folder: their shaper package ``mypkg`` next to them."""
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "shapers.py").write_text(SHAPERS)
    return tmp_path


# ------------------------------------------------------------------ 1. a late config error blocks its own fix
def test_a_shaper_or_term_typo_fails_before_the_model_and_the_fixed_run_uses_the_same_folder(user_dir):
    train = ["train", "env=Arithmetic-v0", *TINY, "--threads", "1"]
    for typo, named, where in [  # a chosen folder, and the default one
            ("env_kwargs.reward=mypkg.shaperz:brevity", "no module named 'mypkg.shaperz'", ["output_dir=runs/typo"]),
            ("env_kwargs.reward=mypkg.shaperz:brevity", "no module named 'mypkg.shaperz'", []),
            ("env_kwargs.reward.nosuchterm=1", "unknown reward terms ['nosuchterm']", ["output_dir=runs/typo"])]:
        r = agentgym_cli(*train, typo, *where, cwd=user_dir)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
        assert last_line(r).startswith("error: ConfigError: env_kwargs: ") and named in last_line(r)
        assert "[train]" not in r.stdout and "torch threads" not in r.stdout   # nothing loaded, nothing begun
        assert not (user_dir / "runs").exists()                                 # no run folder made

    # a shaper that only fails when it scores: the run stops in its first eval, before step 1 ...
    r = agentgym_cli(*train, "env_kwargs.reward=mypkg.shapers:broken", "output_dir=runs/typo", cwd=user_dir)
    assert r.returncode == 2 and "reward term 'broken'" in last_line(r), r.stderr[-2000:]
    assert "stopped before its first step: removed config.yaml" in r.stdout
    assert list((user_dir / "runs" / "typo").iterdir()) == []                  # ... and leaves nothing behind

    # the corrected command, in the same folder, with the YAML mapping the docs show
    reward = "{correct: 1, mypkg.shapers:brevity: 0.1}"
    r = agentgym_cli(*train, f"env_kwargs.reward={reward}", "output_dir=runs/typo", cwd=user_dir)
    assert r.returncode == 0, r.stderr[-2000:]
    run = user_dir / "runs" / "typo"
    assert yaml.safe_load((run / "config.yaml").read_text())["env_kwargs"]["reward"] == {
        "correct": 1, "mypkg.shapers:brevity": 0.1}
    with (run / "train_log.csv").open() as f:
        assert "rollout/reward/brevity" in next(csv.DictReader(f))
    assert sorted(p.name for p in (user_dir / "runs").iterdir()) == ["typo"]   # no runs/train-1 either

    # eval reads the same YAML value after -e (it used to want JSON), as train read it above
    r = agentgym_cli("eval", "Arithmetic-v0", "--policy", "oracle", "--episodes", "2", "--threads", "1",
                     "-e", f"reward={reward}", "--json", "eval.json", cwd=user_dir)
    assert r.returncode == 0, r.stderr[-2000:]
    result = json.loads((user_dir / "eval.json").read_text())
    assert result["env_kwargs"]["reward"] == {"correct": 1, "mypkg.shapers:brevity": 0.1}
    assert result["metrics"]["reward/brevity"] == pytest.approx(0.1)   # the oracle answers with one number


def test_eval_checks_a_reward_before_the_policy_loads(user_dir):
    r = agentgym_cli("eval", "Arithmetic-v0", "--policy", "tiny-random", "--threads", "1",
                     "-e", "reward={nosuchterm: 1}", cwd=user_dir)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert last_line(r).startswith("error: ConfigError: env_kwargs: weights given for unknown reward terms")
    assert "torch threads" not in r.stdout + r.stderr                            # before anything loaded


# ------------------------------------------------------------------ 2. a local-looking path that does not exist
def test_a_missing_run_folder_is_said_at_once_as_a_local_path(tmp_path):
    (tmp_path / "runs").mkdir()
    env = {k: v for k, v in ENV.items() if k != "HF_HUB_OFFLINE"}   # not offline: no Hub retries either way
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "agentgym", "eval", "Math-v0", "--policy", "runs/nope", "--threads", "1"],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120, stdin=subprocess.DEVNULL)
    took = time.monotonic() - t0
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert last_line(r).startswith("error: ConfigError: model: model 'runs/nope': treated as a local path")
    assert took < 5, f"{took:.1f} s"


@pytest.mark.parametrize("spec, how", [("runs/nope", "local path (its first folder 'runs' exists here)"),
                                       ("./nope", "local path (it starts with '.')"),
                                       ("~/nope", "local path (it starts with '~')"),
                                       ("a/b/c", "local path (it has more folders"),
                                       ("some-org/no-model", "hub id; HF_HUB_OFFLINE is set")])
def test_local_or_hub_is_decided_by_looking_and_the_error_says_which(spec, how, tmp_path, monkeypatch):
    import huggingface_hub.constants as hub_constants

    from agentgym.policies.models import resolve_model
    (tmp_path / "runs").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path / "hub"))   # an empty cache
    with pytest.raises(FileNotFoundError) as e:
        resolve_model(spec)
    assert f"model {spec!r}" in str(e.value) and f"treated as a {how}" in str(e.value)


# ------------------------------------------------------------------ 3. one parser for KEY=VALUE everywhere
@pytest.mark.parametrize("text", ["{exact_match: 1, brevity: 0.1}", '{"exact_match": 1}', "3", "[1, 2]", "yes",
                                  "mypkg.shapers:brevity", "1.5e-3"])
def test_eval_env_kwargs_and_train_overrides_read_a_value_alike(text):
    assert parse_kv([f"reward={text}"])["reward"] == apply_overrides({}, [f"reward={text}"])["reward"]


# ------------------------------------------------------------------ 4. the progress bar at Ctrl-C
def test_the_bar_counts_the_step_a_ctrl_c_waited_for(tmp_path, capsys):
    """Ctrl-C during an update is held until the update is in (a whole step); the bar then shows that step,
    as the "interrupted at step N" line does (it showed one fewer)."""
    from agentgym.algorithms.loop.train_config import TrainConfig
    from agentgym.algorithms.loop.trainer import Trainer
    from agentgym.algorithms.loop.run_control import TrainingInterrupted
    cfg = load_config(TrainConfig, None, [*TINY, "env=Arithmetic-v0", "steps=3", "eval.episodes=1",
                                          f"output_dir={tmp_path / 'run'}"])
    trainer = Trainer(cfg)
    real_update, bars = trainer.learner.update, []

    def update_then_ctrl_c(trajectories):           # the real update, then a real SIGINT, as a user's Ctrl-C
        out = real_update(trajectories)
        bars.append(trainer._bar)
        signal.raise_signal(signal.SIGINT)
        return out
    trainer.learner.update = update_then_ctrl_c
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(TrainingInterrupted) as stop:
            trainer.train()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert stop.value.step == 1 and bars[-1].n == 1
    shown = [line for line in capsys.readouterr().err.replace("\r", "\n").splitlines() if "/3 [" in line]
    assert shown and "1/3 [" in shown[-1], shown[-3:]                  # the bar's last state: step 1 of 3


# ------------------------------------------------------------------ 5. help says where the knobs are
@pytest.mark.parametrize("command, which", [("train", "train"), ("sft", "sft"), ("dpo", "dpo"), ("eval", "eval"),
                                            ("compare", "train")])
def test_each_command_help_points_to_its_knobs(command, which, capsys):
    with pytest.raises(SystemExit) as e:
        main([command, "--help"])
    assert e.value.code == 0
    assert f"`agentgym config {which}`" in " ".join(capsys.readouterr().out.split())


# ------------------------------------------------------------------ issue 48 item 3: no old import paths
@pytest.mark.parametrize("old", ["cli", "report", "checking", "app.runs", "app.stats", "app.evaluation"])
def test_the_app_modules_have_one_path(old):
    """The app's modules live only under agentgym.app; run directories, statistics and the evaluation path
    moved from the app to the kernel (agentgym.runs, agentgym.stats, agentgym.evaluation), and their old app
    paths are gone too."""
    r = subprocess.run([sys.executable, "-c", f"import agentgym.{old}"], capture_output=True, text=True, env=ENV,
                       timeout=120)
    assert r.returncode == 1 and f"No module named 'agentgym.{old}'" in r.stderr
    assert not any(type(f).__name__ == "_MovedModuleFinder" for f in sys.meta_path)


@pytest.mark.parametrize("module", ["agentgym", "agentgym.app.cli"])
def test_the_command_runs_as_a_module(module, tmp_path):
    r = subprocess.run([sys.executable, "-m", module, "list"], capture_output=True, text=True, timeout=120,
                       cwd=tmp_path, env=ENV)
    assert r.returncode == 0, r.stderr
    assert "agentgym/Arithmetic-v0" in r.stdout


def test_the_kernel_does_not_import_the_app():
    """The app wires the kernel together; no kernel module imports it (``__main__`` runs the app's ``main``)."""
    import ast
    kernel = Path(agentgym.__file__).parent
    for path in kernel.glob("*.py"):
        if path.name == "__main__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [f"{'.' * node.level}{node.module or ''}"] + [
                    f"{node.module}.{a.name}" for a in node.names if node.module == "agentgym"]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            assert not any(n.startswith(("agentgym.app", ".app")) for n in names), (path.name, names)
