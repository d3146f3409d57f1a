"""Layers a newcomer can see (issue 48): the trainer reports through events and never calls the application
(a subscriber sees every step, each eval, each checkpoint and the end of the run, in order; the HTML report is
written only by the app's subscriber); tests that read the imports: no part (algorithms, policies, envs)
imports the app, the kernel imports no part, and only package ``__init__`` files re-export names."""

from __future__ import annotations

import ast
from pathlib import Path

from agentgym.algorithms.loop.events import TrainerEvents
from agentgym.algorithms.loop.train_config import TrainConfig
from agentgym.algorithms.loop.trainer import Trainer
from agentgym.config import load_config

ROOT = Path(__file__).resolve().parents[1]


class Recorder(TrainerEvents):
    def __init__(self):
        self.seen: list[tuple] = []

    def step_done(self, trainer, batch, row):
        self.seen.append(("step", int(row["step"]), len(batch.trajectories)))

    def eval_done(self, trainer, tag, metrics, trajectories):
        self.seen.append(("eval", tag, len(trajectories)))

    def checkpoint_saved(self, trainer, path):
        self.seen.append(("checkpoint", Path(path).name))

    def run_done(self, trainer, eval_trajectories):
        self.seen.append(("done", len(eval_trajectories), (trainer.out / "curves.png").exists()))


def test_a_subscriber_sees_the_run_in_order_and_no_html_is_written_without_the_app(tmp_path):
    cfg = load_config(TrainConfig, overrides=[
        "model=tiny-random", "algo=grpo", "groups_per_step=2", "group_size=2", "sampling.max_new_tokens=4",
        "eval.episodes=2", "steps=2", "checkpoint_every=2", "learner.micro_batch_size=4", "tensorboard=false",
        "env=Arithmetic-v0", f"output_dir={tmp_path / 'run'}"])
    rec = Recorder()
    Trainer(cfg, log=lambda _: None, events=[rec]).train()
    kinds = [e[0] for e in rec.seen]
    assert kinds[0] == "eval" and rec.seen[0][1] == "before"
    assert [e for e in rec.seen if e[0] == "step"] == [("step", 1, 4), ("step", 2, 4)]
    assert ("checkpoint", "step_000002") in rec.seen
    assert rec.seen[-1] == ("done", 2, True) and ("eval", "after", 2) in rec.seen
    assert kinds.index("done") == len(kinds) - 1
    assert not (tmp_path / "run" / "eval_trajectories.html").exists()   # the app's subscriber writes it


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_no_part_imports_the_app():
    offenders = []
    for part in ("algorithms", "policies", "envs"):
        for path in sorted((ROOT / part).rglob("*.py")):
            bad = sorted(m for m in _imports(path) if m == "agentgym.app" or m.startswith("agentgym.app."))
            if bad:
                offenders.append(f"{path.relative_to(ROOT)}: {', '.join(bad)}")
    assert not offenders, "parts import the application:\n" + "\n".join(offenders)


def test_the_kernel_imports_no_concrete_part():
    offenders = []
    for path in sorted((ROOT / "agentgym").glob("*.py")):
        bad = sorted(m for m in _imports(path)
                     if m.split(".")[:2] in (["agentgym", "envs"], ["agentgym", "policies"], ["agentgym", "algorithms"],
                                             ["agentgym", "app"]))
        if bad:
            offenders.append(f"{path.relative_to(ROOT)}: {', '.join(bad)}")
    assert not offenders, "the kernel imports concrete parts:\n" + "\n".join(offenders)




