"""Offline training data from agent episodes: SFT examples and DPO preference pairs.

Both are built from :class:`~agentgym.Trajectory` token ids, never from re-rendered text. A
trajectory already holds the exact ids the policy produced (``loss_mask`` 1) between the ids of the
prompt, the environment's observations and the chat template's glue (``loss_mask`` 0), laid out
append-only by the same formatter the RL trainer and ``agentgym eval`` use. Training on those ids
means the warm-up sees byte for byte the sequences RL will later sample and score; re-rendering the
messages through ``apply_chat_template`` instead can tokenize differently at turn boundaries
(merges across the boundary, a template that renders history differently from the live prompt,
truncated observations) and silently teach the model tokens it never produces at rollout time.
TRL accepts this directly: ``SFTTrainer`` takes pre-tokenized ``input_ids`` with an
``assistant_masks`` column (labels become -100 where it is 0), and our ``DPOTrainer`` subclass takes
``prompt_ids`` / ``chosen_ids`` / ``rejected_ids`` with per-token masks (see ``dpo.py``).

Sources of episodes (``CollectConfig.source``): the env's scripted ``oracle``, the model being
trained (``self``: rejection sampling), another model with the same tokenizer (its ids are valid
for the student; the student's chat template lays out the conversation), or a JSON file written by
``agentgym eval --json``. SFT keeps only successful episodes (filtered behaviour cloning, as the seeds
recommend); DPO pairs the best and the worst episode of each task when their rewards differ.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from agentgym.policy import SamplingParams
from agentgym.rollout_config import ROLLOUT_ALIASES, RolloutConfig
from agentgym.rollout import RolloutEngine, RolloutProgress
from agentgym.trajectory import Trajectory, check_trajectory

__all__ = ["CollectConfig", "OFFLINE_ROLLOUT_ALIASES", "offline_rollout", "source_policy", "collect_trajectories", "load_trajectories",
           "successful", "sft_example", "sft_dataset", "preference_pairs", "dpo_example", "dpo_dataset"]


#: Config keys of SFT / DPO runs that moved into their one ``rollout`` (a ``RolloutConfig``).
OFFLINE_ROLLOUT_ALIASES = {**ROLLOUT_ALIASES, "layout": "rollout",
                           **{f"data.{k}": f"rollout.sampling.{k}" for k in ("max_new_tokens", "temperature", "top_p")}}


def offline_rollout() -> RolloutConfig:
    """SFT / DPO collection defaults: the trainer's token layout (so warm-up data and RL rollouts share
    one layout) with a longer per-turn budget for oracle episodes."""
    return RolloutConfig(sampling=SamplingParams(max_new_tokens=256), max_obs_tokens=256, max_context_tokens=2048)


@dataclass
class CollectConfig:
    """Which episodes to collect: ``episodes`` tasks from ``first_task`` on (the env's train split unless
    ``env_kwargs`` says otherwise), ``samples_per_task`` episodes each.

    ``source``: ``oracle`` | ``self`` (the model being trained) | a model spec with the same
    tokenizer | ``FILE.json`` from ``agentgym eval --json`` (then nothing is collected).
    """
    source: str = field(default="oracle", metadata={
        "help": "who plays: oracle, self (the model trained), a model spec, or FILE.json from agentgym eval --json"})
    episodes: int = field(default=64, metadata={"help": "tasks to collect from (>= 1)"})
    samples_per_task: int = field(default=1, metadata={"help": "episodes per task (>= 1)"})
    first_task: int = field(default=0, metadata={"help": "index of the first task (>= 0)"})
    batch_size: int = field(default=16, metadata={
        "help": "episodes per rollout call (one batched generate per turn)"})
    seed: int = field(default=0, metadata={"help": "base seed of the collected episodes (env resets)"})

    def __post_init__(self) -> None:
        if self.episodes < 1 or self.samples_per_task < 1 or self.batch_size < 1:
            raise ValueError("episodes, samples_per_task and batch_size must be >= 1")
        if self.first_task < 0:
            raise ValueError(f"first_task must be >= 0, got {self.first_task}")


class _StudentLayout:
    """A teacher policy whose conversations are laid out with the student's tokenizer (same vocabulary),
    so the collected ids are exactly what the student would see and produce."""

    def __init__(self, policy: Any, tokenizer: Any):
        self.policy, self.tokenizer = policy, tokenizer
        from agentgym.backend import as_backend
        self.wants_context = as_backend(policy).needs_context

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams, **kwargs: Any) -> Any:
        return self.policy.generate(prompts, sampling, **kwargs)


def source_policy(source: str, model_policy: Any, env_id: str) -> Any:
    """The token-level policy that plays the episodes of ``source`` (not for ``.json`` sources)."""
    if source == "self":
        return model_policy
    if source == "oracle":
        import agentgym
        from agentgym.policies.scripted import ScriptedPolicy
        env = agentgym.make(env_id)
        oracle = getattr(env.unwrapped, "oracle", None)
        env.close()
        if oracle is None:
            raise ValueError(f"{env_id} defines no oracle; use data.source=self or a model")
        return ScriptedPolicy(model_policy.tokenizer, oracle)
    from agentgym.policies.loading import load_policy
    from agentgym.policies.backends import trainable_backend
    teacher = load_policy(source, trainable_backend(), device=str(model_policy.device))   # the one loader
    if teacher.tokenizer.get_vocab() != model_policy.tokenizer.get_vocab():
        raise ValueError(f"data.source {source!r} has another tokenizer than the model; token-level data "
                         "needs the same vocabulary (write its episodes as text and re-tokenize elsewhere)")
    return _StudentLayout(teacher, model_policy.tokenizer)


def collect_trajectories(policy: Any, env_id: str, env_kwargs: Mapping[str, Any], data: CollectConfig,
                         rollout: RolloutConfig | None = None, *, desc: str = "collect") -> list[Trajectory]:
    """Run ``data.episodes × data.samples_per_task`` episodes; groups share a task (``task_index``)."""
    from tqdm import tqdm
    engine = RolloutEngine(policy, rollout or offline_rollout())
    tasks_per_call = max(1, data.batch_size // data.samples_per_task)
    out: list[Trajectory] = []
    try:
        with tqdm(total=data.episodes * data.samples_per_task, desc=desc, unit="ep") as bar:
            for start in range(0, data.episodes, tasks_per_call):
                indices = [data.first_task + start + i for i in range(min(tasks_per_call, data.episodes - start))]
                done_before = len(out)

                def turn(p: RolloutProgress) -> None:   # live, every turn
                    bar.update(done_before + p.finished - bar.n)
                    bar.set_postfix_str(f"{p.tokens} tokens in this batch")
                batch = engine.collect(env_id, task_indices=indices, group_size=data.samples_per_task,
                                       seed=data.seed + start, env_kwargs=dict(env_kwargs), progress=turn)
                out.extend(batch.trajectories)
                bar.update(len(out) - bar.n)
    finally:
        engine.close()
    return out


def load_trajectories(path: str | Path, tokenizer: Any) -> list[Trajectory]:
    """Trajectories from ``agentgym eval --json`` output, checked against ``tokenizer``: each policy span
    must decode to the action the env received, or the ids belong to another tokenizer."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"trajectory file {p} not found")
    raw = json.loads(p.read_text())
    items = raw["trajectories"] if isinstance(raw, dict) else raw
    trajs = [Trajectory.from_dict(d) for d in items]
    for i, t in enumerate(trajs):
        if not t.token_ids:
            raise ValueError(f"{p}: trajectory {i} has no token ids (a chat-only policy's); it cannot be trained on")
        problems = check_trajectory(t, tokenizer)
        if problems:
            raise ValueError(f"{p}: trajectory {i} does not fit this model's tokenizer: {problems[0]}")
    return trajs


