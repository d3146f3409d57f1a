"""Reward shapers and their composition (agentgym/rewards.py), checked against hand computations."""

from __future__ import annotations

import inspect
from fractions import Fraction

import gymnasium as gym
import pytest

import agentgym
from agentgym.rewards import (
    CallCost, ExactMatch, FormatCompliance, InvalidActionPenalty, LengthPenalty, Reward, RewardShaper,
    StepEvent, StepRecord, TokenF1, TurnLimitPenalty, exact_match, normalize_answer, shaper, token_f1,
)


def event(action: str = "", action_type: str = "answer", *, done: bool = False, truncated: bool = False,
          answer: str | None = None, gold=("Paris",), history=(), turn: int = 0) -> StepEvent:
    return StepEvent(task={"answers": list(gold) if not isinstance(gold, str) else gold}, action=action,
                     action_type=action_type, parsed=None, observation=[], turn=turn, history=tuple(history),
                     done=done, truncated=truncated, answer=answer)


def record(action_type: str, answer: str | None = None, turn: int = 0) -> StepRecord:
    return StepRecord(turn, "", action_type, None, {} if answer is None else {"answer": answer})


# --------------------------------------------------------------------------- normalize_answer
@pytest.mark.parametrize("raw, expected", [
    ("The  Eiffel-Tower!", "eiffeltower"),
    ("Paris", "paris"),
    ("  paris\t\n", "paris"),
    ("The Beatles", "beatles"),
    ("a cat and an owl, the end.", "cat and owl end"),
    ("Theatre", "theatre"),          # articles only at word boundaries
    ("Anathema", "anathema"),
    ("A", ""),
    ("U.S.A.", "usa"),
    ("1,234", "1234"),
    ("-5", "5"),                     # text normalisation drops the sign (numbers need numeric_equal)
    ("O'Neil", "oneil"),
    ("the-the", "thethe"),           # punctuation goes first, then articles
    ("Ünïcödé  ÉCOLE", "ünïcödé école"),
    ("", ""),
])
def test_normalize_answer_golden(raw, expected):
    assert normalize_answer(raw) == expected


def test_normalize_answer_is_idempotent():
    for s in ["The  Eiffel-Tower!", "a b c", "An apple a day", "x—y"]:
        assert normalize_answer(normalize_answer(s)) == normalize_answer(s)


# --------------------------------------------------------------------------- exact_match
def test_exact_match_against_several_golds():
    golds = ["Eiffel Tower", "la tour Eiffel", "The Iron Lady"]
    assert exact_match("the eiffel tower.", golds) == 1.0
    assert exact_match("La Tour-Eiffel", golds) == 0.0   # "tour-eiffel" -> "toureiffel"
    assert exact_match("La tour eiffel", golds) == 1.0
    assert exact_match("iron lady", golds) == 1.0
    assert exact_match("Eiffel", golds) == 0.0
    assert exact_match(None, golds) == 0.0
    assert exact_match("anything", []) == 0.0
    assert isinstance(exact_match("x", ["x"]), float)


# --------------------------------------------------------------------------- token_f1
def _f1(p: Fraction, r: Fraction) -> float:
    return float(2 * p * r / (p + r))


def test_token_f1_hand_computations():
    # pred -> "cat sat on mat" (4), gold -> "cat on mat" (3): 3 common
    assert token_f1("The cat sat on the mat", ["a cat on a mat"]) == pytest.approx(_f1(Fraction(3, 4), Fraction(1)), abs=1e-15)
    assert token_f1("The cat sat on the mat", ["a cat on a mat"]) == pytest.approx(6 / 7, abs=1e-15)
    # multiset overlap: pred x x y, gold x y y -> common {x:1, y:1} = 2
    assert token_f1("x x y", ["x y y"]) == pytest.approx(2 / 3, abs=1e-15)
    # pred 2 tokens, gold 5 tokens, 1 common: p = 1/2, r = 1/5 -> 2/7
    assert token_f1("red car", ["blue car with four wheels"]) == pytest.approx(_f1(Fraction(1, 2), Fraction(1, 5)), abs=1e-15)
    assert token_f1("red car", ["blue car with four wheels"]) == pytest.approx(2 / 7, abs=1e-15)


