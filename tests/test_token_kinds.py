"""Typed token provenance (issue 17 §4): every trajectory token has a kind (prompt, policy, template,
tool, retrieved, env) next to ``loss_mask`` — set by the formatter, carried by the builder and the
rollout engine, checked by ``check_trajectory``, collated into ``Batch.kind`` and selectable with
``Batch.train_mask(kinds=...)``; trajectories from before kinds existed keep loading.

Real parts: the SmolLM2 tokenizer, ``ScriptedPolicy`` oracles through the ``RolloutEngine`` on
Arithmetic (calculator tool) and SearchQA (BM25 retrieval, both protocols)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from agentgym.algorithms.loop.batch import collate, kind_codes
from agentgym.envs.searchqa.env import SearchQAEnv
from agentgym.formatting import ChatFormatter, ContinuationFormatter, message_kind
from agentgym.policies.scripted import ScriptedPolicy
from agentgym.rollout_config import RolloutConfig
from agentgym.rollout import RolloutEngine
from agentgym.trajectory import (SAMPLED_KINDS, TOKEN_KINDS, TokenIds, Trajectory, TrajectoryBuilder,
                                 check_trajectory, kinds_from_mask)

from fixtures_llm import tok  # noqa: F401  (fixture)

CALC = {"role": "tool", "name": "calculator", "content": "79252"}
FEEDBACK = {"role": "user", "content": "Invalid action: use <answer>."}
PASSAGES = {"role": "user", "content": "\n\n<information>Doc 1(Title: \"Nanre\") Nanre is a city.\n</information>\n\n"}
SEARCH_TOOL = {"role": "tool", "name": "search", "content": "Doc 1(Title: \"Nanre\") Nanre is a city."}


def kind_text(tok, ids, kinds, kind: str) -> str:
    return tok.decode([t for t, k in zip(ids, kinds) if k == kind], skip_special_tokens=False)


# --------------------------------------------------------------------------- message kinds and formatters

def test_message_kinds():
    assert message_kind(CALC) == "tool"
    assert message_kind(FEEDBACK) == "env"
    assert message_kind(PASSAGES) == "retrieved"
    assert message_kind(SEARCH_TOOL) == "retrieved"  # SearchQA's chat protocol, ReAct's search / lookup
    assert message_kind({"role": "user", "content": "quote <information>x</information> here"}) == "env"
    assert message_kind({"role": "user", "content": "passages", "kind": "retrieved"}) == "retrieved"  # env's own label
    assert message_kind({"role": "tool", "content": "x", "kind": "policy"}) == "tool"  # never a sampled kind


def test_chat_kinds_cover_glue_and_each_message(tok):
    f = ChatFormatter(tok)
    reply = tok.encode("The answer is 4.", add_special_tokens=False)  # no EOS: the closing is glue
    ids = f.observation_ids(reply, [CALC, FEEDBACK, PASSAGES])
    assert isinstance(ids, TokenIds) and isinstance(ids, list) and len(ids.kinds) == len(ids)
    text = tok.decode(ids, skip_special_tokens=False)
    # the ids are exactly the plain encoding of the rendered text: kinds never change tokenization
    assert list(ids) == tok.encode(text, add_special_tokens=False)
    assert kind_text(tok, ids, ids.kinds, "tool") == "79252"
    assert kind_text(tok, ids, ids.kinds, "env") == FEEDBACK["content"]
    # a token that straddles template and message text takes the message's kind (the header's "\n"
    # merges with the passages' leading newlines)
    assert kind_text(tok, ids, ids.kinds, "retrieved").strip("\n") == PASSAGES["content"].strip("\n")
    glue = kind_text(tok, ids, ids.kinds, "template")
    assert glue.startswith("<|im_end|>\n<|im_start|>tool\n") and glue.endswith("<|im_start|>assistant\n")
    assert "79252" not in glue and "Invalid" not in glue
    assert ids[0] == tok.eos_token_id and ids.kinds[0] == "template"  # the closing of the policy's turn


def test_chat_kinds_with_a_trimming_template(tok):
    """Templates may change a message's text (trim it): the sentinel alignment still finds it."""
    trim = __import__("copy").copy(tok)
    trim.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] | trim }}<|im_end|>\n"
                          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    ids = ChatFormatter(trim).observation_ids([tok.eos_token_id], [{**CALC, "content": "  user  "}])
    assert kind_text(tok, ids, ids.kinds, "tool") == "user"  # not the role name in the header
    assert kind_text(tok, ids, ids.kinds, "template") == "\n<|im_start|>tool\n<|im_end|>\n<|im_start|>assistant\n"


def test_continuation_kinds(tok):
    f = ContinuationFormatter(tok)
    ids = f.observation_ids([5], [PASSAGES, {"role": "user", "content": " go on"}])
    assert list(ids) == tok.encode(PASSAGES["content"] + " go on", add_special_tokens=False)
    assert kind_text(tok, ids, ids.kinds, "retrieved") == PASSAGES["content"]
    assert kind_text(tok, ids, ids.kinds, "env") == " go on"
    assert f.observation_ids([5], []) == [] and f.observation_ids([5], []).kinds == []


