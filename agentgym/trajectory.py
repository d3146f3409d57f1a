"""``Trajectory``: one episode as training data (token-faithful, environment tokens masked).

Built append-only by :class:`TrajectoryBuilder`: the prompt, then alternating policy spans (the
ids exactly as sampled, ``loss_mask`` 1) and environment spans (observations and chat-template
glue, ``loss_mask`` 0). A step's reward belongs to the last token of that turn's policy span.

Every token also has a *kind* (its provenance, ``Trajectory.token_kinds``), one of
:data:`TOKEN_KINDS`:

==============  =====================================================================  =========
kind            what the token is                                                      loss_mask
==============  =====================================================================  =========
``prompt``      the initial prompt (system / task messages and their template)          0
``policy``      sampled by the policy (kept exactly as sampled, its EOS included)       1
``template``    chat-template glue: role headers, end-of-turn tokens, generation prompt 0
``tool``        a tool's output                                                         0
``retrieved``   a retrieved passage (Search-R1 ``<information>``, a search tool)        0
``env``         any other environment text (feedback, errors); also every env token of  0
                a trajectory written before kinds existed
==============  =====================================================================  =========

``policy`` is the only *sampled* kind: ``loss_mask == (kind == "policy")`` always holds, and
:func:`check_trajectory` asserts it. Kinds let a learner choose finer than the binary mask
(``Batch.train_mask(kinds=...)``) and let the viewer colour what is what.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Sequence

__all__ = ["Trajectory", "TrajectoryBuilder", "TokenIds", "check_trajectory", "TOKEN_KINDS", "SAMPLED_KINDS",
           "kinds_from_mask"]

#: Every token kind, in the order of their integer codes (``Batch.kind`` holds ``TOKEN_KINDS.index(kind)``).
TOKEN_KINDS: tuple[str, ...] = ("prompt", "policy", "template", "tool", "retrieved", "env")
#: The kinds the policy sampled (loss_mask 1); every other kind is environment or template text.
SAMPLED_KINDS: frozenset[str] = frozenset({"policy"})


def kinds_from_mask(loss_mask: Sequence[int], prompt_length: int) -> list[str]:
    """The kinds an older trajectory (no ``token_kinds``) implies: ``prompt``, ``policy`` where
    ``loss_mask`` is 1, ``env`` for every other token (its finer provenance is unknown)."""
    return ["prompt" if i < prompt_length else ("policy" if m else "env") for i, m in enumerate(loss_mask)]


class TokenIds(list):
    """Token ids (a plain ``list[int]``) that also carry each id's kind in ``.kinds``.

    What :meth:`Formatter.observation_ids <agentgym.formatting.Formatter.observation_ids>` returns:
    code that wants ids only uses it as the list it is; :meth:`TrajectoryBuilder.add_env` takes the
    kinds from it.
    """

    def __init__(self, ids: Sequence[int] = (), kinds: Sequence[str] | None = None):
        super().__init__(int(t) for t in ids)
        self.kinds = list(kinds) if kinds is not None else ["env"] * len(self)
        if len(self.kinds) != len(self):
            raise ValueError(f"{len(self)} ids but {len(self.kinds)} kinds")


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
    # each token's kind (TOKEN_KINDS); None: unknown (trajectories from before kinds existed, or
    # chat-only ones) — use :meth:`kinds`, which derives them from loss_mask then.
    token_kinds: list[str] | None = None

    def kinds(self) -> list[str]:
        """Each token's kind: ``token_kinds``, or for older trajectories the kinds ``loss_mask`` implies."""
        if self.token_kinds is not None:
            return list(self.token_kinds)
        return kinds_from_mask(self.loss_mask, self.prompt_length)

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
        self.token_kinds: list[str] = ["prompt"] * len(prompt_ids)
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
        self.token_kinds.extend(["policy"] * len(token_ids))
        self.logprobs.extend(float(x) for x in logprobs)
        self.turn_spans.append((start, len(self.token_ids)))
        self.actions.append(text)
        self.finish_reasons.append(finish_reason)
        self.messages.append({"role": "assistant", "content": text})

    def add_env(self, token_ids: Sequence[int], messages: Sequence[dict[str, str]] = (),
                kinds: Sequence[str] | None = None) -> None:
        """Append environment ids (``loss_mask`` 0). Their kinds: ``kinds``, else the ``.kinds`` the
        formatter attached (:class:`TokenIds`), else ``env``."""
        if kinds is None:
            kinds = getattr(token_ids, "kinds", None)
        kinds = ["env"] * len(token_ids) if kinds is None else list(kinds)
        if len(kinds) != len(token_ids):
            raise ValueError(f"{len(token_ids)} environment ids but {len(kinds)} kinds")
        wrong = set(kinds) - (set(TOKEN_KINDS) - SAMPLED_KINDS - {"prompt"})
        if wrong:
            raise ValueError(f"environment tokens cannot be of kind {sorted(wrong)}")
        self.token_kinds.extend(kinds)
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
                          group_id, task_index, env_id, temperature, list(self.token_kinds))


