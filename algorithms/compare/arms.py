"""The arms of a comparison: which variants run (``--algos``), each run's resolved config, and the policy
each run starts from; what the comparison declared about them before it ran (its primary metric, the ones
added later as exploratory) and the code each run ran (the report's opening and provenance block). See :mod:`agentgym.algorithms.compare.harness` for the harness and its guarantees."""

from __future__ import annotations

import copy
import dataclasses
import datetime
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from agentgym.stats import format_ci
from agentgym.config import load_config

from agentgym.algorithms.catalog import LEARNERS, learner_config_class
from agentgym.algorithms.loop.train_config import TrainConfig
from agentgym.algorithms.loop.optim import OptimConfig

__all__ = ["CompareError", "DECLARATION_FILE", "DEFAULT_PRIMARY", "EXTERNAL_ALGOS", "EXTERNAL_SETTINGS", "HARNESS_KEYS",
           "METRICS", "SHARED_KEYS", "RunRecord", "Variant", "declare_metrics", "metric_role", "parse_variants",
           "primary_lines", "provenance_lines", "run_commits"]

#: Learners trained outside :class:`Trainer`: name -> ``module:function`` imported on first use. The
#: function is ``train_with_trl(env, policy, *, steps, num_generations, prompts_per_step, …) -> dict``
#: whose ``history`` has the trainer's row format (``step``, ``rollout/reward_mean``, …).
EXTERNAL_ALGOS = {"trl-grpo": "agentgym.algorithms.offline.trl_adapter:train_with_trl"}
#: The learner settings an external learner takes (see the module docstring).
EXTERNAL_SETTINGS = frozenset({"optim.lr", "learner.kl_coef", "learner.micro_batch_size"})

#: Settings every variant shares: they define the tasks and the rollout budget.
SHARED_KEYS = frozenset({"env", "env_kwargs", "steps", "seed", "algo", "output_dir", "groups_per_step",
                         "group_size", "model", "rollout", "sampling", "eval", "style", "max_obs_tokens",
                         "max_context_tokens"})
#: Keys the harness itself sets (from --env/--algos/--seeds/--steps/--out).
HARNESS_KEYS = {"algo": "--algos", "seed": "--seeds", "steps": "--steps", "output_dir": "--out", "env": "--env"}


class CompareError(ValueError):
    """A bad harness argument (reported in one line by the CLI)."""


#: the metrics a comparison can declare primary (``--primary``) or add as exploratory, and what each is
METRICS = {"eval_success_after": "held-out success after training",
           "eval_reward_after": "held-out reward after training",
           "final_reward": "training reward at the last step (sampled)",
           "final_success": "training success at the last step (sampled)",
           "auc_reward": "mean training reward over all steps (AUC)"}
#: what a comparison is about unless it declares otherwise: the held-out (test split) success after training
DEFAULT_PRIMARY = "eval_success_after"
#: the study's declaration, written into --out before the first run starts
DECLARATION_FILE = "compare_declared.json"


@dataclass(frozen=True)
class Variant:
    """One compared configuration: a learner plus its own overrides (``grpo:mask_env_tokens=false``)."""
    label: str
    algo: str
    overrides: tuple[str, ...] = ()

    @property
    def dirname(self) -> str:
        """A filesystem-safe name for the run directory."""
        return "".join(c if c.isalnum() or c in "-_." else "_" for c in self.label.replace("=", "-"))


@dataclass
class RunRecord:
    """What one (variant, seed) run produced; ``tasks[i]`` is step i+1's prompt digest."""
    label: str
    algo: str
    seed: int
    output_dir: str
    config: dict[str, Any]
    history: list[dict[str, float]] = field(default_factory=list)
    before: dict[str, float] = field(default_factory=dict)
    after: dict[str, float] = field(default_factory=dict)
    tasks: list[str] = field(default_factory=list)
    task_indices: list[list[int | None]] = field(default_factory=list)
    wall_s: float = 0.0
    primary: str = DEFAULT_PRIMARY      # the metric the comparison declared primary when this run was made