# --------------------------------------------------------------------------- builder and serialisation

def test_builder_kinds_and_errors():
    b = TrajectoryBuilder([1, 2, 3], [])
    b.add_policy([4, 5], [-0.1, -0.2], "x", "eos")
    b.add_env(TokenIds([6, 7, 8], ["template", "tool", "template"]))
    b.add_policy([9], [-0.3], "y", "eos")
    b.add_env([10, 11], kinds=["template", "retrieved"])  # explicit kinds win
    b.add_env([12])  # plain ids from older code: env
    t = b.build()
    assert t.token_kinds == ["prompt"] * 3 + ["policy"] * 2 + ["template", "tool", "template", "policy",
                                                                 "template", "retrieved", "env"]
    assert [k in SAMPLED_KINDS for k in t.token_kinds] == [bool(m) for m in t.loss_mask]
    with pytest.raises(ValueError, match="kinds"):
        b.add_env([1, 2], kinds=["tool"])
    with pytest.raises(ValueError, match="cannot be of kind"):
        b.add_env([1], kinds=["policy"])
    with pytest.raises(ValueError, match="cannot be of kind"):
        b.add_env([1], kinds=["prompt"])
    with pytest.raises(ValueError, match="2 ids but 1 kinds"):
        TokenIds([1, 2], ["tool"])


def test_round_trip_and_old_files(tok):
    reply = tok.encode("hi there", add_special_tokens=False)
    assert len(reply) == 2
    b = TrajectoryBuilder([1, 2], [])
    b.add_policy(reply, [-0.5, -0.25], "hi there", "length")
    b.add_env(TokenIds([5, 6], ["template", "tool"]))
    t = b.build(episode={"success": True})
    d = json.loads(json.dumps(t.to_dict()))
    assert Trajectory.from_dict(d) == t and d["token_kinds"] == t.token_kinds
    old = {k: v for k, v in d.items() if k != "token_kinds"}  # a file written before kinds existed
    t_old = Trajectory.from_dict(old)
    assert t_old.token_kinds is None
    assert t_old.kinds() == kinds_from_mask(t_old.loss_mask, 2) == ["prompt", "prompt", "policy", "policy", "env", "env"]
    assert check_trajectory(t_old, tok) == [] and check_trajectory(t, tok) == []


# --------------------------------------------------------------------------- through the engine

def arithmetic_oracle(ctx):
    t = ctx["task"]
    if ctx["turn"] == 0:
        return '<tool_call>{"name": "calculator", "arguments": {"expression": "%s"}}</tool_call>' % t["expression"]
    return "<answer>%s</answer>" % t["answers"][0]


@pytest.fixture(scope="module")
def engine_trajectories(tok):
    out = {}
    for name, script, env, kwargs in [
            ("arithmetic", arithmetic_oracle, "Arithmetic-v0", {}),
            ("searchqa", SearchQAEnv.oracle, "SearchQA-v0", {"retriever": "bm25"}),
            ("searchqa-chat", SearchQAEnv.chat_oracle, "SearchQA-v0", {"retriever": "bm25", "protocol": "chat"})]:
        engine = RolloutEngine(ScriptedPolicy(tok, script), RolloutConfig(debug_checks=True))
        try:
            out[name] = engine.collect(env, num_groups=2, seed=1, env_kwargs=kwargs).trajectories
        finally:
            engine.close()
    return out


def test_engine_trajectories_carry_kinds(engine_trajectories, tok):
    for name, trajs in engine_trajectories.items():
        for t in trajs:
            assert check_trajectory(t, tok) == []  # kinds agree with the mask (debug_checks ran them too)
            assert t.token_kinds[: t.prompt_length] == ["prompt"] * t.prompt_length
            assert [k == "policy" for k in t.token_kinds] == [bool(m) for m in t.loss_mask]
    calc = [t for t in engine_trajectories["arithmetic"]]
    for t in calc:
        tool_out = next(m["content"] for m in t.messages if m["role"] == "tool")
        assert kind_text(tok, t.token_ids, t.token_kinds, "tool") == tool_out
        assert set(t.token_kinds) == {"prompt", "policy", "template", "tool"}
    for name in ("searchqa", "searchqa-chat"):
        for t in engine_trajectories[name]:
            retrieved = kind_text(tok, t.token_ids, t.token_kinds, "retrieved")
            obs = [m["content"] for m in t.messages[t.messages.index({"role": "assistant", "content": t.actions[0]}) + 1:]
                   if m["role"] != "assistant"]
            assert retrieved and "Doc 1(Title:" in retrieved and retrieved.strip("\n") == "".join(obs).strip("\n")
            assert "tool" not in t.token_kinds and "env" not in t.token_kinds


# --------------------------------------------------------------------------- check_trajectory

