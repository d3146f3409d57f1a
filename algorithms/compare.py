"""Algorithm comparison harness: several learners on one env, same tasks, same seeds, same budget.

``agentgym compare --env Arithmetic-v0 --algos reinforce,ppo,grpo --seeds 2 --steps 4`` runs one
:class:`~agentgym.algorithms.trainer.Trainer` per (algorithm, seed) — the training loop is not
duplicated here — each in ``OUT/<algo>/seed<k>/``, then writes into ``OUT``:

- ``compare.csv``: long format, one row per (algo, seed, step) (``phase=train``) plus the greedy
  held-out evals before and after training (``phase=eval``, steps 0 and K);
- ``compare.png``: mean ± std (over seeds) learning curves per algorithm, against episodes;
- ``compare.md``: the summary table (definitions below it);
- ``compare.json``: everything raw (resolved config, per-run histories, task digests, summary). An
  interval that does not exist (one seed; every seed gave the same value, i.e. zero width) has NaN
  bounds there and its reason beside it (``ci_undefined``, a difference's ``undefined``).

**How the rollout budget is matched.** Every run collects ``groups_per_step × group_size``
episodes per step (the trainer's layout), for every algorithm: GRPO's G groups × K samples *are* the
other learners' G×K episodes. At a given (seed, step) all runs draw the same task indices, the same
env reset seeds and the same sampling seed (the trainer derives them from (seed, step)), so the
tasks are identical across algorithms — the harness records a digest of every step's prompt ids and
checks it. REINFORCE and PPO see each task K times; they ignore the grouping (their baselines are
batch-level / a critic), so they get exactly the data GRPO gets. Settings that define the task
distribution or the budget (env, steps, seeds, layout, model, sampling, eval) cannot differ
between variants. What does differ is compute per update (PPO also trains a value head; ``epochs``).

**Variants** of one learner are compared the same way: ``--algos grpo,grpo:mask_env_tokens=false``
(``ALGO[:key=value[:key=value…]]``; a bare key that is a :class:`LearnerConfig` field means
``learner.<key>``). That is the retrieved-token masking ablation in one command.

**Metrics** (train metrics are the sampled rollouts' own rewards, i.e. on-policy and noisy; the eval
is greedy on the same held-out tasks before and after):

- *final reward / success*: the last training step's batch mean, mean ± std over seeds;
- *AUC*: the mean training reward over all steps (area under the reward-vs-episodes curve divided
  by the episodes, so 1.0 would be "perfect from the first episode"); rewards learning early;
- *episodes to X %*: with r0 the mean first-step reward of all runs (the same policy on the same
  tasks) and r* the best algorithm's final seed-mean reward, the first point where an algorithm's
  seed-mean curve reaches r0 + X·(r* − r0), in training episodes; "—" if never, or if no algorithm
  improved on r0 (nothing to be efficient at).

``trl-grpo`` trains with TRL's ``GRPOTrainer`` through ``algorithms/trl_adapter.py`` (imported lazily,
see :func:`run_trl_grpo`) with the same budget (``groups_per_step`` prompts × ``group_size``
generations per step, one optimizer step each), sampling settings and held-out eval. Its tasks come
from TRL's sampler over the env's task list, so they are the same *distribution* but not the same
draws (its runs are left out of the same-tasks check and the table says so); of the learner
settings it takes ``lr``, ``kl_coef`` (TRL's ``beta``) and ``micro_batch_size``, the rest are TRL's
GRPO defaults.
"""

from __future__ import annotations

import copy
import csv
import dataclasses
import datetime
import hashlib
import json
import math
import os
import platform
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch

from agentgym.config import load_config, to_dict
from agentgym.stats import diff_ci, format_ci, mean_ci, min_detectable_difference, verdict, without_undefined

from agentgym.algorithms.catalog import LEARNERS, learner_needs_groups
from agentgym.algorithms.config import LearnerConfig
from agentgym.algorithms.trainer import TrainConfig, Trainer

__all__ = ["Variant", "RunRecord", "parse_variants", "compare", "run_trl_grpo", "CSV_COLUMNS", "EXTERNAL_ALGOS"]

#: Learners trained outside :class:`Trainer`: name -> ``module:function`` imported on first use. The
#: function is ``train_with_trl(env, policy, *, steps, num_generations, prompts_per_step, …) -> dict``
#: whose ``history`` has the trainer's row format (``step``, ``rollout/reward_mean``, …).
EXTERNAL_ALGOS = {"trl-grpo": "agentgym.algorithms.offline.trl_adapter:train_with_trl"}
#: The learner settings an external learner takes (see the module docstring).
EXTERNAL_SETTINGS = frozenset({"learner.lr", "learner.kl_coef", "learner.micro_batch_size"})

