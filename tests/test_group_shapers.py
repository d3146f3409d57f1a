"""Group-level reward shapers (agentgym/rewards.py, issue 17 §3): shapers that see a whole GRPO group,
composed with weights, applied to finished groups by ``apply_group_reward`` — hand computations on
built trajectories, then real trajectories from the ``RolloutEngine`` (SmolLM2 tokenizer, scripted
policy on Arithmetic-v0)."""

from __future__ import annotations

import collections
import inspect

import gymnasium as gym
import pytest

import agentgym
from agentgym.registry import check_env_kwargs
import agentgym.rollout
from agentgym.policies.scripted import ScriptedPolicy
from agentgym.rewards import (AnswerDiversity, GroupMember, GroupReward, GroupShaper, SharedWrongAnswer,
                              apply_group_reward, group_shaper)
from agentgym.rollout_config import RolloutConfig
from agentgym.rollout import RolloutEngine
from agentgym.rollout_metrics import summarize
from agentgym.trajectory import Trajectory

from fixtures_llm import tok  # noqa: F401  (fixture)


def traj(answer: str | None, success: bool, rewards=(0.0, 1.0), *, episode_answer: str | None = None,
         group_id: int = 0) -> Trajectory:
    """A two-turn token-level trajectory whose last action answers ``answer`` (no tag when None)."""
    turns = len(rewards)
    ids, mask, spans = [1, 2, 3], [0, 0, 0], []
    for _ in range(turns):
        spans.append((len(ids), len(ids) + 2))
        ids += [10, 11, 20]
        mask += [1, 1, 0]
    actions = ["<search>q</search>"] * (turns - 1) + ([f"<answer>{answer}</answer>"] if answer is not None else ["hm"])
    terms = [{"correct": 0.0, "format": r} for r in rewards]
    episode = {"success": success, "return": float(sum(rewards)), "reward_terms": {"correct": 0.0,
                                                                                   "format": float(sum(rewards))}}
    if episode_answer is not None:
        episode["answer"] = episode_answer
    return Trajectory(ids, mask, [-0.5 if m else 0.0 for m in mask], 3, spans, actions[:turns], ["eos"] * turns,
                      list(map(float, rewards)), terms, [], episode, True, False, group_id)


# --------------------------------------------------------------------------- members and built-in shapers

def test_group_member_views():
    a = GroupMember.of(0, traj(" Paris ", True, (0.5, 1.0)))
    # the answer as the envs extract it (``parsing.last_tag_content``: the last <answer>, stripped)
    assert (a.index, a.answer, a.success, a.reward, a.truncated) == (0, "Paris", True, 1.5, False)
    assert a.actions == ("<search>q</search>", "<answer> Paris </answer>")
    assert GroupMember.of(1, traj(None, False)).answer is None
    # the env's own answer (an episode summary with "answer") wins over parsing the last action
    assert GroupMember.of(2, traj("x", False, episode_answer="42")).answer == "42"


def test_answer_diversity_hand_computed():
    members = [GroupMember.of(i, t) for i, t in enumerate(
        [traj("Paris", True), traj("paris.", True), traj("Lyon", False), traj(None, False)])]
    # "Paris" and "paris." normalise alike: each differs from 2 of the 3 others; Lyon from all 3;
    # the member without an answer gets nothing
    assert AnswerDiversity()(members) == pytest.approx([2 / 3, 2 / 3, 1.0, 0.0])
    assert AnswerDiversity()(members[:1]) == [0.0]  # a group of one has nobody to differ from
    assert AnswerDiversity().name == "diversity" and isinstance(AnswerDiversity(), GroupShaper)


