"""OpenAIChatPolicy against a real OpenAI-compatible server (FastAPI + uvicorn) on loopback."""

from __future__ import annotations

import json
import socket
import time
from typing import Any, Callable, Iterator

import pytest

from agentgym.parsing import parse_tool_calls
from agentgym.policies.openai_policy import OpenAIChatPolicy
from agentgym.policy import ChatPolicy, SamplingParams
from agentgym.rollout_config import RolloutConfig
from agentgym.rollout import RolloutEngine

from helpers_openai_server import LoopbackServer, ScriptedChatServer

pytestmark = pytest.mark.timeout(30)

CALC_SPEC = {"type": "function", "function": {"name": "calculator", "description": "Evaluate arithmetic.",
                                              "parameters": {"type": "object",
                                                             "properties": {"expression": {"type": "string"}},
                                                             "required": ["expression"]}}}


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": "You are terse."}, {"role": "user", "content": text}]


@pytest.fixture(scope="session")
def server() -> Iterator[tuple[ScriptedChatServer, LoopbackServer]]:
    app = ScriptedChatServer()
    loop = LoopbackServer(app.app).start()
    try:
        yield app, loop
    finally:
        loop.stop()


@pytest.fixture
def make_policy(server, monkeypatch) -> Iterator[Callable[..., OpenAIChatPolicy]]:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    made: list[OpenAIChatPolicy] = []

    def make(model: str = "echo", **kwargs: Any) -> OpenAIChatPolicy:
        kwargs.setdefault("base_url", server[1].url + "/v1")
        kwargs.setdefault("backoff_s", 0.01)
        kwargs.setdefault("timeout_s", 10.0)
        p = OpenAIChatPolicy(model=model, **kwargs)
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()


def test_is_a_chat_policy_and_not_token_level(make_policy):
    p = make_policy()
    assert isinstance(p, ChatPolicy)
    assert not hasattr(p, "generate") and not hasattr(p, "tokenizer")  # the engine must take the chat path
    assert p.respond([], SamplingParams()) == []


def test_request_mapping_greedy_with_tools_and_stops(server, make_policy):
    app, _ = server
    p = make_policy("echo", api_key="sk-test-123", extra_body={"repetition_penalty": 1.1})
    sp = SamplingParams(max_new_tokens=17, greedy=True, temperature=0.3, stop=("</answer>", "STOP"), seed=7)
    before = len(app.requests_for("echo"))
    convs = [user("first mapping"), user("second mapping")]
    gens = p.respond(convs, sp, tools=[CALC_SPEC])
    assert [g.text for g in gens] == ["first mapping", "second mapping"]
    assert all(g.token_ids == [] and g.logprobs == [] for g in gens)
    assert [g.finish_reason for g in gens] == ["eos", "eos"]  # "stop" without a stop string = the model ended
    got = sorted(app.requests_for("echo")[before:], key=lambda r: r["body"]["messages"][-1]["content"])
    assert len(got) == 2
    for r, conv, seed in zip(got, convs, (7, 8)):
        b = r["body"]
        assert b["model"] == "echo"
        assert b["max_tokens"] == 17
        assert b["temperature"] == 0.0 and b["top_p"] == 1.0
        assert b["stop"] == ["</answer>", "STOP"]
        assert b["seed"] == seed  # per-conversation seeds: a GRPO group's copies must not all sample alike
        assert b["tools"] == [CALC_SPEC]
        assert b["repetition_penalty"] == 1.1
        assert b["messages"] == conv
        assert "top_k" not in b
        assert r["headers"]["authorization"] == "Bearer sk-test-123"
    assert gens[0].meta["usage"]["completion_tokens"] == 2
    assert gens[0].meta["usage"]["prompt_tokens"] == 5
    assert gens[0].meta["finish_reason_raw"] == "stop" and gens[0].meta["attempts"] == 1


