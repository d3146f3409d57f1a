"""The shuffled-advantage negative control (algorithms/compare/controls.py): GRPO's advantages, each handed to an
episode of another group, so that the update has GRPO's size but no information about the receiver's action."""

import numpy as np
import pytest

from agentgym.algorithms import ADVANTAGES, LEARNERS, AdvantageInputs, collate, is_negative_control_learner
from agentgym.algorithms.compare.controls import donor_indices
from agentgym.trajectory import Trajectory


def _batch(rewards_by_group: list[list[float]]) -> list[Trajectory]:
    trajs, k = [], 0
    for g, rewards in enumerate(rewards_by_group):
        for r in rewards:
            ids = [1, 2, 10 + k, 11 + k]
            trajs.append(Trajectory(ids, [0, 0, 1, 1], [0.0] * 4, 2, [(2, 4)], ["a"], ["stop"], [r], [{}], [],
                                    group_id=g))
            k += 1
    return trajs


def _advantages(name: str, trajs: list[Trajectory]) -> list[float]:
    batch = collate(trajs)
    cfg = LEARNERS["grpo-shuffled"].config_class()
    adv, _ = ADVANTAGES[name](cfg)(AdvantageInputs(trajs, batch.token_rewards, batch.loss_mask))
    assert adv[:, 2].tolist() == adv[:, 3].tolist()            # one episode advantage on all its policy tokens
    assert adv[:, :2].abs().sum() == 0                          # never on prompt tokens
    return adv[:, 2].tolist()


def test_every_episode_gets_the_advantage_of_an_episode_of_another_group():
    trajs = _batch([[0.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 1.0]])
    grpo = _advantages("group", trajs)
    shuffled = _advantages("shuffled-group", trajs)
    assert sorted(shuffled) == pytest.approx(sorted(grpo))      # same advantages, same size
    assert shuffled != pytest.approx(grpo)
    donors = donor_indices([t.group_id for t in trajs], np.random.default_rng(0))
    assert all(trajs[d].group_id != t.group_id for d, t in zip(donors, trajs))
    for g in range(3):                                           # equal-sized groups: distinct donors
        got = [d for d, t in zip(donors, trajs) if t.group_id == g]
        assert len(set(got)) == len(got) and len({trajs[d].group_id for d in got}) == 1


def test_the_shuffle_is_seeded_by_the_batch():
    trajs = _batch([[0.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert _advantages("shuffled-group", trajs) == _advantages("shuffled-group", _batch([[0.0, 1.0, 1.0],
                                                                                          [1.0, 0.0, 0.0]]))


def test_the_received_advantage_carries_no_information_about_the_action():
    """Over many batches, the correlation between an episode's own GRPO advantage and the one it receives is 0
    (a plain batch permutation would leave 1/B of it; GRPO itself has 1)."""
    rng = np.random.default_rng(1)
    own, got = [], []
    for _ in range(150):
        trajs = _batch([list(rng.integers(0, 2, 4).astype(float)) for _ in range(4)])
        own += _advantages("group", trajs)
        got += _advantages("shuffled-group", trajs)
    own, got = np.array(own), np.array(got)
    keep = own != 0
    assert np.corrcoef(own[keep], got[keep])[0, 1] == pytest.approx(0.0, abs=0.08)
    assert np.corrcoef(own[keep], own[keep])[0, 1] == pytest.approx(1.0)


def test_one_group_is_a_clear_error():
    with pytest.raises(ValueError, match="at least 2 groups"):
        _advantages("shuffled-group", _batch([[0.0, 1.0, 1.0]]))


def test_the_control_is_known_as_one():
    assert is_negative_control_learner("grpo-shuffled") and is_negative_control_learner("GRPO-Shuffled")
    assert not is_negative_control_learner("grpo") and not is_negative_control_learner("no-such-learner")


def test_compare_runs_the_control_and_reports_every_learner_against_it(tmp_path, capsys):
    """A real (tiny) comparison: the control trains like any learner and compare.md judges GRPO against it."""
    from agentgym.algorithms.compare.report import is_negative_control
    from agentgym.app.cli import main
    assert is_negative_control("grpo-shuffled") and is_negative_control("grpo-shuffled:optim.lr=1e-5")
    assert is_negative_control("grpo:lr=0") and not is_negative_control("grpo") and not is_negative_control("ppo:lr=1e-5")
    out = tmp_path / "cmp"
    rc = main(["compare", "--env", "Arithmetic-v0", "--algos", "grpo,grpo-shuffled", "--seeds", "2", "--steps", "2",
               "--out", str(out), "model=tiny-random", "groups_per_step=2", "group_size=2",
               "sampling.max_new_tokens=4", "eval.episodes=2", "optim.lr=1e-3", "learner.micro_batch_size=4",
               "tensorboard=false", "env_kwargs={hard_fraction: 0.0, max_turns: 1}"])
    assert rc == 0, capsys.readouterr().err
    md = (out / "compare.md").read_text()
    assert "**Held-out success after training, paired**" in md and "paired over seeds and tasks:" in md
    assert "**Against the negative control**" in md and "- `grpo` vs `grpo-shuffled`, final_reward:" in md