def _variant_key(key: str, algo: str) -> str:
    """A bare key's one path: ``lr`` → ``optim.lr``, a setting of ``algo``'s typed learner config →
    ``learner.<key>``; TrainConfig fields and dotted keys stay as they are."""
    top = {f.name for f in dataclasses.fields(TrainConfig)}
    if "." in key or key in top:
        return key
    if key in {f.name for f in dataclasses.fields(OptimConfig)}:
        return f"optim.{key}"
    config = learner_config_class(algo)
    if key in {f.name for f in dataclasses.fields(config)}:
        return f"learner.{key}"
    own = ", ".join(sorted(f.name for f in dataclasses.fields(config)))
    raise CompareError(f"variant setting {key!r} is neither a TrainConfig, an optim nor a {config.__name__} field "
                       f"(the {algo} learner's settings: {own})")


def parse_variants(text: str | Sequence[str]) -> list[Variant]:
    """``"reinforce,ppo,grpo:mask_env_tokens=false"`` → variants (labels must be unique). Any registered
    learner (:data:`~agentgym.algorithms.catalog.LEARNERS`, including ones a ``--import`` module added)
    or external one is accepted."""
    items = text.split(",") if isinstance(text, str) else list(text)
    known = sorted(LEARNERS) + sorted(EXTERNAL_ALGOS)
    out: list[Variant] = []
    for item in (s.strip() for s in items):
        if not item:
            continue
        algo, *settings = item.split(":")
        algo = algo.strip()
        if algo.lower() in LEARNERS:
            algo = algo.lower()
        if algo not in known:
            raise CompareError(f"unknown algo {algo!r} in --algos; choose from {', '.join(known)}")
        overrides = []
        for s in settings:
            if "=" not in s:
                raise CompareError(f"variant {item!r}: {s!r} is not key=value")
            key, value = s.split("=", 1)
            key = _variant_key(key.strip(), algo)
            if key.split(".")[0] in SHARED_KEYS:
                raise CompareError(f"variant {item!r}: {key} must be the same for every algo "
                                   "(set it for all runs as a key=value override)")
            if algo in EXTERNAL_ALGOS and key not in EXTERNAL_SETTINGS:
                raise CompareError(f"variant {item!r}: {algo} takes only {', '.join(sorted(EXTERNAL_SETTINGS))}")
            overrides.append(f"{key}={value}")
        out.append(Variant(item, algo, tuple(overrides)))
    if not out:
        raise CompareError("--algos is empty")
    labels = [v.label for v in out]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise CompareError(f"--algos lists {', '.join(dup)} twice")
    dirs = [v.dirname for v in out]
    if len(set(dirs)) != len(dirs):
        raise CompareError("two variants map to the same run directory; make their labels differ")
    return out


def _resolve(env: str | None, variant: Variant, seed: int, steps: int, config: str | Path | None,
             overrides: Sequence[str], out_dir: Path) -> TrainConfig:
    """The run's TrainConfig: defaults < config file < harness defaults < user overrides < run identity."""
    harness_defaults = ["checkpoint_every=0"]  # curves are the product; the final checkpoint is removed
    identity = [f"algo={variant.algo}", f"seed={seed}", f"steps={steps}",
                f"output_dir={out_dir / variant.dirname / f'seed{seed}'}"]
    if env is not None:
        identity.append(f"env={env}")
    cfg = load_config(TrainConfig, config, [*harness_defaults, *overrides, *variant.overrides, *identity])
    return cfg


def _check_env(env_id: str, env_kwargs: Any = None, eval_env_kwargs: Any = None) -> None:
    """The env is registered and takes these constructor arguments (said before any model loads)."""
    import gymnasium as gym

    import agentgym  # noqa: F401  (registers the built-in envs)
    from agentgym.config import ConfigError
    from agentgym.registry import check_run_env_kwargs, full_id
    if full_id(env_id) not in gym.registry:
        raise CompareError(f"no env {env_id!r}; registered: {', '.join(agentgym.list_envs())}")
    try:
        check_run_env_kwargs(full_id(env_id), env_kwargs, eval_env_kwargs)
    except ConfigError as e:
        raise CompareError(str(e)) from None


