"""A host that refuses root over SSH (issue #12): the operator's login user has passwordless sudo and the deployer
becomes root with it (Ansible become: `ansible_become: true` in the inventory, or `--user NAME` on the command line).
Guards: root cannot log in at all; a full deploy, the no-op check, status, a second release, rollback and the
journal all work through sudo; nothing the server runs belongs to the login user."""
import json
import subprocess

import pytest

from sandbox_helpers import FAST, SVC, deployer, health, needs_sandbox, sandbox_hosts, sh, up

pytestmark = [pytest.mark.sandbox, needs_sandbox]
H = "sbx1"


@pytest.fixture(scope="module", autouse=True)
def sandbox():
    yield from sandbox_hosts(1, sudo=True)


def test_root_login_is_refused_and_the_deploy_runs_through_sudo(sandbox):
    sb = sandbox
    ip = sb.host(1).ip
    root = subprocess.run(["ssh", "-F", str(sb.STATE / "ssh_config"), "-o", "BatchMode=yes", "-l", "root", H,
                           "true"], capture_output=True, text=True, timeout=60)
    assert root.returncode == 255 and "Permission denied" in root.stderr, root.stderr
    assert sh(H, "id -un") == "root" and "deploy" in sb.ssh(H, "echo $SUDO_USER").stdout   # the helpers use sudo
    inv = (sb.STATE / "inventory.yml").read_text()
    assert "ansible_user: deploy" in inv and "ansible_become: true" in inv

    r = up()            # cold: install, patch, drafter, render, vLLM's own checks, start, watch, smoke, release
    assert r.returncode == 0, r.stdout + r.stderr
    assert health() == "200"
    # root's files, the server's user; nothing belongs to the login user
    assert sh(H, "find /opt/deployer -user deploy | head -3") == ""
    assert sh(H, f"ps -o user= -p $(systemctl show -p MainPID --value {SVC})") == "vllm"
    # the no-op check reads the host through sudo too
    r = up("--json", *FAST)
    result = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")][-1]["hosts"][H]
    assert r.returncode == 0 and result["noop_checked"] is True and not result["restarted"], result
    st = json.loads(deployer("status", "--sandbox", "--json").stdout)[H]
    assert st["health"] == 200 and st["unit"]["ActiveState"] == "active", st
    # a second release and the rollback, both through sudo
    first = sh(H, "readlink /opt/deployer/current")
    assert up("-e", "deployer_gpu_memory_utilization=0.956", *FAST).returncode == 0
    assert sh(H, "readlink /opt/deployer/current") != first
    r = deployer("rollback", "--sandbox")
    assert r.returncode == 0, r.stdout + r.stderr
    assert sh(H, "readlink /opt/deployer/current") == first and health() == "200"
    # the journal: `deployer logs` reads it with sudo as the login user
    r = deployer("logs", "--sandbox", "-n", "400")
    assert r.returncode == 0 and "Application startup complete" in r.stdout, r.stdout[-2000:] + r.stderr
    # the command-line way: --host/--user deploy becomes root by itself.  A rollback needs root (it replaces root's
    # links and restarts the unit), so it fails if --user stopped meaning become (issue 24 item 5: only `status`
    # was run this way, which needs no root)
    target = ["--host", ip, "--user", "deploy", "--key", str(sb.controller_key())]
    env = dict(__import__("os").environ, ANSIBLE_SSH_ARGS=f"-o UserKnownHostsFile={sb.STATE}/known_hosts")
    second = sh(H, "readlink /opt/deployer/previous")
    r = deployer("rollback", *target, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sh(H, "readlink /opt/deployer/current") == second and health() == "200"
    r = deployer("status", *target, "--json", env=env)
    assert r.returncode == 0 and json.loads(r.stdout)[ip]["health"] == 200, r.stdout + r.stderr
