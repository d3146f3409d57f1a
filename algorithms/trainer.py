"""The trainer: tasks → batched rollouts → advantages → updates → eval / checkpoint / logging.

``agentgym train`` runs :func:`train` with a :class:`TrainConfig` (YAML + ``key=value``
overrides). Every run writes its resolved config, a CSV log (and TensorBoard events), PNG
learning curves and an HTML trajectory report into ``output_dir``. ``--resume`` continues a killed
run from its last checkpoint and reproduces the uninterrupted run's metrics: the rollout seeds and
the torch RNG are derived from (seed, step), and checkpoints hold weights, optimizer, scheduler and
learner state.
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
import random
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterator, Sequence

import numpy as np
import torch

from agentgym.config import save_config, to_dict
from agentgym.policy import SamplingParams
from agentgym.rollout import ROLLOUT_ALIASES, RolloutConfig, RolloutEngine, RolloutViews, summarize
from agentgym.precision import check_precision, resolve_precision
from agentgym.threads import recheck as recheck_threads

from agentgym.algorithms.catalog import make_learner
from agentgym.algorithms.config import LearnerConfig
from agentgym.algorithms.health import Alarm, HealthConfig, HealthMonitor, batch_health
from agentgym.algorithms.overlap import Prefetcher

__all__ = ["TrainConfig", "EvalConfig", "train", "Trainer", "rollout_config", "held_out_eval"]

def _train_rollout() -> RolloutConfig:
    """The main job's rollout settings: short answers, a 2k-token context."""
    return RolloutConfig(sampling=SamplingParams(max_new_tokens=48), max_obs_tokens=256, max_context_tokens=2048)


@dataclass
class EvalConfig:
    every: int = 0                  # steps between evals (0: only before and after training)
    episodes: int = 16
    env_kwargs: dict[str, Any] = field(default_factory=lambda: {"split": "test"})
    first_task: int = 0             # the same held-out tasks at every eval