#: Settings every variant shares: they define the tasks and the rollout budget.
SHARED_KEYS = frozenset({"env", "env_kwargs", "steps", "seed", "algo", "output_dir", "groups_per_step",
                         "group_size", "model", "rollout", "sampling", "eval", "style", "max_obs_tokens",
                         "max_context_tokens"})
#: Keys the harness itself sets (from --env/--algos/--seeds/--steps/--out).
HARNESS_KEYS = {"algo": "--algos", "seed": "--seeds", "steps": "--steps", "output_dir": "--out", "env": "--env"}

CSV_COLUMNS = ["phase", "algo", "learner", "seed", "step", "episodes", "reward", "reward_std", "success",
               "tokens", "tokens_cumulative", "step_s", "wall_s", "run_wall_s", "kl", "entropy", "loss", "tasks"]


class CompareError(ValueError):
    """A bad harness argument (reported in one line by the CLI)."""


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


# ---------------------------------------------------------------------------- arguments

def _variant_key(key: str, algo: str | None = None) -> str:
    """``lr`` → ``learner.lr``; a setting only ``algo``'s own typed config has (a part registered by a
    user module) → ``learner.extra.<key>``; TrainConfig fields and dotted keys stay as they are."""
    top = {f.name for f in dataclasses.fields(TrainConfig)}
    if "." in key or key in top:
        return key
    if key in {f.name for f in dataclasses.fields(LearnerConfig)}:
        return f"learner.{key}"
    learner = LEARNERS.get((algo or "").lower())
    if learner is not None and key in {f.name for f in dataclasses.fields(learner.config_class)}:
        return f"learner.extra.{key}"
    raise CompareError(f"variant setting {key!r} is neither a TrainConfig nor a LearnerConfig field"
                       + (f" nor a setting of {algo}" if learner is not None else ""))


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


def _check_env(env_id: str) -> None:
    import gymnasium as gym

    import agentgym  # noqa: F401  (registers the built-in envs)
    from agentgym.registry import full_id
    if full_id(env_id) not in gym.registry:
        raise CompareError(f"no env {env_id!r}; registered: {', '.join(agentgym.list_envs())}")


# ---------------------------------------------------------------------------- running

def _prompt_digest(batch: Any) -> tuple[str, list[int | None]]:
    """A short hash of the step's prompts (ids, in collection order) and the task indices."""
    trajs = batch.trajectories
    h = hashlib.sha1(json.dumps([[t.task_index, t.token_ids[:t.prompt_length]] for t in trajs]).encode())
    return h.hexdigest()[:12], [t.task_index for t in trajs]


class _PolicySource:
    """Loads a pretrained model once and hands every run a fresh deep copy (a load costs ~15 s on CPU;
    every run must start from the same weights anyway). ``tiny-random`` is left to the trainer,
    which initialises it from the run's seed."""

    def __init__(self) -> None:
        self._base: dict[tuple[str, str | None, str | None], Any] = {}

    def fresh(self, cfg: TrainConfig) -> Any | None:
        if cfg.model == "tiny-random":
            return None
        from agentgym.policies.transformers_policy import TransformersPolicy
        dtype = getattr(cfg, "dtype", None)
        key = (cfg.model, cfg.device, dtype)
        if key not in self._base:
            self._base[key] = TransformersPolicy.from_pretrained(
                cfg.model, device=cfg.device, dtype=getattr(torch, dtype) if dtype else None)
        base = self._base[key]
        return TransformersPolicy(copy.deepcopy(base.model), base.tokenizer, max_batch_size=base.max_batch_size,
                                  name=base.name)