def test_shared_wrong_answer_hand_computed():
    same_wrong = [GroupMember.of(i, traj("7", False)) for i in range(4)]
    assert SharedWrongAnswer()(same_wrong) == [-1.0] * 4
    same_right = [GroupMember.of(i, traj("7", True)) for i in range(4)]
    assert SharedWrongAnswer()(same_right) == [0.0] * 4
    mixed = [GroupMember.of(i, t) for i, t in enumerate(
        [traj("7", False), traj("7", False), traj("7", False), traj("9", True)])]
    assert SharedWrongAnswer()(mixed) == [0.0] * 4  # not everyone: min_share=1 does not fire
    assert SharedWrongAnswer(min_share=0.5)(mixed) == [-1.0, -1.0, -1.0, 0.0]
    no_answers = [GroupMember.of(i, traj(None, False)) for i in range(3)]
    assert SharedWrongAnswer()(no_answers) == [0.0] * 3
    assert SharedWrongAnswer()(same_wrong[:1]) == [0.0]
    with pytest.raises(ValueError, match="min_share"):
        SharedWrongAnswer(min_share=0)


# --------------------------------------------------------------------------- composition

@group_shaper("first_bonus")
def first_bonus(members):
    """1 for the first member (a test shaper with an obvious value per member)."""
    return [1.0 if m.index == 0 else 0.0 for m in members]


def test_group_reward_composition_weights_and_report():
    gr = GroupReward([(AnswerDiversity(), 0.5), first_bonus])
    assert gr.names == ["diversity", "first_bonus"] and gr.weights == {"diversity": 0.5, "first_bonus": 1.0}
    assert repr(gr) == "GroupReward(diversity×0.5, first_bonus×1)" and repr(first_bonus) == "group_shaper('first_bonus')"
    members = [GroupMember.of(i, traj(a, False)) for i, a in enumerate(["a", "b"])]
    (t0, w0, r0), (t1, w1, r1) = gr.evaluate(members)
    assert (r0, w0, t0) == ({"diversity": 1.0, "first_bonus": 1.0}, {"diversity": 0.5, "first_bonus": 1.0}, 1.5)
    assert (r1, w1, t1) == ({"diversity": 1.0, "first_bonus": 0.0}, {"diversity": 0.5, "first_bonus": 0.0}, 0.5)
    assert gr.with_weights(diversity=0.0).evaluate(members)[0][1] == {"diversity": 0.0, "first_bonus": 1.0}
    assert gr.with_terms(SharedWrongAnswer()).names == ["diversity", "first_bonus", "shared_wrong"]
    with pytest.raises(ValueError, match="duplicate"):
        GroupReward([first_bonus, first_bonus])
    with pytest.raises(ValueError, match="unknown reward terms"):
        GroupReward([first_bonus], weights={"nope": 1.0})

    @group_shaper()
    def too_few(members):
        return [0.0]

    with pytest.raises(ValueError, match="too_few.*1 values for 2 members"):
        GroupReward([too_few]).evaluate(members)

    @group_shaper()
    def undefined(members):
        return [0.0, float("nan")]

    with pytest.raises(ValueError, match="reward term 'undefined' returned nan; a shaper must return a finite number"):
        GroupReward([undefined]).evaluate(members)
    assert not callable(gr)  # a callable env attribute would read as a method through Ray env proxies


# --------------------------------------------------------------------------- apply_group_reward