@dataclass
class TrainConfig(RolloutViews):
    """Everything a run needs. Defaults: the README's main job (a short CPU run).

    The default task is ``Math-v0`` at its warm-up level (one operation on numbers up to 20,
    single turn, answer read from ``\\boxed{}``, an "answer is" phrase or the last number): the
    untrained SmolLM2-135M solves about a third of these when sampling, so the rewards inside a
    GRPO group differ and every step has a learning signal. (On ``Arithmetic-v0`` it never writes
    the ``<answer>`` tag, every reward in a group is equal and GRPO's advantages are exactly zero.)
    """
    env: str = "Math-v0"
    # the default env's arguments: a config that picks another env starts from {} (see load_config)
    env_kwargs: dict[str, Any] = field(
        default_factory=lambda: {"kinds": ["arithmetic"], "difficulty": 0, "max_turns": 1},
        metadata={"defaults_belong_to": "env"})
    model: str = "smollm2"
    algo: str = "grpo"
    steps: int = 12
    groups_per_step: int = 4
    group_size: int = 4
    seed: int = 0
    # sampling and token layout: the one RolloutConfig (``sampling.*``, ``style``, ``max_obs_tokens``,
    # ``max_context_tokens`` are accepted as short keys); evals use the same layout, greedily
    rollout: RolloutConfig = field(default_factory=_train_rollout)
    learner: LearnerConfig = field(default_factory=lambda: LearnerConfig(lr=1e-5, micro_batch_size=4))
    eval: EvalConfig = field(default_factory=EvalConfig)
    # steps between checkpoints (0: only the final one). Only the newest checkpoint keeps the optimizer
    # and learner state that --resume needs (≈2× the weights with AdamW); older kept ones hold weights only.
    checkpoint_every: int = 4
    keep_checkpoints: int = 1
    output_dir: str = "runs/train"
    tensorboard: bool = True
    device: str | None = None
    # generation backend of rollouts and evals: hf (the trained module samples in place), vllm (a
    # separate engine, weights synced after every update), None = vllm on CUDA when installed, else hf
    backend: str | None = None
    # options of that backend's policy: hf — reuse_kv (KV reuse across turns, default true), attn_implementation,
    # kv_cache_tokens, max_batch_size; vllm — any vllm.LLM argument (gpu_memory_utilization, ...)
    backend_options: dict[str, Any] = field(default_factory=dict)
    # under torchrun on CUDA: shard the trained model with FSDP2 (needs backend=vllm for rollouts)
    fsdp: bool = False
    # > 0: that many generation engines as Ray actors (data-parallel over episodes), weights pushed
    # to all of them after every update (on the cluster of rollout.ray_address; None: a local one)
    rollout_workers: int = 0
    # how those pushes travel: auto, collective (gloo / NCCL broadcast) or object_store (see policies/ray_pool.py)
    weight_transfer: str = "auto"
    # weights' dtype: None = bf16 on CUDA, fp32 on CPU. "float32" keeps fp32 master weights (bf16
    # autocast still applies with precision bf16): at lr 1e-6 an AdamW step is far below bf16's resolution.
    dtype: str | None = None
    # compute precision of the learner (policy, reference, critic) and the samplers: auto (bf16 on CUDA; on a
    # CPU what a cached probe measures faster), fp32, or bf16 (autocast; fp32 master weights, optimizer, loss)
    precision: str = "auto"
    # overlap generation with the update (bounded staleness, as in AReaL / prime-rl): 0 = on-policy (generate,
    # then update); >= 1 = the batch of step k+1 is generated while step k updates, by a separate sampler
    # holding weights at most this many updates old (one sampler: the pipeline is one batch deep, so 1 in practice)
    max_staleness: int = 0
    # training-health alarms (entropy / length / action-rate collapse, groups without signal) and the opt-in
    # template-collapse MI; the health/* metrics are logged every step either way (algorithms/health.py)
    health: HealthConfig = field(default_factory=HealthConfig)

    config_aliases: ClassVar[dict[str, str]] = ROLLOUT_ALIASES

    def __post_init__(self) -> None:
        if isinstance(self.rollout, dict):
            self.rollout = RolloutConfig(**self.rollout)
        for name in ("steps", "groups_per_step", "group_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.checkpoint_every < 0:
            raise ValueError(f"checkpoint_every must be >= 0 (0: only the final checkpoint), got {self.checkpoint_every}")
        if self.keep_checkpoints < 1:
            raise ValueError(f"keep_checkpoints must be >= 1, got {self.keep_checkpoints}")
        if self.eval.every < 0 or self.eval.first_task < 0 or self.eval.episodes < 1:
            raise ValueError("eval.every and eval.first_task must be >= 0, eval.episodes >= 1")
        if not self.output_dir:
            raise ValueError("output_dir must not be empty")
        if self.dtype is not None:
            _torch_dtype(self.dtype)
        check_precision(self.precision)
        if self.rollout_workers < 0:
            raise ValueError(f"rollout_workers must be >= 0, got {self.rollout_workers}")
        if not isinstance(self.max_staleness, int) or isinstance(self.max_staleness, bool) or self.max_staleness < 0:
            raise ValueError(f"max_staleness must be an integer >= 0 (0: on-policy), got {self.max_staleness!r}")
        from agentgym.policies.ray_pool import check_weight_transfer
        check_weight_transfer(self.weight_transfer)
        if not isinstance(self.backend_options, dict):
            raise ValueError(f"backend_options must be a mapping, got {self.backend_options!r}")
        from agentgym.policies.registry import check_backend
        check_backend(self.backend, self.backend_options)   # a registered name, and options it takes
        lt = self.learner.temperature
        st = self.rollout.sampling.logprob_temperature
        if lt is not None and abs(lt - st) > 1e-9:
            raise ValueError(f"learner.temperature={lt} differs from sampling.temperature={st}: the learner must "
                             "recompute log-probs at the sampling temperature; remove learner.temperature")


def _set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _torch_dtype(name: str | None) -> torch.dtype | None:
    if name is None:
        return None
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"dtype must name a torch dtype (float32, bfloat16, float16), got {name!r}")
    return dtype


def _step_seed(seed: int, step: int) -> int:
    return (seed * 1_000_003 + step * 7_919) % 2**31


def rollout_config(cfg: TrainConfig, greedy: bool = False) -> RolloutConfig:
    """The rollout settings of a run (``greedy`` for its evals): ``cfg.rollout``, nothing else."""
    return cfg.rollout.greedy() if greedy else cfg.rollout


