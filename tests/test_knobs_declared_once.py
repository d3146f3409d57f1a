"""Each knob declared once (issue 48): the learner's, the optimizer's and LoRA's settings are each a
dataclass field of exactly one class in the library, read from the source (``ast``), so a second
declaration anywhere (a redeclared default in a subclass, a mirror in a flat config) fails here."""

from __future__ import annotations

import ast
import dataclasses
from collections import defaultdict
from pathlib import Path

from agentgym.algorithms import LEARNERS
from agentgym.algorithms.offline.sft import TrainerOptimConfig
from agentgym.algorithms.loop.optim import LoraSettings

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ("agentgym", "algorithms", "envs", "policies")

#: Field names declared by more than one dataclass because they mean different things there.
DIFFERENT_MEANINGS = {
    # UpdateConfig.seed: the learner's minibatch shuffling and LoRA init; the run configs' seed: the run's
    # (task choice, sampling), and the other seeds of envs, policies and samplers
    "seed": "each component's own random stream",
    # UpdateConfig.epochs: PPO epochs over one batch of rollouts; TrainerOptimConfig.epochs: passes over
    # the SFT/DPO data set (a float, e.g. 0.5)
    "epochs": "RL passes over a batch vs. SFT/DPO passes over the data set",
    # UpdateConfig.temperature: only checked against the rollouts'; SamplingParams.temperature samples
    "temperature": "the learner's check vs. the sampler's temperature",
    # TrainerOptimConfig.batch_size: examples per SFT/DPO forward/backward; CollectConfig's and
    # EvalRunConfig's: episodes collected together (one generate call per turn)
    "batch_size": "examples per training pass vs. episodes per rollout call",
}
#: What a config class is called; other dataclasses (Batch, Trajectory, AdvantageInputs) are records.
CONFIG_SUFFIXES = ("Config", "Settings", "Params")


def _is_dataclass(node: ast.ClassDef) -> bool:
    for d in node.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name == "dataclass":
            return True
    return False


def declared_fields() -> dict[str, list[str]]:
    """Field name -> every config class (``module:Class``) whose body declares it (a ``ClassVar`` is not a
    field)."""
    where: dict[str, list[str]] = defaultdict(list)
    for part in LIBRARY:
        for path in sorted((ROOT / part).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if not (isinstance(node, ast.ClassDef) and _is_dataclass(node) and node.name.endswith(CONFIG_SUFFIXES)):
                    continue
                for stmt in node.body:
                    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) \
                            and "ClassVar" not in ast.unparse(stmt.annotation):
                        where[stmt.target.id].append(f"{path.relative_to(ROOT)}:{node.name}")
    return where


def test_the_five_named_knobs_are_declared_in_exactly_one_class():
    where = declared_fields()
    for name in ("clip_eps", "kl_coef", "value_coef", "entropy_coef", "lr"):
        assert len(where[name]) == 1, f"{name} is declared in {where[name]}"


def test_every_training_knob_is_declared_once_or_means_something_else():
    """Every setting of every built-in learner's config, of the optimizer (RL's and SFT/DPO's) and of
    LoRA: one declaration, unless the name is listed in DIFFERENT_MEANINGS with the reason."""
    where = declared_fields()
    knobs = {f.name for cls in {learner.config_class for learner in LEARNERS.values()} for f in dataclasses.fields(cls)}
    knobs |= {f.name for cls in (TrainerOptimConfig, LoraSettings) for f in dataclasses.fields(cls)}
    twice = {k: where[k] for k in sorted(knobs) if len(where[k]) != 1 and k not in DIFFERENT_MEANINGS}
    assert twice == {}, f"declared in several classes (or none): {twice}"


def test_an_algorithms_own_default_is_data_of_its_class_not_a_second_field():
    from agentgym.algorithms import DualClipPPOConfig, GSPOConfig, PPOConfig, ReinforceConfig
    assert GSPOConfig.defaults_table() == {"clip_eps": 3e-4, "clip_eps_high": 4e-4, "loss_agg": "seq-mean-token-mean"}
    assert DualClipPPOConfig.defaults_table() == {"credit": "token", "dual_clip_c": 3.0}   # PPO's, then its own
    assert (ReinforceConfig().credit, PPOConfig().credit, DualClipPPOConfig().credit) == ("turn", "token", "token")
    assert "clip_eps" not in vars(GSPOConfig).get("__annotations__", {})