class _PolicySource:
    """Loads a pretrained model once, through the one loader (:func:`~agentgym.policies.loading.load_policy`,
    with the backend learners train), and hands every run a fresh deep copy (a load costs ~15 s on CPU;
    every run must start from the same weights anyway). ``tiny-random`` is left to the trainer, which
    initialises it from the run's seed."""

    def __init__(self) -> None:
        self._base: dict[tuple[str, str | None, str | None], Any] = {}

    def fresh(self, cfg: TrainConfig) -> Any | None:
        if cfg.model == "tiny-random":
            return None
        from agentgym.policies.loading import load_policy
        from agentgym.policies.backends import trainable_backend
        dtype = getattr(cfg, "dtype", None)
        key = (cfg.model, cfg.device, dtype)
        if key not in self._base:
            self._base[key] = load_policy(cfg.model, trainable_backend(), device=cfg.device, dtype=dtype)
        base = self._base[key]
        return type(base)(copy.deepcopy(base.model), base.tokenizer, max_batch_size=base.max_batch_size,
                          name=base.name)


def _check_metric(name: str, flag: str) -> str:
    if name not in METRICS:
        raise CompareError(f"{flag} {name!r} is not a comparison metric; choose from {', '.join(METRICS)}")
    return name


def _recorded_primary(out: Path) -> tuple[str | None, str]:
    """The primary metric this study declared (its :data:`DECLARATION_FILE`, else a finished run's
    ``compare_run.json``) and where that was read; (None, "") for a study with no record yet."""
    declared = out / DECLARATION_FILE
    if declared.is_file():
        return json.loads(declared.read_text()).get("primary"), str(declared)
    for done in sorted(out.glob("*/seed*/compare_run.json")):
        return json.loads(done.read_text()).get("primary", DEFAULT_PRIMARY), str(done)
    return None, ""


def declare_metrics(out: Path, primary: str | None, exploratory: Sequence[str], *, continuing: bool,
                    split: str | None) -> dict[str, Any]:
    """The study's metrics, checked (and, unless only reporting, written) before any run starts.

    A comparison says what it is about before it sees a result: ``primary`` (default
    :data:`DEFAULT_PRIMARY`) is recorded in :data:`DECLARATION_FILE` and in every run's
    ``compare_run.json``. ``continuing`` (``--resume``, ``--report-only``): the recorded primary holds;
    another ``--primary`` is refused, because choosing the headline after the results is how comparisons
    fool their readers. A metric looked at later is added with ``exploratory`` and labelled so in the
    report (with whether finished runs, i.e. test results, existed when it was added)."""
    recorded, where = _recorded_primary(out) if continuing else (None, "")
    if primary is not None:
        _check_metric(primary, "--primary")
    if recorded is not None and primary is not None and primary != recorded:
        raise CompareError(f"--primary {primary}: this comparison declared {recorded} before it ran ({where}); "
                           f"a metric chosen after the results is added with --exploratory {primary}")
    primary = primary or recorded or DEFAULT_PRIMARY
    previous = {}
    if continuing and (out / DECLARATION_FILE).is_file():
        previous = json.loads((out / DECLARATION_FILE).read_text())
    seen = bool(list(out.glob("*/seed*/compare_run.json"))) if continuing else False
    added = dict(previous.get("exploratory", {}))
    for name in exploratory:
        if _check_metric(name, "--exploratory") == primary:
            raise CompareError(f"--exploratory {name} is this comparison's primary metric")
        added.setdefault(name, {"after_results": seen, "date": datetime.date.today().isoformat()})
    return {"primary": primary, "description": METRICS[primary], "split": split,
            "declared": previous.get("declared", datetime.date.today().isoformat()), "exploratory": added}


def metric_role(metric: str, declared: Mapping[str, Any] | None) -> str:
    """``primary`` (declared before the runs), ``exploratory`` (added later) or ``secondary`` (the rest)."""
    declared = declared or {"primary": DEFAULT_PRIMARY}
    if metric == declared["primary"]:
        return "primary"
    return "exploratory" if metric in (declared.get("exploratory") or {}) else "secondary"


def _exploratory_note(declared: Mapping[str, Any]) -> str:
    extra = declared.get("exploratory") or {}
    if not extra:
        return ""
    names = ", ".join(f"`{m}`" + (" (added after test results)" if info.get("after_results") else "")
                      for m, info in extra.items())
    return f"; exploratory, chosen after the declaration: {names}"


