"""``AgentEnv``: a :class:`gymnasium.Env` whose action is the assistant's text and whose
observation is the list of chat messages that are new since the last step.

Subclasses describe *what* happens (tasks, the first messages, one transition); the base class
owns the parts every env must get right the same way: seeding, task selection, the turn limit
(``truncated``), oversized actions, reward composition with per-term reporting, the episode
summary and ``ansi`` rendering.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import numbers
import typing
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping, Sequence

import gymnasium as gym
import numpy as np

from agentgym.errors import InfraError
from agentgym.rewards import Reward, StepEvent, StepRecord, exact_match, resolve_reward
from agentgym.spaces import Message, MessageList, UnicodeText

__all__ = ["AgentEnv", "EnvConfig", "Transition"]


@dataclass
class Transition:
    """What :meth:`AgentEnv.transition` returns for one action.

    Attributes:
        messages: the new observation messages (may be empty, e.g. after a final answer).
        action_type: ``search``, ``answer``, ``tool_call``, ``code``, ``invalid``, …
        parsed: the parsed action (for shapers and logs).
        terminated: the task ended (answer, submit, finish).
        answer: the answer extracted on this step, if any (read by answer-matching shapers).
        info: env-specific facts for shapers and ``info`` (e.g. ``retrieved`` passages).
    """
    messages: list[Message]
    action_type: str
    parsed: Any = None
    terminated: bool = False
    answer: str | None = None
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class EnvConfig:
    """The settings every :class:`AgentEnv` takes. An env's own config extends it (``class MathConfig(EnvConfig)``),
    adding its settings and redeclaring one of these where its default differs; :meth:`AgentEnv.__init__`
    takes these five as keywords with these defaults, so an env without a config (a user's) has them too."""
    reward: Reward | Mapping[str, float] | str | None = field(default=None, metadata={
        "help": "the reward: a Reward, new weights for the env's terms ({term: weight, 'module:attr': weight}) "
                "or 'module:attr'; null: the env's default reward"})
    max_turns: int = field(default=8, metadata={"help": "turns before the episode is truncated (>= 1)"})
    max_action_chars: int = field(default=16_384, metadata={
        "help": "a longer reply is an invalid action (its observation says so)"})
    render_mode: str | None = field(default=None, metadata={"help": "'ansi' (render() returns the chat) or null"})
    group_reward: Any = field(default=None, metadata={
        "help": "a GroupReward the rollout engine applies to each finished group; null: none"})

    @classmethod
    def build(cls, config: EnvConfig | None = None, settings: Mapping[str, Any] | None = None) -> Any:
        """What an env's constructor is given, as one config: ``config`` (an instance of this class, or None
        for the defaults) with the keyword ``settings`` over it. An unknown name is a ``TypeError`` that lists
        the known ones; a bad value is the ``ValueError`` of the config's ``__post_init__``."""
        settings = dict(settings or {})
        if config is not None and not isinstance(config, cls):
            raise TypeError(f"config must be a {cls.__name__}, got {type(config).__name__}")
        names = [f.name for f in dataclasses.fields(cls)]
        for key in settings:
            if key not in names:
                raise TypeError(f"{cls.__name__} has no setting {key!r}; its settings: {', '.join(names)}")
        try:
            built = dataclasses.replace(config, **settings) if config is not None else cls(**settings)
        except TypeError:  # a value of the wrong type ('<' not supported ...): name it, as agentgym.make does
            _check_types(cls, settings)
            raise
        _check_types(cls, settings)  # after the config's own value checks, whose errors come first
        # the two limits every env has, checked here too so that a run's env_kwargs check (which builds the
        # config) names them before a model loads; None (an env's own default) passes
        _check_limits(**{k: getattr(built, k) for k in ("max_turns", "max_action_chars")
                         if getattr(built, k, None) is not None})
        return built


@functools.lru_cache(maxsize=None)
def _config_hints(cls: type) -> dict[str, Any]:
    """The resolved annotations of a config class (none where they do not resolve: then nothing is checked)."""
    try:
        return typing.get_type_hints(cls)
    except Exception:  # noqa: BLE001 - an annotation this check cannot read is left to the env
        return {}


def _check_types(cls: type, settings: Mapping[str, Any]) -> None:
    """The type check :func:`agentgym.make` runs on its arguments (:func:`agentgym.registry.check_env_kwargs`),
    for every other caller too (``gymnasium.make``, the constructor): ``max_attempts must be int, got '3'``."""
    from agentgym.registry import _describe, _fits
    hints = _config_hints(cls)
    for key, value in settings.items():
        if key in hints and not _fits(value, hints[key]):
            raise TypeError(f"{key} must be {_describe(hints[key])}, got {value!r}"[:300])


def _check_limits(**limits: Any) -> None:
    """``max_turns`` / ``max_action_chars``: each an int >= 1 (TypeError naming a wrong type, else ValueError)."""
    for name, value in limits.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"{name} must be an int, got {value!r}")
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")