def test_apply_adds_each_term_to_the_last_step_and_the_episode_totals():
    group = [traj("7", False), traj("7", False), traj("9", True, (0.0, 1.0))]
    before = [(list(t.step_rewards), t.episode["return"]) for t in group]
    apply_group_reward(group, GroupReward([(AnswerDiversity(), 0.5), SharedWrongAnswer(min_share=0.5)]))
    # hand computation: diversity 1/2, 1/2, 1 (× 0.5); shared_wrong -1, -1, 0
    expected = [(0.25, -1.0), (0.25, -1.0), (0.5, 0.0)]
    for t, (steps, ret), (div, wrong) in zip(group, before, expected):
        assert t.step_rewards[:-1] == steps[:-1]
        assert t.step_rewards[-1] == pytest.approx(steps[-1] + div + wrong)
        assert t.reward_terms[-1] == {"correct": 0.0, "format": 1.0, "diversity": div, "shared_wrong": wrong}
        assert "diversity" not in t.reward_terms[0]
        assert t.episode["return"] == pytest.approx(ret + div + wrong) == pytest.approx(t.total_reward)
        assert t.episode["reward_terms"]["diversity"] == div and t.episode["reward_terms"]["shared_wrong"] == wrong
        # the term reaches the last policy token, where returns and advantages pick it up
        assert t.token_rewards()[t.turn_spans[-1][1] - 1] == pytest.approx(t.step_rewards[-1])
    m = summarize(group)
    assert m["reward/diversity"] == pytest.approx((0.25 + 0.25 + 0.5) / 3)
    assert m["reward/shared_wrong"] == pytest.approx(-2 / 3)
    assert m["reward_mean"] == pytest.approx(sum(t.total_reward for t in group) / 3)


def test_apply_edge_cases():
    group = [traj("7", False), traj("7", False)]
    apply_group_reward(group, None)
    apply_group_reward([], GroupReward([first_bonus]))
    assert group[0].step_rewards == [0.0, 1.0]
    apply_group_reward(group, [first_bonus])  # a plain list of group shapers is a GroupReward
    assert group[0].reward_terms[-1]["first_bonus"] == 1.0 and group[0].step_rewards[-1] == 2.0
    with pytest.raises(ValueError, match="applied twice"):
        apply_group_reward(group, [first_bonus])
    with pytest.raises(ValueError, match=r"\['format'\]"):  # a group term may not reuse a step term's name
        apply_group_reward([traj("7", False)], GroupReward({"format": first_bonus}))
    # an episode that ended before its first turn has no step to carry a term, but still counts
    empty = Trajectory([1, 2], [0, 0], [0.0, 0.0], 2, [], [], [], [], [], [], {"success": False}, False, True)
    group = [empty, traj("a", False)]
    apply_group_reward(group, first_bonus)
    assert empty.step_rewards == [] and empty.reward_terms == [] and group[1].reward_terms[-1]["first_bonus"] == 0.0
    # chat-only trajectories (no tokens) take group terms the same way
    chat = Trajectory([], [], [], 0, [], ["<answer>a</answer>"], ["stop"], [1.0], [{"correct": 1.0}], [],
                      {"success": True, "return": 1.0})
    apply_group_reward([chat], first_bonus)
    assert chat.step_rewards == [2.0] and chat.episode["return"] == 2.0


# --------------------------------------------------------------------------- README example, envs, engine

# The README's group shaper, verbatim.
@group_shaper("majority_wrong")                # sees the whole group once its episodes have ended
def majority_wrong(members):
    """-1 for a wrong answer that most of the group gave too."""
    answers = [m.answer for m in members]
    return [-1.0 if m.answer is not None and not m.success and answers.count(m.answer) > len(members) / 2
            else 0.0 for m in members]           # one value per member


README_GROUP_REWARD = GroupReward([majority_wrong, (AnswerDiversity(), 0.1)])


def test_readme_example_is_short_and_settable_through_make():
    assert len(inspect.getsource(majority_wrong.fn).splitlines()) <= 15
    env = agentgym.make("Arithmetic-v0", group_reward=README_GROUP_REWARD)
    # read through the wrapper stack, as the rollout engine reads it (gym.make adds wrappers)
    assert env.get_wrapper_attr("group_reward") is README_GROUP_REWARD and env.unwrapped is not env
    assert agentgym.make("Arithmetic-v0").get_wrapper_attr("group_reward") is None
    assert gym.make("agentgym/SearchQA-v0", group_reward=README_GROUP_REWARD).unwrapped.group_reward is README_GROUP_REWARD
    env.close()