def successful(trajectories: Sequence[Trajectory], min_reward: float | None = None) -> list[Trajectory]:
    """Episodes the env judged successful (and, optionally, with return >= ``min_reward``)."""
    return [t for t in trajectories if t.episode.get("success") and t.num_policy_tokens > 0
            and (min_reward is None or t.total_reward >= min_reward)]


# --------------------------------------------------------------------------- SFT

def sft_example(traj: Trajectory) -> dict[str, list[int]]:
    """One SFT row: the whole episode's ids; ``assistant_masks`` = ``loss_mask`` (1 only on ids the policy
    produced, so the prompt, observations and template glue get label -100)."""
    return {"input_ids": list(traj.token_ids), "assistant_masks": list(traj.loss_mask)}


def sft_dataset(trajectories: Sequence[Trajectory]) -> Any:
    """A ``datasets.Dataset`` of :func:`sft_example` rows (what ``trl.SFTTrainer`` takes pre-tokenized)."""
    from datasets import Dataset
    if not trajectories:
        raise ValueError("no episodes to train on (none was successful?)")
    return Dataset.from_list([sft_example(t) for t in trajectories])


# --------------------------------------------------------------------------- preference pairs

def _task_key(t: Trajectory) -> Any:
    if t.task_index is not None:
        return ("task", t.env_id, t.task_index)
    if t.group_id is not None:
        return ("group", t.env_id, t.group_id)
    return None


