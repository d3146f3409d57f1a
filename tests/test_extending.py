"""docs/extending.md: each example file, written out as its own module, adds its part and learner
through the real ``agentgym --import`` path, and the parts compute what their docstrings say on a
hand-built batch (the page's last block, run by tests/test_docs.py, trains both on a real tiny model)."""

from __future__ import annotations

import importlib
import math
import re
import sys
from pathlib import Path

import pytest
import torch

from agentgym.algorithms import ADVANTAGES, LEARNERS, OBJECTIVES, AdvantageInputs, collate
from agentgym.trajectory import Trajectory

PAGE = Path(__file__).resolve().parents[1] / "docs" / "extending.md"


def example_files() -> dict[str, str]:
    """The page's module blocks, by the file name on their first line (``# name.py: ...``)."""
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(encoding="utf-8"), flags=re.S)
    files = {}
    for code in blocks:
        m = re.match(r"# (\w+\.py):", code)
        if m:
            files[m.group(1)] = code
    return files


@pytest.fixture
def modules(tmp_path, monkeypatch):
    """The example files as modules on sys.path; their registrations are removed afterwards."""
    saved = {id(r): dict(r) for r in (ADVANTAGES, OBJECTIVES, LEARNERS)}
    for name, code in example_files().items():
        (tmp_path / name).write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for r in (ADVANTAGES, OBJECTIVES, LEARNERS):
        r.clear()
        r.update(saved[id(r)])
    for name in example_files():
        sys.modules.pop(name.removesuffix(".py"), None)


def test_the_page_has_one_file_per_part():
    assert set(example_files()) == {"median_baseline.py", "capped_pg.py"}


TINY = ["model=tiny-random", "groups_per_step=2", "group_size=2", "sampling.max_new_tokens=4", "eval.episodes=2",
        "optim.lr=1e-3", "learner.micro_batch_size=4", "tensorboard=false", "steps=1", "env=Arithmetic-v0",
        "env_kwargs={hard_fraction: 0.0, max_turns: 2}"]


@pytest.mark.parametrize("module, algo, extra", [("median_baseline", "median-grpo", []),
                                                 ("capped_pg", "capped-grpo", ["learner.cap=3"])])
def test_each_file_alone_trains_through_the_cli(modules, monkeypatch, capsys, module, algo, extra):
    from agentgym.app.cli import main
    monkeypatch.chdir(modules)                       # --import resolves modules from the current directory
    run = modules / "run"
    rc = main(["--import", module, "train", f"algo={algo}", f"output_dir={run}", *extra, *TINY])
    assert rc == 0, capsys.readouterr().err
    assert algo in LEARNERS and (run / "train_log.csv").stat().st_size > 0
    assert f"algo: {algo}" in (run / "config.yaml").read_text()


def hand_batch() -> list[Trajectory]:
    """Two groups: returns 0, 1, 5 (group 0) and 2, 2 (group 1); one turn of two tokens each."""
    trajs = []
    for k, (group, reward) in enumerate([(0, 0.0), (0, 1.0), (0, 5.0), (1, 2.0), (1, 2.0)]):
        ids = [1, 2, 10 + k, 11 + k]
        trajs.append(Trajectory(ids, [0, 0, 1, 1], [0.0] * 4, 2, [(2, 4)], ["a"], ["stop"], [reward], [{}], [],
                                group_id=group))
    return trajs


def test_the_median_baseline_by_hand(modules):
    importlib.import_module("median_baseline")
    trajs = hand_batch()
    batch = collate(trajs)
    cfg = LEARNERS["median-grpo"].config_class()
    adv, ret = ADVANTAGES["median-baseline"](cfg)(AdvantageInputs(trajs, batch.token_rewards, batch.loss_mask))
    # group 0: median 1 -> -1, 0, 4; group 1: median 2 -> 0, 0; every policy token of a turn
    assert adv[:, 2].tolist() == pytest.approx([-1.0, 0.0, 4.0, 0.0, 0.0])
    assert adv[:, 3].tolist() == adv[:, 2].tolist() and ret[:, 2].tolist() == [0.0, 1.0, 5.0, 2.0, 2.0]


def test_the_capped_objective_by_hand(modules):
    importlib.import_module("capped_pg")
    cfg = LEARNERS["capped-grpo"].config_class(cap=1.5)
    logp = torch.log(torch.tensor([[0.5, 0.2]])).requires_grad_(True)
    old = torch.log(torch.tensor([[0.25, 0.2]]))          # ratios 2 (capped at 1.5) and 1
    adv = torch.tensor([[1.0, -1.0]])
    loss, ratio, clipped = OBJECTIVES["capped-pg"](cfg)(logp, old, adv, torch.ones(1, 2))
    assert ratio[0].tolist() == pytest.approx([2.0, 1.0]) and clipped.tolist() == [[1.0, 0.0]]
    assert loss[0].tolist() == pytest.approx([-1.5 * math.log(0.5), math.log(0.2)])
    loss.sum().backward()
    assert logp.grad[0].tolist() == pytest.approx([-1.5, 1.0])   # the weight is detached: -w·A
