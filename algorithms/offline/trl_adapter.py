"""Train on any agentgym env with TRL's ``GRPOTrainer``.

TRL 1.16's ``GRPOTrainer`` accepts a ``rollout_func(prompts, trainer) -> dict`` that replaces its
single-turn generation. :class:`EnvRollout` is such a function: it runs whole multi-turn episodes with
our :class:`~agentgym.rollout.RolloutEngine` on the very model TRL is training and hands TRL each
episode as one token-faithful sequence:

* ``prompt_ids`` = the trajectory's task prompt, ``completion_ids`` = everything after it: the
  policy's sampled ids *exactly as sampled* and, between turns, the environment's ids (observations
  and chat-template glue). TRL never re-tokenizes them: it pads and concatenates these lists.
* ``env_mask`` = our ``Trajectory.loss_mask`` over the completion (1 on sampled ids, 0 on env ids).
  TRL treats it as its ``tool_mask`` and multiplies it into the loss mask of the policy loss, the KL
  term and the entropy terms, so environment tokens carry no gradient (``tests/test_trl_adapter.py``
  checks it on the gradients of TRL's per-token log-probs and of the hidden states its LM head reads).
* ``logprobs`` = the sampling-time log-probs (log-softmax of ``logits / temperature``), 0.0 on env
  tokens. TRL only reads them for vLLM importance-sampling correction and its off-policy mask.
* Extra keys reach the reward functions as keyword arguments, one value per completion:
  ``trajectory`` (the :class:`~agentgym.Trajectory`), ``env_reward`` (its total reward) and
  ``env_task_index`` (the task the episode ran). :func:`episode_reward` is the reward function that
  gives TRL the env's episode reward.

Which task an episode runs: TRL passes ``rollout_func`` only the prompts of its batch, not the
dataset rows. :func:`make_task_dataset` therefore builds a dataset whose ``prompt`` (the env's reset
messages for the task, which is also what TRL logs) identifies the task uniquely, next to a
``task_index`` column; :class:`EnvRollout` maps each prompt back to its ``task_index`` (from
``trainer.train_dataset`` / ``eval_dataset`` or a dataset given to it), and :func:`episode_reward`
checks that the task each episode ran is the task of its dataset row.

TRL settings this contract cannot honour are refused with an explanation rather than silently
changing what is trained (see :meth:`EnvRollout.check_trainer`): TRL's own tool loop
(``tools`` / ``environment_factory``) ignores ``env_mask``; ``mask_truncated_completions`` calls a
completion truncated when its last token is not EOS, which is wrong for episodes that end on a stop
string (``</answer>``); vLLM generation and sampling options our policy does not implement
(``repetition_penalty``, ``min_p``, ``generation_kwargs``) would make the sampled distribution
differ from the one the log-probs describe.

trl, transformers and datasets are imported inside the functions, so ``import agentgym.algorithms``
stays light.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from agentgym.policy import SamplingParams
from agentgym.rollout_config import RolloutConfig
from agentgym.rollout import RolloutEngine
from agentgym.trajectory import Trajectory

__all__ = ["make_task_dataset", "prompt_key", "EnvRollout", "episode_reward", "train_with_trl"]

def prompt_key(prompt: Any) -> str:
    """A canonical string for a prompt (a message list or a plain string), used to find its task.

    ``None`` fields are dropped: ``datasets`` adds them when message dicts of different rows have
    different keys (e.g. a ``name`` on tool messages).
    """
    if isinstance(prompt, str):
        return prompt
    return json.dumps([{k: v for k, v in dict(m).items() if v is not None} for m in prompt], sort_keys=True,
                      ensure_ascii=False)


def _make_env(env: Any, env_kwargs: Mapping[str, Any]) -> Any:
    if callable(env):
        return env()
    from agentgym.registry import make
    return make(env, **dict(env_kwargs))


def make_task_dataset(env: Any, n_tasks: int, *, env_kwargs: Mapping[str, Any] | None = None,
                      first_task: int = 0, seed: int = 0) -> Any:
    """A ``datasets.Dataset`` of env tasks for ``GRPOTrainer``: columns ``prompt``, ``task_index``, ``env_id``.

    ``prompt`` is the env's reset observation for the task (the chat messages the policy will see),
    so TRL's logs show real prompts and :class:`EnvRollout` can find the task from the prompt alone.
    Tasks are taken in order from ``first_task``; a task whose prompt equals an earlier one's is
    skipped (TRL could not tell them apart), so the dataset always has ``n_tasks`` distinct prompts
    unless the env runs out of tasks first (then a ``ValueError``).
    """
    from datasets import Dataset

    if n_tasks < 1:
        raise ValueError(f"n_tasks must be >= 1, got {n_tasks}")
    e = _make_env(env, env_kwargs or {})
    try:
        total = getattr(e.unwrapped, "num_tasks", None)
        env_id = env if isinstance(env, str) else getattr(env, "__name__", type(e.unwrapped).__name__)
        rows: dict[str, list[Any]] = {"prompt": [], "task_index": [], "env_id": []}
        seen: set[str] = set()
        index = first_task
        while len(rows["prompt"]) < n_tasks:
            if total is not None and index >= total:
                raise ValueError(f"{env_id} has {total} tasks; only {len(rows['prompt'])} distinct prompts from "
                                 f"task {first_task} on, {n_tasks} requested")
            obs, _ = e.reset(seed=seed + index, options={"task_index": index})
            messages = [{"role": m["role"], "content": m["content"]} for m in obs]
            key = prompt_key(messages)
            if key not in seen:
                seen.add(key)
                rows["prompt"].append(messages)
                rows["task_index"].append(index)
                rows["env_id"].append(str(env_id))
            index += 1
    finally:
        e.close()
    return Dataset.from_dict(rows)


def _task_lookup(dataset: Any) -> dict[str, int]:
    """prompt key -> task index, from a dataset with ``prompt`` and ``task_index`` columns."""
    columns = getattr(dataset, "column_names", None) or []
    if "prompt" not in columns or "task_index" not in columns:
        return {}
    lookup: dict[str, int] = {}
    for prompt, index in zip(dataset["prompt"], dataset["task_index"]):
        key = prompt_key(prompt)
        if lookup.setdefault(key, int(index)) != int(index):
            raise ValueError(f"two rows share a prompt but name different tasks ({lookup[key]} and {index}); TRL "
                             "passes rollout_func only the prompt, so the task would be ambiguous "
                             "(make_task_dataset skips such duplicates)")
    return lookup


class EnvRollout:
    """``rollout_func`` for ``trl.GRPOTrainer`` that runs agentgym episodes (see the module docstring).

    Args:
        env: env id (``"Arithmetic-v0"``) or a zero-argument env factory.
        env_kwargs: constructor arguments of the env (must match those of the task dataset).
        dataset: a task dataset (``prompt`` + ``task_index``); by default the trainer's
            ``train_dataset`` and ``eval_dataset`` are indexed on the first call.
        max_new_tokens: per-turn generation budget; ``None`` = the trainer's ``max_completion_length``.
            TRL does not cut rollout_func completions, so an episode's completion (all turns and the
            env tokens between them) can be longer than ``max_completion_length``; bound it with
            ``max_context_tokens``.
        style, max_obs_tokens, max_context_tokens, env_workers, debug_checks: as in
            :class:`~agentgym.rollout.RolloutConfig`.
        seed: base seed of the env resets (each call uses a fresh seed derived from it).
        policy: a :class:`~agentgym.policies.transformers_policy.TransformersPolicy` to sample with
            (keeps its tokenizer and cached stop-string criteria); its ``model`` is set to the
            trainer's unwrapped model on every call. Default: one built around ``trainer.model`` and
            ``trainer.processing_class``.

    Sampling temperature, top-p and top-k are read from the trainer's ``GRPOConfig`` on every call:
    TRL recomputes log-probs with ``logits / args.temperature``, so the episodes must be sampled at
    that temperature for the importance ratio to be 1 on the first update.

    After each call, ``last_trajectories`` holds the episodes and ``records`` gets one entry
    ``{"step", "mode", **summarize(trajectories)}``; ``step`` is the optimizer step the rollout feeds
    (``trainer.state.global_step + 1`` in training).
    """

    def __init__(self, env: Any, *, env_kwargs: Mapping[str, Any] | None = None, dataset: Any = None,
                 max_new_tokens: int | None = None, style: str | None = None, max_obs_tokens: int | None = 512,
                 max_context_tokens: int = 4096, env_workers: int = 8, debug_checks: bool = False, seed: int = 0,
                 policy: Any = None):
        self.env = env
        self.env_kwargs = dict(env_kwargs or {})
        self.max_new_tokens = max_new_tokens
        self.rollout_options = dict(style=style, max_obs_tokens=max_obs_tokens, max_context_tokens=max_context_tokens,
                                    env_workers=env_workers, debug_checks=debug_checks)
        self.seed = seed
        self._lookup: dict[str, int] = _task_lookup(dataset) if dataset is not None else {}
        self._indexed_trainer_datasets = False
        self._policy: Any = policy
        self._engine: RolloutEngine | None = None
        self._calls = 0
        self.last_trajectories: list[Trajectory] = []
        self.records: list[dict[str, Any]] = []

    # ------------------------------------------------------------------ checks and set-up
    @staticmethod
    def check_trainer(trainer: Any) -> None:
        """Refuse GRPOTrainer settings under which TRL would not train what the episodes sampled."""
        args = trainer.args
        problems = []
        if getattr(trainer, "tools", None):
            problems.append("`tools` / `environment_factory` are set: TRL then runs its own tool loop on the "
                            "completions and ignores env_mask")
        if getattr(args, "mask_truncated_completions", False):
            problems.append("`mask_truncated_completions=True` treats every completion whose last token is not EOS as "
                            "truncated and drops its loss; agentgym episodes legitimately end on a stop string "
                            "(e.g. </answer>)")
        if getattr(args, "use_vllm", False):
            problems.append("`use_vllm=True`: this rollout samples with trainer.model through transformers; vLLM "
                            "would only add a weight sync and an importance correction against the same model")
        if getattr(args, "repetition_penalty", 1.0) != 1.0 or getattr(args, "min_p", None) is not None:
            problems.append("`repetition_penalty` / `min_p` are not implemented by the agentgym policy")
        if getattr(args, "generation_kwargs", None):
            problems.append("`generation_kwargs` are not passed to the agentgym policy")
        if problems:
            raise ValueError("EnvRollout cannot honour these GRPOConfig settings:\n- " + "\n- ".join(problems))

    def _sampling(self, trainer: Any) -> SamplingParams:
        args = trainer.args
        return SamplingParams(max_new_tokens=int(self.max_new_tokens or args.max_completion_length),
                              temperature=float(args.temperature), top_p=float(args.top_p or 1.0),
                              top_k=int(args.top_k or 0))

    def _index_trainer_datasets(self, trainer: Any) -> None:
        datasets = [getattr(trainer, "train_dataset", None)]
        ev = getattr(trainer, "eval_dataset", None)
        datasets += list(ev.values()) if isinstance(ev, Mapping) else [ev]
        for ds in datasets:
            if ds is None:
                continue
            for key, index in _task_lookup(ds).items():
                if self._lookup.setdefault(key, index) != index:
                    raise ValueError(f"the same prompt names tasks {self._lookup[key]} and {index} in different datasets")
        self._indexed_trainer_datasets = True

    def task_index(self, prompt: Any, trainer: Any = None) -> int:
        """The task index a prompt stands for."""
        key = prompt_key(prompt)
        if key not in self._lookup and trainer is not None and not self._indexed_trainer_datasets:
            self._index_trainer_datasets(trainer)
        if key not in self._lookup:
            raise KeyError("prompt not found in any task dataset (build the dataset with make_task_dataset, or give "
                           f"rows `prompt` and `task_index` columns): {key[:200]}...")
        return self._lookup[key]

    @contextlib.contextmanager
    def _generation_model(self, trainer: Any):
        """The trainer's model, unwrapped for generation the way TRL's own generate path does it
        (DDP/DeepSpeed unwrapped, ZeRO-3 parameters gathered, gradient checkpointing off, FSDP params
        summoned). ``trainer._dist`` is private TRL API; without it we skip the FSDP summon."""
        from trl.models import unwrap_model_for_generation

        dist = getattr(trainer, "_dist", None)
        summon = dist.summon_full_params(trainer.model_wrapped, recurse=False) if dist is not None else contextlib.nullcontext()
        with unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator,
                                         gather_deepspeed3_params=trainer.args.ds3_gather_for_generation,
                                         gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs) as model, \
                summon:
            yield model

    def _engine_for(self, trainer: Any, model: Any, sampling: SamplingParams) -> RolloutEngine:
        from agentgym.policies.transformers_policy import TransformersPolicy

        if self._policy is None:
            # One policy object for the whole run: it caches the (slow to build) stop-string criteria.
            self._policy = TransformersPolicy(model, trainer.processing_class, name="trl-grpo")
        self._policy.model = model  # the live (possibly re-wrapped) module, every call
        if self._engine is None:
            self._engine = RolloutEngine(self._policy, RolloutConfig(sampling=sampling, **self.rollout_options))
        self._engine.config.sampling = sampling
        return self._engine

    # ------------------------------------------------------------------ the rollout_func
    def __call__(self, prompts: Sequence[Any], trainer: Any) -> dict[str, list[Any]]:
        self.check_trainer(trainer)
        indices = [self.task_index(p, trainer) for p in prompts]
        sampling = self._sampling(trainer)
        seed = (self.seed * 1_000_003 + self._calls * 7_919) % 2**31
        self._calls += 1
        with self._generation_model(trainer) as model:
            engine = self._engine_for(trainer, model, sampling)
            # one episode per prompt entry: TRL's sampler already repeats each prompt num_generations times
            batch = engine.collect(self.env, task_indices=indices, group_size=1, seed=seed, env_kwargs=self.env_kwargs)
        trajs = batch.trajectories
        out: dict[str, list[Any]] = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_mask": [],
                                     "trajectory": [], "env_reward": [], "env_task_index": []}
        for t, asked in zip(trajs, indices):
            p = t.prompt_length
            if len(t.token_ids) == p:
                raise ValueError(f"task {t.task_index}: the prompt ({p} tokens) plus one turn does not fit "
                                 f"max_context_tokens={self.rollout_options['max_context_tokens']}")
            out["prompt_ids"].append(list(t.token_ids[:p]))
            out["completion_ids"].append(list(t.token_ids[p:]))
            out["logprobs"].append(list(t.logprobs[p:]))
            out["env_mask"].append(list(t.loss_mask[p:]))
            out["trajectory"].append(t)
            out["env_reward"].append(t.total_reward)
            # the task the env says it ran (AgentEnv reports it at reset); a bare gym.Env may not
            out["env_task_index"].append(t.task_index if t.task_index is not None else asked)
        self.last_trajectories = trajs
        mode = "train" if trainer.model.training else "eval"
        step = int(trainer.state.global_step) + (1 if mode == "train" else 0)
        self.records.append({"step": step, "mode": mode, **batch.metrics})
        return out

    def close(self) -> None:
        if self._engine is not None:
            self._engine.close()
            self._engine = None


def episode_reward(completions: Sequence[Any], trajectory: Sequence[Trajectory] | None = None,
                   task_index: Sequence[int] | None = None, env_task_index: Sequence[int] | None = None,
                   log_metric: Callable[[str, float], None] | None = None, **_: Any) -> list[float]:
    """TRL reward function: each completion's env episode reward (``Trajectory.total_reward``).

    The per-step rewards of the env are summed; TRL's GRPO then normalises them within each group.
    Checks that every episode ran its dataset row's task (the row's ``task_index`` against the
    rollout's ``env_task_index``), and logs the episode success rate through TRL's ``log_metric``.
    """
    if trajectory is None:
        raise ValueError("episode_reward needs the `trajectory` field that EnvRollout returns; use it with "
                         "GRPOTrainer(rollout_func=EnvRollout(...))")
    if len(trajectory) != len(completions):
        raise ValueError(f"{len(trajectory)} trajectories for {len(completions)} completions")
    if task_index is not None and env_task_index is not None:
        wrong = [(a, b) for a, b in zip(task_index, env_task_index) if int(a) != int(b)]
        if wrong:
            raise AssertionError(f"episodes ran other tasks than their dataset rows name (row, ran): {wrong[:4]}")
    if log_metric is not None:
        log_metric("env/success_rate", sum(bool(t.episode.get("success")) for t in trajectory) / len(trajectory))
        log_metric("env/turns_mean", sum(t.num_turns for t in trajectory) / len(trajectory))
    return [t.total_reward for t in trajectory]


def train_with_trl(env: Any, policy: Any = "smollm2", *, steps: int = 6, num_generations: int = 4,
                   prompts_per_step: int = 4, micro_batch_size: int | None = None,
                   env_kwargs: Mapping[str, Any] | None = None, n_tasks: int | None = None, first_task: int = 0,
                   max_new_tokens: int = 40, max_obs_tokens: int | None = 256, max_context_tokens: int = 2048,
                   style: str | None = None, learning_rate: float = 1e-5, temperature: float = 1.0,
                   beta: float = 0.0, loss_type: str | None = None, seed: int = 0,
                   output_dir: str | Path = "runs/trl-grpo", trl_args: Mapping[str, Any] | None = None,
                   reward_funcs: Sequence[Callable[..., list[float]]] = (), debug_checks: bool = False,
                   trainer_class: Any = None) -> dict[str, Any]:
    """Train ``policy`` on ``env`` with ``trl.GRPOTrainer`` through :class:`EnvRollout` (algorithm ``trl-grpo``).

    Each optimizer step collects ``prompts_per_step`` tasks × ``num_generations`` episodes (one GRPO
    group per task, the same batch shape as ``agentgym train``'s ``groups_per_step`` × ``group_size``)
    and makes one update (``micro_batch_size`` splits it into gradient-accumulation steps). TRL's
    defaults are kept (loss ``dapo``, ``beta`` 0, group-scaled advantages) unless given here or in
    ``trl_args`` (any ``GRPOConfig`` field); on a machine without CUDA it runs in fp32 on the CPU.

    Args:
        env: env id or zero-argument env factory. ``env_kwargs``: its constructor arguments.
        policy: a :class:`~agentgym.policies.transformers_policy.TransformersPolicy` (its ``model`` is
            trained in place), or a model spec for :func:`~agentgym.policies.loading.load_policy` (``"tiny-random"``,
            a model name, a run directory).
        n_tasks: tasks in the dataset (default: a fresh task per group, capped by the env's task count).
        reward_funcs: extra TRL reward functions, added to :func:`episode_reward` (weights 1).
        trainer_class: a ``GRPOTrainer`` subclass to use (tests use one that records the loss inputs).

    Returns:
        ``"history"``: one row per optimizer step, in order: ``"step"`` (1-based), ``"rollout/<k>"`` for
        every metric of :func:`agentgym.rollout.summarize` over that step's episodes (as in ``agentgym
        train``'s history), ``"train/<k>"`` for what TRL logged then (``train/loss`` …), ``"time/step_s"``;
        ``"reward_curve"``: each step's ``rollout/reward_mean``; ``"output_dir"`` (it holds
        ``history.json``); ``"policy"``: the trained :class:`TransformersPolicy`; ``"trainer"``.

    With ``beta`` > 0 (and no PEFT adapter) the KL reference is the policy as given: its weights are
    saved to ``output_dir/reference_model`` for TRL to load (see the comment in the code).
    """
    from trl import GRPOTrainer

    policy = _as_policy(policy, seed)
    args = _grpo_config(output_dir, steps=steps, learning_rate=learning_rate, num_generations=num_generations,
                        prompts_per_step=prompts_per_step, micro_batch_size=micro_batch_size, temperature=temperature,
                        beta=beta, max_new_tokens=max_new_tokens, seed=seed, loss_type=loss_type, trl_args=trl_args)
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    dataset = _task_dataset(env, env_kwargs, n_tasks or steps * prompts_per_step, first_task, seed)
    rollout = EnvRollout(env, env_kwargs=env_kwargs, dataset=dataset, max_new_tokens=max_new_tokens, style=style,
                         max_obs_tokens=max_obs_tokens, max_context_tokens=max_context_tokens,
                         debug_checks=debug_checks, seed=seed, policy=policy)
    step_times: dict[int, float] = {}
    trainer = _grpo_trainer(trainer_class or GRPOTrainer, policy, args, dataset, rollout,
                            [episode_reward, *reward_funcs], step_times, out)
    try:
        trainer.train()
    finally:
        rollout.close()
    policy.model = trainer.accelerator.unwrap_model(trainer.model)
    history = _history(trainer, rollout, step_times)
    _write_history(out / "history.json", history)
    return {"history": history, "reward_curve": [r["rollout/reward_mean"] for r in history], "output_dir": str(out),
            "policy": policy, "trainer": trainer}


def _as_policy(policy: Any, seed: int) -> Any:
    """A policy object as given; a model spec through the one loader, with the backend learners train."""
    if not isinstance(policy, str):
        return policy
    from agentgym.policies.loading import load_policy
    from agentgym.policies.backends import trainable_backend
    return load_policy(policy, trainable_backend(), seed=seed)


def _grpo_config(output_dir: str | Path, *, steps: int, learning_rate: float, num_generations: int,
                 prompts_per_step: int, micro_batch_size: int | None, temperature: float, beta: float,
                 max_new_tokens: int, seed: int, loss_type: str | None, trl_args: Mapping[str, Any] | None) -> Any:
    """TRL's ``GRPOConfig``: one optimizer step per rollout batch of ``prompts_per_step * num_generations``
    episodes, ``micro_batch_size`` per forward pass; fp32 on the CPU without CUDA; ``trl_args`` (any
    ``GRPOConfig`` field) last."""
    from trl import GRPOConfig

    total = prompts_per_step * num_generations
    micro = micro_batch_size or total
    if total % micro:
        raise ValueError(f"micro_batch_size {micro} must divide prompts_per_step * num_generations = {total}")
    cfg: dict[str, Any] = dict(
        output_dir=str(output_dir), max_steps=steps, learning_rate=learning_rate, num_generations=num_generations,
        per_device_train_batch_size=micro, gradient_accumulation_steps=total // micro,
        steps_per_generation=total // micro,      # one rollout batch per optimizer step
        temperature=temperature, beta=beta, max_completion_length=max_new_tokens, seed=seed,
        logging_steps=1, save_strategy="no", report_to="none", gradient_checkpointing=False,
    )
    if loss_type is not None:
        cfg["loss_type"] = loss_type
    if not _cuda():
        cfg.update(bf16=False, use_cpu=True)
    cfg.update(trl_args or {})
    return GRPOConfig(**cfg)


def _write_history(path: Path, history: Sequence[Mapping[str, float]]) -> None:
    finite = lambda v: v if math.isfinite(v) else None  # noqa: E731 - JSON has no NaN
    path.write_text(json.dumps([{k: finite(v) for k, v in r.items()} for r in history], indent=1))

def _cuda() -> bool:
    import torch
    return torch.cuda.is_available()


def _task_dataset(env: Any, env_kwargs: Mapping[str, Any] | None, n: int, first_task: int, seed: int) -> Any:
    """``n`` tasks from ``first_task`` on, capped by the env's task count."""
    probe = _make_env(env, env_kwargs or {})
    available = getattr(probe.unwrapped, "num_tasks", None)
    probe.close()
    if available is not None:
        n = min(n, available - first_task)
    return make_task_dataset(env, n, env_kwargs=env_kwargs, first_task=first_task, seed=seed)


def _grpo_trainer(cls: Any, policy: Any, args: Any, dataset: Any, rollout: Any, reward_funcs: list,
                  step_times: dict[int, float], out: Path) -> Any:
    """The ``GRPOTrainer`` (or subclass ``cls``), timing each optimizer step into ``step_times``."""
    from transformers import TrainerCallback

    class _StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            step_times[int(state.global_step)] = time.perf_counter() - self.t0

    model = policy.model
    name_or_path = getattr(model.config, "_name_or_path", "")
    if args.beta != 0.0 and not hasattr(model, "peft_config"):
        # GRPOTrainer builds the KL reference of a model *instance* by reloading model.config._name_or_path,
        # which is empty for a model built in memory (tiny-random) and holds the original weights, not the
        # ones we start from, for a model trained before. Point it at a copy of the starting weights.
        reference = out / "reference_model"
        model.save_pretrained(reference)
        model.config._name_or_path = str(reference)
    try:
        return cls(model=model, reward_funcs=reward_funcs, args=args, train_dataset=dataset,
                   processing_class=policy.tokenizer, rollout_func=rollout, callbacks=[_StepTimer()])
    finally:
        model.config._name_or_path = name_or_path


def _history(trainer: Any, rollout: Any, step_times: dict[int, float]) -> list[dict[str, float]]:
    """One row per optimizer step: the step's rollout metrics, what TRL logged, and its time."""
    trl_logs: dict[int, dict[str, float]] = {}
    for entry in trainer.state.log_history:
        row = trl_logs.setdefault(int(entry.get("step", 0)), {})
        for k, v in entry.items():
            # skip the end-of-run summary (train_runtime, train_loss, ...) and non-numbers
            if k not in ("step", "epoch") and not k.startswith("train_") and isinstance(v, (int, float)):
                row[f"train/{k}"] = float(v)
    history = []
    for rec in rollout.records:
        if rec["mode"] != "train":
            continue
        s = int(rec["step"])
        row = {"step": float(s), **{f"rollout/{k}": float(v) for k, v in rec.items() if k not in ("step", "mode")},
               **trl_logs.get(s, {})}
        if s in step_times:
            row["time/step_s"] = step_times[s]
        history.append(row)
    return history
