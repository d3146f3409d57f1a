"""The ``agentgym`` command line, run in a subprocess like a user would."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import gymnasium as gym
import pytest

import agentgym  # noqa: F401  (registers the built-in envs for the in-process gold lookups)

PLUGIN = textwrap.dedent('''
    """A user's own envs, registered the README way."""
    import agentgym
    from agentgym import AgentEnv, Reward, Transition
    from agentgym.parsing import first_tag
    from agentgym.rewards import ExactMatch, InvalidActionPenalty


    class EchoEnv(AgentEnv):
        num_tasks = 2
        WORDS = ("alpha", "beta")

        def get_task(self, index):
            return {"word": self.WORDS[index], "answers": [self.WORDS[index]]}

        def initial_messages(self, task):
            return [{"role": "user", "content": f"Say {task['word']} inside <answer></answer>."}]

        def transition(self, action):
            tag = first_tag(action, ("answer",))
            if tag is None:
                return self.invalid("Reply with <answer>WORD</answer>.")
            return Transition([], "answer", parsed=tag, terminated=True, answer=tag.content)

        def default_reward(self):
            return Reward([ExactMatch(), (InvalidActionPenalty(), 0.1)])


    class BrokenEnv(EchoEnv):
        def transition(self, action):
            if "<" in action:
                raise RuntimeError("cannot handle markup")
            return super().transition(action)


    agentgym.register("Echo-v0", entry_point=EchoEnv)
    agentgym.register("Broken-v0", entry_point=BrokenEnv)
