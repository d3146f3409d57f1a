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
task ``group_size`` times (GRPO). The engine reads only what :class:`~agentgym.core.AgentEnv` declares
for it (``stop_strings``, ``cut_after``, ``observation_style``, ``tool_specs()`` after each reset,
``group_reward``, ``num_tasks``), through the wrapper stack (``env.get_wrapper_attr``), so a wrapper can
change them. Progress is reported as one :class:`RolloutProgress` to ``progress(p)``.
"""

from __future__ import annotations

import concurrent.futures as cf
import time
from collections import defaultdict, deque
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import gymnasium as gym
import numpy as np

from agentgym.backend import as_backend, tokenizer_of
from agentgym.formatting import Formatter, make_formatter
from agentgym.policy import Generation
from agentgym.rewards import apply_group_reward
from agentgym.rollout_config import RolloutConfig
from agentgym.rollout_metrics import summarize
from agentgym.threads import recheck as recheck_threads
from agentgym.trajectory import Trajectory
from agentgym.turns import ChatTurns, TokenTurns, _Episode, apply_cut_after, env_attr, reset_with_tools

# RolloutConfig (rollout_config.py), the turns (turns.py) and the metrics (rollout_metrics.py) are
# importable from here too: this is the module users know the engine by.
__all__ = ["RolloutProgress", "RolloutBatch", "RolloutEngine"]


@dataclass
class RolloutBatch:
    trajectories: list[Trajectory]
    metrics: dict[str, float]


def _timed(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, float]:
    """Run an env call (in a worker thread) and return its result with its duration."""
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - t0


@dataclass(frozen=True)
class RolloutProgress:
    """What ``collect(..., progress=fn)`` passes to ``fn`` as episodes end and turns are generated.

    Attributes:
        finished: episodes ended so far in this ``collect`` call.
        total: episodes the call runs.
        tokens: tokens generated so far in this call.
        generating: ``(sequences_done, sequences)`` of the ``generate`` call in flight, after every decode
            step where the backend reports it (``Backend.reports_progress``); ``None`` between calls.
    """
    finished: int
    total: int
    tokens: int = 0
    generating: tuple[int, int] | None = None


class _Run:
    """The state of one ``collect`` call shared by both schedules: what happens when a reset or
    a step returns, generation, finishing, timings and progress. Everything here runs on the
    engine's thread (env calls run in workers; their results are handed in)."""

    def __init__(self, turns: TokenTurns | ChatTurns, episodes: list[_Episode], env_name: str | None,
                 progress: Callable[[RolloutProgress], None] | None):
        self.turns, self.episodes, self.env_name = turns, episodes, env_name
        self.timing: dict[str, float] = defaultdict(float)
        self.finished = 0
        self.tokens = 0
        self.batch_sizes: list[int] = []
        self.last_generate_s: float | None = None
        self._progress = progress
        self._reported = (0, 0)

    def generate(self, eps: Sequence[_Episode]) -> list[Generation]:
        t0 = time.perf_counter()
        live = None
        if self._progress is not None:   # per decode step, where the backend can tell (hf): bars move
            def live(done: int, tokens: int, n: int = len(eps)) -> None:
                self._progress(RolloutProgress(self.finished, len(self.episodes), self.tokens + tokens, (done, n)))
        gens = self.turns.generate(eps, live)
        if self.turns.cut_after:
            gens = [apply_cut_after(g, self.turns.cut_after, tokenizer_of(self.turns.policy)) for g in gens]
        self.last_generate_s = time.perf_counter() - t0
        self.timing["generate_s"] += self.last_generate_s
        if len(gens) != len(eps):
            raise RuntimeError(f"the policy returned {len(gens)} generations for {len(eps)} prompts")
        self.batch_sizes.append(len(eps))
        self.tokens += sum(len(g.token_ids) for g in gens)
        return gens

    def started(self, ep: _Episode, result: tuple[Any, float]) -> bool:
        """The reset returned; True if the episode now waits for its first turn."""
        (obs, info, tools), seconds = result
        self.timing["env_calls_s"] += seconds
        t0 = time.perf_counter()
        ep.task = info.get("privileged", {}).get("task", ep.options.get("task", {}))
        ep.task_index = info.get("task_index")
        self.turns.start(ep, obs, tools)
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
            self._progress(RolloutProgress(self.finished, len(self.episodes), self.tokens))


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
        # an env's ordered cut rule (SearchQA under Search-R1: first </search> anywhere, else first </answer>)
        cut = tuple(env_attr(env, "cut_after", ()) or ())
        return (TokenTurns(self.policy, self.config, sampling, self.formatter_for(env), cut) if self.token_level
                else ChatTurns(self.policy, sampling, cut))

    def num_tasks(self, env: str | Callable[[], gym.Env], env_kwargs: Mapping[str, Any] | None = None) -> int | None:
        """How many tasks ``env`` has (its ``num_tasks``, through the wrappers); None = procedurally unbounded.
        For a caller that draws ``task_indices`` itself (the trainer's difficulty filtering)."""
        return env_attr(self._get_envs(env, 1, dict(env_kwargs or {}))[0], "num_tasks")

    # ------------------------------------------------------------------ collection
    def collect(self, env: str | Callable[[], gym.Env], *, num_groups: int = 1, group_size: int = 1,
                task_indices: Sequence[int] | None = None, tasks: Sequence[Mapping[str, Any]] | None = None,
                seed: int = 0, env_kwargs: Mapping[str, Any] | None = None,
                progress: Callable[[RolloutProgress], None] | None = None) -> RolloutBatch:
        """Run ``num_groups × group_size`` episodes (each group shares one task).

        Tasks: ``tasks`` (explicit task dicts), else ``task_indices``, else indices drawn from
        ``seed``; reset seeds are drawn from ``seed`` too, in episode order, so both modes reset
        every episode the same way. ``progress(p)`` gets a :class:`RolloutProgress` (episodes finished
        and total, tokens generated, the generate call in flight) as episodes end and turns are
        generated. Trajectories come back in episode order (group by group).

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
                result = _timed(reset_with_tools, env, ep.seed, ep.options)
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
                    future = self._pool.submit(_timed, reset_with_tools, ep.env, ep.seed, ep.options)
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
