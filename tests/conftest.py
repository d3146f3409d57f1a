import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


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
