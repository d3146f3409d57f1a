"""The trainer: tasks → batched rollouts → advantages → updates → eval / checkpoint / logging.

``agentgym train`` runs :func:`train` with a :class:`TrainConfig` (YAML + ``key=value``
overrides). Every run writes its resolved config, a CSV log (and TensorBoard events), PNG learning curves
and an HTML trajectory report into ``output_dir``. ``--resume`` continues a killed run from its last
checkpoint and reproduces the uninterrupted run's metrics: the rollout seeds and the torch RNG are derived
from (seed, step), and checkpoints hold weights, optimizer, scheduler and learner state.
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
import random
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
import torch

from agentgym.config import save_config
from agentgym.rollout import RolloutEngine, RolloutProgress
from agentgym.rollout_metrics import scored_episodes, summarize
from agentgym.precision import resolve_precision
from agentgym.threads import recheck as recheck_threads

from agentgym.algorithms.catalog import make_learner
from agentgym.algorithms.loop.curves import held_out_gain, plot_curves
from agentgym.algorithms.loop.events import TrainerEvents, dispatch
from agentgym.algorithms.loop.group_filter import GroupSampler
from agentgym.algorithms.loop.health import HealthMonitor, batch_health
from agentgym.algorithms.loop.overlap import Prefetcher
from agentgym.algorithms.loop.run_control import (ServiceOutage, TrainingInterrupted, WholeSteps, checkpoint_step,
                                             discard_unstarted, latest_checkpoint, prune_checkpoints, rng_state,
                                             save_model_quietly, set_rng_state)
from agentgym.algorithms.loop.train_config import TrainConfig, torch_dtype
from agentgym.algorithms.loop.held_out import (eval_line, eval_rollout_config, rollout_config, scored_eval)

__all__ = ["train", "Trainer"]


def _set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _step_seed(seed: int, step: int) -> int:
    return (seed * 1_000_003 + step * 7_919) % 2**31


class Trainer:
    """One training run. It reports through ``events`` (:class:`~agentgym.algorithms.loop.events.TrainerEvents`:
    step done, alarm, eval done, checkpoint saved, run done) and never calls the application: the CLI
    subscribes to write the HTML report, the comparison harness to record which tasks each step drew."""

    def __init__(self, cfg: TrainConfig, policy: Any | None = None, log: Callable[[str], None] = print,
                 events: Sequence[TrainerEvents] = ()):
        self.cfg, self.events = cfg, list(events)
        self._print = log
        self._bar: Any = None
        self._outage_steps = 0   # steps in a row that an infrastructure failure emptied (_check_outage)
        self.out = Path(cfg.output_dir)
        # each step's groups: one engine call, or with group_filter.* refilled for signal / drawn by difficulty
        self.groups = GroupSampler(cfg.group_filter, cfg.groups_per_step, cfg.group_size, log=self.log)
        from agentgym.algorithms.loop.distributed import init_from_env
        self.dist = init_from_env(cfg.device)   # None in one process; torchrun: this rank's process group
        self.is_main = self.dist is None or self.dist.is_main
        if self.dist is not None and cfg.groups_per_step % self.dist.world_size:
            raise ValueError(f"groups_per_step={cfg.groups_per_step} must be divisible by the number of "
                             f"processes ({self.dist.world_size})")
        if cfg.fsdp and self.dist is None:
            from agentgym.algorithms.loop.distributed import under_torchrun
            if not under_torchrun():
                raise ValueError("fsdp=true needs torchrun (FSDP2 shards the model across the processes: "
                                 "torchrun --nproc-per-node N -m agentgym train fsdp=true ...)")
            self.log("[agentgym] fsdp=true at world size 1: one process holds the whole model, nothing to "
                     "shard; training as a single process")
        if cfg.max_staleness and self.dist is not None:
            raise ValueError("max_staleness > 0 under torchrun is not supported yet: the batch gathered across ranks "
                             "and the update's all-reduce would run collectives from two threads at once")
        if cfg.fsdp and cfg.rollout_workers > 0:
            raise ValueError("fsdp=true with rollout_workers > 0 is not supported yet: use one engine per rank")
        _set_seed(cfg.seed)
        from agentgym.policies.placement import place_sampler
        from agentgym.policies.backends import resolve_backend
        backend = resolve_backend(cfg.backend, notice=self.log)
        # one precision for the whole run, decided before anything loads (a probe, cached per machine)
        device = cfg.device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.precision = resolve_precision(cfg.precision, device)
        if self.is_main:
            self.log(f"[agentgym] {self.precision.describe()}")
        # train_policy: the transformers module the learner trains; policy: the sampler (the same object
        # when colocated, else a separate engine, Ray actors or an unsharded copy: see policies/placement.py)
        self.train_policy, self.policy = place_sampler(cfg, backend, self.precision, policy,
                                                       train_dtype=torch_dtype(cfg.dtype))
        self.colocated = self.policy is self.train_policy
        lcfg = cfg.learner
        if lcfg.total_steps is None or lcfg.total_steps <= 0:
            from dataclasses import replace
            lcfg = replace(lcfg, total_steps=cfg.steps)
        self.learner = make_learner(cfg.algo, self.train_policy, lcfg, optim=cfg.optim, lora=cfg.lora,
                                    separate_sampler=not self.colocated, fsdp=cfg.fsdp, precision=self.precision)
        if not self.colocated:              # the engine starts from exactly the learner's weights
            self.policy.sync_weights(self.learner.policy_weights())
        self.engine = RolloutEngine(self.policy, rollout_config(cfg))
        # every step's batch comes through it; with max_staleness >= 1 it generates one step ahead
        self.sampling = Prefetcher(self._collect)
        self.sampler_version = 0    # the learner step whose weights the sampler holds
        self.eval_engine = RolloutEngine(self.policy, eval_rollout_config(cfg))
        self.step = 0
        self.health = HealthMonitor(cfg.health)
        self.history: list[dict[str, float]] = []
        self.evals: list[dict[str, float]] = []
        self._tb = None

    def log(self, message: str) -> None:
        """Print above the training bar (never through it); only rank 0 speaks."""
        if not getattr(self, "is_main", True):
            return
        if self._bar is not None and self._print is print:
            self._bar.write(message)
        else:
            self._print(message)

    # ------------------------------------------------------------------ checkpoints
    def _ckpt_dir(self, step: int) -> Path:
        return self.out / "checkpoints" / f"step_{step:06d}"

    def save_checkpoint(self) -> Path | None:
        """Write ``checkpoints/step_N`` (rank 0). Under FSDP every rank must call it: the full weights and
        optimizer state are gathered from the shards (collectives) before rank 0 writes them."""
        fsdp = self.learner.fsdp
        full = self.learner.full_model_state() if fsdp else None
        learner_state = self.learner.state_dict() if fsdp or self.is_main else None
        if not self.is_main:
            return None
        d = self._ckpt_dir(self.step)
        tmp = d.with_name(d.name + ".tmp")
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        # full weights, or only the adapter with LoRA; under FSDP the gathered full weights
        save_model_quietly(self.learner.model, tmp / "model", full)
        try:   # max_staleness >= 1: the next step's batch, generated by older weights
            ahead = self.sampling.pending()
        except Exception:   # its error is raised where the batch is taken; the checkpoint stands without it
            ahead = None
        # the task filter's state after the newest batch a resumed run will not generate again
        groups = self.groups.state_after(ahead.step if ahead is not None else self.step - 1)
        torch.save({"learner": learner_state, "step": self.step, "group_filter": groups, **rng_state()},
                   tmp / "state.pt")
        (tmp / "history.json").write_text(json.dumps({"history": self.history, "evals": self.evals,
                                                      "alarms": [asdict(a) for a in self.health.alarms]}))
        if ahead is not None:             # saved, so that --resume trains on exactly the batch this run would
            torch.save(ahead, tmp / "batch_ahead.pt")
        if d.exists():
            shutil.rmtree(d)
        tmp.rename(d)
        prune_checkpoints(self.out, self.cfg.keep_checkpoints)
        dispatch(self.events, "checkpoint_saved", self, d)
        return d

    def load_checkpoint(self, d: Path) -> None:
        from safetensors.torch import load_file
        model_dir = d / "model"
        weights = {}
        for f in sorted(model_dir.glob("*.safetensors")):
            weights.update(load_file(f))
        if (model_dir / "adapter_config.json").exists():
            from peft import set_peft_model_state_dict
            set_peft_model_state_dict(self.learner.model, weights)
        else:   # under FSDP into each rank's shards: every rank loads the same file
            try:
                self.learner.load_full_model_state(weights)
            except RuntimeError as e:
                raise RuntimeError(f"checkpoint {d} does not match the model: {e}") from None
        state = torch.load(d / "state.pt", weights_only=False)
        if "learner" not in state:
            raise FileNotFoundError(f"checkpoint {d} holds weights only (not the newest one); resume needs the newest")
        self.learner.load_state_dict(state["learner"])
        self.step = int(state["step"])
        set_rng_state(state)
        h = json.loads((d / "history.json").read_text())
        self.history, self.evals = h["history"], h["evals"]
        self.health.load_state_dict({"rows": self.history, "alarms": h.get("alarms", [])})
        if state.get("group_filter") is not None:   # checkpoints from before group_filter start from zero
            self.groups.load_state_dict(state["group_filter"])
        if self.cfg.max_staleness and (d / "batch_ahead.pt").exists():
            self.sampling.put(torch.load(d / "batch_ahead.pt", weights_only=False))

    def latest_checkpoint(self) -> Path | None:
        return latest_checkpoint(self.out)

    # ------------------------------------------------------------------ logging
    def _log_row(self, row: dict[str, float]) -> None:
        path = self.out / "train_log.csv"
        rows = self.history
        keys = sorted({k for r in rows for k in r})
        with path.open("w", newline="") as f:  # rewritten whole: columns may appear later
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            w.writerows(rows)
        if self.cfg.tensorboard:
            if self._tb is None:
                from torch.utils.tensorboard import SummaryWriter
                self._tb = SummaryWriter(str(self.out / "tensorboard"))
            for k, v in row.items():
                if isinstance(v, (int, float)) and math.isfinite(v):
                    self._tb.add_scalar(k, v, int(row["step"]))

    def evaluate(self, tag: str) -> tuple[dict[str, float], list[Any]]:
        from tqdm import tqdm

        from agentgym.progress import GeneratingPostfix
        e = self.cfg.eval
        with tqdm(total=e.episodes * max(1, e.samples), desc=f"eval {tag} (held-out, {e.describe()})", unit="ep",
                  leave=False, position=1 if self._bar is not None else 0) as bar:
            postfix = GeneratingPostfix(bar)

            def progress(p: RolloutProgress) -> None:
                bar.update(p.finished - bar.n)     # episodes ended; while a batch generates, its sequences done
                postfix(p.tokens, p.generating)
            metrics, trajectories = scored_eval(self.eval_engine, self.cfg, progress=progress)
        m = {"step": float(self.step), **metrics}
        self.evals.append({"tag": tag, **m})
        dispatch(self.events, "eval_done", self, tag, m, trajectories)
        self.log(eval_line(tag, self.step, m, self.cfg))
        return m, trajectories

    def use_before_eval(self, before: Mapping[str, Any], source: str) -> None:
        """Take ``before`` (an :meth:`evaluate` result of this run's initial weights on the same eval, made by
        another run: ``source``) as this run's eval before training instead of evaluating again. Only
        valid where the weights, the held-out tasks and the draws are the same, as in a comparison's arms
        of one seed; :func:`~agentgym.algorithms.compare.harness.compare` checks that."""
        if self.step != 0 or any(ev["tag"] == "before" for ev in self.evals):
            raise ValueError("use_before_eval: this run has trained or already has its eval before training")
        m = {**dict(before), "tag": "before", "step": 0.0}
        self.evals.append(m)
        self.log(eval_line("before", 0, m, self.cfg, source=source))

    # ------------------------------------------------------------------ loop
    def train(self, resume: bool = False, overwrite: bool = False, prepared: Path | None = None) -> dict[str, Any]:
        """Run to ``cfg.steps``. A non-empty output directory is refused unless ``resume`` (continue from
        its last checkpoint) or ``overwrite`` (delete it first); see :mod:`agentgym.runs`. ``prepared``:
        the directory a caller already prepared with ``prepare_output_dir`` (the CLI does, before loading
        the model), so it is not prepared twice. Ctrl-C raises :class:`TrainingInterrupted` after
        checkpointing the last whole step."""
        from agentgym.runs import prepare_output_dir
        cfg = self.cfg
        main = self.is_main
        if main:   # only rank 0 writes (other ranks read checkpoints when resuming)
            if prepared is None:
                prepare_output_dir(self.out, resume=resume, overwrite=overwrite, command="train")
            elif Path(prepared).expanduser().resolve() != self.out.expanduser().resolve():
                raise ValueError(f"prepared={prepared} is not this run's output_dir {self.out}")
            save_config(cfg, self.out / "config.yaml")
            self.write_provenance()
        if resume:
            ckpt = self.latest_checkpoint()
            if ckpt is None:   # stopped before its first checkpoint: nothing to continue, nothing to lose
                self.log(f"--resume: {self.out} has no checkpoint yet (it stopped before the first one); "
                         "starting it over from step 0")
            else:
                self.load_checkpoint(ckpt)
                self.sampler_version = -1   # the engine starts from the checkpoint's weights
                self._sync_sampler()
                self.log(f"resumed from {ckpt} (step {self.step})")
        # Ctrl-C in one process stops at a whole step and checkpoints it (torchrun: each rank gets the
        # signal and collectives cannot be finished alone, so the last periodic checkpoint stands)
        guard = WholeSteps() if self.dist is None else None
        try:
            with guard or contextlib.nullcontext(), self._lanes():
                return self._train_loop(guard)
        except KeyboardInterrupt:
            if guard is None:
                raise
            self._close_bar()
            saved = self.latest_checkpoint()
            if not guard.torn and self.step > checkpoint_step(saved):
                self.log(f"[train] saving a checkpoint at step {self.step} ...")
                saved = self.save_checkpoint()
            if main:
                discard_unstarted(self.out, self.step, resume, self.log)
            raise TrainingInterrupted(self.step, saved) from None
        except ServiceOutage as stop:   # raised between whole steps: the state is consistent and can be saved
            self._close_bar()
            saved = self.latest_checkpoint()
            if self.step > checkpoint_step(saved):
                self.log(f"[train] saving a checkpoint at step {self.step} ...")
                saved = self.save_checkpoint()
            stop.checkpoint = saved
            raise
        except Exception:   # a late error before the first step: nothing to keep, nothing to block a re-run
            if main:
                discard_unstarted(self.out, self.step, resume, self.log)
            raise

    def _close_bar(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    @contextlib.contextmanager
    def _lanes(self) -> Iterator[None]:
        """With max_staleness >= 1 the sampler and the learner compute at once: they share the thread budget."""
        from agentgym.threads import current
        governor = current() if self.cfg.max_staleness else None
        if self.cfg.max_staleness and self.is_main:
            self.log(f"[train] overlap: step k+1's batch is generated while step k updates (max_staleness="
                     f"{self.cfg.max_staleness}; the sampler is a separate engine, weights pushed once per step)")
        if governor is not None:
            governor.set_lanes(2)
        try:
            yield
        finally:
            if governor is not None:
                governor.set_lanes(1)

    def _collect(self, step: int) -> Any:
        """``step``'s rollout batch: seeded by the step alone, so it does not matter which thread collects it."""
        from agentgym.algorithms.loop.distributed import gather_lists
        cfg = self.cfg
        world, rank = (self.dist.world_size, self.dist.rank) if self.dist is not None else (1, 0)
        # each rank its own groups and seeds (rank 0's are those of a one-process run)
        seed = _step_seed(cfg.seed + 100_003 * rank, step)
        torch.manual_seed(seed)

        def generate(num_groups: int, round_seed: int, task_indices: list[int] | None) -> Any:
            batch = self.engine.collect(cfg.env, num_groups=num_groups, group_size=cfg.group_size, seed=round_seed,
                                        task_indices=task_indices, env_kwargs=cfg.env_kwargs)
            if self.dist is not None:   # the global batch, in rank order, on every rank
                trajectories = gather_lists(batch.trajectories, self.dist)
                timing = {k: v for k, v in batch.metrics.items() if k.startswith("time/")}
                batch = type(batch)(trajectories, {**summarize(trajectories), **timing})
            return batch
        return self.groups.collect(step, seed, generate, world, lambda: self.engine.num_tasks(cfg.env, cfg.env_kwargs))

    def _without_infra_errors(self, trajectories: list[Any]) -> tuple[list[Any], int]:
        """The episodes to train on: those that ended on an infrastructure error (a sandbox, a retrieval
        server, a tool backend: :class:`agentgym.errors.InfraError`) are left out of the group baselines and
        the loss — their zero reward says nothing about the policy. Returns the rest and how many were left out."""
        kept = scored_episodes(trajectories)
        if len(kept) == len(trajectories):
            return trajectories, 0
        kept_ids = {id(t) for t in kept}
        first = next(t for t in trajectories if id(t) not in kept_ids).episode["infra_error"]
        self.log(f"[train] step {self.step + 1}: {len(trajectories) - len(kept)} of {len(trajectories)} episodes ended "
                 f"on an infrastructure error, left out of the baselines and the loss (first: {first})")
        return kept, len(trajectories) - len(kept)

    def _sync_sampler(self) -> float:
        """Give the sampler the learner's current weights (once per step); seconds it took."""
        if self.sampler_version == self.step:
            return 0.0
        took = self.policy.sync_weights(self.learner.model if self.colocated else self.learner.policy_weights())
        self.sampler_version = self.step
        return float(took or 0.0)

    def _sampler_idle(self) -> None:
        """Before an eval: let a batch in flight finish (it is kept), then give the sampler the newest weights."""
        self.sampling.pending()
        self._sync_sampler()

    def _train_loop(self, guard: WholeSteps | None) -> dict[str, Any]:
        """Eval before, then one step per iteration: take a batch, update, log, eval and checkpoint on
        schedule; then the final eval and artifacts (:meth:`_finish`)."""
        from tqdm import tqdm

        cfg = self.cfg
        main = self.is_main
        update_section = guard.update if guard is not None else contextlib.nullcontext
        if main and self.step == 0 and not any(ev["tag"] == "before" for ev in self.evals):
            self.evaluate("before")
        self._bar = tqdm(total=cfg.steps, initial=self.step, desc=f"{cfg.algo} on {cfg.env}", unit="step",
                         disable=not main)
        ahead = cfg.max_staleness > 0   # generation of step k+1 overlaps update k (algorithms/loop/overlap.py)
        while self.step < cfg.steps:
            recheck_threads()   # torch threads follow the load between steps (agentgym.threads)
            t0 = time.perf_counter()
            got = self.sampling.take(self.step, self.sampler_version)
            batch, t_wait, sync_s = got.batch, time.perf_counter() - t0, 0.0
            if ahead:   # the sampler is idle: newest weights, then the next batch in the background
                sync_s = self._sync_sampler()
                if self.step + 1 < cfg.steps:
                    self.sampling.start(self.step + 1, self.sampler_version)
            trajectories, infra = self._without_infra_errors(batch.trajectories)
            with update_section():   # a Ctrl-C here waits for the whole update (see WholeSteps)
                upd = self.learner.update(trajectories) if trajectories else {"skipped": 1.0}
                staleness = self.step - got.version
                self.step += 1
                if not ahead:   # the sampler gets the new weights (a no-op when it is the trained module itself)
                    sync_s = self._sync_sampler()
                timing = {"time/step_s": time.perf_counter() - t0, "time/rollout_s": got.seconds,
                          "time/rollout_wait_s": t_wait, "time/sync_s": sync_s}
                row = self._step_row(batch, upd, staleness, infra, timing)
                self._bar.update(1)   # the step is done: the bar shows it before a held Ctrl-C stops the loop
            self._after_step(batch, row)
            self._check_outage(batch.trajectories, infra)
        self._close_bar()
        return self._finish()

    def _check_outage(self, trajectories: list[Any], infra: int) -> None:
        """Count steps in a row whose every episode an infrastructure error ended (nothing was trained on);
        at ``health.max_outage_steps`` stop the run with :class:`ServiceOutage` rather than spend the rest of
        its budget on steps that train nothing. One process only: under torchrun each rank sees its own share of
        the batch, and a stop that one rank decides alone would leave the others waiting in a collective."""
        if self.dist is not None:
            return
        self._outage_steps = self._outage_steps + 1 if trajectories and infra == len(trajectories) else 0
        limit = self.cfg.health.max_outage_steps
        if limit and self._outage_steps >= limit:
            first = next(t.episode["infra_error"] for t in trajectories if (t.episode or {}).get("infra_error"))
            raise ServiceOutage(f"every episode of the last {self._outage_steps} steps ended on an infrastructure "
                                f"error, so nothing was trained (last: {str(first)[:300]}); the run stopped at step "
                                f"{self.step} (health.max_outage_steps={limit})", self.step)

    def _step_row(self, batch: Any, upd: dict[str, Any], staleness: int, infra: int,
                  timing: dict[str, float]) -> dict[str, float]:
        """The step's logged row (kept in ``history``, checked by the health monitor, written by rank 0)."""
        dt = timing["time/step_s"]
        row = {"step": float(self.step), **{f"rollout/{k}": v for k, v in batch.metrics.items()},
               **{f"train/{k}": float(v) for k, v in upd.items()},
               "rollout/staleness": float(staleness), "rollout/infra_errors": float(infra), **timing,
               "perf/tokens_per_s": batch.metrics.get("generated_tokens", 0.0) / max(dt, 1e-9),
               # the policy's health, over the episodes it is trained on: an outage is not a collapse
               **batch_health(scored_episodes(batch.trajectories), self.cfg.health)}
        self.history.append(row)
        for alarm in self.health.check(row):
            self.log(f"[health] WARNING step {alarm.step}: {alarm.message} ({alarm.rule})")
            dispatch(self.events, "alarm", self, alarm)
        if self.is_main:
            self._log_row(row)
        return row

    def _after_step(self, batch: Any, row: dict[str, float]) -> None:
        """The step-done event, the progress bar's batch numbers, and the scheduled eval and checkpoint."""
        cfg, main = self.cfg, self.is_main
        dispatch(self.events, "step_done", self, batch, row)
        # the training batch's own (sampled) reward and success; held-out success is the eval's
        self._bar.set_postfix(batch_reward=f"{batch.metrics['reward_mean']:+.3f}",
                              batch_success=f"{batch.metrics['success_rate']:.2f}")
        if main and cfg.eval.every and self.step % cfg.eval.every == 0 and self.step < cfg.steps:
            self._sampler_idle()
            self.evaluate(f"step{self.step}")
        if (main or self.learner.fsdp) and cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0:
            self.save_checkpoint()    # FSDP: every rank takes part in gathering the shards

    def _finish(self) -> dict[str, Any]:
        """After the last step: rank 0 evaluates, checkpoints and writes the artifacts; the others close."""
        if not self.is_main:   # the other ranks are done once the last update is in
            if self.learner.fsdp:
                self.save_checkpoint()    # rank 0's final checkpoint gathers from every rank
            self.close()
            return {"before": None, "after": None, "history": self.history, "output_dir": str(self.out)}
        self._sampler_idle()
        final, trajs = self.evaluate("after")
        self.save_checkpoint()
        (self.out / "evals.json").write_text(json.dumps(self.evals, indent=1))
        self.write_artifacts()
        dispatch(self.events, "run_done", self, trajs)
        if self._tb is not None:
            self._tb.close()
        self.close()
        before = next(e for e in self.evals if e["tag"] == "before")
        gain = held_out_gain(before, final)
        if gain is not None:
            (self.out / "evals.json").write_text(json.dumps(self.evals + [{"tag": "gain", **gain}], indent=1))
        from agentgym.runs import release_output_dir
        release_output_dir(self.out)   # finished: another process may now --resume or --overwrite it
        return {"before": before, "after": final, "history": self.history, "output_dir": str(self.out), "gain": gain}

    def write_provenance(self) -> None:
        """``provenance.json``: what the resolved config cannot say (machine, versions, the precision ``auto``
        chose and why, the code that ran: :func:`agentgym.provenance.write_run_provenance`)."""
        from agentgym.provenance import write_run_provenance
        write_run_provenance(self.out / "provenance.json", self.precision, torch.get_num_threads())

    def close(self) -> None:
        """Release a separate sampler (vLLM engine, Ray actors); a colocated policy stays usable."""
        if not self.colocated:
            from agentgym.backend import as_backend
            as_backend(self.policy).close()

    def write_artifacts(self) -> None:
        """``alarms.json`` and ``curves.png`` (the HTML trajectory report is the app's: run_done)."""
        alarms = self.health.alarms
        (self.out / "alarms.json").write_text(json.dumps([asdict(a) for a in alarms], indent=1))
        plot_curves(self.history, self.evals, self.out / "curves.png", title=f"{self.cfg.algo} on {self.cfg.env}",
                    alarms=alarms)


def train(cfg: TrainConfig, resume: bool = False, policy: Any | None = None,
          events: Sequence[TrainerEvents] = ()) -> dict[str, Any]:
    return Trainer(cfg, policy=policy, events=events).train(resume=resume)
