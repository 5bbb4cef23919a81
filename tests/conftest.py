import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]


def pytest_configure(config):
    """Under pytest-xdist each worker gets its own sandbox slot (own bridge, subnet, hosts, state dir), so
    test modules run side by side; deployer.sandbox.hosts reads the slot when it is first imported."""
    import os
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw") and worker[2:].isdigit():
        os.environ["DEPLOYER_SANDBOX_SLOT"] = str(int(worker[2:]) + int(os.environ.get("DEPLOYER_SANDBOX_SLOT", "0")))