def test_every_env_class_takes_group_reward():
    """Envs need not forward ``group_reward``: every AgentEnv subclass accepts it, and says so."""
    from agentgym.envs.arithmetic import ArithmeticEnv

    class Mine(ArithmeticEnv):
        def __init__(self, level: int = 1, **kwargs):
            super().__init__(**kwargs)
            self.level = level

    class WithDefault(ArithmeticEnv):
        group_reward = GroupReward([first_bonus])  # a class default, kept when none is given

    assert "group_reward" in ArithmeticEnv.constructor_parameters()
    assert {"level", "split", "group_reward", "max_turns"} <= set(Mine.constructor_parameters())   # through **kwargs
    with pytest.raises(TypeError, match="did you mean 'group_reward'"):
        check_env_kwargs("Arithmetic-v0", {"group_rewrd": README_GROUP_REWARD})
    env = Mine(level=2, group_reward=README_GROUP_REWARD, split="test")
    assert (env.level, env.split, env.group_reward) == (2, "test", README_GROUP_REWARD)
    assert Mine().group_reward is None and ArithmeticEnv().group_reward is None
    assert WithDefault().group_reward is WithDefault.group_reward
    assert WithDefault(group_reward=README_GROUP_REWARD).group_reward is README_GROUP_REWARD


def grouped_answers_script(answers_by_member):
    """Turn 0: member k of each group (k-th call for that task, in episode order) answers
    ``answers_by_member[k]`` ("gold" = the task's answer)."""
    seen = collections.Counter()

    def script(ctx):
        key = ctx["task"]["question"]
        k = seen[key]
        seen[key] += 1
        a = answers_by_member[k % len(answers_by_member)]
        return "<answer>%s</answer>" % (ctx["task"]["answers"][0] if a == "gold" else a)
    return script


def collect(tok, group_reward=None, **kwargs):
    engine = RolloutEngine(ScriptedPolicy(tok, grouped_answers_script(["gold", "7", "7", "7"])),
                           RolloutConfig(mode="lockstep", debug_checks=True))
    try:
        env_kwargs = {"group_reward": group_reward} if group_reward is not None else {}
        return engine.collect("Arithmetic-v0", num_groups=2, group_size=4, seed=0, env_kwargs=env_kwargs, **kwargs)
    finally:
        engine.close()


def check_readme_terms(batch) -> None:
    for g in range(2):
        group = batch.trajectories[4 * g: 4 * g + 4]
        assert [t.episode["success"] for t in group] == [True, False, False, False]
        assert [t.reward_terms[-1]["majority_wrong"] for t in group] == [0.0, -1.0, -1.0, -1.0]
        assert [t.reward_terms[-1]["diversity"] for t in group] == pytest.approx([0.1, 0.1 / 3, 0.1 / 3, 0.1 / 3])


def test_real_engine_trajectories_take_group_terms(tok):
    """The function on real trajectories: the engine's groups (episode order), one call per group."""
    batch = collect(tok)
    plain = [t.total_reward for t in batch.trajectories]
    for g in range(2):
        group = batch.trajectories[4 * g: 4 * g + 4]
        assert {t.group_id for t in group} == {g}
        apply_group_reward(group, README_GROUP_REWARD)
    check_readme_terms(batch)
    diffs = [t.total_reward - p for t, p in zip(batch.trajectories, plain)]
    assert diffs == pytest.approx([0.1, -1 + 0.1 / 3, -1 + 0.1 / 3, -1 + 0.1 / 3] * 2)
    assert summarize(batch.trajectories)["reward/majority_wrong"] == pytest.approx(-0.75)


def test_engine_applies_the_envs_group_reward(tok):
    batch = collect(tok, README_GROUP_REWARD)
    check_readme_terms(batch)
    assert batch.metrics["reward/majority_wrong"] == pytest.approx(-0.75)
    assert batch.metrics["reward/diversity"] == pytest.approx((0.1 + 3 * 0.1 / 3) / 4)
    # without a group reward nothing changes
    assert "reward/majority_wrong" not in collect(tok).metrics