def run_trl_grpo(cfg: TrainConfig, policy: Any | None = None, log: Callable[[str], None] = print) -> dict[str, Any]:
    """One ``trl-grpo`` run with ``cfg``'s budget and sampling, evaluated like a :class:`Trainer` run
    (greedy on the same held-out tasks before and after); returns what ``Trainer.train`` returns."""
    from agentgym.config import save_config
    from agentgym.rollout import RolloutEngine

    from agentgym.algorithms.trainer import held_out_eval, rollout_config
    train_with_trl = _external_runner("trl-grpo")
    if policy is None:
        from agentgym.policies.transformers_policy import TransformersPolicy
        policy = TransformersPolicy.tiny_random(seed=cfg.seed)  # the trainer's tiny-random, same seed
    Path(cfg.output_dir).mkdir(parents=True, exist_ok=True)
    save_config(cfg, Path(cfg.output_dir) / "config.yaml")
    evaluator = RolloutEngine(policy, rollout_config(cfg, greedy=True))  # reads policy.model at every call
    try:
        before, _ = held_out_eval(evaluator, cfg)
        log(f"[eval before @ step 0] success {before['eval/success_rate']:.3f}  "
            f"reward {before['eval/reward_mean']:+.3f}")
        total, micro = cfg.groups_per_step * cfg.group_size, cfg.learner.micro_batch_size
        result = train_with_trl(
            cfg.env, policy, steps=cfg.steps, num_generations=cfg.group_size, prompts_per_step=cfg.groups_per_step,
            micro_batch_size=micro if total % micro == 0 else None, env_kwargs=cfg.env_kwargs,
            max_new_tokens=cfg.sampling.max_new_tokens, max_obs_tokens=cfg.max_obs_tokens,
            max_context_tokens=cfg.max_context_tokens, style=cfg.style, learning_rate=cfg.learner.lr,
            temperature=cfg.sampling.temperature, beta=cfg.learner.kl_coef, seed=cfg.seed,
            output_dir=cfg.output_dir, trl_args={"top_p": cfg.sampling.top_p}, debug_checks=cfg.debug_checks)
        after, _ = held_out_eval(evaluator, cfg)
        log(f"[eval after @ step {cfg.steps}] success {after['eval/success_rate']:.3f}  "
            f"reward {after['eval/reward_mean']:+.3f}")
    finally:
        evaluator.close()
    return {"history": result["history"], "before": before, "after": after, "output_dir": cfg.output_dir}


def _external_runner(algo: str) -> Callable[..., dict[str, Any]]:
    """Import ``EXTERNAL_ALGOS[algo]`` lazily, with a clear message when it is missing."""
    import importlib
    module, _, name = EXTERNAL_ALGOS[algo].partition(":")
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name == module:
            raise CompareError(f"{algo} needs algorithms/{module.rsplit('.', 1)[-1]}.py") from None
        raise CompareError(f"{algo}: cannot import {module}: {e}") from None
    fn = getattr(mod, name, None)
    if not callable(fn):
        raise CompareError(f"{algo} needs {module}.{name}() (see agentgym.algorithms.compare.EXTERNAL_ALGOS)")
    return fn


def _run_one(cfg: TrainConfig, variant: Variant, policies: _PolicySource, log: Callable[[str], None]) -> RunRecord:
    rec = RunRecord(variant.label, variant.algo, cfg.seed, cfg.output_dir, to_dict(cfg))

    def on_step(step: int, batch: Any, row: dict[str, float]) -> None:
        digest, indices = _prompt_digest(batch)
        rec.tasks.append(digest)
        rec.task_indices.append(indices)

    t0 = time.perf_counter()
    if variant.algo == "trl-grpo":
        result = run_trl_grpo(cfg, policies.fresh(cfg), log=log)
    else:
        # a leftover directory here is an unfinished or changed run of this comparison: start it afresh
        result = Trainer(cfg, policy=policies.fresh(cfg), log=log, on_step=on_step).train(overwrite=True)
    rec.wall_s = time.perf_counter() - t0
    rec.history = [{k: v for k, v in row.items() if isinstance(v, (int, float))} for row in result["history"]]
    rec.before, rec.after = dict(result.get("before", {})), dict(result.get("after", {}))
    return rec


