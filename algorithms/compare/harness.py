"""Algorithm comparison harness: several learners on one env, same tasks, same seeds, same budget.

``agentgym compare --env Arithmetic-v0 --algos reinforce,ppo,grpo --seeds 2 --steps 4`` runs one
:class:`~agentgym.algorithms.loop.trainer.Trainer` per (algorithm, seed) — the training loop is not
duplicated here — each in ``OUT/<algo>/seed<k>/``, then writes into ``OUT``:

- ``compare.csv``: long format, one row per (algo, seed, step) (``phase=train``) plus the
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

**The eval before training is made once per seed.** The arms of one seed start from the same weights
and are evaluated on the same held-out tasks with the same draws (greedy, or ``eval.samples`` with a
fixed seed), so the first arm's eval before training is every arm's (:data:`BEFORE_EVAL_KEYS`: the
settings that must agree); each run's log says whose eval it took.

**Variants** of one learner are compared the same way: ``--algos grpo,grpo:mask_env_tokens=false``
(``ALGO[:key=value[:key=value…]]``; a bare key that is a field of the algorithm's learner config
means ``learner.<key>``, an optimizer field ``optim.<key>``). That is the retrieved-token masking ablation in one command.

**Metrics** (train metrics are the sampled rollouts' own rewards, i.e. on-policy and noisy; the eval
is on the same held-out tasks before and after: greedy, or with ``eval.samples=k`` each task's
success averaged over k sampled episodes, which sees a gain that leaves the argmax unchanged):

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

The parts: the arms (variants, each run's config, the starting policy) in :mod:`.arms`; the runs
here; the summary, intervals and artifacts in :mod:`.report`; per-arm health in :mod:`.health`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from agentgym.config import load_config, same_config, to_dict

from agentgym.algorithms.loop.events import TrainerEvents
from agentgym.algorithms.catalog import learner_needs_groups
from agentgym.algorithms.compare.arms import (DECLARATION_FILE, EXTERNAL_ALGOS, HARNESS_KEYS, CompareError, RunRecord,
                                              Variant, _check_env, _PolicySource, _resolve, declare_metrics,
                                              parse_variants, run_commits)
from agentgym.algorithms.compare.report import _check_same_tasks, _g, summarize_runs, write_artifacts
from agentgym.algorithms.loop.run_control import latest_checkpoint, release_memory
from agentgym.algorithms.loop.train_config import TrainConfig
from agentgym.algorithms.loop.trainer import Trainer

__all__ = ["compare", "run_trl_grpo"]


def _prompt_digest(batch: Any) -> tuple[str, list[int | None]]:
    """A short hash of the step's prompts (ids, in collection order) and the task indices."""
    trajs = batch.trajectories
    h = hashlib.sha1(json.dumps([[t.task_index, t.token_ids[:t.prompt_length]] for t in trajs]).encode())
    return h.hexdigest()[:12], [t.task_index for t in trajs]


