"""One reward-shaper path from plain data: ``reward={"module.path:attr": weight, ...}`` or
``reward="module.path:attr"`` imports a user's shaper inside the env and adds it beside the default
terms, so configs and command lines (``-e reward=...``, ``env_kwargs.reward=...``) can name it.

Real components throughout: a shaper module written to ``tmp_path``, ``agentgym.make``, the config
loader, and the CLI in a subprocess run from the directory holding ``mypkg/`` as a user would."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

import agentgym
from agentgym.config import load_config, save_config

SHAPERS = textwrap.dedent('''
    """A user's shapers, in every form ``reward=`` accepts (and a few it refuses)."""
    from agentgym.rewards import group_shaper, shaper


    @shaper("brevity", terminal=True)            # terminal: 0 until the last step
    def brevity(event):
        """Reward short final answers."""
        words = len((event.final_answer or "").split())
        return 1.0 if 0 < words <= 3 else 0.0


    def shouting(event):                         # a plain callable: its term is named "shouting"
        return 1.0 if event.action.isupper() else 0.0


    class Politeness:                            # a class: built with no arguments
        name = "polite"

        def __call__(self, event):
            return 1.0 if "please" in event.action.lower() else 0.0


    class NeedsArgs:
        def __init__(self, budget):
            self.name, self.budget = "needs_args", budget

        def __call__(self, event):
            return 0.0


    NOT_A_SHAPER = 3
    clash = shaper("format")(lambda event: 0.0)  # the name of one of Arithmetic-v0's default terms


    @group_shaper("grp")
    def grp(members):
        return [0.0 for _ in members]