def primary_lines(summary: Mapping[str, Any], declared: Mapping[str, Any] | None, scored: str,
                  split: str) -> list[str]:
    """The report's opening: the declared primary metric, which split it is on (``split``: the eval split's
    name), each arm's value and every pair's headline interval (held-out success: over seeds and questions; a
    training metric: over seeds). Without a declaration (a summary built by hand) it is the default."""
    primary = (declared or {}).get("primary", DEFAULT_PRIMARY)
    when = f"declared {declared['declared']} before the runs" if declared else "the default, no declaration recorded"
    where = (f"held-out split `{split}`, {scored} per task" if primary.startswith("eval_")
             else "training rollouts, sampled")
    lines = [f"**Primary metric: {METRICS[primary]}** (`{primary}`, {where}), {when}; every other figure is "
             f"secondary{_exploratory_note(declared or {})}.", ""]
    arms = {k: v for k, v in summary.items() if not k.startswith("_")}
    values = ", ".join(f"`{k}` {np.nanmean(v['per_seed'][primary]):.3f}" for k, v in arms.items()
                       if v.get("per_seed", {}).get(primary))
    lines += [f"Mean over seeds: {values}.", ""] if values else []
    if primary == "eval_success_after" and summary.get("_paired"):
        lines += ["| a − b | difference | 95 % CI over seeds and questions (headline) "
                  "| over questions, conditional on these runs | verdict |", "|---|---:|---:|---:|---|"]
        for d in summary["_paired"]:
            head = _ci_text(d["headline"], d["headline_undefined"])
            cond = _ci_text(d["over_tasks"], d["over_tasks_undefined"])
            lines.append(f"| `{d['a']}` − `{d['b']}` | {d['diff']:+.3f} | {head} | {cond} | {d['verdict']} |")
    else:
        rows = [d for d in summary.get("_differences", []) if d["metric"] == primary]
        if rows:
            lines += ["| a − b | difference | 95 % CI over seeds (Welch) | verdict |", "|---|---:|---:|---|"]
            lines += [f"| `{d['a']}` − `{d['b']}` | {d['diff']:+.3f} | "
                      f"{_ci_text((d['diff'], d['low'], d['high']), d.get('undefined'))} | {d['verdict']} |" for d in rows]
    return lines + [""]


def _ci_text(ci: Sequence[float], reason: str | None) -> str:
    return f"n/a ({reason})" if reason else format_ci(tuple(ci))  # type: ignore[arg-type]


def run_commits(records: Sequence[Any]) -> dict[str, list[str]]:
    """commit (``+dirty`` when the checkout had uncommitted changes) -> the runs made at it, from each run's
    ``provenance.json``; ``unknown`` for a run without one (made before runs recorded their code)."""
    out: dict[str, list[str]] = {}
    for r in records:
        path = Path(r.output_dir) / "provenance.json" if r.output_dir else None
        code: Mapping[str, Any] = {}
        if path is not None and path.is_file():
            try:
                code = json.loads(path.read_text()).get("code") or {}
            except (OSError, ValueError):
                code = {}
        commit = code.get("commit")
        key = f"{commit[:12]}{'+dirty' if code.get('dirty') else ''}" if commit else "unknown"
        out.setdefault(key, []).append(f"{r.label} seed {r.seed}")
    return out


def provenance_lines(provenance: Mapping[str, Any], commits: Mapping[str, Sequence[str]]) -> list[str]:
    """compare.md's provenance block: the code, libraries and machine that wrote the report, and the commit
    of every run (a comparison whose runs ran different code says so)."""
    code, dev = provenance["code"], provenance["device"]
    at = (f"commit `{code['commit'][:12]}`" + (" with uncommitted changes" if code.get("dirty") else "")
          if code.get("commit") else f"agentgym {code.get('agentgym')} (installed, no checkout)")
    packages = ", ".join(f"{k} {v or '—'}" for k, v in provenance["packages"].items())
    device = dev.get("gpu") or f"{dev.get('cpu')} ({', '.join(dev.get('cpu_flags', [])) or 'no bf16 flags'})"
    runs = "; ".join(f"`{c}`: {len(names)} run{'s' * (len(names) > 1)}" for c, names in commits.items())
    mixed = f" — **{len(commits)} different commits**" if len(commits) > 1 else ""
    return ["**Provenance**: report written at " + at + f"; {packages}; {device}; {provenance.get('threads')} "
            f"threads; python {provenance.get('python')}. Runs' code: {runs}{mixed}.", ""]