def check_trajectory(traj: Trajectory, tokenizer: Any, *, require_logprobs: bool | None = None) -> list[str]:
    """Token-faithfulness invariants; returns the violations (empty = all hold).

    Cheap enough for every episode (``RolloutConfig.debug_checks``):

    - lengths of ids, mask, log-probs (and kinds) agree;
    - prefix invariant: the policy turns come in order after the prompt, without overlap, so the
      ids the policy saw before turn ``k`` (``token_ids[:turn_spans[k][0]]``) hold every earlier
      turn unchanged; the mask is 1 exactly on the policy spans;
    - decoding each policy span (special tokens skipped) gives exactly the text the env received;
    - kinds agree with the mask: ``policy`` exactly where ``loss_mask`` is 1, ``prompt`` exactly on
      the first ``prompt_length`` tokens, only known kinds;
    - every ``policy`` token has a sampling log-prob: finite and <= 0, and 0.0 on every other token.
      A log-prob of exactly 0 is genuine for a deterministic policy (a scripted one reports 0 for
      every token), so a turn of two or more tokens whose log-probs are *all* exactly 0 counts as
      missing only when ``require_logprobs`` is True, or — by default (None) — when other policy
      tokens of the same trajectory have real ones (log-probs lost on some turns);
    - each step reward has a policy turn to sit on.
    """
    problems = []
    n = len(traj.token_ids)
    kinds = traj.token_kinds
    if not (len(traj.loss_mask) == len(traj.logprobs) == n) or (kinds is not None and len(kinds) != n):
        problems.append(f"length mismatch: ids {n}, mask {len(traj.loss_mask)}, logprobs {len(traj.logprobs)}"
                        + ("" if kinds is None else f", kinds {len(kinds)}"))
        return problems
    expected = [0] * n
    previous_end = traj.prompt_length
    for k, (s, e) in enumerate(traj.turn_spans):
        if not traj.prompt_length <= s <= e <= n:
            problems.append(f"span {(s, e)} outside the trajectory")
            continue
        if s < previous_end:
            problems.append(f"turn {k}: span {(s, e)} starts before the previous turn (or the prompt) ends at "
                            f"{previous_end}: not append-only")
        previous_end = max(previous_end, e)
        expected[s:e] = [1] * (e - s)
    if expected != list(traj.loss_mask):
        problems.append("loss_mask is not 1 exactly on the policy spans")
    for k, ((s, e), text) in enumerate(zip(traj.turn_spans, traj.actions)):
        decoded = tokenizer.decode(traj.token_ids[s:e], skip_special_tokens=True)
        if decoded != text:
            problems.append(f"turn {k}: decoded span {decoded!r} != sampled text {text!r}")
    if kinds is not None:
        problems.extend(_kind_problems(traj, kinds, expected))
    problems.extend(_logprob_problems(traj, require_logprobs))
    if len(traj.step_rewards) > len(traj.turn_spans):
        problems.append(f"{len(traj.step_rewards)} step rewards but {len(traj.turn_spans)} policy turns")
    return problems


def _first_positions(positions: Sequence[int], limit: int = 5) -> str:
    shown = ", ".join(str(i) for i in positions[:limit])
    return shown + (f", … ({len(positions)} in all)" if len(positions) > limit else "")


def _kind_problems(traj: Trajectory, kinds: Sequence[str], sampled: Sequence[int]) -> list[str]:
    """Kinds against the policy spans (``sampled``: 1 on them). The mask is checked against the same
    spans, so a kind that disagrees with a correct mask is named here, and a wrong mask only once."""
    problems = []
    unknown = sorted(set(kinds) - set(TOKEN_KINDS))
    if unknown:
        problems.append(f"unknown token kinds {unknown}; kinds are {list(TOKEN_KINDS)}")
    wrong = [i for i, (k, m) in enumerate(zip(kinds, sampled)) if (k in SAMPLED_KINDS) != bool(m)]
    if wrong:
        problems.append(f"token kinds disagree with loss_mask (kind 'policy' exactly on the policy spans) at "
                        f"positions {_first_positions(wrong)}")
    prompt_wrong = [i for i, k in enumerate(kinds) if (k == "prompt") != (i < traj.prompt_length)]
    if prompt_wrong:
        problems.append(f"kind 'prompt' is not exactly the first {traj.prompt_length} tokens (positions "
                        f"{_first_positions(prompt_wrong)})")
    return problems


def _logprob_problems(traj: Trajectory, require_logprobs: bool | None) -> list[str]:
    problems = []
    lps = traj.logprobs
    sampled = [0] * len(lps)
    for s, e in traj.turn_spans:
        sampled[s:e] = [1] * (e - s)
    bad = [i for i, (lp, m) in enumerate(zip(lps, sampled)) if m and not (math.isfinite(lp) and lp <= 1e-4)]
    if bad:
        problems.append(f"policy tokens without a valid sampling log-prob (finite, <= 0) at positions "
                        f"{_first_positions(bad)}")
    stray = [i for i, (lp, m) in enumerate(zip(lps, sampled)) if not m and lp != 0.0]
    if stray:
        problems.append(f"log-probs on tokens the policy did not sample at positions {_first_positions(stray)}")
    # one token at exactly 0 can be genuine (p rounds to 1); two or more all at 0 from a sampler cannot
    all_zero = [k for k, (s, e) in enumerate(traj.turn_spans) if e - s >= 2 and all(lp == 0.0 for lp in lps[s:e])]
    if require_logprobs is None:
        require_logprobs = any(lp != 0.0 for lp, m in zip(lps, sampled) if m)  # some turn has real ones
    if require_logprobs and all_zero:
        problems.append(f"turns {all_zero} have no sampling log-probs (all exactly 0)")
    return problems