''')

ENV_ID = "Arithmetic-v0"
DEFAULT_TERMS = ["correct", "format", "tool_cost", "invalid"]
RUN_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "COLUMNS": "200", "NO_COLOR": "1"}


def write_pkg(root: Path) -> Path:
    (root / "mypkg").mkdir()
    (root / "mypkg" / "__init__.py").write_text("")
    (root / "mypkg" / "shapers.py").write_text(SHAPERS)
    (root / "mypkg" / "broken.py").write_text("import no_such_dependency_xyz\n")
    return root


@pytest.fixture
def pkg(tmp_path, monkeypatch):
    """``mypkg`` importable from ``tmp_path``; forgotten again afterwards (each test imports it afresh)."""
    write_pkg(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m == "mypkg" or m.startswith("mypkg.")]:
        del sys.modules[name]


def answer_correctly(env) -> tuple[float, dict[str, float]]:
    """One episode answered right on the first turn: ``(reward, info["reward_terms"])`` of that step."""
    _, info = env.reset(seed=0)
    gold = info["privileged"]["task"]["answers"][0]
    _, reward, terminated, _, info = env.step(f"<answer>{gold}</answer>")
    assert terminated
    return reward, info["reward_terms"]


def test_import_path_key_adds_a_term_and_plain_keys_still_reweight(pkg):
    env = agentgym.make(ENV_ID, reward={"mypkg.shapers:brevity": 0.2, "format": 0.5})
    assert env.unwrapped.reward.names == DEFAULT_TERMS + ["brevity"]
    reward, terms = answer_correctly(env)
    assert terms["brevity"] == pytest.approx(0.2)        # weight 0.2 x 1 (a one-word answer)
    assert terms["format"] == pytest.approx(0.5)         # re-weighted default term
    assert terms["correct"] == pytest.approx(1.0)        # untouched default term
    assert set(terms) == set(DEFAULT_TERMS) | {"brevity"}
    assert reward == pytest.approx(sum(terms.values()))


def test_string_form_adds_the_shaper_with_weight_one(pkg):
    env = agentgym.make(ENV_ID, reward="mypkg.shapers:brevity")
    reward, terms = answer_correctly(env)
    assert terms["brevity"] == pytest.approx(1.0)
    assert terms["format"] == pytest.approx(0.1)         # defaults keep their default weights
    assert reward == pytest.approx(sum(terms.values()))


def test_a_yaml_weight_read_as_a_string_still_counts(pkg):
    """YAML 1.1 reads ``1e-3`` (no dot) as a string; a weight that is a number in words still counts."""
    assert yaml.safe_load("{mypkg.shapers:brevity: 1e-3}") == {"mypkg.shapers:brevity": "1e-3"}
    env = agentgym.make(ENV_ID, reward=yaml.safe_load("{mypkg.shapers:brevity: 1e-3}"))
    assert env.unwrapped.reward.weights["brevity"] == pytest.approx(1e-3)


def test_plain_callable_and_class_become_named_terms(pkg):
    env = agentgym.make(ENV_ID, reward={"mypkg.shapers:shouting": 0.5, "mypkg.shapers:Politeness": 0.3})
    assert env.unwrapped.reward.names == DEFAULT_TERMS + ["shouting", "polite"]
    env.reset(seed=0)
    _, reward, _, _, info = env.step("PLEASE HELP")                # invalid, shouted, polite
    terms = info["reward_terms"]
    assert terms["shouting"] == pytest.approx(0.5) and terms["polite"] == pytest.approx(0.3)
    assert terms["invalid"] == pytest.approx(-0.1)
    assert reward == pytest.approx(sum(terms.values()))


def test_the_config_keeps_plain_strings_and_the_env_holds_the_shaper(pkg, tmp_path):
    """What the trainer saves as config.yaml is the user's strings, readable back to the same run."""
    from agentgym.algorithms.loop.train_config import TrainConfig
    cfg = load_config(TrainConfig, None,
                      [f"env={ENV_ID}", "env_kwargs.reward={mypkg.shapers:brevity: 0.2, format: 0.5}"])
    assert cfg.env_kwargs == {"reward": {"mypkg.shapers:brevity": 0.2, "format": 0.5}}
    save_config(cfg, tmp_path / "config.yaml")
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert saved["env_kwargs"] == cfg.env_kwargs
    env = agentgym.make(cfg.env, **saved["env_kwargs"])
    assert env.spec.kwargs["reward"] == {"mypkg.shapers:brevity": 0.2, "format": 0.5}   # still plain data
    assert answer_correctly(env)[1]["brevity"] == pytest.approx(0.2)


@pytest.mark.parametrize("reward, error, message", [
    ({"nopkg_xyz.shapers:brevity": 0.2}, ValueError, "no module named 'nopkg_xyz'"),
    ({"mypkg.broken:brevity": 0.2}, ValueError,
     "importing 'mypkg.broken' failed: No module named 'no_such_dependency_xyz'"),
    ({"mypkg.shapers:brevty": 0.2}, ValueError, "'mypkg.shapers' has no attribute 'brevty'; shapers there: "
                                                "NeedsArgs, Politeness, brevity, clash, grp, shouting"),
    ({"mypkg.shapers:NOT_A_SHAPER": 0.2}, TypeError, "is not callable (type int)"),
    ({"mypkg.shapers:NeedsArgs": 0.2}, TypeError, "is a class that cannot be built without arguments"),
    ({"mypkg.shapers:grp": 0.2}, TypeError, "is a group shaper; pass it as group_reward"),
    ({"mypkg.shapers:clash": 0.2}, ValueError, "is named 'format', which a default term already uses"),
    ({"brevity": 0.2}, ValueError, "weights given for unknown reward terms ['brevity']; terms are "
                                   "['correct', 'format', 'tool_cost', 'invalid'] (a custom shaper is named by "
                                   "import path, 'module.path:attr')"),
    ({"mypkg.shapers:brevity": "lots"}, ValueError,
     "reward weight for 'mypkg.shapers:brevity' must be a finite number, got 'lots'"),
    ({"format": True}, ValueError, "reward weight for 'format' must be a finite number, got True"),
    ({"format": float("nan")}, ValueError, "must be a finite number, got nan"),
    ("brevity", ValueError, "a string reward names a shaper by import path 'module.path:attr'"),
    ("mypkg.shapers:", ValueError, "expected an import path 'module.path:attr'"),
    ("{mypkg.shapers:brevity: 0.2}", ValueError, "looks like a mapping given as a string: pass a dict in Python"),
])
def test_mistakes_are_one_clear_line(pkg, reward, error, message):
    with pytest.raises(error) as e:
        agentgym.make(ENV_ID, reward=reward)
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_the_same_shaper_twice_is_refused(pkg):
    (pkg / "mypkg" / "again.py").write_text("from mypkg.shapers import brevity as short\n")
    with pytest.raises(ValueError, match="named 'brevity', which 'mypkg.shapers:brevity' already uses"):
        agentgym.make(ENV_ID, reward={"mypkg.shapers:brevity": 0.2, "mypkg.again:short": 0.1})


# ------------------------------------------------------------------ the command line, as a user types it
def cli(*args: str, cwd: Path, exe: str | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    cmd = [exe] if exe else [sys.executable, "-m", "agentgym.app.cli"]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=timeout, env=RUN_ENV, cwd=cwd)


def test_eval_reports_the_imported_term(tmp_path):
    write_pkg(tmp_path)
    out = cli("eval", ENV_ID, "--policy", "oracle", "--episodes", "2", "-e", 'reward={"mypkg.shapers:brevity": 0.2}',
              "--json", "out.json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "reward/brevity" in out.stdout
    result = json.loads((tmp_path / "out.json").read_text())
    assert result["metrics"]["reward/brevity"] == pytest.approx(0.2)   # the oracle answers with one number
    assert result["metrics"]["reward/correct"] == pytest.approx(1.0)
    assert result["env_kwargs"]["reward"] == {"mypkg.shapers:brevity": 0.2}
    for t in result["trajectories"]:
        assert t["reward_terms"][-1]["brevity"] == pytest.approx(0.2)


def test_a_typo_on_the_command_line_is_one_line_not_a_traceback(tmp_path):
    write_pkg(tmp_path)
    out = cli("check", ENV_ID, "--actions", "5", "-e", "reward=mypkg.shapers:brevty", cwd=tmp_path)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1] == (
        "error: ValueError: reward shaper 'mypkg.shapers:brevty': 'mypkg.shapers' has no attribute 'brevty'; "
        "shapers there: NeedsArgs, Politeness, brevity, clash, grp, shouting")


def test_train_from_the_console_script_logs_the_term(tmp_path):
    """The ``agentgym`` script (unlike ``python -m``) does not put the current directory on the path:
    the env does, as ``--import`` does. String form: weight 1."""
    exe = shutil.which("agentgym") or str(Path(sys.executable).with_name("agentgym"))
    if not Path(exe).exists():
        pytest.skip("the agentgym console script is not installed")
    write_pkg(tmp_path)
    run = tmp_path / "run"
    out = cli("train", f"env={ENV_ID}", "env_kwargs.reward=mypkg.shapers:brevity", "model=tiny-random", "steps=1",
              "groups_per_step=2", "group_size=2", "sampling.max_new_tokens=6", "eval.episodes=2", "tensorboard=false",
              f"output_dir={run}", cwd=tmp_path, exe=exe)
    assert out.returncode == 0, out.stderr[-3000:]
    with (run / "train_log.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert "rollout/reward/brevity" in rows[0]
    assert {f"rollout/reward/{n}" for n in DEFAULT_TERMS} <= set(rows[0])
    assert yaml.safe_load((run / "config.yaml").read_text())["env_kwargs"] == {"reward": "mypkg.shapers:brevity"}