def test_check_trajectory_names_kind_and_logprob_faults(engine_trajectories, tok):
    t = engine_trajectories["arithmetic"][0]
    d = t.to_dict()
    (s0, e0), (s1, e1) = t.turn_spans

    def problems(**changes):
        return check_trajectory(Trajectory.from_dict({**d, **changes}), tok)

    kinds = list(d["token_kinds"])
    kinds[e0] = "policy"  # a glue token labelled as sampled
    assert problems(token_kinds=kinds) == [f"token kinds disagree with loss_mask (kind 'policy' exactly on the "
                                           f"policy spans) at positions {e0}"]
    kinds = list(d["token_kinds"])
    kinds[s0] = "tool"
    assert "disagree" in problems(token_kinds=kinds)[0]
    assert problems(token_kinds=kinds[:-1])[0].startswith("length mismatch")
    assert "unknown token kinds ['weird']" in problems(token_kinds=["weird"] + kinds[1:])[0]
    kinds = list(d["token_kinds"])
    kinds[e0] = "prompt"
    assert problems(token_kinds=kinds) == [f"kind 'prompt' is not exactly the first {t.prompt_length} tokens "
                                           f"(positions {e0})"]
    # log-probs: scripted policies report 0 everywhere (a deterministic policy): fine by default ...
    assert problems() == []
    assert problems() == check_trajectory(t, tok, require_logprobs=False) == []
    # ... missing when the caller says log-probs are required, or when other turns have real ones
    assert check_trajectory(t, tok, require_logprobs=True) == ["turns [0, 1] have no sampling log-probs (all exactly 0)"]
    lps = list(d["logprobs"])
    lps[s1:e1] = [-0.5] * (e1 - s1)
    assert problems(logprobs=lps) == ["turns [0] have no sampling log-probs (all exactly 0)"]
    lps[s0:e0] = [-0.1] * (e0 - s0)
    assert problems(logprobs=lps) == []
    bad = list(lps)
    bad[s0], bad[s0 + 1] = math.nan, 0.5
    assert problems(logprobs=bad) == [f"policy tokens without a valid sampling log-prob (finite, <= 0) at positions "
                                      f"{s0}, {s0 + 1}"]
    bad = list(lps)
    bad[e0] = -1.0  # a log-prob on an environment token: log-probs shifted against the ids
    assert problems(logprobs=bad) == [f"log-probs on tokens the policy did not sample at positions {e0}"]
    # prefix invariant: turns out of order (the second turn before the first) is not append-only
    swapped = problems(turn_spans=[(s1, e1), (s0, e0)], actions=[t.actions[1], t.actions[0]])
    assert any("starts before the previous turn" in p for p in swapped)


# --------------------------------------------------------------------------- Batch.kind and train_mask

def test_batch_kinds_and_train_mask(engine_trajectories, tok):
    trajs = engine_trajectories["arithmetic"] + engine_trajectories["searchqa"]
    old = Trajectory.from_dict({k: v for k, v in trajs[0].to_dict().items() if k != "token_kinds"})
    batch = collate(trajs + [old])
    assert batch.kind.dtype == torch.long and batch.kind.shape == batch.input_ids.shape
    for i, t in enumerate(trajs):
        n = len(t.token_ids)
        assert batch.kind[i, :n].tolist() == kind_codes(t.token_kinds)
        assert (batch.kind[i, n:] == -1).all()  # padding has no kind
    assert batch.kind[-1, : len(old.token_ids)].tolist() == kind_codes(old.kinds())  # derived for old files
    assert kind_codes(TOKEN_KINDS) == list(range(len(TOKEN_KINDS)))

    assert torch.equal(batch.train_mask(), batch.loss_mask)
    assert torch.equal(batch.train_mask(kinds=("policy",)), batch.loss_mask)
    assert torch.equal(batch.train_mask(False), batch.response_mask)
    # the ablation: policy tokens and tool outputs, never retrieved passages nor template glue
    code = {k: i for i, k in enumerate(TOKEN_KINDS)}
    ablation = batch.train_mask(mask_env_tokens=False, kinds=("policy", "tool"))
    expected = ((batch.kind == code["policy"]) | (batch.kind == code["tool"])).float()
    assert torch.equal(ablation, expected) and ablation.sum() > batch.loss_mask.sum()
    assert not ablation[batch.kind == code["retrieved"]].any() and not ablation[batch.kind == code["template"]].any()
    tool_only = batch.train_mask(mask_env_tokens=False, kinds=["tool"])
    assert tool_only.sum() == sum(t.token_kinds.count("tool") for t in trajs)
    # the rule: with mask_env_tokens=True only sampled kinds may be named
    with pytest.raises(ValueError, match=r"\['tool'\] are not sampled.*mask_env_tokens=False"):
        batch.train_mask(kinds=("policy", "tool"))
    with pytest.raises(ValueError, match="prompt tokens never carry loss"):
        batch.train_mask(mask_env_tokens=False, kinds=("prompt",))
    with pytest.raises(ValueError, match="unknown token kind 'tools'"):
        batch.train_mask(kinds=("tools",))
    # kinds travel with select / micro_batches
    piece = next(batch.micro_batches(2))
    assert torch.equal(piece.kind, batch.kind[:2, : piece.width])
    assert torch.equal(piece.train_mask(False, ("tool",)), tool_only[:2, : piece.width])