def compare(variants: Sequence[Variant] | str, seeds: int | Sequence[int], steps: int, *, env: str | None = None,
            config: str | Path | None = None, overrides: Sequence[str] = (), out_dir: str | Path = "runs/compare",
            keep_checkpoints: bool = False, resume: bool = False, threshold: float = 0.8,
            log: Callable[[str], None] = print, overwrite: bool = False) -> dict[str, Any]:
    """Run every variant on every seed and write the comparison artifacts into ``out_dir``.

    ``seeds``: a count n (seeds base, base+1, …, base+n-1 where base is the config's ``seed``) or an
    explicit list. ``resume``: reuse finished runs whose resolved config is unchanged (a run writes
    ``compare_run.json`` when it ends; the others are run again from scratch). A non-empty ``out_dir``
    is refused unless ``resume`` or ``overwrite`` (which deletes it first). Returns the summary with the
    artifact paths.
    """
    variants = parse_variants(variants) if isinstance(variants, str) else list(variants)
    if steps < 1:
        raise CompareError(f"--steps must be >= 1, got {steps}")
    if not 0 < threshold <= 1:
        raise CompareError(f"--threshold must be in (0, 1], got {threshold}")
    for o in overrides:
        key = o.split("=", 1)[0].strip()
        if key in HARNESS_KEYS:
            raise CompareError(f"set {key} with {HARNESS_KEYS[key]}, not as an override")
    out = Path(out_dir)
    base = load_config(TrainConfig, config, [*overrides, *([f"env={env}"] if env else [])])
    if isinstance(seeds, int):
        if seeds < 1:
            raise CompareError(f"--seeds must be >= 1, got {seeds}")
        seeds = [base.seed + i for i in range(seeds)]
    seeds = list(seeds)
    if not seeds or len(set(seeds)) != len(seeds):
        raise CompareError(f"--seeds must list distinct seeds, got {seeds}")
    _check_env(base.env)
    configs: list[tuple[Variant, TrainConfig]] = []
    for seed in seeds:  # seed-major: an interrupted comparison still has every algo on the first seeds
        for v in variants:
            cfg = _resolve(env, v, seed, steps, config, overrides, out)
            if (v.algo == "trl-grpo" or learner_needs_groups(v.algo)) and cfg.group_size < 2:
                raise CompareError(f"{v.label} needs group_size >= 2 (got {cfg.group_size}); "
                                   "set group_size=K for all algos")
            configs.append((v, cfg))
    for algo in sorted({v.algo for v in variants} & set(EXTERNAL_ALGOS)):
        _external_runner(algo)  # fail before hours of training, not after

    per_step = base.groups_per_step * base.group_size
    log(f"[compare] {base.env}: {', '.join(v.label for v in variants)} × seeds {seeds} × {steps} steps; "
        f"{base.groups_per_step} groups × {base.group_size} = {per_step} episodes/step for every run; "
        f"model {base.model} -> {out}")
    if not resume:
        from agentgym.runs import prepare_output_dir
        prepare_output_dir(out, overwrite=overwrite, command="compare")
    out.mkdir(parents=True, exist_ok=True)
    policies = _PolicySource()
    records: list[RunRecord] = []
    for i, (v, cfg) in enumerate(configs, 1):
        head = f"[compare {i}/{len(configs)}] {v.label} seed={cfg.seed}"
        done_file = Path(cfg.output_dir) / "compare_run.json"
        if resume and done_file.exists():
            old = json.loads(done_file.read_text())
            if old.get("config") == to_dict(cfg):
                records.append(RunRecord(**old))
                log(f"{head}: reused {done_file}")
                continue
        log(f"{head} -> {cfg.output_dir}")
        rec = _run_one(cfg, v, policies, log)
        if not keep_checkpoints:
            shutil.rmtree(Path(cfg.output_dir) / "checkpoints", ignore_errors=True)
        done_file.write_text(json.dumps(dataclasses.asdict(rec)))
        records.append(rec)
        h = rec.history
        log(f"{head} done in {rec.wall_s:.0f}s: train reward {_g(h[0], 'rollout/reward_mean'):+.3f} -> "
            f"{_g(h[-1], 'rollout/reward_mean'):+.3f}, held-out success {_g(rec.before, 'eval/success_rate'):.2f} "
            f"-> {_g(rec.after, 'eval/success_rate'):.2f}")

    check = _check_same_tasks(records)
    summary = summarize_runs(records, variants, per_step, threshold)
    paths = {ext: out / f"compare.{ext}" for ext in ("csv", "png", "md", "json")}
    write_csv(records, per_step, paths["csv"])
    plot_comparison(records, variants, per_step, paths["png"], title=f"{base.env} · {base.model} · {len(seeds)} seeds")
    paths["md"].write_text(markdown_table(summary, base, seeds, steps, per_step, threshold, check))
    paths["json"].write_text(json.dumps({
        "date": datetime.date.today().isoformat(), "env": base.env, "model": base.model, "seeds": seeds,
        "steps": steps, "episodes_per_step": per_step, "threshold": threshold, "same_tasks": check,
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "variants": [dataclasses.asdict(v) for v in variants], "summary": summary,
        "runs": [dataclasses.asdict(r) for r in records]}, indent=1, default=_json_default))
    log(f"[compare] same tasks across algos: {check}")
    log(f"[compare] wrote {', '.join(str(p) for p in paths.values())}")
    return {"summary": summary, "same_tasks": check, "paths": {k: str(p) for k, p in paths.items()},
            "runs": records}


