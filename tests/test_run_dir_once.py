"""The run directory is prepared once per run (issue 24): the command line prepares it before the slow
model load and the code it calls does not prepare it again; ``Trainer`` used from Python without the
command line still prepares its own."""

import pytest

import agentgym.runs as runs
from agentgym.app.cli import main
from agentgym.runs import RunDirError

TINY = ["model=tiny-random", "algo=grpo", "steps=1", "groups_per_step=1", "group_size=2", "sampling.max_new_tokens=4",
        "eval.episodes=1", "tensorboard=false", "env=Arithmetic-v0", "env_kwargs={hard_fraction: 0.0, max_turns: 1}"]


@pytest.fixture
def prepared_dirs(monkeypatch):
    """Every prepare_output_dir call's directory, in order."""
    calls = []
    real = runs.prepare_output_dir

    def counting(path, **kw):
        calls.append(str(path))
        return real(path, **kw)
    monkeypatch.setattr(runs, "prepare_output_dir", counting)
    return calls


def test_train_prepares_its_run_directory_once(tmp_path, prepared_dirs):
    out = tmp_path / "run"
    assert main(["train", *TINY, f"output_dir={out}", "--threads", "1"]) == 0
    assert prepared_dirs == [str(out)]
    assert (out / "config.yaml").exists()


@pytest.mark.parametrize("command", [["sft", "data.episodes=2", "optim.max_steps=1", "optim.batch_size=2"]])
def test_sft_prepares_its_run_directory_once(tmp_path, prepared_dirs, command):
    out = tmp_path / "sft"
    assert main([*command, "model=tiny-random", "env=Arithmetic-v0", f"output_dir={out}", "--threads", "1"]) == 0
    assert prepared_dirs == [str(out)]


@pytest.mark.parametrize("command", ["sft", "dpo"])
def test_a_used_directory_is_refused_before_anything_is_prepared(tmp_path, prepared_dirs, capsys, command):
    used = tmp_path / "used"
    used.mkdir()
    (used / "notes.txt").write_text("mine")
    assert main([command, "model=tiny-random", f"output_dir={used}"]) == 2
    assert "already holds" in capsys.readouterr().err
    assert prepared_dirs == [] and (used / "notes.txt").read_text() == "mine"


def test_trainer_from_python_prepares_its_own(tmp_path):
    from agentgym.algorithms.loop.train_config import TrainConfig
    from agentgym.algorithms.loop.trainer import Trainer
    from agentgym.config import load_config
    used = tmp_path / "used"
    used.mkdir()
    (used / "notes.txt").write_text("mine")
    cfg = load_config(TrainConfig, overrides=[*TINY, f"output_dir={used}"])
    with pytest.raises(RunDirError, match="already holds"):
        Trainer(cfg).train()
    assert (used / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("command", ["train", "sft", "dpo"])
def test_an_output_dir_that_cannot_be_made_is_said_before_anything_loads(tmp_path, prepared_dirs, capsys, command):
    (tmp_path / "afile").write_text("a file where a folder would go")
    assert main([command, "model=tiny-random", f"output_dir={tmp_path / 'afile' / 'run'}"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == f"error: RunDirError: output_dir {tmp_path / 'afile' / 'run'} cannot be " \
        f"made: {tmp_path / 'afile'} is a file, not a directory"
    assert "Loading weights" not in err and (tmp_path / "afile").is_file()


def test_a_failing_mkdir_is_a_run_dir_error(tmp_path, monkeypatch):
    from pathlib import Path

    def refuse(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(Path, "mkdir", refuse)
    with pytest.raises(RunDirError, match=r"output_dir .*new_run cannot be made: Permission denied"):
        runs.prepare_output_dir(tmp_path / "new_run")
