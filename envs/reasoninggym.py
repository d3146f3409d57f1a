"""``agentgym/ReasoningGym-v0``: any ``reasoning-gym`` dataset, or a weighted mix, as an agentgym env.

reasoning-gym (open-thought) ships ~100 procedural generators (arithmetic, algebra, logic, graphs,
games, ...), each a dataset whose items hold a ``question``, an ``answer`` and ``metadata``, and whose
``score_answer(answer, entry)`` grades a reply in [0, 1] by that task's own rules. This env asks the
question, reads the reply's last ``<answer>...</answer>`` (reasoning-gym's own extraction rule) and
scores it with that ``score_answer``.

Tasks. ``task="<name>"`` with ``task_config={...}`` (that dataset's config fields), or
``tasks={"<name>": weight, ...}`` for a weighted mix (reasoning-gym's ``composite`` dataset does the
weighted draw; ``task_config`` then maps a name to its config). One split is ``size`` questions
(``num_tasks``); ``get_task(i)`` is deterministic.

Splits. ``train``, ``validation`` and ``test`` are drawn from disjoint seed ranges (``seed``,
``seed + 2**30``, ``seed + 2**31``: reasoning-gym seeds item ``i`` with ``seed + i``) and are
deduplicated by normalised question text (:func:`agentgym.splits.normalise_task_text`: NFKC, case
and whitespace folded): a repeat is dropped where it is drawn, so no question appears twice in a split
or in two splits. Test is drawn first, validation
skips test's questions, train skips both, so a split never changes when a *later* split grows.
Drawing stops with a ValueError when a config has too few distinct questions for the sizes asked.
A split is drawn whole at its first ``get_task`` (with the splits drawn before it) and kept per process,
so envs of one config share it; ``basic_arithmetic``'s default 1300 questions take about a second.

Answer extraction (``answer_format``). ``"tag"`` (the default) is reasoning-gym's own rule: the last
``<answer>...</answer>``. ``"flexible"`` also takes a reply without the tag, as lm-evaluation-harness's
"flexible-extract" does for GSM8K: the tag if there is one, else Math-v0's order (the last ``\boxed{}``,
else an "answer is" phrase's number, else the last number in the reply; ``envs/mathrl/answers.py``). It
suits tasks whose answers are numbers: SmolLM2-135M-Instruct never writes the tag (0 of 128 sampled
replies on chain_sum and leg_counting), so under ``"tag"`` it has no reward to learn from. The score is
the dataset's own ``score_answer`` either way; ``info["extraction"]`` says which rule found the answer,
and results under ``"flexible"`` must say so.

Episode: one answer. The first reply with an answer (a complete ``<answer>`` tag, or under ``"flexible"``
any extractable one) ends it. A reply without one is invalid (an observation says so, and the ``invalid`` term) and the model may try again while turns
are left: ``max_turns=2`` by default, as Math-v0 (one retry). ``max_turns=1`` makes it strictly one
reply; it is not the default because Gymnasium's ``check_env`` (run on every registered env) takes an
env that truncates after one random action for a broken one.

Reward terms (weights: ``reward={"name": w}``):

* ``score`` 1.0 (terminal): the dataset's own ``score_answer`` of the final answer, in [0, 1]
  (partial credit where the dataset gives it).
* ``invalid`` 0.1: -1 per reply without an answer tag.

Success means full marks: ``score == 1.0``. ``score_answer`` runs in this process, as in reasoning-gym's
own training loops; one that raises scores 0 (``info["score_error"]`` says why) and never ends a run.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import json
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from agentgym import AgentEnv, EnvConfig, Reward, Transition, shaper
from agentgym.parsing import last_tag_content
from agentgym.rewards import InvalidActionPenalty, StepEvent
from agentgym.splits import SPLITS, check_split, normalise_task_text
from agentgym.envs.mathrl.answers import extract_answer

__all__ = ["ReasoningGymEnv", "ReasoningGymConfig",
           "SYSTEM_PROMPT", "DEFAULT_TASK", "ANSWER_FORMATS", "DEFAULT_SIZES", "MAX_SIZE", "dataset_score",
           "dataset_names"]

SYSTEM_PROMPT = (
    "Solve the problem. You may reason first; then give your final answer, and nothing else, inside "
    "<answer> and </answer>, for example <answer>42</answer>. Write it in the form the question asks for."
)
DEFAULT_TASK = "basic_arithmetic"
DEFAULT_SIZES = {"train": 1000, "validation": 100, "test": 200}
MAX_SIZE = 100_000               # questions per split at most: drawing is ~1000 questions a second, and up to
                                 # 4x size draws are made before a split is declared unfillable
_SPLIT_OFFSETS = {"train": 0, "validation": 2 ** 30, "test": 2 ** 31}
_MAX_SEED = 2 ** 30              # keeps every item seed below 2**32 (numpy-seeded generators need that)
_DRAWS_PER_TASK, _EXTRA_DRAWS = 4, 200   # draws allowed before a split is declared unfillable
ANSWER_FORMATS = ("tag", "flexible")
_OWNED_KEYS = ("seed", "size")   # set by the env, per split
_EXAMPLE_KEYS = ("example_answer", "example_correct_answer", "possible_answer")  # where answer is None


def _registry() -> dict[str, tuple[type, type]]:
    """reasoning-gym's dataset registry (name -> (dataset class, config class)), imported on first use."""
    try:
        from reasoning_gym.factory import DATASETS
    except ImportError as e:  # a missing extra is a setup error, said in one line
        raise ImportError("ReasoningGym-v0 needs the reasoning-gym package: pip install reasoning-gym") from e
    return DATASETS


