"""Infrastructure failures are not the policy's: the episode is marked and kept out of the baselines and the loss.

Real components: a real HTTP retrieval server on loopback (Search-R1's wire format) that answers 500 to
every 5th request, the real SearchQA env with the real RemoteRetriever, a real tiny transformers model
trained by the real Trainer.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import gymnasium as gym
import httpx
import pytest

import agentgym
from agentgym import AgentEnv
from agentgym.core import Transition
from agentgym.errors import InfraError
from agentgym.tools import Tool, ToolSet


class _Flaky(BaseHTTPRequestHandler):
    """Search-R1's /retrieve; every 5th request (20 %) answers HTTP 500."""
    count = 0
    lock = threading.Lock()

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with _Flaky.lock:
            _Flaky.count += 1
            fail = _Flaky.count % 5 == 0
        if fail:
            payload, status = {"detail": "index shard unavailable"}, 500
        else:
            payload, status = {"result": [[{"document": {"id": str(i), "contents": f'"Doc {i}"\nabout {q}'},
                                            "score": 1.0 - i / 10} for i in range(body.get("topk", 3))]
                                          for q in body["queries"]]}, 200
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def flaky_url():
    _Flaky.count = 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Flaky)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/retrieve"
    server.shutdown()
    server.server_close()


def test_a_failing_retriever_marks_the_episode_without_a_traceback(flaky_url):
    from agentgym.envs.services.retrieval.remote import RemoteRetriever, RetrieverUnavailable
    assert issubclass(RetrieverUnavailable, InfraError)
    env = agentgym.make("SearchQA-v0", retriever=RemoteRetriever(flaky_url, max_retries=0), max_turns=4)
    marked = normal = 0
    for episode in range(6):
        env.reset(seed=episode)
        for turn in range(3):
            obs, reward, terminated, truncated, info = env.step(f"<search>query {episode}-{turn}</search>")
            if "infra_error" in info:
                marked += 1
                assert truncated and not terminated and "HTTP 500" in info["infra_error"]
                assert "Infrastructure error, not your fault" in obs[0]["content"]
                assert info["episode_summary"]["infra_error"] == info["infra_error"]
                assert info["action_type"] == "infra_error"
                break
            normal += 1
            assert "Doc 0" in obs[-1]["content"]
            if terminated or truncated:
                assert info["episode_summary"]["infra_error"] is None
                break
    assert marked >= 2 and normal >= 8      # every 5th request failed, the rest searched normally


def test_tools_pass_infra_errors_through_and_keep_policy_errors_as_observations():
    def backend_down(x: int) -> str:
        raise InfraError("sandbox daemon gone")

    def bug(x: int) -> str:
        raise KeyError("no such row")

    tools = ToolSet([Tool.from_function(backend_down), Tool.from_function(bug)])
    with pytest.raises(InfraError, match="daemon gone"):
        tools.call("backend_down", {"x": 1})
    result = tools.call("bug", {"x": 1})
    assert not result.ok and result.error == "exception" and "no such row" in result.content


def test_sandbox_failures_are_infrastructure_failures():
    from agentgym.envs.services.sandbox import SandboxError
    assert issubclass(SandboxError, InfraError)


class FlakyServiceEnv(AgentEnv):
    """Each action is sent to a service (the flaky server); its 5xx is an infrastructure error."""
    num_tasks = 8
    url = ""

    def get_task(self, index):
        return {"n": index}

    def initial_messages(self, task):
        return [{"role": "user", "content": f"Say a number near {task['n']}."}]

    def transition(self, action):
        r = httpx.post(self.url, json={"queries": [action[:50]], "topk": 1})
        if r.status_code >= 500:
            raise InfraError(f"service answered HTTP {r.status_code}")
        return Transition([], "answer", terminated=True, answer=action, info={})

    def default_reward(self):
        from agentgym.rewards import Reward, shaper

        @shaper("length")
        def length(event):   # a reward that varies inside a group, so GRPO has advantages to compute
            return min(len(event.action), 20) / 20

        return Reward([length])


