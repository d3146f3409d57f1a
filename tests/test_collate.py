"""``algorithms.loop.batch.collate`` (vectorised) against a per-row reference written here: the same tensors on
multi-turn trajectories, older ones without token kinds, rewards on one position, and bad input."""

from __future__ import annotations

import random

import pytest
import torch

from agentgym.algorithms.loop.batch import collate
from agentgym.trajectory import TOKEN_KINDS, Trajectory


def _trajectory(rng: random.Random, prompt: int, turns: int, kinds: bool = True, group: int | None = 0) -> Trajectory:
    ids, mask, lps, ks, spans = [rng.randrange(100) for _ in range(prompt)], [0] * prompt, [0.0] * prompt, \
        ["prompt"] * prompt, []
    for _ in range(turns):
        n, m = rng.randint(1, 5), rng.randint(0, 4)
        spans.append((len(ids), len(ids) + n))
        ids += [rng.randrange(100) for _ in range(n + m)]
        mask += [1] * n + [0] * m
        lps += [-rng.random() for _ in range(n)] + [0.0] * m
        ks += ["policy"] * n + ["tool"] * m
    return Trajectory(token_ids=ids, loss_mask=mask, logprobs=lps, prompt_length=prompt, turn_spans=spans,
                      actions=["a"] * turns, finish_reasons=["stop"] * turns,
                      step_rewards=[rng.uniform(-1, 1) for _ in spans], reward_terms=[{} for _ in spans], messages=[],
                      token_kinds=ks if kinds else None, group_id=group)


def _reference(trajectories: list[Trajectory], pad_id: int) -> dict[str, torch.Tensor]:
    """Row by row, the obvious way."""
    width = max(len(t.token_ids) for t in trajectories)
    out = {"input_ids": torch.full((len(trajectories), width), pad_id, dtype=torch.long),
           "loss_mask": torch.zeros(len(trajectories), width), "old_logprobs": torch.zeros(len(trajectories), width),
           "kind": torch.full((len(trajectories), width), -1, dtype=torch.long),
           "token_rewards": torch.zeros(len(trajectories), width), "response_mask": torch.zeros(len(trajectories), width)}
    for i, t in enumerate(trajectories):
        n = len(t.token_ids)
        out["input_ids"][i, :n] = torch.tensor(t.token_ids)
        out["loss_mask"][i, :n] = torch.tensor(t.loss_mask, dtype=torch.float32)
        out["old_logprobs"][i, :n] = torch.tensor(t.logprobs)
        out["kind"][i, :n] = torch.tensor([TOKEN_KINDS.index(k) for k in t.kinds()])
        out["token_rewards"][i, :n] = torch.tensor(t.token_rewards())
        out["response_mask"][i, t.prompt_length:n] = 1.0
    return out


@pytest.mark.parametrize("seed", range(5))
def test_collate_equals_the_per_row_reference(seed):
    rng = random.Random(seed)
    trajectories = [_trajectory(rng, rng.randint(1, 6), rng.randint(1, 4), kinds=rng.random() < 0.7,
                                group=rng.choice([None, 0, 1])) for _ in range(rng.randint(1, 7))]
    batch, ref = collate(trajectories, pad_id=7), _reference(trajectories, 7)
    for name, expected in ref.items():
        assert torch.equal(getattr(batch, name), expected), name
    assert torch.equal(batch.sampler_logprobs, batch.old_logprobs)
    assert batch.sampler_logprobs.data_ptr() != batch.old_logprobs.data_ptr()   # not one tensor twice
    assert batch.lengths.tolist() == [len(t.token_ids) for t in trajectories]
    assert batch.group_ids.tolist() == [-1 if t.group_id is None else t.group_id for t in trajectories]
    lengths = torch.tensor([len(t.token_ids) for t in trajectories])
    assert torch.equal(batch.attention_mask, (torch.arange(batch.width)[None, :] < lengths[:, None]).long())
    assert torch.equal(batch.position_ids, torch.arange(batch.width).repeat(len(trajectories), 1) * batch.attention_mask)


def test_two_rewards_on_one_token_add_up():
    t = _trajectory(random.Random(0), 2, 1)
    t.turn_spans = t.turn_spans * 2
    t.step_rewards = [0.25, 0.5]
    assert collate([t]).token_rewards.sum().item() == pytest.approx(0.75)


def test_bad_trajectories_are_named():
    t = _trajectory(random.Random(1), 2, 2)
    t.token_kinds = t.token_kinds[:-1]
    with pytest.raises(ValueError, match="trajectory 0: .* token kinds for"):
        collate([t])
    t = _trajectory(random.Random(1), 2, 2)
    t.token_kinds[-1] = "nonsense"
    with pytest.raises(ValueError, match="unknown token kind 'nonsense'"):
        collate([t])
    t = _trajectory(random.Random(1), 2, 2)
    t.logprobs = t.logprobs[:-1]
    with pytest.raises(ValueError, match="differ in length"):
        collate([t])
    with pytest.raises(ValueError, match="empty"):
        collate([])