def dataset_names() -> list[str]:
    """The reasoning-gym datasets this env can serve (all registered ones but ``composite``)."""
    return sorted(n for n in _registry() if n != "composite")


def _check_config(name: str, config: Any) -> dict[str, Any]:
    """``config`` as checked keyword arguments of dataset ``name`` (ValueError in one line otherwise)."""
    names = dataset_names()
    if name not in names:
        close = difflib.get_close_matches(str(name), names, n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise ValueError(f"unknown reasoning-gym dataset {name!r}{hint}; valid: {', '.join(names)}")
    if config is None:
        config = {}
    if not isinstance(config, Mapping):
        raise ValueError(f"the config of {name!r} must be a mapping of its fields, got {type(config).__name__}")
    config_cls = _registry()[name][1]
    fields = sorted(f.name for f in dataclasses.fields(config_cls) if f.name not in _OWNED_KEYS)
    owned = sorted(set(config) & set(_OWNED_KEYS))
    if owned:
        raise ValueError(f"{name}: {', '.join(owned)} is set by the env (its seed= and size= arguments), "
                         "not in task_config")
    unknown = sorted(set(config) - set(fields))
    if unknown:
        raise ValueError(f"{name}: unknown config key(s) {', '.join(map(str, unknown))}; valid: {', '.join(fields)}")
    try:
        checked = config_cls(**config)
        if hasattr(checked, "validate"):
            checked.validate()
    except (AssertionError, ValueError, TypeError) as e:
        raise ValueError(f"{name}: bad config {dict(config)}: {e or type(e).__name__}") from None
    return dict(config)


def _mix_spec(task: str | None, task_config: Any, tasks: Any) -> tuple[tuple[str, float, str], ...]:
    """The checked mix as ((name, weight, config as JSON), ...): hashable, so generated splits can be cached."""
    if tasks is None:
        name = DEFAULT_TASK if task is None else task
        return ((name, 1.0, json.dumps(_check_config(name, task_config), sort_keys=True)),)
    if task is not None:
        raise ValueError("give task= (one dataset) or tasks= (a weighted mix), not both")
    if not isinstance(tasks, Mapping) or not tasks:
        raise ValueError(f"tasks must be a non-empty mapping of dataset name -> weight, got {tasks!r}")
    configs = task_config or {}
    if not isinstance(configs, Mapping) or set(configs) - set(tasks):
        raise ValueError("with tasks=, task_config maps some of the mix's dataset names to their configs; "
                         f"got keys {sorted(configs) if isinstance(configs, Mapping) else configs!r}")
    spec = []
    for name, weight in tasks.items():
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 < weight < math.inf:
            raise ValueError(f"the weight of {name!r} must be a positive number (not inf or nan), got {weight!r}")
        spec.append((name, float(weight), json.dumps(_check_config(name, configs.get(name)), sort_keys=True)))
    return tuple(spec)


def _dataset(spec: tuple[tuple[str, float, str], ...], seed: int, draws: int) -> Any:
    """reasoning-gym's composite dataset over ``spec``: its weighted draw picks each item's source."""
    from reasoning_gym.composite import CompositeConfig, CompositeDataset, DatasetSpec

    config = CompositeConfig(size=draws, seed=seed,
                             datasets=[DatasetSpec(name, weight, json.loads(cfg)) for name, weight, cfg in spec])
    config.validate()
    return CompositeDataset(config)


@functools.lru_cache(maxsize=32)
def _split_tasks(spec: tuple[tuple[str, float, str], ...], seed: int, sizes: tuple[tuple[str, int], ...],
                 split: str) -> tuple[dict[str, Any], ...]:
    """The questions of ``split``: drawn in order, repeats (within it, or of an earlier-drawn split) dropped."""
    size = dict(sizes)
    order = ("test", "validation", "train")  # the held-out sets first: train never moves them
    taken: set[str] = set()
    for earlier in order[:order.index(split)]:
        taken |= {normalise_task_text(t["question"]) for t in _split_tasks(spec, seed, sizes, earlier)}
    want = size[split]
    draws = _DRAWS_PER_TASK * want + _EXTRA_DRAWS
    data = _dataset(spec, seed + _SPLIT_OFFSETS[split], draws)
    tasks: list[dict[str, Any]] = []
    for idx in range(draws):
        if len(tasks) == want:
            break
        item = data[idx]
        key = normalise_task_text(item["question"])
        if key in taken:
            continue
        taken.add(key)
        metadata = dict(item.get("metadata") or {})
        tasks.append({"question": item["question"], "answer": item.get("answer"), "metadata": metadata,
                      "dataset": metadata.get("source_dataset", spec[0][0]), "split": split,
                      "source_index": idx})
    if len(tasks) < want:
        names = ", ".join(name for name, _, _ in spec)
        raise ValueError(f"{names}: only {len(tasks)} distinct new questions in {draws} draws for the {split} split "
                         f"of {want}; ask for fewer (size=) or widen the config (task_config=)")
    return tuple(tasks)


@shaper("score", terminal=True)
def dataset_score(event: StepEvent) -> float:
    """The dataset's own ``score_answer`` of the final answer (computed by the env, in [0, 1])."""
    return float(event.info.get("score", 0.0)) if event.action_type == "answer" else 0.0


def _split_sizes(size: Any) -> dict[str, int]:
    """Questions per split: ``DEFAULT_SIZES``, one int for all three, or some splits' sizes over the defaults."""
    sizes = dict(DEFAULT_SIZES)
    if isinstance(size, Mapping):
        unknown = sorted(set(size) - set(SPLITS))
        if unknown:
            raise ValueError(f"size: unknown split(s) {unknown}; valid: {list(SPLITS)}")
        sizes.update(size)
    elif size is not None:
        sizes = {s: size for s in SPLITS}
    for split, n in sizes.items():
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"size of the {split} split must be a positive int, got {n!r}")
        if n > MAX_SIZE:
            raise ValueError(f"size of the {split} split must be at most {MAX_SIZE}, got {n!r}")
    return sizes


