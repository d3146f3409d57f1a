"""One sandbox per node for env actors (issue 25): env actors on a node share the node's sandbox
service (a named detached Ray actor) instead of each starting a pool of their own. Real local Ray
cluster (tests/conftest.py), real bwrap, real CodeExec env."""
from __future__ import annotations

import pytest

ray = pytest.importorskip("ray", reason="ray not installed: bash scripts/setup.sh installs it")

pytestmark = pytest.mark.usefixtures("ray_cluster")   # tests/conftest.py: a local Ray cluster


def _services() -> list[str]:
    from ray.util import list_named_actors

    from agentgym.ray_envs import SERVICE_NAMESPACE
    return [a["name"] for a in list_named_actors(all_namespaces=True)
            if a.get("namespace") == SERVICE_NAMESPACE and a["name"].startswith("sandbox-")]


def test_env_actors_share_the_nodes_one_sandbox_service():
    from agentgym.ray_envs import make_ray_envs
    envs = make_ray_envs("CodeExec-v0", 3, {"sandbox": "bwrap", "max_attempts": 1})
    try:
        for i, env in enumerate(envs):
            env.reset(seed=i)
            task = env.get_wrapper_attr("task")
            _, reward, terminated, _, info = env.step(f"```python\n{task['solution']}\n```")
            assert terminated and info["episode_summary"]["success"], info
        assert len(_services()) == 1
        # every env actor's sandbox is a proxy to the same service process, which runs one warm pool
        infos = [env.get_wrapper_attr("sandbox").info() for env in envs]
        pids = {ray.get(env.actor.pid.remote()) for env in envs}
        assert len({i["pid"] for i in infos}) == 1 and infos[0]["pid"] not in pids
        assert infos[0]["name"] == "bwrap" and infos[0]["runners_started"] <= 3
        assert env.get_wrapper_attr("sandbox_backend") == "bwrap"
    finally:
        for env in envs:
            env.close()
    assert _services() == []   # the last env closed: the driver stopped the services it used


def test_node_sandbox_runs_and_batches_like_a_sandbox():
    from agentgym.envs.services.sandbox.ray_service import NodeSandbox, close_node_sandboxes
    sb = NodeSandbox("bwrap")
    try:
        assert sb.run("print(input())", stdin="hi").stdout == "hi\n"
        r1, r2 = sb.run_batch([{"code": "print(1)"}, {"code": "while True: pass", "time_limit_s": 0.5}])
        assert r1.stdout == "1\n" and r2.timed_out
        with pytest.raises(ValueError):   # the caller's mistakes still raise ValueError through Ray
            sb.run("pass", files={"../x": "1"})
    finally:
        assert close_node_sandboxes() == 1


def test_a_missing_env_attribute_is_asked_for_once():
    from agentgym.ray_envs import make_ray_envs
    env = make_ray_envs("Arithmetic-v0", 1, {})[0]
    try:
        for _ in range(2):
            with pytest.raises(AttributeError):
                env.get_wrapper_attr("no_such_attribute")
        assert "no_such_attribute" in env._attrs   # the second miss did not go to the actor
        assert env.get_wrapper_attr("max_turns") > 0
    finally:
        env.close()