def test_marked_episodes_never_reach_the_loss(tmp_path, flaky_url):
    from agentgym.algorithms.loop.events import TrainerEvents
    from agentgym.algorithms.loop.train_config import TrainConfig
    from agentgym.algorithms.loop.trainer import Trainer
    from agentgym.config import load_config

    FlakyServiceEnv.url = flaky_url
    env_id = agentgym.register("FlakyService-v0", entry_point=FlakyServiceEnv)
    try:
        cfg = load_config(TrainConfig, overrides=[
            "model=tiny-random", "algo=grpo", "env=FlakyService-v0", "env_kwargs={}", "groups_per_step=4",
            "group_size=4", "steps=1", "sampling.max_new_tokens=6", "eval.episodes=2", "learner.micro_batch_size=8",
            "tensorboard=false", "eval.env_kwargs={}", f"output_dir={tmp_path / 'run'}"])
        logged: list[str] = []
        batches: list[list] = []

        class KeepBatches(TrainerEvents):
            def step_done(self, trainer, batch, row):
                batches.append(list(batch.trajectories))
        trainer = Trainer(cfg, log=logged.append, events=[KeepBatches()])
        seen: list[list] = []
        update = trainer.learner.update
        trainer.learner.update = lambda trajectories: (seen.append(list(trajectories)), update(trajectories))[1]
        history = trainer.train()["history"]
    finally:
        del gym.registry[env_id]
    marked_total = 0
    for batch, trained, row in zip(batches, seen, history):
        marked = [t for t in batch if t.episode.get("infra_error")]
        marked_total += len(marked)
        assert row["rollout/infra_errors"] == len(marked)
        assert not any(t.episode.get("infra_error") for t in trained)
        # exactly the rest, in order: the group baselines are those of a batch without the marked episodes
        assert [id(t) for t in trained] == [id(t) for t in batch if not t.episode.get("infra_error")]
    assert marked_total >= 2          # 16 episodes, every 5th service call failed
    assert any("infrastructure error, left out of the baselines and the loss" in line for line in logged)


def test_an_eval_neither_passes_nor_fails_an_episode_a_service_failure_ended(flaky_url):
    """Held-out metrics leave marked episodes out of every rate and count them apart (issue 23)."""
    from agentgym.app.eval_run import EvalRunConfig, evaluate
    from agentgym.policies.scripted import ScriptedPolicy
    from agentgym.rollout_metrics import summarize
    from fixtures_llm import cached_tokenizer

    FlakyServiceEnv.url = flaky_url
    env_id = agentgym.register("FlakyServiceEval-v0", entry_point=FlakyServiceEnv)
    try:
        policy = ScriptedPolicy(cached_tokenizer(), ["a reply of twenty chars"])
        result = evaluate(policy, EvalRunConfig(episodes=10, group_size=1, batch_size=10), env_id)
    finally:
        del gym.registry[env_id]
    marked = [t for t in result.trajectories if t.episode.get("infra_error")]
    clean = [t for t in result.trajectories if not t.episode.get("infra_error")]
    assert len(marked) == 2 and len(clean) == 8            # every 5th service call failed
    assert result.metrics["episodes"] == 10 and result.metrics["infra_errors"] == 2
    assert result.metrics["reward_mean"] == pytest.approx(1.0)   # the clean episodes' reward, not diluted by 2 zeros
    assert result.std["reward_mean"] == pytest.approx(0.0)
    everything_failed = summarize(marked)
    assert everything_failed["infra_errors"] == 2 and everything_failed["success_rate"] != everything_failed["success_rate"]


class ServiceDownEnv(AgentEnv):
    """Every action goes to a service that is down while ``down`` is set (a sandbox daemon, a retrieval server)."""
    num_tasks = 8
    down = True

    def get_task(self, index):
        return {"n": index}

    def initial_messages(self, task):
        return [{"role": "user", "content": f"Say a number near {task['n']}."}]

    def transition(self, action):
        if ServiceDownEnv.down:
            raise InfraError("retrieval server http://10.0.0.9:8000/retrieve failed after 4 attempt(s): ConnectError")
        return Transition([], "answer", terminated=True, answer=action, info={})

    def default_reward(self):
        from agentgym.rewards import Reward, shaper

        @shaper("length")
        def length(event):
            return min(len(event.action), 20) / 20

        return Reward([length])