# ---------------------------------------------------------------------------- analysis

def _g(row: Mapping[str, Any], key: str) -> float:
    v = row.get(key)
    return float(v) if isinstance(v, (int, float)) else float("nan")


def _json_default(x: Any) -> Any:
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    return str(x)


def _check_same_tasks(records: Sequence[RunRecord]) -> str:
    """``"yes"`` when every run of a seed saw the same prompts at every step (runs that record no
    digests, e.g. an external trainer, are left out of the check and named)."""
    by_seed: dict[int, dict[str, list[str]]] = {}
    unchecked = sorted({r.label for r in records if not r.tasks})
    for r in records:
        if r.tasks:
            by_seed.setdefault(r.seed, {})[r.label] = r.tasks
    for seed, runs in by_seed.items():
        if len({tuple(t) for t in runs.values()}) > 1:
            return f"NO (seed {seed} differs between {', '.join(runs)})"
    return "yes" + (f" (not recorded for {', '.join(unchecked)})" if unchecked else "")


def _curve(records: Sequence[RunRecord], key: str) -> np.ndarray:
    """seeds × steps array of a history key (NaN where missing)."""
    steps = max(len(r.history) for r in records)
    arr = np.full((len(records), steps), np.nan)
    for i, r in enumerate(records):
        for j, row in enumerate(r.history):
            arr[i, j] = _g(row, key)
    return arr


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample std (ddof 1; 0 for a single seed), ignoring NaN."""
    x = np.asarray([v for v in values if not math.isnan(v)], dtype=float)
    if x.size == 0:
        return float("nan"), float("nan")
    return float(x.mean()), float(x.std(ddof=1)) if x.size > 1 else 0.0


def summarize_runs(records: Sequence[RunRecord], variants: Sequence[Variant], per_step: int,
                   threshold: float) -> dict[str, dict[str, Any]]:
    """Per variant: the table's numbers (see the module docstring for the definitions)."""
    groups = {v.label: [r for r in records if r.label == v.label] for v in variants}
    groups = {k: g for k, g in groups.items() if g}
    r0 = float(np.nanmean([_g(r.history[0], "rollout/reward_mean") for r in records if r.history]))
    mean_curves = {k: np.nanmean(_curve(g, "rollout/reward_mean"), axis=0) for k, g in groups.items()}
    best = max(float(c[-1]) for c in mean_curves.values())
    target = r0 + threshold * (best - r0)
    out: dict[str, dict[str, Any]] = {}
    for label, runs in groups.items():
        rewards = _curve(runs, "rollout/reward_mean")
        success = _curve(runs, "rollout/success_rate")
        tokens = _curve(runs, "rollout/generated_tokens")
        step_s = _curve(runs, "time/step_s")
        reach = None
        if best > r0:
            hits = np.nonzero(mean_curves[label] >= target - 1e-12)[0]
            reach = int((hits[0] + 1) * per_step) if hits.size else None
        out[label] = {
            "seeds": [r.seed for r in runs],
            "final_reward": _mean_std(rewards[:, -1]),
            "final_success": _mean_std(success[:, -1]),
            "auc_reward": _mean_std(np.nanmean(rewards, axis=1)),
            "episodes_to_threshold": reach,
            "eval_success_before": _mean_std([_g(r.before, "eval/success_rate") for r in runs]),
            "eval_success_after": _mean_std([_g(r.after, "eval/success_rate") for r in runs]),
            "eval_reward_after": _mean_std([_g(r.after, "eval/reward_mean") for r in runs]),
            "train_s": _mean_std(np.nansum(step_s, axis=1)),
            "run_wall_s": _mean_std([r.wall_s for r in runs]),
            "tokens": _mean_std(np.nansum(tokens, axis=1)),
            # 95 % t intervals over seeds (agentgym.stats.mean_ci), and the per-seed values they rest on
            **_seed_intervals({"final_reward": rewards[:, -1], "final_success": success[:, -1],
                               "auc_reward": np.nanmean(rewards, axis=1),
                               "eval_success_after": [_g(r.after, "eval/success_rate") for r in runs]}),
            "per_seed": {"final_reward": rewards[:, -1].tolist(), "auc_reward": np.nanmean(rewards, axis=1).tolist(),
                         "eval_success_after": [_g(r.after, "eval/success_rate") for r in runs]},
        }
    out["_reference"] = {"r0": r0, "best_final": best, "target": target}
    out["_differences"] = _pairwise_differences(out)
    return out