@dataclass
class ReasoningGymConfig(EnvConfig):
    """The settings of ``ReasoningGym-v0``."""
    task: str | None = field(default=None, metadata={
        "help": f"a reasoning-gym dataset name (see dataset_names()); null: {DEFAULT_TASK} (fast, offline)"})
    task_config: Mapping[str, Any] | None = field(default=None, metadata={
        "help": "that dataset's config fields (e.g. {max_terms: 3}); with tasks, dataset name -> its config"})
    tasks: Mapping[str, float] | None = field(default=None, metadata={
        "help": "a weighted mix instead of task: {basic_arithmetic: 2, leg_counting: 1}"})
    split: str = field(default="train", metadata={
        "help": "train, validation or test (disjoint, deduplicated question sets)"})
    size: int | Mapping[str, int] | None = field(default=None, metadata={
        "help": "questions per split (num_tasks, at most MAX_SIZE = 100000): an int for all three or "
                "{train: n, ...}; null: DEFAULT_SIZES (1000 / 100 / 200)"})
    seed: int = field(default=0, metadata={
        "help": "the base seed in [0, 2**30); each split draws from its own seed range above it"})
    max_turns: int = field(default=2, metadata={
        "help": "2: one retry after a reply without an answer (1: one reply, no retry)"})
    answer_format: str = field(default="tag", metadata={
        "help": "tag: the last <answer>...</answer> (reasoning-gym's rule); flexible: the tag, else a \\boxed{}, "
                "an 'answer is' number or the last number (for numeric tasks; say so with results)"})

    def __post_init__(self) -> None:
        check_split(self.split, SPLITS)
        if self.answer_format not in ANSWER_FORMATS:
            raise ValueError(f"answer_format must be one of {list(ANSWER_FORMATS)}, got {self.answer_format!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < _MAX_SEED:
            raise ValueError(f"seed must be an int in [0, 2**30), got {self.seed!r}")
        _mix_spec(self.task, self.task_config, self.tasks)   # each raises on a bad value
        _split_sizes(self.size)


class ReasoningGymEnv(AgentEnv):
    """One reasoning-gym dataset, or a weighted mix, scored by the dataset's own ``score_answer``; settings:
    :class:`ReasoningGymConfig`; reward terms ``score`` 1.0, ``invalid`` 0.1."""

    stop_strings = ("</answer>",)
    config_class = ReasoningGymConfig

    def __init__(self, config: ReasoningGymConfig | None = None, **settings: Any):
        c = self.config = self.config_class.build(config, settings)
        self.mix = _mix_spec(c.task, c.task_config, c.tasks)
        self.split, self.seed = c.split, c.seed
        self.sizes = _split_sizes(c.size)
        self.num_tasks = self.sizes[c.split]
        self._data: Any = None
        self._tasks: tuple[dict[str, Any], ...] | None = None
        super().__init__(reward=c.reward, max_turns=c.max_turns, max_action_chars=c.max_action_chars,
                         render_mode=c.render_mode, group_reward=c.group_reward)

    def default_reward(self) -> Reward:
        return Reward([(dataset_score, 1.0), (InvalidActionPenalty(), 0.1)])

    @property
    def task_names(self) -> list[str]:
        """The datasets this env draws from."""
        return [name for name, _, _ in self.mix]

    # ------------------------------------------------------------------ tasks
    def get_task(self, index: int) -> dict[str, Any]:
        if self._tasks is None:  # drawn on first use (shared by envs of the same spec)
            self._tasks = _split_tasks(self.mix, self.seed, tuple(sorted(self.sizes.items())), self.split)
        return copy.deepcopy(self._tasks[index])

    def initial_messages(self, task: Mapping[str, Any]) -> list[dict[str, str]]:
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": str(task["question"])}]

    def on_reset(self, task: Mapping[str, Any]) -> None:
        if not isinstance(task.get("question"), str) or not isinstance(task.get("metadata", {}), Mapping):
            raise ValueError("a ReasoningGym-v0 task needs a 'question' string (and its 'metadata' mapping)")

    # ------------------------------------------------------------------ one step
    def transition(self, action: str) -> Transition:
        answer, rule = self._extract(action)
        if answer is None:
            return self.invalid("No final answer found: give it inside <answer> and </answer>, "
                                "for example <answer>42</answer>.")
        score, error = self._score(answer)
        info: dict[str, Any] = {"score": score, "extraction": rule}
        if error is not None:
            info["score_error"] = error
        return Transition([], "answer", parsed=answer, terminated=True, answer=answer, info=info)

    def _extract(self, action: str) -> tuple[str | None, str | None]:
        """The reply's final answer and the rule that found it (see ``answer_format``)."""
        answer = last_tag_content(action, "answer")
        if answer is not None or self.config.answer_format == "tag":
            return answer, "tag" if answer is not None else None
        found = extract_answer(action)
        return (found.text, found.method) if found is not None else (None, None)

    def _score(self, answer: str) -> tuple[float, str | None]:
        """The dataset's ``score_answer``, clipped to [0, 1]; a scorer that raises scores 0 (and says why)."""
        entry = {"question": self.task.get("question"), "answer": self.task.get("answer"),
                 "metadata": self.task.get("metadata") or {}}
        name = self.task.get("dataset") or entry["metadata"].get("source_dataset") or self.mix[0][0]
        try:
            value = float(self._scorer(str(name))(answer, entry))
        except Exception as e:  # noqa: BLE001 - a third-party scorer must not end the run
            return 0.0, f"{type(e).__name__}: {e}"
        return (min(1.0, max(0.0, value)) if value == value else 0.0), None

    def _scorer(self, name: str) -> Any:
        if name in self.task_names:
            if self._data is None:  # one small dataset object per env, for its score_answer
                self._data = _dataset(self.mix, self.seed, 1)
            return self._data.datasets[name].score_answer
        from reasoning_gym import get_score_answer_fn
        return get_score_answer_fn(name)  # a task given at reset from another dataset

    # ------------------------------------------------------------------ summaries
    def episode_success(self) -> bool:
        return any(r.info.get("score") == 1.0 for r in self._history if r.action_type == "answer")

    def episode_metrics(self) -> dict[str, Any]:
        score = next((r.info["score"] for r in reversed(self._history) if "score" in r.info), None)
        return {"dataset": self.task.get("dataset"), "score": score}

    @staticmethod
    def oracle(context: Mapping[str, Any]) -> str:
        """The dataset's own answer, in the tag. Datasets that grade validity rather than one answer
        (``answer`` None: propositional_logic, graph_color, rubiks_cube) keep an example solution in the
        metadata, used instead; the few with none (rush_hour, boxnet) get an empty answer."""
        task = context["task"]
        answer = task.get("answer")
        if answer is None:
            metadata = task.get("metadata") or {}
            answer = next((metadata[k] for k in _EXAMPLE_KEYS if metadata.get(k) is not None), "")
        return f"<answer>{answer if isinstance(answer, str) else json.dumps(answer)}</answer>"
