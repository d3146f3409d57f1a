"""A run's learning curves (``curves.png``) and its held-out gain with a paired confidence interval."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from agentgym.algorithms.loop.health import Alarm

__all__ = ["held_out_gain", "plot_curves"]


def held_out_gain(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float] | None:
    """Held-out success after − before on the same tasks, with a 95 % paired bootstrap CI over tasks."""
    from agentgym.stats import paired_bootstrap_ci, paired_count, verdict
    a, b = after.get("successes"), before.get("successes")
    if not a or not b or len(a) != len(b):
        return None
    ci = paired_bootstrap_ci(a, b)
    return {"success_gain": ci[0], "ci_low": ci[1], "ci_high": ci[2], "tasks": float(paired_count(a, b)),
            "verdict": verdict(ci)}


def plot_curves(history: list[dict[str, float]], evals: list[dict[str, Any]], path: Path, title: str,
                alarms: Sequence[Alarm] = ()) -> None:
    """PNG learning curves: rollout reward / success, each reward term, the learner's stats, training health
    (groups without signal, diversity, actions per episode by kind); health alarms as red vertical lines."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    if not history:
        return
    steps = [r["step"] for r in history]
    panels = [("reward", ["rollout/reward_mean", "rollout/success_rate"]),
              ("reward terms", sorted(k for k in history[-1] if k.startswith("rollout/reward/"))),
              ("learner", [k for k in ("train/kl", "train/entropy", "train/clip_frac", "train/grad_norm") if k in history[-1]]),
              ("tokens", ["rollout/response_tokens_mean", "rollout/turns_mean"]),
              ("health", sorted(k for k in history[-1] if k.startswith("health/") and k != "health/response_tokens"))]
    panels[2][1].extend(k for k in ("train/sampler_logp_diff_mean",) if k in history[-1])
    panels = [(name, keys) for name, keys in panels if keys]   # e.g. no reward terms: no empty panel
    cols = 3
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax, (name, keys) in zip(axes.flat, panels):
        for k in keys:
            ax.plot(steps, [r.get(k, float("nan")) for r in history], label=k.split("/", 1)[1], marker=".")
        if name == "reward":
            ev = [e for e in evals if "eval/success_rate" in e]
            if ev:
                ax.plot([e["step"] for e in ev], [e["eval/success_rate"] for e in ev], "k--o", label="eval success (greedy)")
        for a in alarms:
            ax.axvline(a.step, color="red", alpha=0.5, linestyle=":", linewidth=1.2)
        ax.set_title(name + (f" ({len(alarms)} alarm{'s' if len(alarms) != 1 else ''}: red lines)"
                             if alarms and name == "health" else ""))
        ax.set_xlabel("step")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