def preference_pairs(trajectories: Sequence[Trajectory], min_gap: float = 0.0) -> list[tuple[Trajectory, Trajectory]]:
    """(chosen, rejected) per task: its highest- and lowest-return episodes, only if the returns differ by
    more than ``min_gap``. Ties pick the earliest episode (deterministic). Episodes of one task must
    share the prompt ids (else the task is skipped: the pair would condition on different prompts);
    an episode without any policy token cannot be a side of a pair."""
    groups: dict[Any, list[Trajectory]] = defaultdict(list)
    for t in trajectories:
        key = _task_key(t)
        if key is not None and t.num_policy_tokens > 0:
            groups[key].append(t)
    pairs = []
    for group in groups.values():
        if len(group) < 2:
            continue
        prompt = group[0].token_ids[: group[0].prompt_length]
        if any(t.token_ids[: t.prompt_length] != prompt for t in group):
            continue
        best = max(group, key=lambda t: t.total_reward)      # max/min return the first of equals
        worst = min(group, key=lambda t: t.total_reward)
        if best.total_reward - worst.total_reward > min_gap:
            pairs.append((best, worst))
    return pairs


def dpo_example(chosen: Trajectory, rejected: Trajectory) -> dict[str, Any]:
    """One DPO row, multi-turn: the shared task prompt, then each whole episode after it (policy turns
    *and* observations, as the policy saw them) with its ``loss_mask`` as the completion mask, so the
    sequence log-probabilities sum over the policy's own tokens only."""
    n = chosen.prompt_length
    return {"prompt_ids": list(chosen.token_ids[:n]),
            "chosen_ids": list(chosen.token_ids[n:]), "chosen_mask": list(chosen.loss_mask[n:]),
            "rejected_ids": list(rejected.token_ids[n:]), "rejected_mask": list(rejected.loss_mask[n:]),
            "chosen_reward": chosen.total_reward, "rejected_reward": rejected.total_reward}


def dpo_dataset(pairs: Sequence[tuple[Trajectory, Trajectory]]) -> Any:
    from datasets import Dataset
    if not pairs:
        raise ValueError("no preference pairs: every task's episodes had equal returns (sample more per task, "
                         "raise the temperature, or add the oracle with data.oracle_chosen=true)")
    return Dataset.from_list([dpo_example(c, r) for c, r in pairs])