def held_out_eval(engine: RolloutEngine, cfg: TrainConfig,
                  progress: Callable[[int, int], None] | None = None) -> tuple[dict[str, float], list[Any]]:
    """The eval of every run: the same held-out tasks (``eval.first_task`` on, the eval split), so runs
    and algorithms (including ones trained outside :class:`Trainer`) are compared on equal terms.
    Returns ``eval/``-prefixed metrics and the trajectories."""
    e = cfg.eval
    indices = list(range(e.first_task, e.first_task + e.episodes))
    batch = engine.collect(cfg.env, task_indices=indices, seed=cfg.seed, env_kwargs={**cfg.env_kwargs, **e.env_kwargs},
                           progress=progress)
    return {f"eval/{k}": v for k, v in batch.metrics.items() if not k.startswith("time/")}, batch.trajectories


def latest_checkpoint(out: str | Path) -> Path | None:
    """The newest ``checkpoints/step_N`` of a run directory, or None."""
    ckpts = sorted((Path(out) / "checkpoints").glob("step_*[0-9]"))
    return ckpts[-1] if ckpts else None


def checkpoint_step(ckpt: Path | None) -> int:
    return int(ckpt.name.split("_", 1)[1]) if ckpt is not None else 0


def finished_run(out: str | Path, steps: int) -> dict[str, Any] | None:
    """The final evals of a run in ``out`` that already trained ``steps`` steps and wrote its final
    eval (``evals.json``), else None — ``--resume`` on such a run has nothing left to do."""
    evals_path = Path(out) / "evals.json"
    if checkpoint_step(latest_checkpoint(out)) < steps or not evals_path.is_file():
        return None
    try:
        evals = json.loads(evals_path.read_text())
    except (OSError, ValueError):
        return None
    tags = {e.get("tag"): e for e in evals if isinstance(e, dict)}
    return tags if "after" in tags and "before" in tags else None


def interrupted_run(out: str | Path) -> bool:
    """Whether ``out`` holds a run that checkpointed but stopped before the steps its config asked for."""
    import yaml
    try:
        steps = int((yaml.safe_load((Path(out) / "config.yaml").read_text()) or {})["steps"])
    except (OSError, ValueError, TypeError, KeyError, yaml.YAMLError):
        return False
    return latest_checkpoint(out) is not None and finished_run(out, steps) is None


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped a run; ``checkpoint`` is what ``--resume`` continues from (None: nothing saved)."""

    def __init__(self, step: int, checkpoint: Path | None) -> None:
        super().__init__(f"interrupted at step {step}")
        self.step, self.checkpoint = step, checkpoint


class _WholeSteps:
    """SIGINT handling for a training loop: a Ctrl-C that arrives while an update is being applied (learner
    step, weight sync, step counter, log row) is held until that update is complete, so an interrupted run
    stops at a whole step and can be checkpointed there; a second Ctrl-C stops at once (``torn``: the state
    may then be half-updated and must not be saved). Elsewhere (rollouts, evals) Ctrl-C stops at once —
    nothing is lost there but the current step's episodes."""

    def __init__(self) -> None:
        self.critical = self.pending = self.torn = False
        self._previous: Any = None

    def _handler(self, signum: int, frame: Any) -> None:
        if self.critical and not self.pending:
            self.pending = True
            print("\n[train] Ctrl-C: finishing this update so the run can stop at a whole step "
                  "(Ctrl-C again to stop now)", file=sys.stderr, flush=True)
            return
        self.torn = self.critical
        raise KeyboardInterrupt

    def __enter__(self) -> "_WholeSteps":
        import signal
        import threading
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handler)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._previous is not None:
            import signal
            signal.signal(signal.SIGINT, self._previous)

    @contextlib.contextmanager
    def update(self) -> Iterator[None]:
        """The section a Ctrl-C waits for; raises the held KeyboardInterrupt once the update is in."""
        self.critical = True
        try:
            yield
        finally:
            self.critical = False
        if self.pending:
            raise KeyboardInterrupt