def run_trl_grpo(cfg: TrainConfig, policy: Any | None = None, log: Callable[[str], None] = print) -> dict[str, Any]:
    """One ``trl-grpo`` run with ``cfg``'s budget and sampling, evaluated like a :class:`Trainer` run
    (on the same held-out tasks before and after); returns what ``Trainer.train`` returns."""
    from agentgym.config import save_config
    from agentgym.rollout import RolloutEngine

    from agentgym.algorithms.loop.held_out import eval_line, eval_rollout_config, scored_eval
    train_with_trl = _external_runner("trl-grpo")
    if policy is None:
        from agentgym.policies.transformers_policy import TransformersPolicy
        policy = TransformersPolicy.tiny_random(seed=cfg.seed)  # the trainer's tiny-random, same seed
    Path(cfg.output_dir).mkdir(parents=True, exist_ok=True)
    save_config(cfg, Path(cfg.output_dir) / "config.yaml")
    evaluator = RolloutEngine(policy, eval_rollout_config(cfg))  # reads policy.model at every call
    try:
        before, _ = scored_eval(evaluator, cfg)
        log(eval_line("before", 0, before, cfg))
        total, micro = cfg.groups_per_step * cfg.group_size, cfg.learner.micro_batch_size
        result = train_with_trl(
            cfg.env, policy, steps=cfg.steps, num_generations=cfg.group_size, prompts_per_step=cfg.groups_per_step,
            micro_batch_size=micro if total % micro == 0 else None, env_kwargs=cfg.env_kwargs,
            max_new_tokens=cfg.sampling.max_new_tokens, max_obs_tokens=cfg.max_obs_tokens,
            max_context_tokens=cfg.max_context_tokens, style=cfg.style, learning_rate=cfg.optim.lr,
            temperature=cfg.sampling.temperature, beta=cfg.learner.kl_coef, seed=cfg.seed,
            output_dir=cfg.output_dir, trl_args={"top_p": cfg.sampling.top_p}, debug_checks=cfg.debug_checks)
        after, _ = scored_eval(evaluator, cfg)
        log(eval_line("after", cfg.steps, after, cfg))
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
        raise CompareError(f"{algo} needs {module}.{name}() (see agentgym.algorithms.compare.harness.EXTERNAL_ALGOS)")
    return fn


#: the settings that decide a run's eval before training: its initial weights, held-out tasks and draws.
#: Arms of one seed that agree on all of them (a comparison's arms differ only in the learner) share it.
BEFORE_EVAL_KEYS = ("env", "env_kwargs", "model", "seed", "rollout", "eval", "device", "backend", "backend_options",
                    "dtype", "precision")


def _before_eval_key(cfg: TrainConfig) -> str:
    d = to_dict(cfg)
    return json.dumps({k: d[k] for k in BEFORE_EVAL_KEYS}, sort_keys=True, default=str)


#: a run's per-step task digests, kept beside its checkpoints so that a resumed run still has them all
TASKS_FILE = "compare_tasks.json"


def _resumable(cfg: TrainConfig) -> Path | None:
    """The newest checkpoint of an unfinished run of this very config in ``cfg.output_dir`` (its
    ``config.yaml`` equal but for :data:`TrainConfig.RESULT_NEUTRAL`), else None."""
    import yaml
    out = Path(cfg.output_dir)
    ckpt = latest_checkpoint(out)
    if ckpt is None or not (out / "config.yaml").is_file() or not (out / TASKS_FILE).is_file():
        return None
    try:
        recorded = yaml.safe_load((out / "config.yaml").read_text()) or {}
    except yaml.YAMLError:
        return None
    same = same_config(recorded, to_dict(cfg), to_dict(TrainConfig()), TrainConfig.RESULT_NEUTRAL)
    return ckpt if same else None


def _run_one(cfg: TrainConfig, variant: Variant, policies: _PolicySource, log: Callable[[str], None],
             before: tuple[Mapping[str, Any], str] | None = None, resume: bool = False,
             events: Sequence[TrainerEvents] = ()) -> RunRecord:
    """One run. ``before``: (eval, which run made it), an eval before training by an earlier run with the
    same :data:`BEFORE_EVAL_KEYS`, used instead of evaluating the same weights on the same draws again.
    ``resume``: go on from the run's last checkpoint (:func:`_resumable` said it has one of this config);
    otherwise a leftover directory is an unfinished or changed run, started afresh. ``wall_s`` is then
    this process's share."""
    rec = RunRecord(variant.label, variant.algo, cfg.seed, cfg.output_dir, to_dict(cfg))
    tasks_file = Path(cfg.output_dir) / TASKS_FILE
    # step -> (digest, task indices); a resumed run redraws the steps after its checkpoint, the same ones
    steps: dict[str, Any] = json.loads(tasks_file.read_text()) if resume else {}

    class RecordTasks(TrainerEvents):   # which tasks each step drew, for the "same tasks" check
        def step_done(self, trainer: Any, batch: Any, row: dict[str, float]) -> None:
            steps[str(trainer.step)] = _prompt_digest(batch)
            tasks_file.write_text(json.dumps(steps))

    t0 = time.perf_counter()
    if variant.algo == "trl-grpo":
        result = run_trl_grpo(cfg, policies.fresh(cfg), log=log)
    else:
        trainer = Trainer(cfg, policy=policies.fresh(cfg), log=log, events=[RecordTasks(), *events])
        if before is not None and not resume:
            trainer.use_before_eval(*before)
        result = trainer.train(resume=resume, overwrite=not resume)
        done = [steps[str(k)] for k in range(1, len(result["history"]) + 1) if str(k) in steps]
        rec.tasks, rec.task_indices = [d for d, _ in done], [list(i) for _, i in done]
    rec.wall_s = time.perf_counter() - t0
    rec.history = [{k: v for k, v in row.items() if isinstance(v, (int, float))} for row in result["history"]]
    rec.before, rec.after = dict(result.get("before", {})), dict(result.get("after", {}))
    return rec


