"""The rollout engine: many episodes at once, batched generation, env steps in a thread pool.

Two schedules produce the same trajectories (``RolloutConfig.mode``):

* ``async`` — episodes advance independently. The engine's loop gathers every episode that is
  waiting for its next turn, calls the policy once on that batch, and hands each reply to a worker
  thread that steps that episode's env; as soon as a step returns, the episode waits for the next
  batch. Env steps (tools, retrieval, sandboxes: slow, I/O-bound) overlap with generation for
  other episodes, so a slow tool holds up only its own episode (continuous batching at the level
  of ``generate`` calls).
* ``lockstep`` — turn by turn: one ``generate`` call for every active episode, then all their env
  steps; the next turn starts when the slowest step has returned. Easy to follow when debugging.

Two policy paths (:class:`TokenTurns`, :class:`ChatTurns`): token-level policies (``generate`` on
token ids, with a tokenizer) yield token-faithful trajectories; chat-level policies (``respond`` on
messages, e.g. an OpenAI-compatible endpoint) yield messages and rewards only. Groups repeat one
task ``group_size`` times (GRPO). Env settings (``stop_strings``, ``observation_style``,
``tool_specs``, ``num_tasks``) are read through the wrapper stack (``env.get_wrapper_attr``), so a
wrapper can change them.
"""

from __future__ import annotations

import concurrent.futures as cf
import inspect
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import gymnasium as gym
import numpy as np

from agentgym.formatting import Formatter, make_formatter
from agentgym.backend import as_backend, tokenizer_of
from agentgym.policy import Generation, SamplingParams, cut_at_stop
from agentgym.rewards import apply_group_reward
from agentgym.threads import recheck as recheck_threads
from agentgym.trajectory import Trajectory, TrajectoryBuilder, check_trajectory

__all__ = ["RolloutConfig", "RolloutViews", "ROLLOUT_ALIASES", "RolloutBatch", "RolloutEngine", "TokenTurns", "ChatTurns",
           "env_attr", "summarize", "summarize_std", "episode_values"]

ROLLOUT_MODES = ("async", "lockstep")