class Trainer:
    """One training run. ``on_step(step, batch, row)`` (optional) sees every step's rollout batch and
    logged row after the update, e.g. for the comparison harness to record which tasks were drawn."""

    def __init__(self, cfg: TrainConfig, policy: Any | None = None, log: Callable[[str], None] = print,
                 on_step: Callable[[int, Any, dict[str, float]], None] | None = None):
        self.cfg, self.on_step = cfg, on_step
        self._print = log
        self._bar: Any = None
        self.out = Path(cfg.output_dir)
        from agentgym.algorithms.distributed import init_from_env
        self.dist = init_from_env(cfg.device)   # None in one process; torchrun: this rank's process group
        self.is_main = self.dist is None or self.dist.is_main
        if self.dist is not None and cfg.groups_per_step % self.dist.world_size:
            raise ValueError(f"groups_per_step={cfg.groups_per_step} must be divisible by the number of "
                             f"processes ({self.dist.world_size})")
        if cfg.fsdp and self.dist is None:
            raise ValueError("fsdp=true needs torchrun (FSDP2 shards the model across the processes: "
                             "torchrun --nproc-per-node N -m agentgym.cli train fsdp=true ...)")
        if cfg.max_staleness and self.dist is not None:
            raise ValueError("max_staleness > 0 under torchrun is not supported yet: the batch gathered across ranks "
                             "and the update's all-reduce would run collectives from two threads at once")
        if cfg.fsdp and cfg.rollout_workers > 0:
            raise ValueError("fsdp=true with rollout_workers > 0 is not supported yet: use one engine per rank")
        _set_seed(cfg.seed)
        from agentgym.policies.placement import place_sampler
        from agentgym.policies.registry import resolve_backend
        backend = resolve_backend(cfg.backend, notice=self.log)
        # one precision for the whole run, decided before anything loads (a probe, cached per machine)
        device = cfg.device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.precision = resolve_precision(cfg.precision, device)
        if self.is_main:
            self.log(f"[agentgym] {self.precision.describe()}")
        # train_policy: the transformers module the learner trains; policy: the sampler (the same object
        # when colocated, else a separate engine, Ray actors or an unsharded copy: see policies/placement.py)
        self.train_policy, self.policy = place_sampler(cfg, backend, self.precision, policy,
                                                       train_dtype=_torch_dtype(cfg.dtype))
        self.colocated = self.policy is self.train_policy
        lcfg = cfg.learner
        if lcfg.total_steps is None or lcfg.total_steps <= 0:
            from dataclasses import replace
            lcfg = replace(lcfg, total_steps=cfg.steps)
        self.learner = make_learner(cfg.algo, self.train_policy, lcfg, separate_sampler=not self.colocated, fsdp=cfg.fsdp,
                                    precision=self.precision)
        if not self.colocated:              # the engine starts from exactly the learner's weights
            self.policy.sync_weights(self.learner.policy_weights())
        self.engine = RolloutEngine(self.policy, rollout_config(cfg))
        # every step's batch comes through it; with max_staleness >= 1 it generates one step ahead
        self.sampling = Prefetcher(self._collect)
        self.sampler_version = 0    # the learner step whose weights the sampler holds
        self.eval_engine = RolloutEngine(self.policy, rollout_config(cfg, greedy=True))
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
        from transformers.utils import logging as hf_logging
        shown = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()  # its shard bar would break the training bar
        try:
            # full weights, or only the adapter with LoRA; under FSDP the gathered full weights
            self.learner.model.save_pretrained(tmp / "model", **({"state_dict": full} if full is not None else {}))
        finally:
            if shown:
                hf_logging.enable_progress_bar()
        torch.save({"learner": learner_state, "step": self.step,
                    "torch_rng": torch.get_rng_state(), "numpy_rng": np.random.get_state(),
                    "python_rng": random.getstate()}, tmp / "state.pt")
        (tmp / "history.json").write_text(json.dumps({"history": self.history, "evals": self.evals,
                                                      "alarms": [asdict(a) for a in self.health.alarms]}))
        try:   # max_staleness >= 1: the next step's batch, generated by older weights
            ahead = self.sampling.pending()
        except Exception:   # its error is raised where the batch is taken; the checkpoint stands without it
            ahead = None
        if ahead is not None:             # saved, so that --resume trains on exactly the batch this run would
            torch.save(ahead, tmp / "batch_ahead.pt")
        if d.exists():
            shutil.rmtree(d)
        tmp.rename(d)
        ckpts = sorted((self.out / "checkpoints").glob("step_*[0-9]"))
        for old in ckpts[: max(0, len(ckpts) - self.cfg.keep_checkpoints)]:
            shutil.rmtree(old)
        for old in ckpts[max(0, len(ckpts) - self.cfg.keep_checkpoints):-1]:
            # older kept checkpoints: weights only; the optimizer state (the bulk) is for resuming the newest
            state = old / "state.pt"
            if state.exists():
                light = torch.load(state, weights_only=False)
                if "learner" in light:
                    torch.save({"step": light["step"], "resumable": False}, state)
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
        torch.set_rng_state(state["torch_rng"])
        np.random.set_state(state["numpy_rng"])
        random.setstate(state["python_rng"])
        h = json.loads((d / "history.json").read_text())
        self.history, self.evals = h["history"], h["evals"]
        self.health.rows, self.health.alarms = list(self.history), [Alarm(**a) for a in h.get("alarms", [])]
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

        from agentgym.evaluation import show_generating
        with tqdm(total=self.cfg.eval.episodes, desc=f"eval {tag} (held-out, greedy)", unit="ep", leave=False,
                  position=1 if self._bar is not None else 0) as bar:
            def progress(done: int, total: int, tokens: int = 0, generating: tuple[int, int] | None = None) -> None:
                bar.update(done - bar.n)     # episodes ended; while a batch generates, its sequences done
                show_generating(bar, tokens, generating)
            metrics, trajectories = held_out_eval(self.eval_engine, self.cfg, progress=progress)
        m = {"step": float(self.step), **metrics}
        # per held-out task (episode order = task order), for the paired CI of the gain
        m["successes"] = [float(bool(t.episode.get("success"))) for t in trajectories]
        self.evals.append({"tag": tag, **m})
        self.log(f"[eval {tag} @ step {self.step}] success {m['eval/success_rate']:.3f}  reward {m['eval/reward_mean']:+.3f}")
        return m, trajectories

    # ------------------------------------------------------------------ loop
    def train(self, resume: bool = False, overwrite: bool = False) -> dict[str, Any]:
        """Run to ``cfg.steps``. A non-empty output directory is refused unless ``resume`` (continue from
        its last checkpoint) or ``overwrite`` (delete it first); see :mod:`agentgym.runs`. Ctrl-C raises
        :class:`TrainingInterrupted` after checkpointing the last whole step."""
        from agentgym.runs import prepare_output_dir
        cfg = self.cfg
        main = self.is_main
        if main:   # only rank 0 writes (other ranks read checkpoints when resuming)
            prepare_output_dir(self.out, resume=resume, overwrite=overwrite, command="train")
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
        guard = _WholeSteps() if self.dist is None else None
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
            raise TrainingInterrupted(self.step, saved) from None

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
        from agentgym.algorithms.distributed import gather_lists
        cfg = self.cfg
        world, rank = (self.dist.world_size, self.dist.rank) if self.dist is not None else (1, 0)
        # each rank its own groups and seeds (rank 0's are those of a one-process run)
        seed = _step_seed(cfg.seed + 100_003 * rank, step)
        torch.manual_seed(seed)
        batch = self.engine.collect(cfg.env, num_groups=cfg.groups_per_step // world, group_size=cfg.group_size,
                                    seed=seed, env_kwargs=cfg.env_kwargs)
        if self.dist is not None:   # the global batch, in rank order, on every rank
            trajectories = gather_lists(batch.trajectories, self.dist)
            timing = {k: v for k, v in batch.metrics.items() if k.startswith("time/")}
            batch = type(batch)(trajectories, {**summarize(trajectories), **timing})
        return batch

    def _without_infra_errors(self, trajectories: list[Any]) -> tuple[list[Any], int]:
        """The episodes to train on: those that ended on an infrastructure error (a sandbox, a retrieval
        server, a tool backend: :class:`agentgym.errors.InfraError`) are left out of the group baselines and
        the loss — their zero reward says nothing about the policy. Returns the rest and how many were left out."""
        marked = [t for t in trajectories if (t.episode or {}).get("infra_error")]
        if not marked:
            return trajectories, 0
        self.log(f"[train] step {self.step + 1}: {len(marked)} of {len(trajectories)} episodes ended on an "
                 f"infrastructure error, left out of the baselines and the loss (first: {marked[0].episode['infra_error']})")
        return [t for t in trajectories if not (t.episode or {}).get("infra_error")], len(marked)

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

    def _train_loop(self, guard: _WholeSteps | None) -> dict[str, Any]:
        from tqdm import tqdm

        cfg = self.cfg
        main = self.is_main
        update_section = guard.update if guard is not None else contextlib.nullcontext
        if main and self.step == 0 and not any(ev["tag"] == "before" for ev in self.evals):
            self.evaluate("before")
        bar = self._bar = tqdm(total=cfg.steps, initial=self.step, desc=f"{cfg.algo} on {cfg.env}", unit="step",
                               disable=not main)
        ahead = cfg.max_staleness > 0   # generation of step k+1 overlaps update k (algorithms/overlap.py)
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
            with update_section():   # a Ctrl-C here waits for the whole update (see _WholeSteps)
                upd = self.learner.update(trajectories) if trajectories else {"skipped": 1.0}
                staleness = self.step - got.version
                self.step += 1
                if not ahead:   # the sampler gets the new weights (a no-op when it is the trained module itself)
                    sync_s = self._sync_sampler()
                dt = time.perf_counter() - t0
                row = {"step": float(self.step), **{f"rollout/{k}": v for k, v in batch.metrics.items()},
                       **{f"train/{k}": float(v) for k, v in upd.items()},
                       "rollout/staleness": float(staleness), "rollout/infra_errors": float(infra), "time/step_s": dt, "time/rollout_s": got.seconds,
                       "time/rollout_wait_s": t_wait, "time/sync_s": sync_s,
                       "perf/tokens_per_s": batch.metrics.get("generated_tokens", 0.0) / max(dt, 1e-9),
                       **batch_health(batch.trajectories, cfg.health)}
                self.history.append(row)
                for alarm in self.health.check(row):
                    self.log(f"[health] WARNING step {alarm.step}: {alarm.message} ({alarm.rule})")
                if main:
                    self._log_row(row)
            if self.on_step is not None:
                self.on_step(self.step, batch, row)
            bar.update(1)
            # the training batch's own (sampled) reward and success; held-out success is the eval's
            bar.set_postfix(batch_reward=f"{batch.metrics['reward_mean']:+.3f}",
                            batch_success=f"{batch.metrics['success_rate']:.2f}")
            if main and cfg.eval.every and self.step % cfg.eval.every == 0 and self.step < cfg.steps:
                self._sampler_idle()
                self.evaluate(f"step{self.step}")
            if (main or self.learner.fsdp) and cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0:
                self.save_checkpoint()    # FSDP: every rank takes part in gathering the shards
        self._close_bar()
        if not main:   # the other ranks are done once the last update is in
            if self.learner.fsdp:
                self.save_checkpoint()    # rank 0's final checkpoint gathers from every rank
            self.close()
            return {"before": None, "after": None, "history": self.history, "output_dir": str(self.out)}
        self._sampler_idle()
        final, trajs = self.evaluate("after")
        self.save_checkpoint()
        (self.out / "evals.json").write_text(json.dumps(self.evals, indent=1))
        self.write_artifacts(trajs)
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
        """``provenance.json``: what the resolved config cannot say — the machine, the library versions and
        the precision ``auto`` chose, with the probe figures it chose by."""
        import platform

        import transformers

        from agentgym.precision import cpu_identity
        ident = cpu_identity()
        (self.out / "provenance.json").write_text(json.dumps({
            "precision": self.precision.to_dict(), "cpu": ident["cpu"], "cpu_flags": ident["flags"],
            "torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "torch_threads": torch.get_num_threads()}, indent=1))

    def close(self) -> None:
        """Release a separate sampler (vLLM engine, Ray actors); a colocated policy stays usable."""
        if not self.colocated:
            from agentgym.policies.backend import as_backend
            as_backend(self.policy).close()

    def write_artifacts(self, eval_trajectories: list[Any]) -> None:
        from agentgym.report import write_html_report
        from agentgym.algorithms.health import health_section
        alarms = self.health.alarms
        (self.out / "alarms.json").write_text(json.dumps([asdict(a) for a in alarms], indent=1))
        plot_curves(self.history, self.evals, self.out / "curves.png", title=f"{self.cfg.algo} on {self.cfg.env}",
                    alarms=alarms)
        write_html_report(self.out / "eval_trajectories.html", eval_trajectories, tokenizer=self.policy.tokenizer,
                          metrics=summarize(eval_trajectories), title=f"{self.cfg.env} · after {self.step} steps",
                          sections=[health_section(self.out / "curves.png", alarms)])


def held_out_gain(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float] | None:
    """Held-out success after − before on the same tasks, with a 95 % paired bootstrap CI over tasks."""
    from agentgym.stats import paired_bootstrap_ci, verdict
    a, b = after.get("successes"), before.get("successes")
    if not a or not b or len(a) != len(b):
        return None
    ci = paired_bootstrap_ci(a, b)
    return {"success_gain": ci[0], "ci_low": ci[1], "ci_high": ci[2], "tasks": float(len(a)),
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


def train(cfg: TrainConfig, resume: bool = False, policy: Any | None = None) -> dict[str, Any]:
    return Trainer(cfg, policy=policy).train(resume=resume)
