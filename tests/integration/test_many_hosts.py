"""Three sandbox hosts: parallel deploy, then a rolling deploy that stops at a broken host."""
import re

import pytest

from sandbox_helpers import FAST, flat, main_pid, needs_sandbox, sandbox_hosts, sh, stages, up, venv

pytestmark = [pytest.mark.sandbox, needs_sandbox]
HOSTS = ["sbx1", "sbx2", "sbx3"]


@pytest.fixture(scope="module", autouse=True)
def sandbox():
    # parallel cold installs are the point here (sbx1 with our uv shipped, sbx2 with its own); sbx3 boots with this
    # run's pre-baked venv (when one is saved yet): a fleet where one host already has the release's venv
    yield from sandbox_hosts(3, cold=(1, 2))


def test_parallel_then_rolling_stops_at_broken_host():
    from deployer import tools
    from deployer.sandbox import hosts as sb
    # sbx2 has its own uv on the PATH (common on GPU boxes); sbx1 and sbx3 have none and get ours shipped
    sb.copy_to("sbx2", tools.uv(), "/usr/local/bin/uv")
    r = up(*FAST)       # vLLM's own checks are the single-host modules' (test_sandbox, test_real_host)
    assert r.returncode == 0, r.stderr
    for h in HOSTS:     # (on the seeded host too: the stage makes the service user and the deploy root)
        assert stages(r.stderr, h)["install"] == "changed", r.stderr
        assert sh(h, f"cat {venv()}/.deployer-installed") == "0.16.0"
    assert sh("sbx2", "test -e /opt/deployer/bin/uv && echo shipped || echo own") == "own"
    assert sh("sbx1", "test -x /opt/deployer/bin/uv && echo shipped || echo own") == "shipped"
    for h in HOSTS:
        assert f"{h}: release" in r.stdout
        assert sh(h, "curl -s -o /dev/null -w '%{http_code}' localhost:8000/health") == "200"
    before = {h: (sh(h, "readlink /opt/deployer/current"), main_pid(h)) for h in HOSTS}

    sb.set_knobs("sbx2", gpus={"count": 7})
    try:
        r = up("--serial", "1", "-e", "deployer_max_model_len=65536", *FAST)
    finally:
        sb.set_knobs("sbx2", gpus={})
    assert r.returncode == 3, r.stdout + r.stderr
    assert "GPU count: measured 7, expected 8" in flat(r.stderr)
    assert sh("sbx1", "readlink /opt/deployer/current") != before["sbx1"][0]        # batch 1 deployed
    assert (sh("sbx2", "readlink /opt/deployer/current"), main_pid("sbx2")) == before["sbx2"]
    assert (sh("sbx3", "readlink /opt/deployer/current"), main_pid("sbx3")) == before["sbx3"]  # untouched
    assert "sbx3" not in r.stderr.split("GPU count")[-1]


def test_parallel_deploy_where_one_host_fails_after_restart():
    """All hosts at once; sbx2's new release crashes during its load: only sbx2 rolls back, the others go live."""
    from deployer.sandbox import hosts as sb
    before = {h: sh(h, "readlink /opt/deployer/current") for h in HOSTS}
    sb.set_knobs("sbx2", standin={"crash_phase": "compile", "load_seconds": 3, "only_if_arg": "0.9571"})
    try:
        r = up("-e", "deployer_gpu_memory_utilization=0.9571", *FAST)
    finally:
        sb.set_knobs("sbx2", standin={})
    assert r.returncode == 1, r.stdout + r.stderr
    assert "deploy failed in stage 'watch'; rolled back to the last live release" in flat(r.stderr)
    assert re.search(r"sbx2 watch +failed", r.stderr) and re.search(r"sbx2 rollback +changed", r.stderr), r.stderr
    assert sh("sbx2", "readlink /opt/deployer/current") == before["sbx2"]
    for h in ("sbx1", "sbx3"):
        assert sh(h, "readlink /opt/deployer/current") != before[h], h
        assert "0.9571" in sh(h, "cat /opt/deployer/current/argv.json")
    for h in HOSTS:
        assert sh(h, "curl -s -o /dev/null -w '%{http_code}' localhost:8000/health") == "200"


def test_rolling_deploy_stops_at_a_failure_after_the_restart():
    """--serial 1: sbx1's new release crashes during its load; it is rolled back and sbx2, sbx3 are never touched."""
    from deployer.sandbox import hosts as sb
    before = {h: (sh(h, "readlink /opt/deployer/current"), main_pid(h)) for h in HOSTS}
    sb.set_knobs("sbx1", standin={"crash_phase": "kv_cache", "load_seconds": 3, "only_if_arg": "0.9572"})
    try:
        r = up("--serial", "1", "-e", "deployer_gpu_memory_utilization=0.9572", *FAST)
    finally:
        sb.set_knobs("sbx1", standin={})
    assert r.returncode == 1, r.stdout + r.stderr
    assert "deploy failed in stage 'watch'; rolled back to the last live release" in flat(r.stderr)
    assert sh("sbx1", "readlink /opt/deployer/current") == before["sbx1"][0]
    for h in ("sbx2", "sbx3"):
        assert (sh(h, "readlink /opt/deployer/current"), main_pid(h)) == before[h], h     # never started
        assert not stages(r.stderr, h), r.stderr
