"""The real SmolLM2-135M-Instruct plays every built-in env end to end through the CLI.

This is the "done when" of the env issues, kept true in CI: ``agentgym eval ENV --policy smollm2``
runs whole episodes (model → env → model …) with the in-process retriever and, for SearchQA, with
a retrieval server started the way a user starts it (``agentgym retriever serve bundled``).
A 135M model rarely solves these tasks; what is checked is that the loop is complete and
token-faithful: every policy span decodes back to the assistant message the env received, env
tokens are masked, and the episode's reward is the sum of its step rewards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from agentgym.app.cli import main
from agentgym.policies.models import load_tokenizer

# Turn limits trimmed (the envs' own defaults are 4-10 turns) to keep CI time in check; every
# episode still crosses at least one model -> env -> model boundary.
ENVS = {"Arithmetic-v0": [], "Math-v0": [], "SearchQA-v0": ["-e", "max_turns=2"],
        "ToolCall-v0": ["-e", "max_turns=3"], "ReAct-v0": ["-e", "max_turns=3"],
        "CodeExec-v0": ["-e", "max_attempts=2"]}


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("smollm2")


def _eval(tmp_path: Path, env: str, *extra: str, episodes: int = 1, tokens: int = 24) -> dict:
    out = tmp_path / f"{env.replace('/', '_')}.json"
    rc = main(["eval", f"agentgym/{env}", "--policy", "smollm2", "--episodes", str(episodes),
               "--max-new-tokens", str(tokens), "--seed", "0", "--json", str(out), *extra])
    assert rc == 0
    return json.loads(out.read_text())


def _check_faithful(traj: dict, tokenizer) -> None:
    ids, mask = traj["token_ids"], traj["loss_mask"]
    assert len(ids) == len(mask) == len(traj["logprobs"])
    assert traj["turn_spans"], "the model never acted"
    assistant = [m["content"] for m in traj["messages"] if m["role"] == "assistant"]
    assert len(assistant) == len(traj["turn_spans"])
    for (start, end), text in zip(traj["turn_spans"], assistant):
        assert all(mask[start:end]), "a sampled token is masked out of the loss"
        assert tokenizer.decode(ids[start:end], skip_special_tokens=True).strip() == text.strip()
    policy_tokens = sum(e - s for s, e in traj["turn_spans"])
    assert sum(mask) == policy_tokens, "an env token is in the loss"
    assert traj["episode"]["return"] == pytest.approx(sum(traj["step_rewards"]))


@pytest.mark.parametrize("env", sorted(ENVS))
def test_smollm2_plays_env_from_cli(env, tmp_path, tokenizer):
    data = _eval(tmp_path, env, "--greedy", *ENVS[env])
    assert data["metrics"]["episodes"] == 1 and data["metrics"]["generated_tokens"] > 0
    (traj,) = data["trajectories"]
    assert traj["env_id"] == f"agentgym/{env}"
    assert traj["terminated"] or traj["truncated"]
    _check_faithful(traj, tokenizer)


def test_smollm2_plays_searchqa_through_the_retrieval_server(tmp_path, tokenizer):
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    # --port 0: the server binds a free port itself and prints it (no free-port-then-bind race with other tests)
    server = subprocess.Popen([sys.executable, "-m", "agentgym.app.cli", "retriever", "serve", "bundled",
                               "--port", "0"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
    watchdog = threading.Timer(300, server.kill)   # a hung start ends the test instead of blocking it
    watchdog.start()
    try:
        lines = []
        while not (lines and " on http://127.0.0.1:" in lines[-1]):
            line = server.stdout.readline()
            assert line, "the retrieval server ended before serving:\n" + "".join(lines)
            lines.append(line)
        watchdog.cancel()
        threading.Thread(target=server.stdout.read, daemon=True).start()   # drained: a full pipe would block it
        url = lines[-1].split(" on ", 1)[1].split()[0].removesuffix("/retrieve")
        health = httpx.get(url + "/health", timeout=30).json()
        assert health["requests"] == 0
        # Sampled (not greedy) so that over a few episodes the model does emit <search> now and then.
        data = _eval(tmp_path, "SearchQA-v0", "-e", f"retriever={url}", "-e", "max_turns=2",
                     "--temperature", "1.0", episodes=2, tokens=24)
        searches = 0
        for traj in data["trajectories"]:
            _check_faithful(traj, tokenizer)
            searches += traj["episode"]["searches"]
        health = httpx.get(url + "/health", timeout=10).json()
        # Every search the model made went to the server, and nothing else did.
        assert health["requests"] == searches
    finally:
        server.terminate()
        server.wait(timeout=30)