''')


def run_cli(*args: str, stdin: str = "", pythonpath: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(pythonpath), env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "agentgym.app.cli", *args], input=stdin, capture_output=True,
                          text=True, timeout=timeout, env=env)


@pytest.fixture
def plugin_dir(tmp_path):
    (tmp_path / "my_agentgym_plugin.py").write_text(PLUGIN)
    return tmp_path


def gold_for_seed(seed: int) -> dict:
    env = gym.make("agentgym/Arithmetic-v0")
    _, info = env.reset(seed=seed)
    return info["privileged"]["task"]


def test_list_shows_arithmetic():
    out = run_cli("list")
    assert out.returncode == 0, out.stderr
    line = next(l for l in out.stdout.splitlines() if l.startswith("agentgym/Arithmetic-v0"))
    assert line.split() == ["agentgym/Arithmetic-v0", "agentgym.envs.arithmetic:ArithmeticEnv"]
    assert "Echo-v0" not in out.stdout


def test_console_script_is_installed():
    exe = shutil.which("agentgym") or str(Path(sys.executable).with_name("agentgym"))
    assert Path(exe).exists(), "the agentgym console script is not installed"
    out = subprocess.run([exe, "list"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "agentgym/Arithmetic-v0" in out.stdout


def test_check_passes():
    out = run_cli("check", "agentgym/Arithmetic-v0", "--actions", "200")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "check_env: passed" in out.stdout
    assert re.search(r"agentgym/Arithmetic-v0: 200 fuzzed actions over \d+ episodes: OK", out.stdout), out.stdout


def test_check_with_env_kwargs_and_short_id():
    out = run_cli("check", "Arithmetic-v0", "--actions", "50", "-e", "max_turns=2", "-e", "split=test")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "50 fuzzed actions" in out.stdout


def test_play_through_stdin():
    task = gold_for_seed(0)
    call = json.dumps({"name": "calculator", "arguments": {"expression": task["expression"]}})
    stdin = f"<tool_call>{call}</tool_call>\n\nThe result:\n<answer>{task['answers'][0]}</answer>\n\n"
    out = run_cli("play", "Arithmetic-v0", "--seed", "0", stdin=stdin)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert task["question"] in text
    assert re.search(r"turn 1: tool_call,\s+reward\s+-0\.050", text), text
    assert re.search(r"turn 2: answer,\s+reward\s+\+1\.100", text), text
    assert re.search(r"tool_cost\s+│\s+-0\.050", text)
    assert re.search(r"correct\s+│\s+\+1\.000", text)
    assert re.search(r"format\s+│\s+\+0\.100", text)
    assert "episode over (terminated): success=True return=+1.050 turns=2" in text


def test_play_invalid_action_then_eof():
    out = run_cli("play", "Arithmetic-v0", "--seed", "1", stdin="just words\n\n")
    assert out.returncode == 0, out.stderr
    assert "Invalid action: no <tool_call> or <answer> found." in out.stdout
    assert re.search(r"invalid\s+│\s+-0\.100", out.stdout)
    assert out.stdout.rstrip().endswith("bye")
    assert "episode over" not in out.stdout


def test_play_truncated_episode():
    out = run_cli("play", "Arithmetic-v0", "--seed", "2", "-e", "max_turns=1", stdin="no idea\n\n")
    assert out.returncode == 0, out.stderr
    assert "episode over (truncated): success=False return=-0.100 turns=1" in out.stdout


def test_import_makes_user_env_listable(plugin_dir):
    out = run_cli("--import", "my_agentgym_plugin", "list", pythonpath=plugin_dir)
    assert out.returncode == 0, out.stderr
    listed = [l.split()[0] for l in out.stdout.splitlines() if l.strip()]
    assert {"agentgym/Arithmetic-v0", "agentgym/Echo-v0", "agentgym/Broken-v0"} <= set(listed)
    assert re.search(r"agentgym/Echo-v0\s+EchoEnv", out.stdout)


def test_import_makes_user_env_playable(plugin_dir):
    # first run: look at the task for seed 0, try an invalid action, then quit with EOF
    out = run_cli("--import", "my_agentgym_plugin", "play", "Echo-v0", "--seed", "0", stdin="hmm\n\n",
                  pythonpath=plugin_dir)
    assert out.returncode == 0, out.stderr
    assert "Reply with <answer>WORD</answer>." in out.stdout
    assert re.search(r"invalid\s+│\s+-0\.100", out.stdout)
    word = re.search(r"Say (alpha|beta) inside", out.stdout).group(1)
    # second run, same seed: answer it
    out = run_cli("--import", "my_agentgym_plugin", "play", "Echo-v0", "--seed", "0",
                  stdin=f"<answer>{word}</answer>\n\n", pythonpath=plugin_dir)
    assert out.returncode == 0, out.stderr
    assert f"Say {word} inside" in out.stdout
    assert re.search(r"exact_match\s+│\s+\+1\.000", out.stdout)
    assert "episode over (terminated): success=True return=+1.000 turns=1" in out.stdout


def test_import_user_env_check_and_failure_exit_code(plugin_dir):
    out = run_cli("--import", "my_agentgym_plugin", "check", "agentgym/Echo-v0", "--actions", "100",
                  pythonpath=plugin_dir)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "check_env: passed" in out.stdout and "100 fuzzed actions" in out.stdout and ": OK" in out.stdout
    out = run_cli("--import", "my_agentgym_plugin", "check", "Broken-v0", "--actions", "100", pythonpath=plugin_dir)
    assert out.returncode == 1
    assert "FAILURES" in out.stdout and "cannot handle markup" in out.stdout


def test_unknown_env_and_missing_command():
    out = run_cli("play", "NoSuch-v0", stdin="")
    assert out.returncode != 0
    assert "NoSuch-v0" in out.stderr and "Arithmetic-v0" in out.stderr
    out = run_cli()
    assert out.returncode == 2
    assert "usage: agentgym" in out.stderr


def test_sandbox_status_and_help():
    res = run_cli("sandbox", "status")
    assert res.returncode == 0, res.stderr
    assert "default:" in res.stdout.lower() and "security boundary" in res.stdout
    res = run_cli("sandbox", "status", "--json")
    status = json.loads(res.stdout)
    assert set(status["backends"]) == {"docker", "bwrap", "subprocess"}
    assert status["default"] in ("docker", "bwrap") and status["security_boundary"] is True
    assert status["backends"]["subprocess"]["security_boundary"] is False
    res = run_cli("sandbox", "--help")
    assert res.returncode == 0 and "build-image" in res.stdout
    res = run_cli("sandbox", "build-image", "--help")
    assert res.returncode == 0 and "--if-missing" in res.stdout
    res = run_cli("sandbox", "bogus")
    assert res.returncode == 2 and "invalid choice" in res.stderr


@pytest.mark.parametrize("argv", [["check", "Nope-v0"], ["play", "Nope-v0"], ["eval", "Nope-v0", "--policy", "oracle"],
                                  ["train", "env=Nope-v0"], ["sft", "env=Nope-v0"], ["dpo", "env=Nope-v0"]])
def test_an_unknown_env_is_a_usage_error_listing_the_ids_in_every_command(argv):
    r = subprocess.run([sys.executable, "-m", "agentgym.app.cli", *argv], capture_output=True, text=True, timeout=300,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 2, (argv, r.returncode, r.stderr[-500:])
    err = r.stderr.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert "no env 'agentgym/Nope-v0'" in err and "agentgym/Arithmetic-v0" in err and "--import" in err


def test_every_option_of_every_command_has_help():
    import argparse

    from agentgym.app.parser import build_parser

    missing = []

    def walk(parser: argparse.ArgumentParser, path: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{path} {name}")
            elif not isinstance(action, argparse._HelpAction) and not action.help:
                missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}")

    walk(build_parser(), "agentgym")
    assert missing == []


# --- `--KEY VALUE` as a config override (as HF-style command lines take them) ---

def test_unknown_options_become_overrides_only_after_the_subcommand():
    from agentgym.app.cli import flags_as_overrides

    argv = ["--threads", "1", "train", "--steps", "5", "--optim.lr=1e-5", "--max-staleness", "-1",
            "--learner.skip-no-signal", "seed=3", "--fsdp", "--config", "c.yaml"]
    unknown = ["--steps", "--optim.lr=1e-5", "--max-staleness", "--learner.skip-no-signal", "--fsdp"]
    assert flags_as_overrides(argv, unknown, "train") == [
        "--threads", "1", "train", "steps=5", "optim.lr=1e-5", "max_staleness=-1", "learner.skip_no_signal=true",
        "seed=3", "fsdp=true", "--config", "c.yaml"]
    # a KEY=VALUE after a bare option is not its value; nothing after `--` is rewritten
    assert flags_as_overrides(["train", "--fsdp", "steps=2", "--", "--x"], ["--fsdp", "--x"], "train") == [
        "train", "fsdp=true", "steps=2", "--", "--x"]


def test_an_option_is_never_an_abbreviation_of_another():
    from agentgym.app.parser import build_parser
    from agentgym.app.cli import parse_command_line

    args, extra = parse_command_line(build_parser(), ["compare", "--seed", "3", "--algos", "grpo"])
    assert (args.seeds, args.overrides, extra) == ("2", ["seed=3"], [])    # the config's seed, not --seeds 3
    args, _ = parse_command_line(build_parser(), ["train", "--over"])
    assert args.overwrite is False and args.overrides == ["over=true"]     # then: unknown config key over


def test_train_takes_config_keys_as_options(tmp_path):
    import yaml

    from agentgym.app.cli import main

    out = tmp_path / "run"
    argv = ["train", "--model", "tiny-random", "--algo=grpo", "--steps", "1", "--groups-per-step", "1", "--group-size=2",
            "--optim.lr", "3e-6", "sampling.max_new_tokens=4", "eval.episodes=1", "--tensorboard", "false",
            "env=Arithmetic-v0", "env_kwargs={hard_fraction: 0.0, max_turns: 1}", "--output-dir", str(out),
            "--threads", "1"]
    assert main(argv) == 0
    cfg = yaml.safe_load((out / "config.yaml").read_text())
    assert (cfg["steps"], cfg["groups_per_step"], cfg["group_size"], cfg["optim"]["lr"]) == (1, 1, 2, 3e-6)


@pytest.mark.parametrize("argv, message", [
    (["train", "--steps", "abc"], "steps: expected int, got str ('abc')"),
    (["train", "--steps", "-1"], "steps must be >= 1, got -1"),
    (["train", "--optim.lr=foo"], "optim.lr: expected float"),
    (["train", "--stepz", "3"], "unknown config key(s) stepz"),
    (["compare", "--algos", "grpo", "--seeds", "1", "--optim.lr", "foo"], "optim.lr: expected float"),
    (["eval", "Arithmetic-v0", "--groupsize", "3"], "unknown config key(s) groupsize"),
])
def test_a_bad_config_option_is_a_one_line_usage_error(argv, message):
    r = run_cli(*argv, timeout=300)
    err = r.stderr.strip()
    assert r.returncode == 2 and "Traceback" not in err and len(err.splitlines()) == 1, (r.returncode, err)
    assert message in err


def test_an_unknown_option_of_a_command_without_overrides_says_so():
    r = run_cli("list", "--bogus")
    assert r.returncode == 2 and "unrecognized arguments: --bogus" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("train", "-x")      # a short option is not read as a config key: the error says how keys are set
    assert r.returncode == 2 and "unrecognized arguments: -x (config keys are set as KEY=VALUE or --KEY VALUE; " \
        "`agentgym config train` lists them)" in r.stderr


def test_eval_makes_the_folder_of_its_json_and_says_a_bad_output_path_before_it_runs(tmp_path):
    out = tmp_path / "new" / "sub" / "eval.json"
    r = run_cli("eval", "Arithmetic-v0", "--policy", "oracle", "--episodes", "1", "--json", str(out), "--threads", "1")
    assert r.returncode == 0, r.stderr[-800:]
    assert json.loads(out.read_text())["env"] == "agentgym/Arithmetic-v0"
    r = run_cli("eval", "Arithmetic-v0", "--policy", "oracle", "--episodes", "1", "--json", str(tmp_path))
    assert r.returncode == 2 and r.stderr.strip() == f"error: ConfigError: json: {tmp_path} is a directory; give a file name"
    assert "eval agentgym" not in r.stderr      # said before any episode ran
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)                          # a folder that cannot be written (root writes anyway: /proc then)
    target = locked / "eval.html" if not os.access(locked, os.W_OK) else Path("/proc/eval.html")
    r = run_cli("eval", "Arithmetic-v0", "--policy", "oracle", "--episodes", "1", "--html", str(target))
    assert r.returncode == 2 and r.stderr.strip().startswith(f"error: ConfigError: html: cannot write {target} (")
    assert "eval agentgym" not in r.stderr and not target.exists()
    kept = tmp_path / "kept.json"
    kept.write_text("an earlier eval")
    r = run_cli("eval", "Arithmetic-v0", "--policy", str(tmp_path / "no-model"), "--episodes", "1", "--json", str(kept))
    assert r.returncode == 2 and kept.read_text() == "an earlier eval"   # the probe leaves a file as it was


@pytest.mark.parametrize("args, said", [
    (["HumanEval-v0", "--split", "train"], "error: ConfigError: split: HumanEval-v0: HumanEval has only a test split"),
    (["BFCL-v0", "--split", "train"], "error: ConfigError: split: BFCL-v0: split must be 'test'"),
    (["ReasoningGym-v0", "--split", "nope"],
     "error: ConfigError: split: ReasoningGym-v0: split must be one of ['train', 'validation', 'test'], got 'nope'"),
    (["ReasoningGym-v0", "--episodes", "2", "--first-task", "100000"],
     "error: ConfigError: first_task 100000 with episodes 2 goes past the last task of ReasoningGym-v0 (200 tasks, "
     "indices 0..199): give first_task at most 199"),
    (["HumanEval-v0", "--episodes", "2", "--first-task", "163"],
     "error: ConfigError: first_task 163 with episodes 2 goes past the last task of HumanEval-v0 (164 tasks, "
     "indices 0..163): give at most 1 episodes from there"),
    (["BFCL-v0", "tasks=[1,400]"], "error: ConfigError: tasks: BFCL-v0 has 400 tasks (indices 0..399); no task 400"),
    (["ReasoningGym-v0", "--seed", "-1"], "error: ConfigError: EvalRunConfig: seed must be >= 0, got -1"),
    (["ReasoningGym-v0", "-e", "size=1000000000"],
     "error: ConfigError: env_kwargs: ReasoningGym-v0: size of the train split must be at most 100000, got 1000000000"),
    (["ReasoningGym-v0", "-e", "max_action_chars=-5"],
     "error: ConfigError: env_kwargs: ReasoningGym-v0: max_action_chars must be >= 1, got -5"),
    (["HumanEval-v0", "-e", "timeout_s=.inf"],
     "error: ConfigError: env_kwargs: HumanEval-v0: timeout_s must be a finite number of seconds > 0, got inf"),
])
def test_eval_says_a_bad_split_task_range_or_setting_in_one_line_before_any_episode(args, said):
    """Each used to fail after the episodes had started (a progress bar, then the error; a first episode's work
    lost with --first-task near the end), or to run for hours (a split of 10**9 questions)."""
    r = run_cli("eval", *args, "--policy", "oracle", "--threads", "1", timeout=300)
    assert r.returncode == 2 and r.stderr.strip().startswith(said), r.stderr[-800:]
    assert len(r.stderr.strip().splitlines()) == 1 and "eval agentgym" not in r.stderr


def test_eval_split_null_passes_no_split(tmp_path):
    out = tmp_path / "eval.json"
    r = run_cli("eval", "ReasoningGym-v0", "--policy", "oracle", "--episodes", "1", "--split", "null", "--threads", "1",
                "-e", "size=3", "--json", str(out), timeout=300)
    assert r.returncode == 0, r.stderr[-800:]
    assert json.loads(out.read_text())["env_kwargs"] == {"size": 3}     # the env's own default split (train)


def test_check_refuses_a_negative_action_count():
    r = run_cli("check", "Arithmetic-v0", "--actions", "-5")
    assert r.returncode == 2 and r.stderr.strip() == "error: ConfigError: --actions must be >= 0, got -5"


def test_eval_says_when_a_service_failure_ended_every_episode(tmp_path):
    """A retrieval server that is down is an infrastructure error, not the policy's: eval says so in one line,
    scores nothing, still writes --json (nothing is lost) and exits 1 because no episode could be scored."""
    import socket
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]  # closed again below: nothing listens there
    out = tmp_path / "eval.json"
    r = run_cli("--threads", "1", "eval", "SearchQA-v0", "--policy", "oracle", "--episodes", "2", "--json", str(out),
                "-e", f'retriever="http://127.0.0.1:{port}/retrieve"', timeout=300)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-800:]
    said = [line for line in r.stderr.splitlines() if line.startswith("[eval]")]
    assert len(said) == 1 and said[0].startswith("[eval] 2 of 2 episodes ended on an infrastructure error"), r.stderr
    assert "RetrieverUnavailable" in said[0] and f"127.0.0.1:{port}" in said[0]
    assert r.stderr.strip().splitlines()[-1] == \
        "error: no episode could be scored: every one ended on an infrastructure error (above)"
    data = json.loads(out.read_text())
    assert data["metrics"]["infra_errors"] == 2 and len(data["trajectories"]) == 2


@pytest.mark.parametrize("name, source, message", [
    ("no_such_plugin_mod", None, "error: --import no_such_plugin_mod failed: No module named 'no_such_plugin_mod'"),
    ("plug_missing_dep", "import no_such_dependency_xyz\n",
     "error: --import plug_missing_dep failed: No module named 'no_such_dependency_xyz' (raised while importing "
     "plug_missing_dep)"),
    ("plug_raises", "x = 1\nraise RuntimeError('broken plugin')\n",
     "error: --import plug_raises failed: RuntimeError: broken plugin at {dir}/plug_raises.py:2 "
     "(AGENTGYM_DEBUG=1 shows the traceback)"),
    ("plug_syntax", "x = (\n", "error: --import plug_syntax failed: SyntaxError: "),
    ("", None, "error: --import '': not a module name (a dotted Python name such as mypkg.envs)"),
    ("my-plugin", None, "error: --import 'my-plugin': not a module name (a dotted Python name such as mypkg.envs)"),
])
def test_a_plugin_that_cannot_be_imported_is_one_line(tmp_path, name, source, message):
    if source is not None:
        (tmp_path / f"{name}.py").write_text(source)
    r = subprocess.run([sys.executable, "-m", "agentgym.app.cli", "--import", name, "list"], capture_output=True,
                       text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message.format(dir=tmp_path)), lines


def test_eval_warns_when_the_prompt_never_fits_the_context(tmp_path):
    """An episode whose first prompt + max_new_tokens exceeds max_context_tokens ends before the model acts; eval
    scores it a failure (as before) but says so in one warning line naming the setting to raise."""
    out = tmp_path / "eval.json"
    r = run_cli("--threads", "1", "eval", "Arithmetic-v0", "--policy", "tiny-random", "--episodes", "2",
                "--max-new-tokens", "8", "--max-context-tokens", "24", "--json", str(out), timeout=300)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-800:]
    said = [line for line in r.stderr.splitlines() if line.startswith("[eval] warning")]
    assert len(said) == 1 and "2 of 2 episodes ended at the context limit before the model's first turn" in said[0]
    assert "max_context_tokens 24" in said[0] and "--max-context-tokens" in said[0]
    data = json.loads(out.read_text())
    assert all(t["episode"]["end_reason"] == "context_limit" and not t["actions"] for t in data["trajectories"])


def test_eval_does_not_warn_when_the_prompt_fits(tmp_path):
    r = run_cli("--threads", "1", "eval", "Arithmetic-v0", "--policy", "tiny-random", "--episodes", "2",
                "--max-new-tokens", "8", timeout=300)
    assert r.returncode == 0, r.stderr[-800:]
    assert "[eval] warning" not in r.stderr