def _finite_count(values: Sequence[float]) -> int:
    return int(np.isfinite(np.asarray(values, dtype=float)).sum())


def _seed_intervals(per_metric: Mapping[str, Sequence[float]]) -> dict[str, dict[str, Any]]:
    """``ci``: metric -> (mean, low, high) over seeds, NaN bounds where no interval exists (one seed, or
    every seed gave the same value); ``ci_undefined``: metric -> why not (``"1 seed"``, ``"seeds agree:
    no spread"``), only for those. A zero-width interval is kept out of the record because a reader
    of ``compare.json`` would take it for an exact value."""
    cis: dict[str, Any] = {}
    reasons: dict[str, str] = {}
    for metric, values in per_metric.items():
        cis[metric], reason = without_undefined(mean_ci(values), _finite_count(values))
        if reason:
            reasons[metric] = reason
    return {"ci": cis, "ci_undefined": reasons}


def _pairwise_differences(summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every pair of variants, per metric: Welch's 95 % interval of the difference of seed means and
    whether it excludes 0 (:func:`agentgym.stats.verdict`). Where it does not exist (a variant with one
    seed; both variants' seeds agreeing among themselves) ``low``/``high`` are NaN, ``undefined`` says
    why and the verdict is ``n/a``: such a difference is never called significant."""
    labels = [k for k in summary if not k.startswith("_")]
    rows = []
    for i, a in enumerate(labels):
        for b in labels[i + 1:]:
            for metric in ("final_reward", "auc_reward", "eval_success_after"):
                xa, xb = summary[a]["per_seed"][metric], summary[b]["per_seed"][metric]
                raw = diff_ci(xa, xb)
                ci, reason = without_undefined(raw, min(_finite_count(xa), _finite_count(xb)))
                rows.append({"a": a, "b": b, "metric": metric, "diff": ci[0], "low": ci[1], "high": ci[2],
                             "verdict": verdict(raw), "undefined": reason,
                             "min_detectable": min_detectable_difference(xa, xb)})
    return rows


def write_csv(records: Sequence[RunRecord], per_step: int, path: Path) -> None:
    """The long-format CSV (columns :data:`CSV_COLUMNS`).

    ``reward`` / ``success``: the step's sampled batch means (train) or the greedy held-out eval
    (eval); ``tokens``: generated tokens; ``wall_s``: cumulative seconds of the training loop so far;
    ``run_wall_s`` (last eval row): the whole run including model copy and evals; ``tasks``: the
    digest of the step's prompts (equal across algos at each (seed, step)).
    """
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        w.writeheader()
        for r in records:
            base = {"algo": r.label, "learner": r.algo, "seed": r.seed}
            w.writerow({**base, "phase": "eval", "step": 0, "episodes": 0, "wall_s": 0.0,
                        "reward": _g(r.before, "eval/reward_mean"),
                        "success": _g(r.before, "eval/success_rate"), "tokens": _g(r.before, "eval/generated_tokens")})
            wall = cum_tokens = 0.0
            for j, row in enumerate(r.history):
                wall += _g(row, "time/step_s") if not math.isnan(_g(row, "time/step_s")) else 0.0
                tok = _g(row, "rollout/generated_tokens")
                cum_tokens += 0.0 if math.isnan(tok) else tok
                w.writerow({**base, "phase": "train", "step": int(_g(row, "step")), "episodes": (j + 1) * per_step,
                            "reward": _g(row, "rollout/reward_mean"), "reward_std": _g(row, "rollout/reward_std"),
                            "success": _g(row, "rollout/success_rate"), "tokens": tok, "tokens_cumulative": cum_tokens,
                            "step_s": _g(row, "time/step_s"), "wall_s": round(wall, 3), "kl": _g(row, "train/kl"),
                            "entropy": _g(row, "train/entropy"), "loss": _g(row, "train/loss"),
                            "tasks": r.tasks[j] if j < len(r.tasks) else ""})
            w.writerow({**base, "phase": "eval", "step": len(r.history), "episodes": len(r.history) * per_step,
                        "reward": _g(r.after, "eval/reward_mean"), "success": _g(r.after, "eval/success_rate"),
                        "tokens": _g(r.after, "eval/generated_tokens"), "wall_s": round(wall, 3),
                        "run_wall_s": round(r.wall_s, 3)})


def plot_comparison(records: Sequence[RunRecord], variants: Sequence[Variant], per_step: int, path: Path,
                    title: str) -> None:
    """Mean ± std over seeds of training reward and success against episodes, and the held-out eval."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for k, v in enumerate(variants):
        runs = [r for r in records if r.label == v.label]
        if not runs:
            continue
        colour = f"C{k % 10}"
        for ax, key in zip(axes[:2], ("rollout/reward_mean", "rollout/success_rate")):
            arr = _curve(runs, key)
            x = np.arange(1, arr.shape[1] + 1) * per_step
            m = np.nanmean(arr, axis=0)
            band = np.array([mean_ci(arr[:, j])[1:] for j in range(arr.shape[1])]) if len(runs) > 1 else None
            ax.plot(x, m, marker=".", color=colour, label=f"{v.label} (n={len(runs)})")
            if band is not None:
                ax.fill_between(x, band[:, 0], band[:, 1], color=colour, alpha=0.2)
        before = _mean_std([_g(r.before, "eval/success_rate") for r in runs])
        after = _mean_std([_g(r.after, "eval/success_rate") for r in runs])
        steps = max(len(r.history) for r in runs)
        axes[2].errorbar([0, steps * per_step], [before[0], after[0]], yerr=[before[1], after[1]], marker="o",
                         capsize=4, color=colour, label=v.label)
    for ax, name in zip(axes, ("training reward (sampled)", "training success (sampled)",
                               "held-out success (greedy) before / after")):
        ax.set_title(name)
        ax.set_xlabel("training episodes")
        if "success" in name:
            ax.set_ylim(-0.05, 1.05)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"{title} · mean over seeds, bands: 95 % t interval")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _fmt(ms: tuple[float, float], digits: int = 3, signed: bool = False) -> str:
    m, s = ms
    if math.isnan(m):
        return "—"
    return f"{m:+.{digits}f} ± {s:.{digits}f}" if signed else f"{m:.{digits}f} ± {s:.{digits}f}"


def markdown_table(summary: Mapping[str, Any], base: TrainConfig, seeds: Sequence[int], steps: int, per_step: int,
                   threshold: float, same_tasks: str) -> str:
    """The comparison table plus the definitions a reader needs to interpret it."""
    ref = summary["_reference"]
    pct = round(threshold * 100)
    lines = [f"Env `{base.env}` (env_kwargs `{json.dumps(base.env_kwargs)}`), model `{base.model}`, seeds {list(seeds)}, "
             f"{steps} steps × {per_step} episodes ({base.groups_per_step} groups × {base.group_size}), "
             f"max_new_tokens {base.sampling.max_new_tokens}; same tasks across algos: {same_tasks}.",
             "",
             f"| algo | final train reward | final train success | AUC (mean train reward) | episodes to {pct} % "
             "| held-out success before → after | held-out reward after | train s / run | run wall s | gen. tokens / run |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for label, s in summary.items():
        if label.startswith("_"):
            continue
        reach = "—" if s["episodes_to_threshold"] is None else str(s["episodes_to_threshold"])
        if "ci" in s:
            ci = {k: _fmt_ci(s["ci"][k], s.get("ci_undefined", {}).get(k)) for k in s["ci"]}
            lines.append(f"| `{label}` (95 % CI) | {ci['final_reward']} | {ci['final_success']} | "
                         f"{ci['auc_reward']} | | → {ci['eval_success_after']} | | | | |")
        lines.append(f"| `{label}` | {_fmt(s['final_reward'], signed=True)} | {_fmt(s['final_success'], 2)} | "
                     f"{_fmt(s['auc_reward'], signed=True)} | {reach} | {_fmt(s['eval_success_before'], 2)} → "
                     f"{_fmt(s['eval_success_after'], 2)} | {_fmt(s['eval_reward_after'], signed=True)} | "
                     f"{_fmt(s['train_s'], 0)} | {_fmt(s['run_wall_s'], 0)} | {_fmt(s['tokens'], 0)} |")
    lines += ["",
              f"mean ± sample std over {len(seeds)} seed(s). *final*: the last step's sampled batch. *AUC*: mean training "
              f"reward over all steps. *episodes to {pct} %*: first training episode count at which the seed-mean reward "
              f"reaches r0 + {threshold:g}·(r* − r0), r0 = {ref['r0']:+.3f} (mean first-step reward, all runs), "
              f"r* = {ref['best_final']:+.3f} (best final seed-mean), target {ref['target']:+.3f}; — = never, or no "
              "algo improved on r0. *held-out*: greedy, on the same "
              f"{base.eval.episodes} test tasks before and after. *train s*: the training loop (rollouts + updates); "
              "*run wall*: also model copy and both evals. *95 % CI*: Student's t interval over seeds (with few "
              "seeds it is wide; a bootstrap over 3 seeds would be falsely narrow). *n/a (1 seed)*: one seed has "
              "no spread to estimate; *n/a (seeds agree: no spread)*: every seed gave the same value, so the "
              "interval would have zero width, which means the seeds agreed, not that the value is exact. "
              "Neither is an interval, and a difference without one is never called significant.", ""]
    diffs = summary.get("_differences", [])
    if diffs:
        lines += ["**Which differences are significant** (difference of seed means, Welch 95 % interval; "
                  "*significant* = the interval excludes 0, *noise* = it does not, *n/a* = there is no interval: "
                  "a variant has one seed, or each variant's seeds agree exactly, see above):", "",
                  "| a − b | metric | difference | 95 % CI | verdict | smallest detectable (80 % power) |",
                  "|---|---|---:|---:|---|---:|"]
        for d in diffs:
            ci = _fmt_ci((d["diff"], d["low"], d["high"]), d.get("undefined"))
            mdd = d.get("min_detectable", math.nan)
            lines.append(f"| `{d['a']}` − `{d['b']}` | {d['metric']} | {d['diff']:+.3f} | {ci} | {d['verdict']} | "
                         f"{'n/a' if math.isnan(mdd) else f'{mdd:.3f}'} |")
        sig = sum(d["verdict"] == "significant" for d in diffs)
        undefined = sum(d["verdict"] == "n/a" for d in diffs)
        rest = len(diffs) - sig - undefined
        lines += ["", f"{sig} of {len(diffs)} differences are significant at 95 %"
                  + (f"; {undefined} have no interval (n/a) and are not judged" if undefined else "")
                  + ("; the rest cannot be told apart from seed noise with this budget." if rest
                     else "." if undefined else "; all separate from seed noise."), ""]
        lines += _power_lines(diffs, len(seeds)) + _control_lines(diffs)
    return "\n".join(lines)


def is_negative_control(label: str) -> bool:
    """A variant trained with lr 0 (``grpo:lr=0``): it samples and updates like the others but cannot
    learn, so whatever it gains is the noise floor every learner must clear."""
    for setting in label.split(":")[1:]:
        key, _, value = setting.partition("=")
        if key.strip() in ("lr", "learner.lr"):
            try:
                return float(value) == 0.0
            except ValueError:
                return False
    return False


def _control_lines(diffs: Sequence[Mapping[str, Any]]) -> list[str]:
    """Every learner against the negative control(s): separated (CI excluding 0) or not."""
    rows = [d for d in diffs if is_negative_control(d["a"]) != is_negative_control(d["b"])]
    if not rows:
        return []
    out = ["**Against the negative control** (lr 0: samples and updates, cannot learn):", ""]
    for d in rows:
        learner, control = (d["b"], d["a"]) if is_negative_control(d["a"]) else (d["a"], d["b"])
        sign = -1.0 if is_negative_control(d["a"]) else 1.0
        out.append(f"- `{learner}` vs `{control}`, {d['metric']}: {sign * d['diff']:+.3f} — "
                   + {"significant": "separated from the control", "noise": "not separated (noise)",
                      "n/a": "no interval"}[d["verdict"]])
    return out + [""]


def _power_lines(diffs: Sequence[Mapping[str, Any]], n_seeds: int) -> list[str]:
    """What this budget can resolve: per metric, the median smallest detectable difference over the pairs."""
    out = []
    for metric in dict.fromkeys(d["metric"] for d in diffs):
        mdds = [d["min_detectable"] for d in diffs if d["metric"] == metric and not math.isnan(d.get("min_detectable", math.nan))]
        if mdds:
            out.append(f"- *{metric}*: with {n_seeds} seeds, a true difference smaller than "
                       f"**{float(np.median(mdds)):.3f}** (median over the pairs) is more likely than not to read "
                       "as noise: the smallest detectable difference at 95 % and 80 % power, from the spread over "
                       "seeds (each seed's value averages its questions, so question variance is in it too). "
                       "Halving it takes about 4× the seeds.")
    return (["**Resolution of this budget:**", "", *out, ""] if out else [])


def _fmt_ci(ci: tuple[float, float, float], reason: str | None = None) -> str:
    """``[low, high]``, or ``n/a (<reason>)`` for a recorded undefined interval (its bounds are NaN)."""
    if reason is not None:
        return f"n/a ({reason})"
    return format_ci(ci)
