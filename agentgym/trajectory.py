"""``Trajectory``: one episode as training data (token-faithful, environment tokens masked).

Built append-only by :class:`TrajectoryBuilder`: the prompt, then alternating policy spans (the
ids exactly as sampled, ``loss_mask`` 1) and environment spans (observations and chat-template
glue, ``loss_mask`` 0). A step's reward belongs to the last token of that turn's policy span.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Sequence

__all__ = ["Trajectory", "TrajectoryBuilder", "check_trajectory"]


@dataclass
class Trajectory:
    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]            # sampling-time log-probs on policy tokens, 0.0 elsewhere
    prompt_length: int               # ids of the initial prompt (loss_mask 0)
    turn_spans: list[tuple[int, int]]  # [start, end) of each policy turn's sampled ids
    actions: list[str]               # the text of each policy turn, as given to the env
    finish_reasons: list[str]
    step_rewards: list[float]        # one per env step
    reward_terms: list[dict[str, float]]
    messages: list[dict[str, str]]   # the conversation (observations as the policy saw them)
    episode: dict[str, Any] = field(default_factory=dict)  # the env's episode summary
    terminated: bool = False
    truncated: bool = False
    group_id: int | None = None
    task_index: int | None = None
    env_id: str | None = None
    # temperature of ``logprobs`` (log-softmax(logits / T)); learners recompute log-probs at this T.
    # None: unknown (e.g. trajectories loaded from an older file) — learners then assume 1.0.
    temperature: float | None = None

    @property
    def total_reward(self) -> float:
        return float(sum(self.step_rewards))

    @property
    def num_turns(self) -> int:
        return len(self.actions)

    @property
    def num_policy_tokens(self) -> int:
        return int(sum(self.loss_mask))

    @property
    def reward_positions(self) -> list[int]:
        """Token index that carries each step's reward (the last token of that policy turn)."""
        return [end - 1 for _, end in self.turn_spans]

    def token_rewards(self) -> list[float]:
        """Per-token rewards: each step reward placed on its turn's last policy token."""
        out = [0.0] * len(self.token_ids)
        for pos, r in zip(self.reward_positions, self.step_rewards):
            out[pos] += r
        return out

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Trajectory":
        d = dict(d)
        d["turn_spans"] = [tuple(s) for s in d["turn_spans"]]
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


class TrajectoryBuilder:
    """Append-only construction; earlier ids are never touched."""

    def __init__(self, prompt_ids: Sequence[int], messages: Sequence[dict[str, str]]):
        self.token_ids: list[int] = list(prompt_ids)
        self.loss_mask: list[int] = [0] * len(prompt_ids)
        self.logprobs: list[float] = [0.0] * len(prompt_ids)
        self.prompt_length = len(prompt_ids)
        self.turn_spans: list[tuple[int, int]] = []
        self.actions: list[str] = []
        self.finish_reasons: list[str] = []
        self.step_rewards: list[float] = []
        self.reward_terms: list[dict[str, float]] = []
        self.messages: list[dict[str, str]] = [dict(m) for m in messages]

    def __len__(self) -> int:
        return len(self.token_ids)

    def add_policy(self, token_ids: Sequence[int], logprobs: Sequence[float], text: str, finish_reason: str) -> None:
        if len(token_ids) != len(logprobs):
            raise ValueError(f"{len(token_ids)} sampled ids but {len(logprobs)} log-probs")
        start = len(self.token_ids)
        self.token_ids.extend(int(t) for t in token_ids)
        self.loss_mask.extend([1] * len(token_ids))
        self.logprobs.extend(float(x) for x in logprobs)
        self.turn_spans.append((start, len(self.token_ids)))
        self.actions.append(text)
        self.finish_reasons.append(finish_reason)
        self.messages.append({"role": "assistant", "content": text})

    def add_env(self, token_ids: Sequence[int], messages: Sequence[dict[str, str]] = ()) -> None:
        self.token_ids.extend(int(t) for t in token_ids)
        self.loss_mask.extend([0] * len(token_ids))
        self.logprobs.extend([0.0] * len(token_ids))
        self.messages.extend(dict(m) for m in messages)

    def add_step(self, reward: float, terms: dict[str, float]) -> None:
        self.step_rewards.append(float(reward))
        self.reward_terms.append(dict(terms))

    def build(self, *, episode: dict[str, Any] | None = None, terminated: bool = False, truncated: bool = False,
              group_id: int | None = None, task_index: int | None = None, env_id: str | None = None,
              temperature: float | None = None) -> Trajectory:
        return Trajectory(list(self.token_ids), list(self.loss_mask), list(self.logprobs), self.prompt_length,
                          list(self.turn_spans), list(self.actions), list(self.finish_reasons),
                          list(self.step_rewards), [dict(t) for t in self.reward_terms],
                          [dict(m) for m in self.messages], dict(episode or {}), terminated, truncated,
                          group_id, task_index, env_id, temperature)


def check_trajectory(traj: Trajectory, tokenizer: Any) -> list[str]:
    """Token-faithfulness invariants; returns the violations (empty = all hold).

    - lengths of ids, mask and log-probs agree; the mask is 1 exactly on the policy spans;
    - decoding each policy span (special tokens skipped) gives exactly the text the env received;
    - each step reward has a policy turn to sit on.
    """
    problems = []
    n = len(traj.token_ids)
    if not (len(traj.loss_mask) == len(traj.logprobs) == n):
        problems.append(f"length mismatch: ids {n}, mask {len(traj.loss_mask)}, logprobs {len(traj.logprobs)}")
        return problems
    expected = [0] * n
    for s, e in traj.turn_spans:
        if not traj.prompt_length <= s <= e <= n:
            problems.append(f"span {(s, e)} outside the trajectory")
            continue
        expected[s:e] = [1] * (e - s)
    if expected != list(traj.loss_mask):
        problems.append("loss_mask is not 1 exactly on the policy spans")
    for k, ((s, e), text) in enumerate(zip(traj.turn_spans, traj.actions)):
        decoded = tokenizer.decode(traj.token_ids[s:e], skip_special_tokens=True)
        if decoded != text:
            problems.append(f"turn {k}: decoded span {decoded!r} != sampled text {text!r}")
    if len(traj.step_rewards) > len(traj.turn_spans):
        problems.append(f"{len(traj.step_rewards)} step rewards but {len(traj.turn_spans)} policy turns")
    return problems