@dataclass
class RolloutConfig:
    """Settings of the rollout engine — the one place sampling and token layout live.

    ``TrainConfig.rollout``, ``EvalRunConfig.rollout``, the SFT / DPO data collection (``rollout``) and
    ``agentgym compare`` all nest this class; nothing else stores a temperature. Learners read the
    temperature from the trajectories (``Trajectory.temperature``), so the log-probs they recompute are
    always at the temperature the episodes were sampled at.

    Attributes:
        sampling: sampling parameters; the env's ``stop_strings`` are added to ``sampling.stop``.
        style: ``chat`` or ``continuation``; ``None`` = the env's ``observation_style``.
        max_obs_tokens: per-step observation budget (longer observations are cut, visibly); the task
            prompt (the reset observation) is not cut.
        max_context_tokens: an episode whose next turn would not fit ends as truncated.
        env_workers: threads stepping envs concurrently.
        debug_checks: assert the token-faithfulness invariants after every episode.
        mode: ``async`` (default) or ``lockstep`` — see the module docstring. Async is the default
            because, measured (``benchmarks/rollout_async.py``, RESULTS.md), it gives the lockstep's
            trajectories for deterministic policies (greedy, scripted; every row of the benchmark) and
            is not slower: when ``generate`` dominates (HF on a CPU) it forms the lockstep's batches
            exactly, so the work is the same; when env steps dominate (sandbox runs on CodeExec) a slow
            step holds up only its own episode (1.5-1.7x faster there). Greedy log-probs agree to
            float rounding (an episode may share a padded batch with other episodes than in
            lockstep). *Sampling* with ``sampling.seed`` replays exactly in lockstep mode (the seed
            applies per ``generate`` call, and the calls are the same every run). In async mode it
            replays whenever the env steps return within the batching window (then the batches are
            the lockstep's; always so on a one-turn env with every episode running at once);
            when they don't, the composition of a batch depends on timing, and so do the sampled
            tokens — every episode is still a correct sample from the policy, but not the same one
            run to run. Use ``lockstep`` to debug or to replay.
        max_concurrent_episodes: at most this many episodes run at once (each holds an env and, on
            an inference engine, KV cache); ``None`` = every episode of a ``collect`` call. Async
            starts the next episode as soon as one ends; lockstep runs waves of this size.
        batch_wait_s: async only — how long episodes that are ready to generate wait for env calls
            still in flight to join their batch (counted from when each call was submitted). ``None``
            (default) = adaptive: half the duration of the last ``generate`` call, at least 10 ms;
            the first batch of a ``collect`` waits for every reset. Waiting costs at most that
            fraction of a generate call, while splitting a batch costs a whole extra call, so fast
            env steps always join (the lockstep's batches) and only slow ones are left for the next
            batch. ``0`` = never wait (pure continuous batching).
        env_backend: ``thread`` (envs in this process, stepped by a thread pool) or ``ray`` (each env
            in a Ray actor, see :mod:`agentgym.ray_envs`; same trajectories for the same seeds).
        on_template_drift: a chat template that rewrites earlier turns (thinking models dropping old
            ``<think>`` blocks): ``keep`` the sampled history verbatim (trains exactly what was sampled;
            counted and logged once) or ``error`` (see :mod:`agentgym.formatting`).
        env_resources: Ray resource requests of each env actor (e.g. ``{"num_cpus": 1}``); None = none.
        ray_address: an existing Ray cluster (``HEAD:6379``); None = a local one (started on demand).
    """
    sampling: SamplingParams = field(default_factory=SamplingParams)
    style: str | None = None
    max_obs_tokens: int | None = 512
    max_context_tokens: int = 4096
    env_workers: int = 8
    debug_checks: bool = False
    mode: str = "async"
    max_concurrent_episodes: int | None = None
    batch_wait_s: float | None = None
    on_template_drift: str = "keep"
    env_backend: str = "thread"
    env_resources: dict[str, Any] | None = None
    ray_address: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.sampling, Mapping):
            self.sampling = SamplingParams(**self.sampling)
        if self.style not in (None, "chat", "continuation"):
            raise ValueError(f"style must be chat, continuation or null (the env's), got {self.style!r}")
        if self.max_obs_tokens is not None and self.max_obs_tokens < 1:
            raise ValueError(f"max_obs_tokens must be >= 1 or null (no cut), got {self.max_obs_tokens}")
        if self.max_context_tokens < 2:
            raise ValueError(f"max_context_tokens must be >= 2, got {self.max_context_tokens}")
        if self.env_workers < 1:
            raise ValueError(f"env_workers must be >= 1, got {self.env_workers}")
        if self.mode not in ROLLOUT_MODES:
            raise ValueError(f"mode must be one of {ROLLOUT_MODES}, got {self.mode!r}")
        if self.max_concurrent_episodes is not None and self.max_concurrent_episodes < 1:
            raise ValueError(f"max_concurrent_episodes must be >= 1 or null (all at once), got {self.max_concurrent_episodes}")
        if self.on_template_drift not in ("keep", "error", "segment"):
            raise ValueError(f"on_template_drift must be keep or error, got {self.on_template_drift!r}")
        if self.env_backend not in ("thread", "ray"):
            raise ValueError(f"env_backend must be thread or ray, got {self.env_backend!r}")
        if self.batch_wait_s is not None and not self.batch_wait_s >= 0:
            raise ValueError(f"batch_wait_s must be >= 0 or null (adaptive), got {self.batch_wait_s}")

    def replace(self, **changes: Any) -> "RolloutConfig":
        from dataclasses import replace
        return replace(self, **changes)

    def greedy(self) -> "RolloutConfig":
        """The same layout, greedy decoding (evaluations)."""
        return self.replace(sampling=self.sampling.replace(greedy=True))


#: Short spellings of the rollout settings, accepted by every config that nests a ``RolloutConfig``
#: as ``rollout`` (``sampling.temperature=0.7`` means ``rollout.sampling.temperature=0.7``).
ROLLOUT_ALIASES = {"sampling": "rollout.sampling", "style": "rollout.style",
                   "max_obs_tokens": "rollout.max_obs_tokens", "max_context_tokens": "rollout.max_context_tokens",
                   "debug_checks": "rollout.debug_checks", "env_workers": "rollout.env_workers",
                   "max_concurrent_episodes": "rollout.max_concurrent_episodes"}


class RolloutViews:
    """Read-only views of a config's nested ``rollout`` under the short names users type
    (``cfg.sampling``, ``cfg.style``, …). Views, not copies: the values live in ``cfg.rollout`` only."""
    rollout: RolloutConfig

    @property
    def sampling(self) -> SamplingParams:
        return self.rollout.sampling

    @property
    def style(self) -> str | None:
        return self.rollout.style

    @property
    def max_obs_tokens(self) -> int | None:
        return self.rollout.max_obs_tokens

    @property
    def max_context_tokens(self) -> int:
        return self.rollout.max_context_tokens

    @property
    def debug_checks(self) -> bool:
        return self.rollout.debug_checks


