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


# The longest test modules first.  pytest-xdist's loadfile scheduler hands modules to workers in collection order
# when told not to reorder (scripts/dev.sh passes --no-loadscope-reorder: by default it sorts modules by their
# number of tests, so the unit modules' hundreds of parametrised cases went first and this order was ignored).
# First the two modules whose cold deploys are their point (one makes the run's seed, sandbox_helpers.SEED) and,
# beside them, the two that need no sandbox, so no seeded module starts before a seed exists; then the rest by
# their summed --durations in a full run (cold caches: faults_load 1366, releases 1003,
# controller_killed 839, sglang 802, faults_smoke 625, fleet 566, many_hosts 447, watch 396, reboot 313,
# engine_versions 226, become 143 s); modules not listed follow.
HEAVY_FIRST = ("test_real_engine.py", "test_real_host.py", "test_sandbox.py", "test_real_venv.py", "test_lint.py",
               "test_faults_load.py", "test_releases.py", "test_controller_killed.py", "test_sglang.py",
               "test_faults_smoke.py", "test_fleet.py", "test_many_hosts.py", "test_watch.py", "test_reboot.py",
               "test_engine_versions.py", "test_become.py", "test_patch_engine.py")


def pytest_collection_modifyitems(session, config, items):
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))   # stable: a module's own order is kept


# DEPLOYER_TEST_CPU_FILE=path (scripts/dev.sh passes it through): one JSON line per test with the CPU seconds its
# own processes used (the worker and every child it waited for: the CLI, ansible-playbook and its workers, vLLM's
# checks run here) and the wall seconds, for bench/suite_cpu.py.  A sandbox host's processes (sshd, modules, units)
# are counted only when the host stops (its container is a child reaped then): on the test whose teardown stops it.
# Measurement only: nothing is asserted on it.
def _cpu_now():
    import resource
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def pytest_runtest_protocol(item, nextitem):
    import os
    path = os.environ.get("DEPLOYER_TEST_CPU_FILE")
    if not path:
        return None
    import json
    import time

    from _pytest.runner import runtestprotocol
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    c0, t0 = _cpu_now(), time.time()
    runtestprotocol(item, nextitem=nextitem)
    with open(path, "a") as f:
        f.write(json.dumps({"test": item.nodeid, "cpu_s": round(_cpu_now() - c0, 2),
                            "wall_s": round(time.time() - t0, 2),
                            "worker": os.environ.get("PYTEST_XDIST_WORKER", "")}) + "\n")
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True