def test_a_service_down_for_whole_steps_stops_the_run_checkpointed_and_resume_finishes_it(tmp_path):
    """Steps whose every episode an outage ended train nothing; after health.max_outage_steps of them in a row
    the run stops with ServiceOutage and a checkpoint, instead of spending its whole budget on nothing, and
    --resume finishes it once the service is back."""
    from agentgym.algorithms.loop.run_control import ServiceOutage
    from agentgym.algorithms.loop.train_config import TrainConfig
    from agentgym.algorithms.loop.trainer import Trainer
    from agentgym.algorithms.loop.run_control import latest_checkpoint
    from agentgym.config import load_config

    env_id = agentgym.register("ServiceDown-v0", entry_point=ServiceDownEnv)
    overrides = ["model=tiny-random", "algo=grpo", "env=ServiceDown-v0", "env_kwargs={}", "groups_per_step=2",
                 "group_size=2", "steps=5", "sampling.max_new_tokens=4", "eval.episodes=2", "tensorboard=false",
                 "eval.env_kwargs={}", "health.max_outage_steps=2", f"output_dir={tmp_path / 'run'}"]
    try:
        ServiceDownEnv.down = True
        logged: list[str] = []
        trainer = Trainer(load_config(TrainConfig, overrides=overrides), log=logged.append)
        with pytest.raises(ServiceOutage) as stop:
            trainer.train()
        assert stop.value.step == 2 and stop.value.checkpoint == latest_checkpoint(tmp_path / "run")
        assert stop.value.checkpoint.name == "step_000002"
        assert str(stop.value).startswith("every episode of the last 2 steps ended on an infrastructure error, so "
                                          "nothing was trained (last: InfraError: retrieval server http://10.0.0.9:8000")
        assert "health.max_outage_steps=2" in str(stop.value)
        ServiceDownEnv.down = False      # the service is back: the run goes on from step 2 to the end
        result = Trainer(load_config(TrainConfig, overrides=overrides), log=logged.append).train(resume=True)
    finally:
        del gym.registry[env_id]
        ServiceDownEnv.down = True
    steps = [int(row["step"]) for row in result["history"]]
    assert steps == [1, 2, 3, 4, 5]
    assert [row["rollout/infra_errors"] for row in result["history"]] == [4, 4, 0, 0, 0]
    # health is the policy's, over the episodes trained on: an outage step has none, and raises no alarm
    assert not any(k.startswith("health/") for k in result["history"][0]) and "health/response_tokens" in result["history"][2]


def test_max_outage_steps_zero_never_stops_and_a_partial_outage_does_not_count(tmp_path):
    from agentgym.algorithms.loop.health import HealthConfig
    from agentgym.algorithms.loop.train_config import TrainConfig
    from agentgym.algorithms.loop.trainer import Trainer
    from agentgym.config import load_config
    with pytest.raises(ValueError, match="max_outage_steps must be >= 0"):
        HealthConfig(max_outage_steps=-1)
    env_id = agentgym.register("ServiceDown-v1", entry_point=ServiceDownEnv)
    try:
        ServiceDownEnv.down = True
        cfg = load_config(TrainConfig, overrides=[
            "model=tiny-random", "algo=grpo", "env=ServiceDown-v1", "env_kwargs={}", "groups_per_step=2",
            "group_size=2", "steps=3", "sampling.max_new_tokens=4", "eval.episodes=2", "tensorboard=false",
            "eval.env_kwargs={}", "health.max_outage_steps=0", f"output_dir={tmp_path / 'run'}"])
        result = Trainer(cfg, log=lambda _: None).train()
    finally:
        del gym.registry[env_id]
    assert [row["rollout/infra_errors"] for row in result["history"]] == [4, 4, 4]
    # a step with one clean episode breaks the run of outage steps (the count is of steps in a row)
    trainer = Trainer.__new__(Trainer)
    trainer.dist, trainer._outage_steps = None, 1
    trainer.cfg = load_config(TrainConfig, overrides=["health.max_outage_steps=2"])
    trainer._check_outage([object(), object()], 1)
    assert trainer._outage_steps == 0