@dataclass
class RolloutBatch:
    trajectories: list[Trajectory]
    metrics: dict[str, float]


#: Episode-summary keys every env reports; the others (numeric ones) become ``episode/<key>`` metrics.
_STANDARD_EPISODE_KEYS = frozenset({"success", "return", "turns", "terminated", "truncated", "tool_calls",
                                    "invalid_actions", "task_index"})


def episode_values(trajectories: Sequence[Trajectory]) -> dict[str, list[float]]:
    """Each per-episode metric's values, named as :func:`summarize` names their mean.

    One place defines what an episode contributes (success, return, each reward term's total, the
    env's own numeric episode metrics such as ToolCall's ``tool_selection_accuracy``), so means
    and spreads (:func:`summarize_std`) are always computed over the same numbers. Reward terms
    missing from an episode count as 0; ``episode/<key>`` lists hold only the episodes reporting it.
    """
    trajs = list(trajectories)
    values: dict[str, list[float]] = {
        "success_rate": [float(bool(t.episode.get("success"))) for t in trajs],
        "reward_mean": [t.total_reward for t in trajs],
        "turns_mean": [float(t.num_turns) for t in trajs],
        "tool_calls_mean": [float(t.episode.get("tool_calls", 0)) for t in trajs],
        "invalid_actions_mean": [float(t.episode.get("invalid_actions", 0)) for t in trajs],
        "truncated_rate": [float(t.truncated) for t in trajs],
        "response_tokens_mean": [float(t.num_policy_tokens) for t in trajs],
    }
    term_names = {k for t in trajs for step in t.reward_terms for k in step}
    for t in trajs:
        totals: dict[str, float] = defaultdict(float)
        for step in t.reward_terms:
            for k, v in step.items():
                totals[k] += v
        for k in term_names:
            values.setdefault(f"reward/{k}", []).append(totals.get(k, 0.0))
    extra: dict[str, list[float]] = defaultdict(list)
    for t in trajs:
        for k, v in t.episode.items():
            if k not in _STANDARD_EPISODE_KEYS and isinstance(v, (int, float, bool, np.number)):
                extra[k].append(float(v))
    for k, vals in sorted(extra.items()):
        values[f"episode/{k}"] = vals
    return values