def test_request_mapping_sampling_defaults_env_key_and_extra_body_removal(server, make_policy, monkeypatch):
    app, _ = server
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    p = make_policy("echo", extra_body={"max_tokens": None, "max_completion_tokens": 9})
    before = len(app.requests_for("echo"))
    [g] = p.respond([user("sampling defaults")], SamplingParams(temperature=0.7, top_p=0.9, top_k=20))
    assert g.text == "sampling defaults"
    [r] = app.requests_for("echo")[before:]
    b = r["body"]
    assert b["temperature"] == 0.7 and b["top_p"] == 0.9 and b["top_k"] == 20
    assert "max_tokens" not in b and b["max_completion_tokens"] == 9
    assert not {"stop", "seed", "tools"} & set(b)
    assert r["headers"]["authorization"] == "Bearer sk-from-env"

    monkeypatch.delenv("OPENAI_API_KEY")
    q = make_policy("echo")
    q.respond([user("no key")], SamplingParams())
    assert "authorization" not in app.requests_for("echo")[-1]["headers"]


def test_batch_runs_concurrently_and_returns_in_order(server, make_policy):
    app, _ = server
    p = make_policy("echo", concurrency=3)
    delays = [0.4, 0.3, 0.2, 0.1, 0.05, 0.0]  # early conversations finish last
    convs = [user(f"[delay={d}] reply {i}") for i, d in enumerate(delays)]
    app.reset_peak()
    t0 = time.perf_counter()
    gens = p.respond(convs, SamplingParams(greedy=True))
    wall = time.perf_counter() - t0
    assert [g.text for g in gens] == [f"reply {i}" for i in range(len(delays))]
    assert 2 <= app.peak_in_flight <= 3  # concurrent, but never more than `concurrency`
    assert wall < sum(delays)


def test_server_stops_are_restored_and_the_rest_cut_client_side(server, make_policy):
    app, _ = server
    p = make_policy("echo")
    stops = ("S1", "S2", "S3", "S4", "<end>", "zz")
    before = len(app.requests_for("echo"))
    gens = p.respond([user("one two <end> three S4 four"),   # S4 cut by the server, <end> earlier: client cut
                      user("alpha S3 beta <end>"),            # S3 ends it on the server, restored
                      user("x y zz w"),                       # only a client-side stop
                      user("nothing to see"),                 # no stop at all: the model ended (EOS)
                      user("a b c d e f")],                   # max_tokens
                     SamplingParams(max_new_tokens=4, stop=stops))
    assert [g.text for g in gens] == ["one two <end>", "alpha S3", "x y zz", "nothing to see", "a b c d"]
    assert [g.finish_reason for g in gens] == ["stop", "stop", "stop", "eos", "length"]
    for r in app.requests_for("echo")[before:]:
        assert r["body"]["stop"] == ["S1", "S2", "S3", "S4"]  # OpenAI's limit of 4

    [g] = p.respond([user("a b zz c d e")], SamplingParams(max_new_tokens=4, stop=stops))
    assert (g.text, g.finish_reason) == ("a b zz", "stop")  # a stop inside a length-capped reply wins


def test_stop_string_inferred_when_the_server_does_not_name_it(make_policy):
    p = make_policy("echo-openai")
    sp = SamplingParams(stop=("</tool_call>", "</answer>"))
    gens = p.respond([user("I think <answer>42</answer> is right"), user("just words"),
                      user("<answer>1</answer> then <answer>2</answer>")], sp)
    assert [g.text for g in gens] == ["I think <answer>42</answer>", "just words", "<answer>1</answer>"]
    assert [g.finish_reason for g in gens] == ["stop", "eos", "stop"]
    assert "stop_reason" not in gens[0].meta