def test_token_f1_best_gold_and_edge_cases():
    assert token_f1("new york city", ["york", "new york city", "boston"]) == 1.0
    assert token_f1("new york city", ["york", "boston"]) == pytest.approx(_f1(Fraction(1, 3), Fraction(1)), abs=1e-15)
    assert token_f1("Paris", ["London"]) == 0.0
    assert token_f1(None, ["x"]) == 0.0
    assert token_f1("x", []) == 0.0
    # both normalise to nothing -> equal -> 1; one empty -> 0
    assert token_f1("The", ["a"]) == 1.0
    assert token_f1("", ["x"]) == 0.0
    assert token_f1("x", ["!!"]) == 0.0


# --------------------------------------------------------------------------- built-in shapers
def test_exact_match_shaper_is_terminal_and_uses_final_answer():
    s = ExactMatch()
    assert s.name == "exact_match" and isinstance(s, RewardShaper)
    assert s(event(answer="Paris", done=False)) == 0.0
    assert s(event(answer="paris.", done=True)) == 1.0
    assert s(event(answer="Lyon", done=True)) == 0.0
    # final answer from an earlier step (e.g. truncated afterwards)
    hist = [record("answer", "Paris"), record("invalid")]
    assert s(event(action_type="invalid", done=True, truncated=True, history=hist)) == 1.0
    # the latest earlier answer counts
    hist = [record("answer", "Paris"), record("answer", "Lyon")]
    assert s(event(action_type="invalid", done=True, history=hist)) == 0.0
    # no answer at all
    assert s(event(action_type="invalid", done=True)) == 0.0
    # a scalar gold answer
    assert s(event(answer="42", done=True, gold="42")) == 1.0
    assert ExactMatch(name="em").name == "em"


def test_token_f1_shaper():
    s = TokenF1()
    assert s.name == "f1"
    assert s(event(answer="cat sat on mat", gold=["cat on mat"], done=False)) == 0.0
    assert s(event(answer="cat sat on mat", gold=["cat on mat"], done=True)) == pytest.approx(6 / 7)


def test_format_compliance_step_wise():
    s = FormatCompliance(r"<answer>.+</answer>")
    assert s.name == "format"
    assert s(event("<answer>1</answer>")) == 1.0
    assert s(event("<answer>\n1\n</answer>")) == 1.0      # DOTALL
    assert s(event("1")) == 0.0
    assert s(event("<answer></answer>")) == 0.0


def test_format_compliance_terminal_and_penalty():
    terminal = FormatCompliance(r"^<answer>\d+</answer>$", name="fmt", terminal=True)
    assert terminal(event("<answer>1</answer>", done=False)) == 0.0
    assert terminal(event("<answer>1</answer>", done=True)) == 1.0
    assert terminal(event("answer 1", done=True)) == 0.0
    pen = FormatCompliance(r"<answer>", penalty=-1.0)
    assert pen(event("no tag")) == -1.0
    assert pen(event("<answer>")) == 1.0
    tpen = FormatCompliance(r"<answer>", terminal=True, penalty=-0.5)
    assert tpen(event("no tag", done=False)) == 0.0
    assert tpen(event("no tag", done=True)) == -0.5


