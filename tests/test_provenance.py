"""Provenance (issue 47): every run records the code it ran (git commit, dirty flag), package versions, CPU or
GPU, precision and threads (agentgym.provenance; the trainer's provenance.json)."""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
from pathlib import Path

import torch

import agentgym.provenance as prov
from agentgym.provenance import code_version, collect_provenance
from fixtures_llm import one_torch_thread  # noqa: F401  (autouse: a 64-wide model is faster on one thread)

ROOT = Path(__file__).resolve().parents[1]


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args], cwd=cwd,
                          capture_output=True, text=True, check=True).stdout.strip()


def test_the_record_names_this_checkout_its_packages_machine_precision_and_threads():
    p = collect_provenance("bf16", threads=3)
    assert p["code"]["commit"] == _git(ROOT, "rev-parse", "HEAD") and p["code"]["source"] == "git"
    assert p["code"]["dirty"] is bool(_git(ROOT, "status", "--porcelain"))
    assert p["packages"]["torch"] == torch.__version__
    for name in ("vllm", "trl"):       # None exactly when the package is not installed
        assert (p["packages"][name] is None) == (importlib.util.find_spec(name) is None), name
    assert p["precision"] == "bf16" and p["threads"] == 3 and p["python"].count(".") == 2
    assert ("gpu" in p["device"]) == torch.cuda.is_available()
    if not torch.cuda.is_available():
        assert p["device"]["cpu"] and isinstance(p["device"]["cpu_flags"], list)
    json.dumps(p)       # a plain JSON record


def test_a_commit_and_its_dirty_flag_come_from_the_checkout(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "a.py").write_text("x = 1\n")
    _git(repo, "add", "a.py")
    _git(repo, "commit", "-q", "-m", "one")
    clean = code_version(repo)
    assert clean["commit"] == _git(repo, "rev-parse", "HEAD") and clean["dirty"] is False
    (repo / "a.py").write_text("x = 2\n")
    assert code_version(repo)["dirty"] is True


def test_outside_a_checkout_the_installed_version_and_no_commit(tmp_path):
    outside = code_version(tmp_path)
    assert outside["commit"] is None and outside["dirty"] is None and outside["source"] == "installed"
    assert outside["agentgym"] == importlib.metadata.version(prov.DISTRIBUTION)


def test_the_kernel_module_imports_no_part_and_no_application():
    tree = ast.parse(Path(prov.__file__).read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
    assert not [m for m in names if m.split(".")[0] in ("envs", "policies", "algorithms")
                or m.startswith(("agentgym.envs", "agentgym.policies", "agentgym.algorithms", "agentgym.app"))], names


def test_a_training_run_records_its_commit_beside_the_keys_it_always_wrote(tmp_path):
    from agentgym.algorithms.loop.trainer import Trainer
    from agentgym.algorithms.loop.train_config import TrainConfig
    from agentgym.config import load_config
    cfg = load_config(TrainConfig, overrides=[
        "env=Arithmetic-v0", "model=tiny-random", "steps=1", "groups_per_step=1", "group_size=2",
        "sampling.max_new_tokens=4", "eval.episodes=1", "tensorboard=false", "precision=fp32",
        "env_kwargs={hard_fraction: 0.0, max_turns: 1}", f"output_dir={tmp_path / 'run'}"])
    Trainer(cfg).train()
    record = json.loads((tmp_path / "run" / "provenance.json").read_text())
    assert record["code"]["commit"] == _git(ROOT, "rev-parse", "HEAD")
    assert record["threads"] == record["torch_threads"] == torch.get_num_threads()
    assert record["precision"]["resolved"] == "fp32" and record["torch"] == torch.__version__
    for key in ("cpu", "cpu_flags", "torch", "transformers", "python", "cuda", "torch_threads", "precision"):
        assert key in record, key