def test_native_tool_calls_rendered_as_hermes_blocks(make_policy):
    p = make_policy("tools")
    [g] = p.respond([user("call tools")], SamplingParams(), tools=[CALC_SPEC])
    assert g.text == ('<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>\n'
                      '<tool_call>{"name": "lookup", "arguments": "{not json"}</tool_call>')
    assert g.finish_reason == "eos"
    parsed = parse_tool_calls(g.text)  # what an env sees: the good call, and the model's broken JSON as an error
    assert [(c.name, c.arguments) for c in parsed.calls] == [("calculator", {"expression": "6*7"})]
    assert len(parsed.errors) == 1 and "not valid JSON" in parsed.errors[0]
    assert [c["id"] for c in g.meta["tool_calls"]] == ["call_a", "call_b"]

    [g] = p.respond([user("call tools")], SamplingParams(stop=("</tool_call>",)), tools=[CALC_SPEC])
    assert g.text == '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'
    assert g.finish_reason == "stop"  # as a token policy with this stop string would have ended


def test_tool_history_is_sent_as_structured_tool_calls(server, make_policy):
    app, _ = server
    conv = [*user("What is 12345 * 678?"),
            {"role": "assistant", "content": 'Let me compute. <tool_call>{"name": "calculator", '
                                             '"arguments": {"expression": "12345 * 678"}}</tool_call>'},
            {"role": "tool", "name": "calculator", "content": "8369910"}]
    p = make_policy("arithmetic")
    [g] = p.respond([conv], SamplingParams(stop=("</answer>",)), tools=[CALC_SPEC])
    assert (g.text, g.finish_reason) == ("<answer>8369910</answer>", "stop")
    sent = app.requests_for("arithmetic")[-1]["body"]["messages"]
    assert sent[:2] == conv[:2]
    assert sent[2] == {"role": "assistant", "content": "Let me compute.", "tool_calls": [
        {"id": "call_2_0", "type": "function",
         "function": {"name": "calculator", "arguments": json.dumps({"expression": "12345 * 678"})}}]}
    assert sent[3] == {"role": "tool", "tool_call_id": "call_2_0", "content": "8369910"}

    # as plain text, a strict server rejects the tool message; the error is the operator's, so it raises
    plain = make_policy("arithmetic", structured_tool_history=False)
    with pytest.raises(RuntimeError, match=r"HTTP 400: messages with role 'tool' must be a response"):
        plain.respond([conv], SamplingParams(), tools=[CALC_SPEC])


def test_retry_on_503_then_success(server, make_policy):
    app, _ = server
    p = make_policy("flaky", max_retries=3, extra_body={"fail_key": "503-twice", "fail_times": 2, "fail_status": 503})
    [g] = p.respond([user("made it")], SamplingParams())
    assert g.text == "made it" and g.meta["attempts"] == 3
    assert app.failures["503-twice"] == 3

    q = make_policy("flaky", max_retries=2, extra_body={"fail_key": "429-once", "fail_times": 1, "fail_status": 429})
    [g] = q.respond([user("after rate limit")], SamplingParams())
    assert g.text == "after rate limit" and g.meta["attempts"] == 2


def test_retries_are_bounded(server, make_policy):
    app, loop = server
    p = make_policy("flaky", max_retries=1, extra_body={"fail_key": "503-always", "fail_times": 99, "fail_status": 503})
    with pytest.raises(RuntimeError) as err:
        p.respond([user("never")], SamplingParams())
    msg = str(err.value)
    assert f"{loop.url}/v1/chat/completions" in msg and "2 attempt(s)" in msg
    assert "HTTP 503" in msg and "overloaded (attempt 2)" in msg
    assert app.failures["503-always"] == 2


def test_connection_refused_raises_after_retries(make_policy):
    with socket.socket() as s:  # bound but not listening: connections are refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        p = make_policy("echo", base_url=f"http://127.0.0.1:{port}/v1", max_retries=2)
        t0 = time.perf_counter()
        with pytest.raises(RuntimeError, match=rf"127\.0\.0\.1:{port}/v1/chat/completions failed after 3 attempt\(s\).*connection error"):
            p.respond([user("hello?")], SamplingParams())
        assert time.perf_counter() - t0 < 5


def test_http_400_is_not_retried_and_names_the_server_message(server, make_policy):
    app, loop = server
    p = make_policy("no-such-model", max_retries=3)
    with pytest.raises(RuntimeError) as err:
        p.respond([user("hi")], SamplingParams())
    msg = str(err.value)
    assert f"POST {loop.url}/v1/chat/completions" in msg
    assert "HTTP 400" in msg and "The model `no-such-model` does not exist." in msg
    assert len(app.requests_for("no-such-model")) == 1