def _copy_messages(messages: Sequence[Message]) -> list[Message]:
    """What ``copy.deepcopy`` gives for chat messages (string values are immutable and shared), at a
    fraction of its cost; non-string values are still deep-copied."""
    return [{k: v if isinstance(v, str) else copy.deepcopy(v) for k, v in m.items()} for m in messages]


class AgentEnv(gym.Env[list, str]):
    """Base class for text environments (see ``docs/architecture.md``: Environment contract).

    Subclasses implement :meth:`get_task`, :meth:`initial_messages`, :meth:`transition` and
    :meth:`default_reward`, and set :attr:`num_tasks` (``None`` = procedurally unbounded).

    ``info`` keys: ``reward_terms`` (weighted term values, summing to the reward), ``raw_reward_terms``
    (unweighted values, also of weight-0 terms), ``action_type``,
    ``turn``, and on the last step ``episode_summary`` (success, turns, tool calls, term totals, …).
    The summary is not under ``info["episode"]``: Gymnasium's ``RecordEpisodeStatistics`` owns that
    key and asserts it is absent, and our envs must work with Gymnasium's wrappers unchanged. Privileged (hidden-state) data appears only under
    ``info["privileged"]`` — at reset it holds the task, for oracles and evaluation; a policy must
    not read it.

    **The env–engine contract.** What an env may ask of the rollout engine is declared here, and the
    engine (:mod:`agentgym.rollout`) reads nothing else, through the wrapper stack
    (``env.get_wrapper_attr``), so a wrapper can change any of it:

    * ``stop_strings``: generation stops after the first of these (merged with the run's own).
    * ``cut_after``: strings in priority order; the first one present anywhere in a reply cuts it just
      after its first occurrence (Search-R1: the first ``</search>``, else the first ``</answer>``).
    * ``observation_style``: ``"chat"`` (each env message a chat turn) or ``"continuation"`` (env text
      appended raw inside the running sequence, the Search-R1 style).
    * :meth:`tool_specs`: the tools a chat template renders, read after every reset (tools may differ
      per task).
    * ``max_turns``: the turn limit (``truncated`` after it); the engine's context budget ends an episode
      earlier when the next turn would not fit.
    * ``group_reward``: a :class:`~agentgym.rewards.GroupReward` the engine applies to each finished
      group with :func:`~agentgym.rewards.apply_group_reward` (None = none). ``group_reward=`` is a
      keyword of :meth:`__init__`: a subclass either forwards ``**kwargs`` to ``super().__init__`` or
      names it and passes it on; the env itself never uses it.
    * ``num_tasks``: how many task indices exist (``None``: unbounded), for drawing tasks.

    **Settings.** ``config_class`` declares an env's settings as one typed dataclass extending
    :class:`EnvConfig` (types, defaults and ``metadata={"help": ...}``; value checks in its ``__post_init__``).
    Such an env's constructor is ``__init__(self, config=None, **settings)``: it builds ``self.config =
    self.config_class.build(config, settings)``, so ``make("Math-v0", difficulty=0)`` and
    ``MathEnv(MathConfig(difficulty=0))`` are the same env, and each default is declared once, in the
    config. ``agentgym config env ID`` lists the config's fields, and ``env_kwargs`` are checked against
    them before a run loads a model (:func:`agentgym.registry.check_env_kwargs`). An env without a config
    (``config_class = None``, the default) is described by its constructor's signature instead:
    :meth:`constructor_parameters` covers both.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 1}
    stop_strings: tuple[str, ...] = ()
    cut_after: tuple[str, ...] = ()
    observation_style: str = "chat"
    group_reward: Any = None
    num_tasks: int | None = None
    #: the env's settings (a dataclass extending :class:`EnvConfig`); None: its constructor's signature
    config_class: ClassVar[type[EnvConfig] | None] = None
    #: action types counted as tool calls in the episode summary
    tool_action_types: tuple[str, ...] = ("search", "tool_call", "code")

    def __init__(self, *, reward: Reward | Mapping[str, float] | str | None = EnvConfig.reward,
                 max_turns: int = EnvConfig.max_turns, max_action_chars: int = EnvConfig.max_action_chars,
                 render_mode: str | None = EnvConfig.render_mode, group_reward: Any = EnvConfig.group_reward):
        if group_reward is not None:
            self.group_reward = group_reward
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']} or None, got {render_mode!r}")
        _check_limits(max_turns=max_turns, max_action_chars=max_action_chars)
        self.render_mode = render_mode
        self.max_turns = int(max_turns)
        self.max_action_chars = int(max_action_chars)
        # None, a Reward, or plain data from a config / the CLI: {term: weight, "module.path:attr": weight}
        # or "module.path:attr". Imported here, not by the caller, so env kwargs stay serialisable.
        self.reward = resolve_reward(reward, self.default_reward)
        self.action_space = UnicodeText(max_length=self.max_action_chars)
        self.observation_space = MessageList()
        self.task: dict[str, Any] = {}
        self.task_index: int | None = None
        self.messages: list[Message] = []
        self.turn = 0
        self._history: list[StepRecord] = []
        self._term_totals: dict[str, float] = {}
        self._return = 0.0
        self._done = True

    @classmethod
    def constructor_parameters(cls) -> dict[str, inspect.Parameter]:
        """Every keyword the constructor accepts: this class's ``__init__`` parameters and, where one
        passes ``**kwargs`` on, those of the next ``__init__`` up the class hierarchy, ending at the one
        that takes a ``config`` (then ``config`` and the fields of ``cls.config_class``) or at
        :meth:`AgentEnv.__init__`, which takes no ``**kwargs``."""
        out: dict[str, inspect.Parameter] = {}
        for klass in cls.__mro__:
            if "__init__" not in vars(klass):
                continue
            params = list(inspect.signature(vars(klass)["__init__"]).parameters.values())[1:]   # drop self
            if cls.config_class is not None and any(p.name == "config" for p in params):
                shared = {f.name for f in dataclasses.fields(EnvConfig)}   # the env's own settings first
                for f in sorted(dataclasses.fields(cls.config_class), key=lambda field_: field_.name in shared):
                    default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
                    out.setdefault(f.name, inspect.Parameter(
                        f.name, inspect.Parameter.KEYWORD_ONLY, annotation=f.type,
                        default=inspect.Parameter.empty if default is dataclasses.MISSING else default))
                out.setdefault("config", inspect.Parameter("config", inspect.Parameter.KEYWORD_ONLY, default=None))
                return out
            var_kw = None
            for p in params:
                if p.kind is p.VAR_KEYWORD:
                    var_kw = p
                elif p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
                    out.setdefault(p.name, p)
            if var_kw is None or klass is AgentEnv:
                return out
        return out

    # ------------------------------------------------------------------ subclass API
    def get_task(self, index: int) -> dict[str, Any]:
        """The task with this index (deterministic in ``index``)."""
        raise NotImplementedError(f"{type(self).__name__} must define get_task(index) (see docs/environments.md)")

    def initial_messages(self, task: Mapping[str, Any]) -> list[Message]:
        """The first observation: system/user messages holding the task prompt."""
        raise NotImplementedError(f"{type(self).__name__} must define initial_messages(task) (see docs/environments.md)")

    def transition(self, action: str) -> Transition:
        """Apply one action to the hidden state. Must not raise on any string."""
        raise NotImplementedError(f"{type(self).__name__} must define transition(action) (see docs/environments.md)")

    def default_reward(self) -> Reward:
        """The reward used when the env is made without ``reward=``."""
        raise NotImplementedError(f"{type(self).__name__} has no reward: define default_reward() or pass reward=..."
                                  " (see docs/reward_shapers.md)")

    def on_reset(self, task: Mapping[str, Any]) -> None:
        """Hook: build per-episode hidden state (database, sandbox, …)."""

    def episode_success(self) -> bool:
        """Default: the final answer matches a gold answer (``task["answers"]``)."""
        gold = self.task.get("answers", self.task.get("answer"))
        if gold is None:
            return False
        golds = [str(gold)] if isinstance(gold, (str, int, float)) else [str(g) for g in gold]
        answer = next((r.info.get("answer") for r in reversed(self._history) if r.info.get("answer") is not None), None)
        return bool(exact_match(answer, golds))

    def episode_metrics(self) -> dict[str, Any]:
        """Hook: extra entries for the final ``info["episode_summary"]``."""
        return {}

    def tool_specs(self) -> list[dict[str, Any]]:
        """Tool specs for chat templates (``tools=``); empty if the env has no tools."""
        return []

    def invalid(self, message: str, parsed: Any = None, role: str = "user", **info: Any) -> Transition:
        """A non-terminal invalid-action transition whose observation says what was wrong."""
        return Transition([{"role": role, "content": message}], "invalid", parsed=parsed,
                          info={"error": message, **info})

    # ------------------------------------------------------------------ gymnasium API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        if options is not None and not isinstance(options, Mapping):
            raise ValueError(f"options must be a mapping ({{'task_index': i}} or {{'task': {{...}}}}), "
                             f"got {type(options).__name__}")
        options = dict(options or {})
        unknown = set(options) - {"task", "task_index"}
        if unknown:
            raise ValueError(f"unknown reset options {sorted(unknown)}; use 'task' or 'task_index'")
        if "task" in options:
            if not isinstance(options["task"], Mapping):
                raise ValueError(f"options['task'] must be a mapping, got {type(options['task']).__name__}")
            self.task_index = options.get("task_index")
            self.task = dict(options["task"])
        else:
            if "task_index" in options:
                index = options["task_index"]
                if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
                    raise ValueError(f"options['task_index'] must be an int, got {index!r}")
                index = int(index)
                if index < 0 or (self.num_tasks is not None and index >= self.num_tasks):
                    raise ValueError(f"task_index {index} out of range [0, {'inf' if self.num_tasks is None else self.num_tasks})")
            else:
                high = self.num_tasks if self.num_tasks is not None else 2**31 - 1
                if high <= 0:
                    raise RuntimeError(f"{type(self).__name__} has no tasks")
                index = int(self.np_random.integers(high))
            self.task_index = index
            self.task = self.get_task(index)
        self.turn = 0
        self._history = []
        self._term_totals = {n: 0.0 for n in self.reward.names}
        self._return = 0.0
        self._done = False
        self.on_reset(self.task)
        obs = self.initial_messages(self.task)
        self.messages = _copy_messages(obs)
        return obs, {"task_index": self.task_index, "turn": 0, "privileged": {"task": copy.deepcopy(self.task)}}

    def step(self, action: str):
        if self._done:
            raise RuntimeError("step() called on a finished episode; call reset() first")
        if not isinstance(action, str):
            raise TypeError(f"the action must be the assistant's text (str), got {type(action).__name__}")
        if len(action) > self.max_action_chars:
            tr = self.invalid(f"Your response has {len(action)} characters; the limit is {self.max_action_chars}. "
                              "Answer more briefly.")
        else:
            tr = self._transition_or_infra_error(action)
        self.turn += 1
        terminated = bool(tr.terminated)
        infra_error = tr.info.get("infra_error")
        truncated = not terminated and (self.turn >= self.max_turns or infra_error is not None)
        done = terminated or truncated
        info = dict(tr.info)
        if tr.answer is not None:
            info["answer"] = tr.answer
        event = StepEvent(task=self.task, action=action, action_type=tr.action_type, parsed=tr.parsed,
                          observation=tr.messages, turn=self.turn - 1, history=tuple(self._history),
                          done=done, truncated=truncated, answer=tr.answer, info=info)
        reward, terms, raw_terms = self.reward.evaluate(event)
        self._history.append(StepRecord(self.turn - 1, action, tr.action_type, tr.parsed, info))
        for k, v in terms.items():
            self._term_totals[k] = self._term_totals.get(k, 0.0) + v
        self._return += reward
        self.messages.append({"role": "assistant", "content": action})
        self.messages.extend(_copy_messages(tr.messages))
        info.update(reward_terms=terms, raw_reward_terms=raw_terms, action_type=tr.action_type, turn=self.turn)
        if done:
            self._done = True
            info["episode_summary"] = self._episode_summary(terminated, truncated)
        return tr.messages, reward, terminated, truncated, info

    def _transition_or_infra_error(self, action: str) -> Transition:
        """:meth:`transition`, or — when the infrastructure under it failed (:class:`InfraError`: a sandbox,
        a retrieval server, a tool backend) — a transition that ends the episode marked ``infra_error``."""
        try:
            return self.transition(action)
        except InfraError as e:
            message = f"{type(e).__name__}: {e}"
            return Transition([{"role": "user", "content": f"Infrastructure error, not your fault: {message}. "
                                                          "The episode ends here."}],
                              action_type="infra_error", info={"infra_error": message})

    def _episode_summary(self, terminated: bool, truncated: bool) -> dict[str, Any]:
        counts = Counter(r.action_type for r in self._history)
        summary = {
            "success": bool(self.episode_success()),
            "return": self._return,
            "turns": self.turn,
            "terminated": terminated,
            "truncated": truncated,
            "tool_calls": sum(counts.get(k, 0) for k in self.tool_action_types),
            "invalid_actions": counts.get("invalid", 0),
            "action_counts": dict(counts),
            "reward_terms": dict(self._term_totals),
            "task_index": self.task_index,
            "infra_error": next((r.info["infra_error"] for r in self._history if "infra_error" in r.info), None),
        }
        summary.update(self.episode_metrics())
        return summary

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        lines = []
        for m in self.messages:
            lines.append(f"[{m['role']}]")
            lines.append(m["content"])
        return "\n".join(lines) + "\n"