def compare(variants: Sequence[Variant] | str, seeds: int | Sequence[int], steps: int, *, env: str | None = None,
            config: str | Path | None = None, overrides: Sequence[str] = (), out_dir: str | Path = "runs/compare",
            keep_checkpoints: bool = False, resume: bool = False, threshold: float = 0.8,
            log: Callable[[str], None] = print, overwrite: bool = False, report_only: bool = False,
            primary: str | None = None, exploratory: Sequence[str] = (),
            events: Sequence[TrainerEvents] = ()) -> dict[str, Any]:
    """Run every variant on every seed and write the comparison artifacts into ``out_dir``.

    ``events``: subscribers to every run's trainer events (:mod:`agentgym.algorithms.loop.events`; the command
    line passes the HTML trajectory report's).

    ``primary``: the metric the comparison is about, declared before it runs (default: held-out success
    after training on the eval split; :func:`~agentgym.algorithms.compare.arms.declare_metrics`); a
    ``resume`` or ``report_only`` keeps the recorded one and refuses another. ``exploratory``: metrics added
    later, labelled so in the report.

    ``report_only``: train nothing; write the artifacts from the runs already finished in ``out_dir``
    (as ``resume`` would reuse them), on the seeds every variant has finished, naming what is left out:
    a long study's interim report while other processes still run it.

    ``seeds``: a count n (seeds base, base+1, …, base+n-1 where base is the config's ``seed``) or an
    explicit list. ``resume``: reuse finished runs whose resolved config is unchanged (a run writes
    ``compare_run.json`` when it ends); an unfinished run of an unchanged config goes on from its last
    checkpoint (``checkpoint_every``), any other is run again from scratch. A non-empty ``out_dir``
    is refused unless ``resume`` or ``overwrite`` (which deletes it first). Returns the summary with the
    artifact paths.
    """
    variants = parse_variants(variants) if isinstance(variants, str) else list(variants)
    _check_arguments(steps, threshold, overrides)
    out = Path(out_dir)
    base = load_config(TrainConfig, config, [*overrides, *([f"env={env}"] if env else [])])
    seeds = _seed_list(seeds, base.seed)
    _check_env(base.env, base.env_kwargs, base.eval.env_kwargs)
    configs = _plan_runs(variants, seeds, steps, env, config, overrides, out)
    declared = declare_metrics(out, primary, exploratory, continuing=resume or report_only,
                               split=base.eval.env_kwargs.get("split"))

    per_step = base.groups_per_step * base.group_size
    log(f"[compare] {base.env}: {', '.join(v.label for v in variants)} × seeds {seeds} × {steps} steps; "
        f"{base.groups_per_step} groups × {base.group_size} = {per_step} episodes/step for every run; "
        f"model {base.model} -> {out}")
    if report_only:
        if overwrite:
            raise CompareError("--report-only and --overwrite exclude each other: the report reads the finished runs")
        if not out.is_dir():
            raise CompareError(f"--report-only: {out} is not a folder; give the --out of a comparison that ran")
        records, seeds = _finished_runs(configs, variants, out, log)
        (out / DECLARATION_FILE).write_text(json.dumps(declared, indent=1))   # exploratory metrics added now
    else:
        if not resume:
            from agentgym.runs import prepare_output_dir
            prepare_output_dir(out, overwrite=overwrite, command="compare")
        out.mkdir(parents=True, exist_ok=True)
        (out / DECLARATION_FILE).write_text(json.dumps(declared, indent=1))    # before the first run starts
        records = _run_all(configs, resume=resume, keep_checkpoints=keep_checkpoints, log=log,
                           primary=declared["primary"], events=events)
    _warn_mixed_commits(records, log)
    return _report(out, records, variants, base, seeds, steps, threshold, declared, log)


