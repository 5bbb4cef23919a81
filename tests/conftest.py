import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]


def pytest_sessionstart(session):
    """The sandbox seeds (tests/integration/sandbox_helpers.py SEED) of earlier runs go: a seed is only ever
    this run's own deploy, never one made by older code.  Only the run's main process prunes (not xdist workers),
    and only seeds older than a day, which no run still going can be using."""
    import os
    import shutil
    import time
    root = Path("/var/lib/deployer-sandbox-seed")
    if os.environ.get("PYTEST_XDIST_WORKER") or not root.is_dir():
        return
    for d in root.iterdir():
        if time.time() - d.stat().st_mtime > 86400:
            shutil.rmtree(d, ignore_errors=True)


def pytest_configure(config):
    """Under pytest-xdist each worker gets its own sandbox slot (own bridge, subnet, hosts, state dir), so
    test modules run side by side; deployer.sandbox.hosts reads the slot when it is first imported."""
    import os
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw") and worker[2:].isdigit():
        os.environ["DEPLOYER_SANDBOX_SLOT"] = str(int(worker[2:]) + int(os.environ.get("DEPLOYER_SANDBOX_SLOT", "0")))


# The longest test modules first.  pytest-xdist's loadfile scheduler hands modules to workers in collection order,
# so a multi-minute module collected last (alphabetically) ran alone at the end of the run; longest-first shortens
# the whole run.  Ordered by each module's summed --durations of the last full run (session 9: 27, 27, 27, 25, 20,
# 18, 17, 14, 13, 9, 8, 6 min under three workers); modules not listed follow.
HEAVY_FIRST = ("test_sandbox.py", "test_faults_load.py", "test_real_host.py", "test_releases.py",
               "test_controller_killed.py", "test_fleet.py", "test_sglang.py", "test_engine_versions.py",
               "test_faults_smoke.py",
               "test_many_hosts.py", "test_watch.py", "test_reboot.py", "test_become.py", "test_real_venv.py",
               "test_lint.py")


def pytest_collection_modifyitems(session, config, items):
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))   # stable: a module's own order is kept