DOWN_PLUGIN = '''
import os

import agentgym
from agentgym import AgentEnv, Transition
from agentgym.errors import InfraError


class Down(AgentEnv):
    num_tasks = 4

    def get_task(self, index):
        return {"n": index}

    def initial_messages(self, task):
        return [{"role": "user", "content": "Say something."}]

    def transition(self, action):
        if os.environ.get("SERVICE_BACK"):
            return Transition([], "answer", terminated=True, answer=action)
        raise InfraError("sandbox daemon unreachable")

    def default_reward(self):
        from agentgym.rewards import ExactMatch, Reward
        return Reward([ExactMatch()])


agentgym.register("Down-v0", entry_point=Down)
'''


def test_train_command_says_the_outage_and_how_to_go_on(tmp_path):
    """As a user sees it: one error line naming the outage, the checkpoint, and the command that continues."""
    import os
    import subprocess
    import sys
    (tmp_path / "down_plugin.py").write_text(DOWN_PLUGIN)
    r = subprocess.run([sys.executable, "-m", "agentgym.app.cli", "--import", "down_plugin", "--threads", "1", "train",
                        "model=tiny-random", "env=Down-v0", "env_kwargs={}", "eval.env_kwargs={}", "steps=6",
                        "groups_per_step=2", "group_size=2", "sampling.max_new_tokens=4", "eval.episodes=2",
                        "health.max_outage_steps=3", "output_dir=out"], capture_output=True, text=True, timeout=600,
                       cwd=tmp_path, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-1500:]
    lines = r.stderr.strip().splitlines()
    assert lines[-2].startswith("error: every episode of the last 3 steps ended on an infrastructure error, so nothing "
                                "was trained (last: InfraError: sandbox daemon unreachable); the run stopped at step 3")
    assert lines[-2].endswith(f"checkpoint {os.path.join('out', 'checkpoints', 'step_000003')}. Once the service is "
                              "back, continue with:")
    assert lines[-1].strip() == "agentgym --import down_plugin --threads 1 train model=tiny-random env=Down-v0 " \
        "'env_kwargs={}' 'eval.env_kwargs={}' steps=6 groups_per_step=2 group_size=2 sampling.max_new_tokens=4 " \
        "eval.episodes=2 health.max_outage_steps=3 output_dir=out --resume"
    assert (tmp_path / "out" / "checkpoints" / "step_000003").is_dir()
    assert r.stdout.count("episodes ended on an infrastructure error") == 3
    assert "[health]" not in r.stdout   # 3 steps with no scored episode: an outage, not a "no signal" collapse


def test_compare_stops_on_an_outage_and_its_printed_command_finishes_the_comparison(tmp_path):
    import os
    import shlex
    import subprocess
    import sys
    (tmp_path / "down_plugin.py").write_text(DOWN_PLUGIN)
    argv = ["--import", "down_plugin", "--threads", "1", "compare", "--env", "Down-v0", "--algos", "grpo", "--seeds",
            "1", "--steps", "3", "model=tiny-random", "env_kwargs={}", "eval.env_kwargs={}", "groups_per_step=2",
            "group_size=2", "sampling.max_new_tokens=4", "eval.episodes=2", "health.max_outage_steps=2"]
    env = {k: v for k, v in os.environ.items() if k != "SERVICE_BACK"}
    r = subprocess.run([sys.executable, "-m", "agentgym.app.cli", *argv], capture_output=True, text=True,
                       timeout=600, cwd=tmp_path, env=env)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-1500:]
    said, command = r.stderr.strip().splitlines()[-2:]
    assert said.startswith("error: every episode of the last 2 steps ended on an infrastructure error") and \
        said.endswith("Once the service is back, continue with:")
    words = shlex.split(command)
    assert words[0] == "agentgym" and words[-1] == "--resume" and "--out" in words
    out = tmp_path / words[words.index("--out") + 1]
    assert (out / "grpo" / "seed0" / "checkpoints" / "step_000002").is_dir()
    # the service is back: the printed command goes on from step 2 and writes the report
    r = subprocess.run([sys.executable, "-m", "agentgym.app.cli", *words[1:]], capture_output=True, text=True,
                       timeout=600, cwd=tmp_path, env={**env, "SERVICE_BACK": "1"})
    assert r.returncode == 0, r.stderr[-1500:]
    assert "going on from step_000002" in r.stdout + r.stderr and (out / "compare.md").is_file()