def test_call_cost_and_free_calls():
    s = CallCost()
    assert s.name == "call_cost"
    assert s(event(action_type="search")) == -1.0
    assert s(event(action_type="tool_call")) == -1.0
    assert s(event(action_type="answer")) == 0.0
    one_free = CallCost("search", name="search_cost", free=1)
    assert one_free.action_types == ("search",)
    assert one_free(event(action_type="search")) == 0.0
    assert one_free(event(action_type="search", history=[record("search")])) == -1.0
    assert one_free(event(action_type="search", history=[record("tool_call"), record("answer")])) == 0.0
    assert one_free(event(action_type="tool_call")) == 0.0
    two_free = CallCost(["search", "code"], free=2)
    assert two_free(event(action_type="code", history=[record("search")])) == 0.0
    assert two_free(event(action_type="code", history=[record("search"), record("code")])) == -1.0


def test_invalid_action_penalty():
    s = InvalidActionPenalty()
    assert s.name == "invalid"
    assert s(event(action_type="invalid")) == -1.0
    assert s(event(action_type="answer")) == 0.0


def test_length_penalty_with_cap():
    s = LengthPenalty(budget=10)
    assert s.name == "length"
    assert s(event("x" * 5)) == 0.0
    assert s(event("x" * 10)) == 0.0
    assert s(event("x" * 15)) == -0.5
    assert s(event("x" * 20)) == -1.0
    assert s(event("x" * 1000)) == -1.0
    with pytest.raises(ValueError):
        LengthPenalty(budget=0)


def test_turn_limit_penalty():
    s = TurnLimitPenalty()
    assert s.name == "timeout"
    assert s(event(done=True, truncated=True)) == -1.0
    assert s(event(done=True, truncated=False)) == 0.0
    assert s(event(done=False)) == 0.0


def test_step_event_helpers():
    e = event(action_type="search", history=[record("search"), record("answer", "x"), record("search")])
    assert e.count("search") == 3
    assert e.count("search", include_current=False) == 2
    assert e.count("answer") == 1
    assert e.final_answer == "x"
    assert event(answer="now", history=[record("answer", "x")]).final_answer == "now"
    assert event(gold=["1", "2"]).gold == ["1", "2"]
    assert event(gold="1").gold == ["1"]
    assert StepEvent(task={"answer": 7}, action="", action_type="answer", parsed=None, observation=[], turn=0,
                     history=(), done=True).gold == ["7"]


# --------------------------------------------------------------------------- @shaper
def test_shaper_decorator_step_wise():
    @shaper()
    def length_bonus(ev):
        return len(ev.action)

    assert length_bonus.name == "length_bonus"
    assert isinstance(length_bonus, RewardShaper)
    out = length_bonus(event("abc"))
    assert out == 3.0 and isinstance(out, float)


def test_shaper_decorator_terminal_returns_zero_until_done():
    calls = []

    @shaper("politeness", terminal=True)
    def politeness(ev):
        """1 if the answer says please."""
        calls.append(ev.turn)
        return 1.0 if "please" in ev.action.lower() else 0.0

    assert politeness.name == "politeness"
    assert politeness.__doc__ == "1 if the answer says please."
    assert politeness(event("Please", done=False, turn=0)) == 0.0
    assert politeness(event("Please", done=True, turn=1)) == 1.0
    assert politeness(event("no", done=True, turn=2)) == 0.0
    assert calls == [1, 2]  # not even called before the last step


# --------------------------------------------------------------------------- Reward
def test_reward_weighted_terms_sum_to_total():
    r = Reward([ExactMatch(), (CallCost("search"), 0.1), (InvalidActionPenalty(), 0.5)])
    assert r.names == ["exact_match", "call_cost", "invalid"]
    assert r.weights == {"exact_match": 1.0, "call_cost": 0.1, "invalid": 0.5}
    total, terms = r(event(action_type="search"))
    assert terms == {"exact_match": 0.0, "call_cost": -0.1, "invalid": 0.0}
    assert total == pytest.approx(-0.1)
    total, terms = r(event(action_type="invalid"))
    assert terms == {"exact_match": 0.0, "call_cost": 0.0, "invalid": -0.5}
    total, terms = r(event(answer="Paris", done=True))
    assert terms == {"exact_match": 1.0, "call_cost": 0.0, "invalid": 0.0}
    assert total == sum(terms.values()) == 1.0