def _report(out: Path, records: list[RunRecord], variants: Sequence[Variant], base: TrainConfig, seeds: list[int],
            steps: int, threshold: float, declared: dict[str, Any], log: Callable[[str], None]) -> dict[str, Any]:
    """The summary (with the differences of the declared and exploratory metrics too) and the artifacts."""
    check = _check_same_tasks(records)
    metrics = ["final_reward", "auc_reward", "eval_success_after", declared["primary"], *declared["exploratory"]]
    per_step = base.groups_per_step * base.group_size
    summary = summarize_runs(records, variants, per_step, threshold, metrics=list(dict.fromkeys(metrics)))
    paths = write_artifacts(out, records, variants, summary, base, seeds, steps, threshold, check, declared=declared)
    log(f"[compare] same tasks across algos: {check}")
    log(f"[compare] wrote {', '.join(str(p) for p in paths.values())}")
    return {"summary": summary, "same_tasks": check, "paths": {k: str(p) for k, p in paths.items()},
            "runs": records}


def _warn_mixed_commits(records: Sequence[RunRecord], log: Callable[[str], None]) -> None:
    """A comparison whose runs ran different code (a resumed study, another process's seeds) says so: its
    differences may be the code's. The report lists the commits too (:func:`run_commits`)."""
    commits = run_commits(records)
    if len(commits) > 1:
        log(f"[compare] warning: the runs of this comparison ran at {len(commits)} different commits: "
            + "; ".join(f"{c} ({', '.join(names)})" for c, names in commits.items()))


def _check_arguments(steps: int, threshold: float, overrides: Sequence[str]) -> None:
    if steps < 1:
        raise CompareError(f"--steps must be >= 1, got {steps}")
    if not 0 < threshold <= 1:
        raise CompareError(f"--threshold must be in (0, 1], got {threshold}")
    for o in overrides:
        key = o.split("=", 1)[0].strip()
        if key in HARNESS_KEYS:
            raise CompareError(f"set {key} with {HARNESS_KEYS[key]}, not as an override")


def _seed_list(seeds: int | Sequence[int], base_seed: int) -> list[int]:
    """A count n means ``base_seed … base_seed+n-1``; a list is taken as it is (distinct seeds)."""
    if isinstance(seeds, int):
        if seeds < 1:
            raise CompareError(f"--seeds must be >= 1, got {seeds}")
        seeds = [base_seed + i for i in range(seeds)]
    seeds = list(seeds)
    if not seeds or len(set(seeds)) != len(seeds):
        raise CompareError(f"--seeds must list distinct seeds, got {seeds}")
    return seeds


def _plan_runs(variants: Sequence[Variant], seeds: Sequence[int], steps: int, env: str | None,
               config: str | Path | None, overrides: Sequence[str], out: Path) -> list[tuple[Variant, TrainConfig]]:
    """Every (variant, seed) run's resolved config, checked before any run starts."""
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
    return configs