def summarize(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Batch metrics: success, reward and each reward term, turns, tool calls, tokens, mask coverage."""
    if not trajectories:
        return {}
    values = episode_values(trajectories)
    m: dict[str, float] = {"episodes": float(len(trajectories))}
    for k in ("success_rate", "reward_mean"):
        m[k] = float(np.mean(values[k]))
    m["reward_std"] = float(np.std(values["reward_mean"]))
    for k in ("turns_mean", "tool_calls_mean", "invalid_actions_mean", "truncated_rate"):
        m[k] = float(np.mean(values[k]))
    m["generated_tokens"] = float(sum(values["response_tokens_mean"]))
    m["response_tokens_mean"] = float(np.mean(values["response_tokens_mean"]))
    total_after_prompt = sum(len(t.token_ids) - t.prompt_length for t in trajectories)
    # masked-token coverage: share of the non-prompt tokens that are environment tokens (loss_mask 0)
    m["masked_token_fraction"] = float(1 - m["generated_tokens"] / total_after_prompt) if total_after_prompt else 0.0
    # each reward term, then the env's own episode metrics (averaged over the episodes reporting them)
    for k, vals in values.items():
        if k.startswith(("reward/", "episode/")):
            m[k] = float(np.mean(vals))
    return m


def summarize_std(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Population std over episodes of every per-episode metric, keyed like :func:`summarize`'s means
    (``success_rate`` → spread of the success indicator). Aggregates (``episodes``,
    ``generated_tokens``, ``masked_token_fraction``) have no spread and are absent."""
    if not trajectories:
        return {}
    return {k: float(np.std(v)) for k, v in episode_values(trajectories).items()}


# ============================================================================ env settings

def env_attr(env: gym.Env, name: str, default: Any = None) -> Any:
    """``env.get_wrapper_attr(name)`` — the outermost wrapper defining ``name`` wins, as in
    Gymnasium — or ``default`` when no layer defines it."""
    try:
        return env.get_wrapper_attr(name)
    except AttributeError:
        return default


def _env_tools(env: gym.Env) -> list[dict[str, Any]] | None:
    tool_specs = env_attr(env, "tool_specs")
    return tool_specs() if callable(tool_specs) else None


# ============================================================================ episodes and the two policy paths

class _Episode:
    """One planned episode (its task options and reset seed) and, once started, its state."""

    def __init__(self, index: int, group_id: int | None, options: dict[str, Any], seed: int):
        self.index, self.group_id, self.options, self.seed = index, group_id, options, seed
        self.env: gym.Env | None = None
        self.task: Mapping[str, Any] = {}
        self.task_index: int | None = None
        self.turn = 0
        self.done = False
        self.traj: Trajectory | None = None
        self.messages: list[dict[str, str]] = []
        self.builder: TrajectoryBuilder | None = None                # token path
        self.reward_log: list[tuple[float, dict[str, float]]] = []   # chat path
        self.finish_reasons: list[str] = []                          # chat path


class TokenTurns:
    """The token-level path: a policy with ``generate(prompts, sampling)`` and a tokenizer.

    The formatter turns messages into ids append-only and the policy's ids are kept exactly as
    sampled, so trajectories are token-faithful; an episode whose next turn would not fit
    ``max_context_tokens`` ends as truncated before it is generated.
    """

    def __init__(self, policy: Any, config: RolloutConfig, sampling: SamplingParams, formatter: Formatter,
                 tools: list[dict[str, Any]] | None):
        self.policy, self.config, self.sampling, self.formatter, self.tools = policy, config, sampling, formatter, tools
        self.wants_context = as_backend(policy).needs_context
        self.live_progress = _accepts(policy.generate, "on_progress")

    def start(self, ep: _Episode, obs: list[dict[str, str]]) -> None:
        # the task prompt is never cut (max_context_tokens bounds it); only step observations are
        ep.builder = TrajectoryBuilder(self.formatter.prompt_ids(obs, self.tools), obs)
        ep.messages = [dict(m) for m in obs]

    def fits(self, ep: _Episode) -> bool:
        return len(ep.builder) + self.sampling.max_new_tokens <= self.config.max_context_tokens

    def generate(self, eps: Sequence[_Episode], on_progress: Callable[[int, int], None] | None = None) -> list[Generation]:
        # copies: a policy (or a script keeping its context) must not alias the growing trajectory
        prompts = [list(ep.builder.token_ids) for ep in eps]
        extra: dict[str, Any] = {"on_progress": on_progress} if on_progress is not None and self.live_progress else {}
        if self.wants_context:
            contexts = [{"turn": ep.turn, "messages": list(ep.messages), "task": ep.task, "prompt_ids": p}
                        for ep, p in zip(eps, prompts)]
            return self.policy.generate(prompts, self.sampling, contexts=contexts, **extra)
        return self.policy.generate(prompts, self.sampling, **extra)

    def add_turn(self, ep: _Episode, gen: Generation, reward: float, info: Mapping[str, Any]) -> None:
        ep.turn += 1
        ep.messages.append({"role": "assistant", "content": gen.text})
        ep.builder.add_policy(gen.token_ids, gen.logprobs, gen.text, gen.finish_reason)
        ep.builder.add_step(reward, info.get("reward_terms", {}))

    def add_observation(self, ep: _Episode, gen: Generation, obs: list[dict[str, str]]) -> None:
        obs, _ = self.formatter.truncate(obs)
        ep.builder.add_env(self.formatter.observation_ids(gen.token_ids, obs, self.tools, history=ep.builder), obs)
        ep.messages.extend(dict(m) for m in obs)

    def build(self, ep: _Episode, summary: dict[str, Any], terminated: bool, truncated: bool,
              env_name: str | None) -> Trajectory:
        return ep.builder.build(episode=summary, terminated=terminated, truncated=truncated, group_id=ep.group_id,
                                task_index=ep.task_index, env_id=env_name,
                                temperature=self.sampling.logprob_temperature)

    def check(self, trajectories: Sequence[Trajectory]) -> None:
        for t in trajectories:
            problems = check_trajectory(t, self.formatter.tokenizer)
            if problems:
                raise AssertionError("trajectory invariants violated: " + "; ".join(problems))


class ChatTurns:
    """The chat-level path: a policy with ``respond(conversations, sampling, tools=...)`` (e.g. a
    hosted model). Trajectories hold messages, actions and rewards but no token data."""

    def __init__(self, policy: Any, sampling: SamplingParams, tools: list[dict[str, Any]] | None):
        self.policy, self.sampling, self.tools = policy, sampling, tools

    def start(self, ep: _Episode, obs: list[dict[str, str]]) -> None:
        ep.messages = [dict(m) for m in obs]

    def fits(self, ep: _Episode) -> bool:
        return True  # the endpoint enforces its own context window

    def generate(self, eps: Sequence[_Episode], on_progress: Callable[[int, int], None] | None = None) -> list[Generation]:
        return self.policy.respond([list(ep.messages) for ep in eps], self.sampling, tools=self.tools)

    def add_turn(self, ep: _Episode, gen: Generation, reward: float, info: Mapping[str, Any]) -> None:
        ep.turn += 1
        ep.messages.append({"role": "assistant", "content": gen.text})
        ep.reward_log.append((reward, info.get("reward_terms", {})))
        ep.finish_reasons.append(gen.finish_reason)

    def add_observation(self, ep: _Episode, gen: Generation, obs: list[dict[str, str]]) -> None:
        ep.messages.extend(dict(m) for m in obs)

    def build(self, ep: _Episode, summary: dict[str, Any], terminated: bool, truncated: bool,
              env_name: str | None) -> Trajectory:
        actions = [m["content"] for m in ep.messages if m["role"] == "assistant"]
        return Trajectory([], [], [], 0, [], actions, list(ep.finish_reasons),
                          [r for r, _ in ep.reward_log], [t for _, t in ep.reward_log], list(ep.messages), summary,
                          terminated, truncated, ep.group_id, ep.task_index, env_name)

    def check(self, trajectories: Sequence[Trajectory]) -> None:
        pass  # no token data to check


def _cut_after(gen: Generation, order: Sequence[str], tokenizer: Any) -> Generation:
    """Issue 26: an env's ``cut_after`` strings, in priority order: the first one present anywhere in the
    reply cuts it just after its first occurrence (tokens as sampled, up to the one completing it)."""
    for s in order:
        if s not in gen.text:
            continue
        if not gen.token_ids or tokenizer is None:   # a chat-level policy: text only
            text = gen.text[:gen.text.index(s) + len(s)]
            return gen if text == gen.text else Generation([], [], text, "stop", dict(gen.meta))
        decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
        end, _ = cut_at_stop(gen.token_ids, decode, [s])
        if end == len(gen.token_ids):
            return gen
        ids = list(gen.token_ids[:end])
        return Generation(ids, list(gen.logprobs[:end]), decode(ids), "stop", dict(gen.meta))
    return gen


def _timed(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, float]:
    """Run an env call (in a worker thread) and return its result with its duration."""
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - t0


def _accepts(fn: Callable[..., Any], name: str) -> bool:
    """Whether ``fn`` takes a keyword ``name`` (or ``**kwargs``): optional extras reach only callees that
    declared them, so existing callbacks and user policies keep working unchanged."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def _progress_reporter(progress: Callable[..., None] | None) -> Callable[..., None] | None:
    """``progress(finished, total)``; with ``tokens=generated`` when the callback accepts a ``tokens``
    keyword, and ``generating=(sequences_done, sequences)`` of the generate call in flight (after every
    decode step, where the backend reports it) when it accepts ``generating``."""
    if progress is None:
        return None
    tokens, generating = _accepts(progress, "tokens"), _accepts(progress, "generating")

    def report(finished: int, total: int, n_tokens: int, live: tuple[int, int] | None = None) -> None:
        extra: dict[str, Any] = {"tokens": n_tokens} if tokens else {}
        if generating:
            extra["generating"] = live
        progress(finished, total, **extra)
    return report


class _Run:
    """The state of one ``collect`` call shared by both schedules: what happens when a reset or
    a step returns, generation, finishing, timings and progress. Everything here runs on the
    engine's thread (env calls run in workers; their results are handed in)."""

    def __init__(self, turns: TokenTurns | ChatTurns, episodes: list[_Episode], env_name: str | None,
                 progress: Callable[..., None] | None):
        self.turns, self.episodes, self.env_name = turns, episodes, env_name
        self.timing: dict[str, float] = defaultdict(float)
        self.finished = 0
        self.tokens = 0
        self.batch_sizes: list[int] = []
        self.last_generate_s: float | None = None
        self._progress = _progress_reporter(progress)
        self._reported = (0, 0)

    def generate(self, eps: Sequence[_Episode]) -> list[Generation]:
        t0 = time.perf_counter()
        live = None
        if self._progress is not None:   # per decode step, where the backend can tell (hf): bars move
            def live(done: int, tokens: int, n: int = len(eps)) -> None:
                self._progress(self.finished, len(self.episodes), self.tokens + tokens, (done, n))
        gens = self.turns.generate(eps, live)
        if getattr(self.turns, "cut_after", ()):
            gens = [_cut_after(g, self.turns.cut_after, tokenizer_of(self.turns.policy)) for g in gens]
        self.last_generate_s = time.perf_counter() - t0
        self.timing["generate_s"] += self.last_generate_s
        if len(gens) != len(eps):
            raise RuntimeError(f"the policy returned {len(gens)} generations for {len(eps)} prompts")
        self.batch_sizes.append(len(eps))
        self.tokens += sum(len(g.token_ids) for g in gens)
        return gens

    def started(self, ep: _Episode, result: tuple[Any, float]) -> bool:
        """The reset returned; True if the episode now waits for its first turn."""
        (obs, info), seconds = result
        self.timing["env_calls_s"] += seconds
        t0 = time.perf_counter()
        ep.task = info.get("privileged", {}).get("task", ep.options.get("task", {}))
        ep.task_index = info.get("task_index")
        self.turns.start(ep, obs)
        self.timing["format_s"] += time.perf_counter() - t0
        return self._next_turn_fits(ep)

    def stepped(self, ep: _Episode, gen: Generation, result: tuple[Any, float]) -> bool:
        """The step on ``gen`` returned; True if the episode now waits for its next turn."""
        (obs, reward, terminated, truncated, info), seconds = result
        self.timing["env_calls_s"] += seconds
        t0 = time.perf_counter()
        try:
            self.turns.add_turn(ep, gen, reward, info)
            if terminated or truncated:
                self.finish(ep, terminated, truncated, info=info)
                return False
            self.turns.add_observation(ep, gen, obs)
        finally:
            self.timing["format_s"] += time.perf_counter() - t0
        return self._next_turn_fits(ep)

    def _next_turn_fits(self, ep: _Episode) -> bool:
        if self.turns.fits(ep):
            return True
        self.finish(ep, terminated=False, truncated=True, reason="context_limit")
        return False

    def finish(self, ep: _Episode, terminated: bool, truncated: bool, info: Mapping[str, Any] | None = None,
               reason: str | None = None) -> None:
        ep.done = True
        summary = dict((info or {}).get("episode_summary", {}))
        if reason is not None:
            summary.setdefault("success", False)
            summary["end_reason"] = reason
            summary.setdefault("turns", ep.turn)
        ep.traj = self.turns.build(ep, summary, terminated, truncated, self.env_name)
        self.finished += 1

    def report(self) -> None:
        recheck_threads()   # between turn batches: torch threads follow the load (agentgym.threads)
        state = (self.finished, self.tokens)
        if self._progress is not None and state != self._reported:
            self._reported = state
            self._progress(self.finished, len(self.episodes), self.tokens)


# ============================================================================ the engine

class RolloutEngine:
    """Collects trajectories from an env id (or env factory) with a token-level or chat-level policy.

    A policy with ``generate`` and a tokenizer yields token-faithful trajectories
    (:class:`TokenTurns`); a chat-only policy (``respond``, e.g. a hosted model) yields trajectories
    with messages and rewards but no token data (:class:`ChatTurns`). ``config.mode`` picks the
    schedule (async or lockstep); both give the same trajectories for a deterministic policy.
    """

    def __init__(self, policy: Any, config: RolloutConfig | None = None):
        self.policy = policy
        self.config = config or RolloutConfig()
        #: the policy seen through the typed backend interface (a protocol-only object is wrapped)
        self.backend = as_backend(policy)
        self.tokenizer = tokenizer_of(self.backend)
        self.token_level = self.backend.token_level and self.tokenizer is not None
        if not self.token_level and not self.backend.answers_chat:
            raise TypeError("the policy needs generate(prompts, sampling) with a tokenizer, or respond(conversations, sampling)")
        self._envs: dict[Any, list[gym.Env]] = {}
        self._pool = cf.ThreadPoolExecutor(max_workers=max(1, self.config.env_workers), thread_name_prefix="agentgym-env")

    # ------------------------------------------------------------------ envs
    def _get_envs(self, env: str | Callable[[], gym.Env], n: int, env_kwargs: Mapping[str, Any]) -> list[gym.Env]:
        key = (env, tuple(sorted((k, repr(v)) for k, v in env_kwargs.items())))
        pool = self._envs.setdefault(key, [])
        if self.config.env_backend == "ray" and len(pool) < n:
            from agentgym.ray_envs import make_ray_envs
            pool.extend(make_ray_envs(env, n - len(pool), env_kwargs, address=self.config.ray_address,
                                      resources=self.config.env_resources))
        while len(pool) < n:
            if callable(env):
                pool.append(env())
            else:
                from agentgym.registry import make
                pool.append(make(env, **env_kwargs))
        return pool[:n]

    def close(self) -> None:
        for envs in self._envs.values():
            for e in envs:
                e.close()
        self._envs.clear()
        self._pool.shutdown(wait=False)

    def formatter_for(self, env: gym.Env) -> Formatter:
        style = self.config.style or env_attr(env, "observation_style", "chat")
        return make_formatter(style, self.tokenizer, max_obs_tokens=self.config.max_obs_tokens,
                              on_template_drift=self.config.on_template_drift)

    def turns_for(self, env: gym.Env) -> TokenTurns | ChatTurns:
        """The policy path for episodes of ``env``, with the env's stop strings and tools (read
        through its wrappers) merged into the configured sampling."""
        stop = tuple(dict.fromkeys(tuple(self.config.sampling.stop) + tuple(env_attr(env, "stop_strings", ()) or ())))
        sampling = self.config.sampling.replace(stop=stop)
        tools = _env_tools(env)
        turns = (TokenTurns(self.policy, self.config, sampling, self.formatter_for(env), tools) if self.token_level
                 else ChatTurns(self.policy, sampling, tools))
        # an env's ordered cut rule (SearchQA under Search-R1: first </search> anywhere, else first </answer>)
        turns.cut_after = tuple(env_attr(env, "cut_after", ()) or ())
        return turns

    # ------------------------------------------------------------------ collection
    def collect(self, env: str | Callable[[], gym.Env], *, num_groups: int = 1, group_size: int = 1,
                task_indices: Sequence[int] | None = None, tasks: Sequence[Mapping[str, Any]] | None = None,
                seed: int = 0, env_kwargs: Mapping[str, Any] | None = None,
                progress: Callable[..., None] | None = None) -> RolloutBatch:
        """Run ``num_groups × group_size`` episodes (each group shares one task).

        Tasks: ``tasks`` (explicit task dicts), else ``task_indices``, else indices drawn from
        ``seed``; reset seeds are drawn from ``seed`` too, in episode order, so both modes reset
        every episode the same way. ``progress(finished, total)`` is called as episodes end and
        turns are generated; a callback that accepts a ``tokens`` keyword also gets the number of
        tokens generated so far. Trajectories come back in episode order (group by group).

        Metrics: :func:`summarize`, plus ``time/generate_s`` (inside ``generate``), ``time/env_s``
        (the engine waiting for env calls with nothing to generate), ``time/format_s``,
        ``time/env_calls_s`` (env calls' durations summed over worker threads: above the wall
        time when they overlap), ``time/wall_s``, ``rollout/generate_calls`` and
        ``rollout/batch_size_mean``.
        """
        t_start = time.perf_counter()
        if tasks is not None:
            num_groups = len(tasks)
        elif task_indices is not None:
            num_groups = len(task_indices)
        n = num_groups * group_size
        limit = min(n, self.config.max_concurrent_episodes or n)
        envs = self._get_envs(env, max(1, limit), dict(env_kwargs or {}))
        episodes = self._plan(num_groups, group_size, tasks, task_indices, seed, env_attr(envs[0], "num_tasks"))
        env_name = env if isinstance(env, str) else getattr(env, "__name__", None)
        run = _Run(self.turns_for(envs[0]), episodes, env_name, progress)
        if n:
            schedule = self._run_async if self.config.mode == "async" else self._run_lockstep
            schedule(run, envs)
        # every episode has ended: per-sequence caches (hf KV reuse) are dead weight
        self.backend.clear_kv_cache()

        trajs = [ep.traj for ep in episodes]
        group_reward = env_attr(envs[0], "group_reward")
        if group_reward is not None and all(t is not None for t in trajs):
            for start in range(0, n, group_size):   # episodes come group by group
                apply_group_reward(trajs[start:start + group_size], group_reward)
        if self.config.debug_checks:
            run.turns.check(trajs)
        metrics = summarize(trajs)
        wall = time.perf_counter() - t_start
        for k in ("generate_s", "env_s", "format_s", "env_calls_s"):
            metrics[f"time/{k}"] = run.timing[k]
        metrics["time/wall_s"] = wall
        metrics["time/outside_generate_frac"] = float(1 - run.timing["generate_s"] / wall) if wall else 0.0
        metrics["rollout/generate_calls"] = float(len(run.batch_sizes))
        metrics["rollout/batch_size_mean"] = float(np.mean(run.batch_sizes)) if run.batch_sizes else 0.0
        return RolloutBatch(trajs, metrics)

    @staticmethod
    def _plan(num_groups: int, group_size: int, tasks: Sequence[Mapping[str, Any]] | None,
              task_indices: Sequence[int] | None, seed: int, num_tasks: int | None) -> list[_Episode]:
        """Every episode's task options and reset seed, drawn from ``seed`` in episode order."""
        rng = np.random.default_rng(seed)
        episodes = []
        for g in range(num_groups):
            if tasks is not None:
                options: dict[str, Any] = {"task": dict(tasks[g])}
            else:
                idx = int(task_indices[g]) if task_indices is not None else int(rng.integers(num_tasks or 2**31 - 1))
                options = {"task_index": idx}
            for _ in range(group_size):
                episodes.append(_Episode(len(episodes), g if group_size > 1 else None, options,
                                         int(rng.integers(2**31))))
        return episodes

    # ------------------------------------------------------------------ schedules
    def _run_lockstep(self, run: _Run, envs: list[gym.Env]) -> None:
        """Turn by turn, in waves of ``len(envs)`` episodes: one ``generate`` call for every active
        episode, then all their env steps in the thread pool; finished episodes drop out."""
        for start in range(0, len(run.episodes), len(envs)):
            active = []
            for ep, env in zip(run.episodes[start:start + len(envs)], envs):
                ep.env = env
                t0 = time.perf_counter()
                result = _timed(env.reset, seed=ep.seed, options=ep.options)
                run.timing["env_s"] += time.perf_counter() - t0
                if run.started(ep, result):
                    active.append(ep)
            run.report()
            while active:
                gens = run.generate(active)
                t0 = time.perf_counter()
                results = list(self._pool.map(lambda pair: _timed(pair[0].env.step, pair[1].text), zip(active, gens)))
                run.timing["env_s"] += time.perf_counter() - t0
                active = [ep for ep, gen, result in zip(active, gens, results) if run.stepped(ep, gen, result)]
                run.report()

    def _batch_wait(self, run: _Run) -> float:
        """How long ready episodes wait for env calls in flight (see ``RolloutConfig.batch_wait_s``)."""
        if run.last_generate_s is None:
            return float("inf")  # the first batch: every reset joins it
        if self.config.batch_wait_s is not None:
            return self.config.batch_wait_s
        return max(0.01, 0.5 * run.last_generate_s)

    def _run_async(self, run: _Run, envs: list[gym.Env]) -> None:
        """Continuous batching: episodes advance independently (module docstring).

        The loop, on the engine's thread: start episodes while envs are free (at most
        ``len(envs)`` at once); take in every env call that has returned; if episodes are ready
        and no recent env call is still running, generate for all of them in one call and submit
        their steps; otherwise wait for the next env call to return. Batches are ordered by
        episode index, so when every step is fast they are exactly the lockstep's batches.
        """
        waiting = deque(run.episodes)                     # not started yet, in order
        free = list(envs)
        ready: list[_Episode] = []                        # waiting for their next turn
        in_flight: dict[cf.Future, tuple[_Episode, Generation | None, float]] = {}  # resets (None) and steps

        try:
            while waiting or ready or in_flight:
                while waiting and free:
                    ep = waiting.popleft()
                    ep.env = free.pop(0)
                    future = self._pool.submit(_timed, ep.env.reset, seed=ep.seed, options=ep.options)
                    in_flight[future] = (ep, None, time.perf_counter())

                for future in [f for f in in_flight if f.done()]:
                    ep, gen, _ = in_flight.pop(future)
                    result = future.result()
                    if run.started(ep, result) if gen is None else run.stepped(ep, gen, result):
                        ready.append(ep)
                    else:
                        free.append(ep.env)
                run.report()
                if waiting and free:
                    continue  # start the next episodes first: their resets may join this batch

                timeout = None
                if ready:
                    now = time.perf_counter()
                    wait = self._batch_wait(run)
                    recent = [t for _, _, t in in_flight.values() if now - t < wait]
                    if not recent:
                        batch, ready = sorted(ready, key=lambda e: e.index), []
                        for ep, gen in zip(batch, run.generate(batch)):
                            future = self._pool.submit(_timed, ep.env.step, gen.text)
                            in_flight[future] = (ep, gen, time.perf_counter())
                        run.report()
                        continue
                    timeout = min(recent) + wait - now if wait != float("inf") else None
                if in_flight:
                    t0 = time.perf_counter()
                    cf.wait(list(in_flight), timeout=timeout, return_when=cf.FIRST_COMPLETED)
                    run.timing["env_s"] += time.perf_counter() - t0
        except BaseException:
            cf.wait(list(in_flight))  # env calls still running end before their envs are reused
            raise