def test_reward_mapping_form_with_weights():
    r = Reward({"em": ExactMatch(), "cost": CallCost("search")}, weights={"cost": 0.25})
    assert r.names == ["em", "cost"]
    assert r.weights == {"em": 1.0, "cost": 0.25}
    total, terms = r(event(action_type="search"))
    assert terms == {"em": 0.0, "cost": -0.25}
    assert total == -0.25


def test_reward_weights_mapping_overrides_tuple_weight():
    r = Reward([(CallCost("search"), 0.1)], weights={"call_cost": 2.0})
    assert r(event(action_type="search")) == (-2.0, {"call_cost": -2.0})


def test_reward_with_weights_copies():
    r = Reward([ExactMatch(), (CallCost("search"), 0.1)])
    r2 = r.with_weights(call_cost=0.5)
    assert r.weights == {"exact_match": 1.0, "call_cost": 0.1}
    assert r2.weights == {"exact_match": 1.0, "call_cost": 0.5}
    assert r2(event(action_type="search")) == (-0.5, {"exact_match": 0.0, "call_cost": -0.5})
    with pytest.raises(ValueError, match="unknown reward terms"):
        r.with_weights(nope=1.0)


def test_reward_zero_weight_keeps_term_reported():
    r = Reward([ExactMatch(), (CallCost("search"), 0.0)])
    total, terms = r(event(action_type="search"))
    assert terms == {"exact_match": 0.0, "call_cost": 0.0}
    assert total == 0.0


def test_reward_duplicate_names_raise():
    with pytest.raises(ValueError, match="duplicate"):
        Reward([ExactMatch(), ExactMatch()])
    with pytest.raises(ValueError, match="duplicate"):
        Reward([CallCost("search"), CallCost("tool_call")])
    Reward([CallCost("search", name="search_cost"), CallCost("tool_call", name="tool_cost")])  # fine


def test_reward_unknown_weight_names_raise():
    with pytest.raises(ValueError, match="unknown reward terms"):
        Reward([ExactMatch()], weights={"f1": 1.0})
    with pytest.raises(ValueError):
        Reward({"em": ExactMatch()}, weights={"exact_match": 1.0})


def test_reward_repr():
    assert repr(Reward([ExactMatch(), (CallCost(), 0.05)])) == "Reward(exact_match×1, call_cost×0.05)"


# --------------------------------------------------------------------------- README example
# The README's new shaper, verbatim: a few lines, plugged into an env with reward=.
@shaper("brevity", terminal=True)            # terminal: 0 until the last step
def brevity(event):
    """Reward short final answers."""
    words = len((event.final_answer or "").split())
    return 1.0 if 0 < words <= 3 else 0.0


def test_readme_shaper_plugged_into_env():
    from agentgym.envs.arithmetic import ArithmeticEnv

    assert len(inspect.getsource(brevity.fn).splitlines()) <= 15
    env = agentgym.make("Arithmetic-v0", reward=ArithmeticEnv().default_reward().with_terms((brevity, 0.2)))
    assert env.unwrapped.reward.names == ["correct", "format", "tool_cost", "invalid", "brevity"]
    obs, info = env.reset(seed=0)
    gold = info["privileged"]["task"]["answers"][0]

    obs, r, terminated, truncated, info = env.step(f"<answer>{gold}")  # invalid: not terminal yet
    assert info["reward_terms"]["brevity"] == 0.0 and not terminated

    obs, r, terminated, truncated, info = env.step(f"<answer>{gold}</answer>")
    assert terminated and not truncated
    assert info["reward_terms"] == {"correct": 1.0, "format": pytest.approx(0.1), "tool_cost": 0.0, "invalid": 0.0,
                                    "brevity": pytest.approx(0.2)}
    assert r == pytest.approx(1.0 + 0.1 + 0.2)
    assert info["episode_summary"]["reward_terms"]["brevity"] == pytest.approx(0.2)
    assert info["episode_summary"]["return"] == pytest.approx(1.0 + 0.1 + 0.2 - 0.1)

    # a long final answer earns no brevity bonus
    env.reset(seed=0)
    *_, info = env.step(f"<answer>it is {gold} exactly</answer>")
    assert info["reward_terms"]["brevity"] == 0.0


