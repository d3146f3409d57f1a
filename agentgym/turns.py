"""One episode's turns, on each of the two policy paths the rollout engine knows.

:class:`TokenTurns`: a token-level policy (``generate`` on token ids, with a tokenizer) gives
token-faithful trajectories (the formatter appends, the sampled ids are kept as sampled).
:class:`ChatTurns`: a chat-level policy (``respond`` on messages, e.g. an OpenAI-compatible
endpoint) gives messages and rewards only. What the engine reads of an env is declared on
:class:`~agentgym.core.AgentEnv` (``stop_strings``, ``cut_after``, ``observation_style``, ``tool_specs()``,
``group_reward``, ``num_tasks``), read through the wrapper stack with :func:`env_attr`, so a wrapper can
change them; ``tool_specs()`` is read after every reset, so an env whose tools differ per task (BFCL) is
rendered with each task's own tools.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import gymnasium as gym

from agentgym.backend import as_backend
from agentgym.formatting import Formatter
from agentgym.policy import Generation, SamplingParams, cut_at_stop
from agentgym.trajectory import Trajectory, TrajectoryBuilder, check_trajectory

if TYPE_CHECKING:
    from agentgym.rollout_config import RolloutConfig

__all__ = ["ChatTurns", "TokenTurns", "env_attr", "env_tools", "reset_with_tools", "apply_cut_after"]


# ============================================================================ env settings

def env_attr(env: gym.Env, name: str, default: Any = None) -> Any:
    """``env.get_wrapper_attr(name)`` — the outermost wrapper defining ``name`` wins, as in
    Gymnasium — or ``default`` when no layer defines it."""
    try:
        return env.get_wrapper_attr(name)
    except AttributeError:
        return default


def env_tools(env: gym.Env) -> list[dict[str, Any]] | None:
    """The env's tool specs for this episode (:meth:`AgentEnv.tool_specs`, read after each reset);
    ``None`` when it declares none (a plain ``gymnasium.Env``)."""
    tool_specs = env_attr(env, "tool_specs")
    return tool_specs() if callable(tool_specs) else None


def reset_with_tools(env: gym.Env, seed: int, options: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    """``env.reset`` and the tool specs of the episode it started, in one call (a worker thread runs it,
    so a remote env's two calls happen off the engine's thread)."""
    obs, info = env.reset(seed=seed, options=options)
    return obs, info, env_tools(env)


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
        self.tools: list[dict[str, Any]] | None = None               # this episode's tool specs


class TokenTurns:
    """The token-level path: a policy with ``generate(prompts, sampling)`` and a tokenizer.

    The formatter turns messages into ids append-only and the policy's ids are kept exactly as
    sampled, so trajectories are token-faithful; an episode whose next turn would not fit
    ``max_context_tokens`` ends as truncated before it is generated.
    """

    def __init__(self, policy: Any, config: RolloutConfig, sampling: SamplingParams, formatter: Formatter,
                 cut_after: Sequence[str] = ()):
        self.policy, self.config, self.sampling, self.formatter = policy, config, sampling, formatter
        self.cut_after = tuple(cut_after)
        backend = as_backend(policy)
        self.wants_context, self.live_progress = backend.needs_context, backend.reports_progress

    def start(self, ep: _Episode, obs: list[dict[str, str]], tools: list[dict[str, Any]] | None) -> None:
        # the task prompt is never cut (max_context_tokens bounds it); only step observations are
        ep.tools = tools
        ep.builder = TrajectoryBuilder(self.formatter.prompt_ids(obs, tools), obs)
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
        ep.builder.add_env(self.formatter.observation_ids(gen.token_ids, obs, ep.tools, history=ep.builder), obs)
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

    def __init__(self, policy: Any, sampling: SamplingParams, cut_after: Sequence[str] = ()):
        self.policy, self.sampling, self.cut_after = policy, sampling, tuple(cut_after)

    def start(self, ep: _Episode, obs: list[dict[str, str]], tools: list[dict[str, Any]] | None) -> None:
        ep.tools = tools
        ep.messages = [dict(m) for m in obs]

    def fits(self, ep: _Episode) -> bool:
        return True  # the endpoint enforces its own context window

    def generate(self, eps: Sequence[_Episode], on_progress: Callable[[int, int], None] | None = None) -> list[Generation]:
        # one call per distinct tool set (an env's tools may differ per task), answers back in episode order
        out: list[Generation | None] = [None] * len(eps)
        by_tools: dict[str, list[int]] = {}
        for i, ep in enumerate(eps):
            by_tools.setdefault(repr(ep.tools), []).append(i)
        for rows in by_tools.values():
            gens = self.policy.respond([list(eps[i].messages) for i in rows], self.sampling, tools=eps[rows[0]].tools)
            if len(gens) != len(rows):
                raise RuntimeError(f"the policy returned {len(gens)} answers for {len(rows)} conversations")
            for i, g in zip(rows, gens):
                out[i] = g
        return out

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


def apply_cut_after(gen: Generation, order: Sequence[str], tokenizer: Any) -> Generation:
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