def _absolute_imports(path: Path, package: str) -> set[str]:
    """The modules ``path`` imports, relative imports resolved against its ``package``."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
            names.add(".".join(base + ([node.module] if node.module else [])))
    return names


def test_services_import_no_env():
    """Envs import services (sandboxes, retrievers), never the reverse: nothing under
    ``agentgym.envs.services`` imports an env module (``agentgym.envs.<env>``)."""
    envs = {p.stem for p in (ROOT / "envs").iterdir()
            if p.name not in ("services", "__init__.py", "__pycache__") and (p.suffix == ".py" or p.is_dir())}
    assert {"searchqa", "codeexec", "humaneval", "react"} <= envs
    offenders = []
    for path in sorted((ROOT / "envs" / "services").rglob("*.py")):
        rel = path.relative_to(ROOT / "envs").with_suffix("")
        parts = ["agentgym", "envs", *rel.parts]
        package = ".".join(parts if path.name == "__init__.py" else parts[:-1]).removesuffix(".__init__")
        bad = sorted(m for m in _absolute_imports(path, package)
                     if m == "agentgym.envs" or (m.startswith("agentgym.envs.") and m.split(".")[2] in envs))
        if bad:
            offenders.append(f"{path.relative_to(ROOT)}: {', '.join(bad)}")
    assert not offenders, "services import envs:\n" + "\n".join(offenders)



def test_services_have_one_path():
    """No shim where the services lived before they moved under envs/services/ (issue 48: none before 1.0)."""
    import importlib.util
    for old in ("agentgym.envs.sandbox", "agentgym.envs.retrieval"):
        spec = importlib.util.find_spec(old)
        assert spec is None or spec.origin is None, f"{old} is still importable from {spec.origin}"
    assert importlib.util.find_spec("agentgym.envs.services.sandbox") is not None

def _top_level_definitions(tree: ast.Module) -> set[str]:
    out: set[str] = set()
    for n in tree.body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
        elif isinstance(n, (ast.Assign, ast.AnnAssign)):
            for target in (n.targets if isinstance(n, ast.Assign) else [n.target]):
                out.update(x.id for x in ast.walk(target) if isinstance(x, ast.Name))
    return out


def test_only_package_inits_re_export_names():
    """A name lives in the one module that defines it; only a package's ``__init__`` states public names
    that live elsewhere (issue 48: no shims before 1.0)."""
    offenders = []
    for part in ("agentgym", "envs", "policies", "algorithms"):
        for path in sorted((ROOT / part).rglob("*.py")):
            if path.name == "__init__.py":
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"))
            declared = next((ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                             and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets)), [])
            foreign = sorted(set(declared) - _top_level_definitions(tree))
            if foreign:
                offenders.append(f"{path.relative_to(ROOT)}: {', '.join(foreign)}")
    assert not offenders, "modules re-exporting names they do not define:\n" + "\n".join(offenders)


def _group_imports(group: str) -> dict[str, set[str]]:
    """Each module of ``algorithms/<group>/`` and what it imports (relative imports resolved)."""
    out = {}
    for path in sorted((ROOT / "algorithms" / group).rglob("*.py")):
        rel = path.relative_to(ROOT / "algorithms").with_suffix("")
        parts = ["agentgym", "algorithms", *rel.parts]
        package = ".".join(parts if path.name == "__init__.py" else parts[:-1]).removesuffix(".__init__")
        out[str(path.relative_to(ROOT))] = _absolute_imports(path, package)
    return out


def _reaching(imports: dict[str, set[str]], groups: tuple[str, ...]) -> list[str]:
    prefixes = tuple(f"agentgym.algorithms.{g}" for g in groups)
    offenders = []
    for path, names in imports.items():
        bad = sorted(m for m in names if any(m == p or m.startswith(p + ".") for p in prefixes))
        if bad:
            offenders.append(f"{path}: {', '.join(bad)}")
    return offenders


def test_algorithms_groups_import_downwards():
    """``algorithms/`` is grouped by job (issue 48): the maths imports nothing from the loop or the
    comparison harness; the loop may import the maths, never the harness; the harness may import both."""
    maths = _group_imports("maths")
    loop = _group_imports("loop")
    assert maths and loop and _group_imports("compare")
    offenders = _reaching(maths, ("loop", "compare")) + _reaching(loop, ("compare",))
    assert not offenders, "algorithms groups import upwards:\n" + "\n".join(offenders)


def test_algorithms_modules_have_one_path():
    """No shim where the modules of ``algorithms/`` lived before they were grouped, and ``registry`` means
    the env registry only (the helper is ``algorithms.parts``, the backend registry ``policies.backends``)."""
    import importlib.util
    old = ["advantages", "returns", "objectives", "losses", "critic", "learner", "learner_state", "learner_config",
           "batch", "optim", "parallel", "distributed", "overlap", "run_control", "trainer", "events", "health",
           "group_filter", "held_out", "curves", "config", "compare_arms", "compare_health", "compare_report",
           "controls", "registry"]
    for name in [f"agentgym.algorithms.{m}" for m in old] + ["agentgym.policies.registry"]:
        spec = importlib.util.find_spec(name)
        assert spec is None or spec.origin is None, f"{name} is still importable from {spec.origin}"
    for new in ("agentgym.algorithms.maths.advantages", "agentgym.algorithms.loop.train_config",
                "agentgym.algorithms.compare.harness", "agentgym.algorithms.parts", "agentgym.policies.backends"):
        assert importlib.util.find_spec(new) is not None, new


def test_the_train_config_imports_no_concrete_backend():
    """Building and checking a train config (backend names, options, weight transfer) reads the backend
    registry only: no engine module (transformers, vLLM, Ray pool, OpenAI, scripted) is imported."""
    import subprocess
    import sys
    code = ("import sys\n"
            "from agentgym.config import load_config\n"
            "from agentgym.algorithms.loop.train_config import TrainConfig\n"
            "load_config(TrainConfig, None, ['backend=hf', 'weight_transfer=collective', 'rollout_workers=1'])\n"
            "print(sorted(m for m in sys.modules if m.startswith('agentgym.policies.')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    loaded = eval(out.stdout.strip().splitlines()[-1])
    assert loaded == ["agentgym.policies.backends"], loaded
