import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# precision=auto means fp32 on every CPU in the suite (subprocesses inherit it), so numeric assertions do not
# depend on whether this CI machine has bf16 units; tests/test_precision.py clears it to test the probe
os.environ.setdefault("AGENTGYM_PRECISION", "fp32")


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", default=False,
                     help="run long learning runs (marked slow); also AGENTGYM_SLOW=1")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--runslow") or os.environ.get("AGENTGYM_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="long learning run: opt in with --runslow or AGENTGYM_SLOW=1")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def ray_cluster():
    """A real local Ray cluster (2 CPUs) for one test module, shut down after it. Modules that need it
    say ``pytestmark = pytest.mark.usefixtures("ray_cluster")``."""
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    import ray

    from agentgym.ray_envs import ensure_ray
    ensure_ray(num_cpus=2)
    yield
    ray.shutdown()