def test_shaper_in_a_fresh_reward_via_gymnasium_make():
    @shaper("politeness", terminal=True)
    def politeness(event):
        return 1.0 if "please" in event.action.lower() else 0.0

    env = gym.make("agentgym/Arithmetic-v0", reward=Reward([ExactMatch(), (politeness, 0.5)]))
    obs, info = env.reset(seed=0)
    gold = info["privileged"]["task"]["answers"][0]
    obs, r, terminated, truncated, info = env.step("let me think")
    assert info["reward_terms"] == {"exact_match": 0.0, "politeness": 0.0} and r == 0.0
    obs, r, terminated, truncated, info = env.step(f"Please accept <answer>{gold}</answer>")
    assert terminated
    assert info["reward_terms"] == {"exact_match": 1.0, "politeness": 0.5}
    assert r == 1.5
    env.close()


def test_with_terms_appends_and_keeps_names_unique():
    r = Reward([ExactMatch()]).with_terms((CallCost("search"), 0.1), InvalidActionPenalty())
    assert r.weights == {"exact_match": 1.0, "call_cost": 0.1, "invalid": 1.0}
    with pytest.raises(ValueError, match="duplicate"):
        r.with_terms(ExactMatch())


# --------------------------------------------------------------------------- a shaper's bugs, named
@pytest.mark.parametrize("value, message", [
    (float("nan"), r"reward term 'bad' returned nan; a shaper must return a finite number"),
    (float("-inf"), r"reward term 'bad' returned -inf"),
    (None, r"reward term 'bad' returned None"),
    ("1", r"reward term 'bad' returned '1'"),             # float("1") used to pass a string through silently
    ([1.0], r"reward term 'bad' returned '\[1.0\]' \(list\)"),
])
def test_a_shaper_value_that_is_not_a_finite_number_names_the_term(value, message):
    @shaper("bad")
    def decorated(ev):
        return value

    class Plain:                      # a shaper that is not made by @shaper is held to the same rule
        name = "bad"

        def __call__(self, ev):
            return value

    for bad in (decorated, Plain()):
        with pytest.raises(ValueError, match=message):
            Reward([ExactMatch(), bad]).evaluate(event("x", done=True, answer="Paris"))


def test_shaper_values_that_are_numbers_of_any_kind_pass():
    import numpy as np
    import torch
    for value, expected in ((np.float32(0.5), 0.5), (torch.tensor(0.25), 0.25), (True, 1.0), (3, 3.0)):
        total, _, raw = Reward([shaper("v")(lambda ev, v=value: v)]).evaluate(event("x"))
        assert raw == {"v": expected} and total == expected and isinstance(total, float)


def test_an_exception_inside_a_shaper_names_the_term():
    @shaper("lookup")
    def lookup(ev):
        return ev.task["no_such_key"]

    with pytest.raises(KeyError, match=r"reward term 'lookup' raised KeyError: 'no_such_key'") as e:
        Reward([lookup]).evaluate(event("x"))
    assert isinstance(e.value.__cause__, KeyError)     # the original is chained, its traceback kept


@pytest.mark.parametrize("weight", ["abc", float("nan"), float("inf"), None, True])
def test_a_weight_that_is_not_a_finite_number_names_the_term(weight):
    with pytest.raises(ValueError, match=r"the weight of reward term 'exact_match' must be a finite number"):
        Reward([(ExactMatch(), weight)])
    with pytest.raises(ValueError, match=r"the weight of reward term 'exact_match' must be a finite number"):
        Reward([ExactMatch()], weights={"exact_match": weight})