def test_http_404_on_a_wrong_base_url(server, make_policy):
    _, loop = server
    p = make_policy("echo", base_url=loop.url, max_retries=3)  # forgot the /v1
    with pytest.raises(RuntimeError, match=rf"POST {loop.url}/chat/completions failed with HTTP 404: Not Found"):
        p.respond([user("hi")], SamplingParams())


def test_malformed_json_reply(make_policy):
    p = make_policy("malformed")
    with pytest.raises(RuntimeError, match=r"HTTP 200 with a body that is not JSON: '<html>502 Bad Gateway</html>'"):
        p.respond([user("hi")], SamplingParams())


def test_timeout_on_a_slow_endpoint(server, make_policy):
    app, loop = server
    p = make_policy("echo", timeout_s=0.2, max_retries=1)
    before = len(app.requests_for("echo"))
    t0 = time.perf_counter()
    with pytest.raises(RuntimeError) as err:
        p.respond([user("[delay=1.0] too slow")], SamplingParams())
    assert time.perf_counter() - t0 < 1.0  # gave up before the server answered
    msg = str(err.value)
    assert f"{loop.url}/v1/chat/completions" in msg and "timed out after 0.2 s" in msg and "2 attempt(s)" in msg
    assert len(app.requests_for("echo")) - before == 2


def test_one_failure_fails_the_batch(make_policy):
    p = make_policy("echo", timeout_s=0.2, max_retries=0, concurrency=2)
    with pytest.raises(RuntimeError, match="timed out"):
        p.respond([user("fine"), user("[delay=1.0] slow"), user("fine too")], SamplingParams())


def test_rollout_engine_end_to_end_on_arithmetic(server, make_policy):
    app, _ = server
    before = len(app.requests_for("arithmetic"))
    engine = RolloutEngine(make_policy("arithmetic", concurrency=4), RolloutConfig(sampling=SamplingParams(seed=0)))
    try:
        batch = engine.collect("Arithmetic-v0", num_groups=4, seed=0)
    finally:
        engine.close()
    m = batch.metrics
    assert m["episodes"] == 4.0
    assert m["success_rate"] == 1.0
    assert m["invalid_actions_mean"] == 0.0
    assert 0 < m["tool_calls_mean"] < 1  # both paths ran: direct answers and a native tool call round trip
    for t in batch.trajectories:
        assert t.token_ids == [] and t.loss_mask == [] and t.logprobs == []
        assert t.messages[0]["role"] == "system" and t.messages[-1]["role"] == "assistant"
        assert t.actions[-1].startswith("<answer>") or t.actions[-1].startswith("Easy. <answer>")
        assert t.actions[-1].endswith("</answer>")
        assert t.reward_terms[-1]["correct"] == 1.0 and t.total_reward > 0
        assert [bool(terms.get("tool_cost")) for terms in t.reward_terms][:-1] == [True] * t.episode["tool_calls"]
        assert len(t.step_rewards) == t.num_turns == t.episode["turns"]
    reqs = app.requests_for("arithmetic")[before:]
    assert len(reqs) == sum(t.num_turns for t in batch.trajectories)
    assert all(r["body"]["stop"] == ["</tool_call>", "</answer>"] for r in reqs)
    assert all(r["body"]["tools"][0]["function"]["name"] == "calculator" for r in reqs)


@pytest.mark.parametrize("url", ["notaurl", "127.0.0.1:8000/v1", "ftp://host/v1", "http://", ""])
def test_a_base_url_without_scheme_and_host_is_refused_at_once(url):
    with pytest.raises(ValueError, match="base_url must start with http:// or https:// and a host"):
        OpenAIChatPolicy(base_url=url, model="m")
    with pytest.raises(ValueError):
        OpenAIChatPolicy.from_spec(f"openai:m@{url}")
