"""Training health: the numbers that tell learning from collapse, and alarms when a run collapses.

Every training step logs, beside the learner's own ``train/entropy``, ``train/clip_frac``, ``train/kl``,
``train/grad_norm`` and ``train/sampler_logp_diff_*``, what :func:`batch_health` measures on the batch:

* ``health/zero_var_groups``: share of groups whose rewards are all equal. GRPO-style advantages are
  exactly zero there: no learning signal from that group.
* ``health/group_diversity``: distinct responses / group size, averaged over groups (1: all different;
  1/n: the group sampled one answer n times).
* ``health/actions/<kind>``: actions per episode by kind, from the env's ``action_counts`` (``search``,
  ``answer``, ``tool_call``, ``code``, ``invalid``, ...).
* ``health/response_tokens``: policy tokens per episode.
* ``health/input_response_mi`` (opt-in, ``health.template_mi=true``): a plug-in estimate, in bits, of the
  mutual information between the prompt and the response's first tokens — RAGEN-2's "template collapse"
  is responses that no longer depend on the input: MI near 0 while responses still vary.

:class:`HealthMonitor` turns them into alarms (:class:`HealthConfig` sets the thresholds): entropy falling
by a set fraction within a window of steps, an action kind's rate falling below a floor after being above
it (e.g. "never searches any more"), response length collapsing, and groups without signal for several
steps in a row. An alarm is logged as a warning once when its condition starts, recorded in the run's
``alarms.json`` and marked on ``curves.png``.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

__all__ = ["Alarm", "HealthConfig", "HealthMonitor", "batch_health", "health_section", "input_response_mi"]


@dataclass
class HealthConfig:
    """Collapse alarms (``health.*`` keys of a train config)."""
    alarms: bool = field(default=True, metadata={"help": "check the rules below every step and warn"})
    window: int = field(default=5, metadata={"help": "steps over which a drop is measured (>= 2)"})
    entropy_drop: float = field(default=0.5, metadata={
        "help": "alarm when train/entropy falls by this fraction of its window maximum, in (0, 1]"})
    length_drop: float = field(default=0.5, metadata={
        "help": "the same for response tokens per episode, in (0, 1]"})
    action_floors: dict[str, float] = field(default_factory=lambda: {"search": 0.1}, metadata={
        "help": "action kind -> floor of actions per episode; alarm when a rate once >= 2x its floor falls below it"})
    no_signal_share: float = field(default=0.9, metadata={
        "help": "alarm when at least this share of groups has zero reward variance, in (0, 1] ..."})
    no_signal_steps: int = field(default=3, metadata={"help": "... for this many steps in a row (>= 1)"})
    template_mi: bool = field(default=False, metadata={
        "help": "log health/input_response_mi (RAGEN-2 template collapse), opt-in"})
    mi_tokens: int = field(default=16, metadata={"help": "response prefix (tokens) the MI estimate looks at"})
    max_outage_steps: int = field(default=3, metadata={
        "help": "stop the run, checkpointed for --resume, after this many steps in a row in which every episode "
                "ended on an infrastructure error (a retrieval server or sandbox down); 0: never stop"})

    def __post_init__(self) -> None:
        if self.window < 2 or self.no_signal_steps < 1 or self.mi_tokens < 1:
            raise ValueError("health.window must be >= 2, health.no_signal_steps and health.mi_tokens >= 1")
        if isinstance(self.max_outage_steps, bool) or self.max_outage_steps < 0:
            raise ValueError(f"health.max_outage_steps must be >= 0 (0: never stop), got {self.max_outage_steps}")
        for name in ("entropy_drop", "length_drop", "no_signal_share"):
            if not 0.0 < getattr(self, name) <= 1.0:
                raise ValueError(f"health.{name} must be in (0, 1], got {getattr(self, name)}")
        if not isinstance(self.action_floors, dict) or any(
                isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 for v in self.action_floors.values()):
            raise ValueError(f"health.action_floors must map action kinds to floors >= 0, got {self.action_floors!r}")


@dataclass(frozen=True)
class Alarm:
    step: int
    rule: str               # entropy_drop, length_drop, action_floor:<kind>, no_signal
    message: str


def _groups(trajectories: Sequence[Any]) -> dict[Any, list[Any]]:
    groups: dict[Any, list[Any]] = defaultdict(list)
    for i, t in enumerate(trajectories):
        groups[t.group_id if t.group_id is not None else ("single", i)].append(t)
    return groups


def _response(t: Any, tokens: int | None = None) -> tuple[int, ...]:
    ids = t.token_ids[t.prompt_length:]
    return tuple(ids[:tokens] if tokens is not None else ids)


def _entropy_bits(counts: Counter) -> float:
    n = sum(counts.values())
    return -sum(c / n * math.log2(c / n) for c in counts.values()) if n else 0.0


def input_response_mi(trajectories: Sequence[Any], tokens: int = 16) -> float:
    """I(prompt; response prefix) in bits, plug-in: H(response) − mean over prompts of H(response | prompt)."""
    by_prompt: dict[tuple[int, ...], Counter] = defaultdict(Counter)
    for t in trajectories:
        by_prompt[tuple(t.token_ids[:t.prompt_length])][_response(t, tokens)] += 1
    total = Counter()
    for c in by_prompt.values():
        total.update(c)
    n = sum(total.values())
    conditional = sum(sum(c.values()) / n * _entropy_bits(c) for c in by_prompt.values()) if n else 0.0
    return max(0.0, _entropy_bits(total) - conditional)


def batch_health(trajectories: Sequence[Any], config: HealthConfig | None = None) -> dict[str, float]:
    """The ``health/*`` metrics of one rollout batch (see the module docstring)."""
    trajectories = list(trajectories)
    if not trajectories:
        return {}
    config = config or HealthConfig()
    groups = [g for g in _groups(trajectories).values() if len(g) > 1]
    out: dict[str, float] = {"health/response_tokens": sum(t.num_policy_tokens for t in trajectories) / len(trajectories)}
    if groups:
        out["health/zero_var_groups"] = sum(len({t.total_reward for t in g}) == 1 for g in groups) / len(groups)
        out["health/group_diversity"] = sum(len({_response(t) for t in g}) / len(g) for g in groups) / len(groups)
    kinds = Counter()
    for t in trajectories:
        kinds.update((t.episode or {}).get("action_counts") or {})
    for kind, count in sorted(kinds.items()):
        out[f"health/actions/{kind}"] = count / len(trajectories)
    for kind in config.action_floors:   # a kind that vanished from the batch is a rate of 0, not a gap
        out.setdefault(f"health/actions/{kind}", 0.0)
    if config.template_mi:
        out["health/input_response_mi"] = input_response_mi(trajectories, config.mi_tokens)
    return out


class HealthMonitor:
    """Checks each logged row against :class:`HealthConfig`'s rules; an alarm fires once when its
    condition starts and again only after the condition has cleared."""

    def __init__(self, config: HealthConfig | None = None) -> None:
        self.config = config or HealthConfig()
        self.rows: list[dict[str, float]] = []
        self.alarms: list[Alarm] = []
        self._active: set[str] = set()
        self._armed: set[str] = set()     # action kinds seen at or above twice their floor
        self._seen = 0                    # rows that _active and _armed reflect

    def _series(self, key: str) -> list[float]:
        vals = [r.get(key) for r in self.rows[-self.config.window:]]
        return [v for v in vals if isinstance(v, (int, float)) and math.isfinite(v)]

    def _drop(self, key: str, fraction: float) -> str | None:
        vals = self._series(key)
        if len(vals) < 2 or max(vals) <= 0:
            return None
        top, now = max(vals), vals[-1]
        if now <= top * (1 - fraction):
            return f"{key} fell from {top:.3g} to {now:.3g} within {len(vals)} steps (-{1 - now / top:.0%})"
        return None

    def _floor(self, kind: str, floor: float) -> str | None:
        value = self.rows[-1].get(f"health/actions/{kind}")
        if value is None:
            return None
        if value >= 2 * floor:
            self._armed.add(kind)
        if kind in self._armed and value < floor:
            return f"{kind} actions per episode fell to {value:.3g}, below the floor {floor:g}"
        return None

    def _no_signal(self) -> str | None:
        n, share = self.config.no_signal_steps, self.config.no_signal_share
        vals = [r.get("health/zero_var_groups") for r in self.rows[-n:]]
        if len(vals) == n and all(v is not None and v >= share for v in vals):
            return (f"{vals[-1]:.0%} of groups had equal rewards (zero advantage) for {n} steps in a row: "
                    "no learning signal")
        return None

    def check(self, row: dict[str, float]) -> list[Alarm]:
        """Add one logged row; returns the alarms that start at it."""
        if not self.config.alarms:
            return []
        if self._seen != len(self.rows):   # rows restored from a checkpoint: which alarms are on, what is armed
            self._replay()
        new = self._update(row)
        self.alarms.extend(new)
        return new

    def _update(self, row: dict[str, float]) -> list[Alarm]:
        """Append ``row`` and move the rules' state; the alarms that start at it."""
        self.rows.append(row)
        found = {"entropy_drop": self._drop("train/entropy", self.config.entropy_drop),
                 "length_drop": self._drop("health/response_tokens", self.config.length_drop),
                 "no_signal": self._no_signal()}
        for kind, floor in self.config.action_floors.items():
            found[f"action_floor:{kind}"] = self._floor(kind, floor)
        new = []
        for rule, message in found.items():
            if message is None:
                self._active.discard(rule)
            elif rule not in self._active:
                self._active.add(rule)
                step = row.get("step")
                step = int(step) if isinstance(step, (int, float)) and math.isfinite(step) else len(self.rows)
                new.append(Alarm(step, rule, message))
        self._seen = len(self.rows)
        return new

    def _replay(self) -> None:
        """Rebuild the rules' state from :attr:`rows` (their alarms were recorded when they fired)."""
        rows, self.rows = list(self.rows), []
        self._active, self._armed = set(), set()
        for row in rows:
            self._update(row)

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps: the rows seen and the alarms fired (JSON-ready)."""
        return {"rows": list(self.rows), "alarms": [asdict(a) for a in self.alarms]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`: an alarm on at the checkpoint does not fire again while it lasts."""
        self.rows = list(state.get("rows", []))
        self.alarms = [a if isinstance(a, Alarm) else Alarm(**a) for a in state.get("alarms", [])]
        self._replay()


def health_section(curves_png: Any, alarms: Sequence[Alarm]) -> tuple[str, str]:
    """("training health", HTML) for the run's HTML report: the curves image inline and the alarms table."""
    import base64
    import html
    from pathlib import Path

    path = Path(curves_png)
    img = (f'<img alt="training curves" style="max-width:100%" src="data:image/png;base64,'
           f'{base64.b64encode(path.read_bytes()).decode()}">' if path.exists() else "<p>no curves (no steps)</p>")
    if alarms:
        rows = "".join(f"<tr><td>{a.step}</td><td>{html.escape(a.rule)}</td><td>{html.escape(a.message)}</td></tr>"
                       for a in alarms)
        table = f"<table><tr><th>step</th><th>alarm</th><th>what</th></tr>{rows}</table>"
    else:
        table = "<p>no health alarm fired</p>"
    return f"training health ({len(alarms)} alarm{'s' if len(alarms) != 1 else ''})", table + img