def _reusable(cfg: TrainConfig) -> RunRecord | None:
    """The finished run in ``cfg.output_dir`` (its ``compare_run.json``) if it ran this very config. Where
    the run lies is not part of "this config": the same folder named relatively or absolutely, or a study
    folder moved or copied, is reused, and the record then points at where it lies now."""
    done_file = Path(cfg.output_dir) / "compare_run.json"
    if not done_file.exists():
        return None
    old = json.loads(done_file.read_text())
    recorded = old.get("config") or {}
    if not same_config(recorded, to_dict(cfg), to_dict(TrainConfig()), TrainConfig.RESULT_NEUTRAL):
        return None
    here = str(cfg.output_dir)
    return RunRecord(**{**old, "output_dir": here, "config": {**recorded, "output_dir": here}})


def _finished_runs(configs: Sequence[tuple[Variant, TrainConfig]], variants: Sequence[Variant], out: Path,
                   log: Callable[[str], None]) -> tuple[list[RunRecord], list[int]]:
    """``report_only``: the finished runs on the seeds that every variant finished."""
    found = {(v.label, cfg.seed): _reusable(cfg) for v, cfg in configs}
    seeds = sorted({seed for _, seed in found})
    complete = [s for s in seeds if all(found[(v.label, s)] is not None for v in variants)]
    missing = [f"{label} seed {seed}" for (label, seed), rec in found.items() if rec is None]
    if not complete:
        raise CompareError(f"--report-only: no seed has a finished run of every variant in {out}; "
                           f"not finished: {', '.join(missing)}")
    if missing:
        log(f"[compare] --report-only: not finished, left out: {', '.join(missing)}; the report covers seeds {complete}")
    return [rec for (_, seed), rec in found.items() if seed in complete and rec is not None], complete


def _run_all(configs: Sequence[tuple[Variant, TrainConfig]], *, resume: bool, keep_checkpoints: bool,
             log: Callable[[str], None], primary: str, events: Sequence[TrainerEvents] = ()) -> list[RunRecord]:
    """Every planned run in order; with ``resume``, a finished run with an unchanged config is reused. Each
    new run's ``compare_run.json`` records the declared ``primary`` metric."""
    policies = _PolicySource()
    records: list[RunRecord] = []
    befores: dict[str, tuple[dict[str, Any], str]] = {}   # an eval before training per BEFORE_EVAL_KEYS
    for i, (v, cfg) in enumerate(configs, 1):
        head = f"[compare {i}/{len(configs)}] {v.label} seed={cfg.seed}"
        done_file = Path(cfg.output_dir) / "compare_run.json"
        key = _before_eval_key(cfg)
        reused = _reusable(cfg) if resume else None
        if reused is not None:
            records.append(reused)
            if reused.before and key not in befores:
                befores[key] = (reused.before, f"{v.label} seed {cfg.seed}")
            log(f"{head}: reused {done_file}")
            continue
        ckpt = _resumable(cfg) if resume and v.algo != "trl-grpo" else None
        log(f"{head} -> {cfg.output_dir}" + (f" (going on from {ckpt.name})" if ckpt is not None else ""))
        rec = _run_one(cfg, v, policies, log, before=None if v.algo == "trl-grpo" else befores.get(key),
                       resume=ckpt is not None, events=events)
        if rec.before and key not in befores:
            befores[key] = (rec.before, f"{v.label} seed {cfg.seed}")
        if not keep_checkpoints:
            shutil.rmtree(Path(cfg.output_dir) / "checkpoints", ignore_errors=True)
        rec.primary = primary
        done_file.write_text(json.dumps(dataclasses.asdict(rec)))
        records.append(rec)
        h = rec.history
        log(f"{head} done in {rec.wall_s:.0f}s: train reward {_g(h[0], 'rollout/reward_mean'):+.3f} -> "
            f"{_g(h[-1], 'rollout/reward_mean'):+.3f}, held-out success {_g(rec.before, 'eval/success_rate'):.2f} "
            f"-> {_g(rec.after, 'eval/success_rate'):.2f}")
        before, after = release_memory()   # glibc keeps a finished run's heap mapped unless told
        if before is not None and after is not None:
            log(f"{head} memory: process RSS {before / 2**30:.1f} -> {after / 2**30:.1f} GiB, the run freed")
    return records
