"""The playbook never outlives the deployer (deployer/runner.py): ansible-runner starts ansible-playbook through
pexpect in a session of its own with SIGHUP ignored, so a `deployer` killed outright left it running unwatched
(and its lock, which names the dead deployer, was taken over as stale while it still acted on the host)."""
import os
import signal
import subprocess
import sys
import time

from helpers import ROOT

DRIVER = """
import sys, time, pexpect
sys.path.insert(0, sys.argv[3])
from deployer.runner import _playbook_bound_to_us
exe = _playbook_bound_to_us(sys.argv[1], sys.argv[2]) if sys.argv[4] == "bound" else sys.argv[2] + "/ansible-playbook"
child = pexpect.spawn(exe, ["-i", "inventory"], ignore_sighup=True)   # as ansible-runner's runner.py does
time.sleep(300)
"""


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def playbook_after_deployer_killed(tmp_path, how):
    """Start a fake ansible-playbook the way the deployer does (``how``: through the shim or directly), SIGKILL
    the deployer, and return (the fake's pid, whether it is still alive 3 s later)."""
    bin_dir = tmp_path / "real"
    bin_dir.mkdir()
    fake = bin_dir / "ansible-playbook"
    fake.write_text(f"#!/bin/sh\necho $$ > {tmp_path}/pid\nexec sleep 300\n")
    fake.chmod(0o755)
    p = subprocess.Popen([sys.executable, "-c", DRIVER, str(tmp_path), str(bin_dir), str(ROOT), how])
    for _ in range(100):
        if (tmp_path / "pid").exists() and (tmp_path / "pid").read_text().strip():
            break
        time.sleep(0.1)
    pid = int((tmp_path / "pid").read_text())
    assert alive(pid)
    p.send_signal(signal.SIGKILL)
    p.wait()
    for _ in range(30):
        if not alive(pid):
            break
        time.sleep(0.1)
    survived = alive(pid)
    if survived:
        os.kill(pid, signal.SIGKILL)
    return pid, survived


def test_a_playbook_started_as_ansible_runner_does_outlives_a_killed_deployer(tmp_path):
    """The hazard itself (what happened before the shim): pexpect's child, SIGHUP ignored, runs on."""
    _pid, survived = playbook_after_deployer_killed(tmp_path, "direct")
    assert survived


def test_the_deployers_playbook_dies_with_it(tmp_path):
    _pid, survived = playbook_after_deployer_killed(tmp_path, "bound")
    assert not survived


def test_the_shim_runs_the_real_playbook_with_its_arguments(tmp_path):
    from deployer.runner import _playbook_bound_to_us
    bin_dir = tmp_path / "real"
    bin_dir.mkdir()
    fake = bin_dir / "ansible-playbook"
    fake.write_text('#!/bin/sh\nprintf "%s|" "$@"\n')
    fake.chmod(0o755)
    shim = _playbook_bound_to_us(str(tmp_path), str(bin_dir))
    assert oct(os.stat(shim).st_mode & 0o777) == "0o700"
    out = subprocess.run([shim, "-i", "a b", "--check", "it's.yml"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and out.stdout == "-i|a b|--check|it's.yml|", out
    # started by another process than the one that made it: it refuses (its deployer is not its parent)
    r = subprocess.run(["sh", "-c", f"{shim} x; echo rc=$?"], capture_output=True, text=True, timeout=30)
    assert "rc=137" in r.stdout, r


def test_a_real_playbook_runs_through_the_shim_with_events(tmp_path):
    """ansible-runner finds the shim first on PATH and stays in playbook mode: the playbook path is passed and the
    event stream arrives (an explicit `binary` would have put it in raw mode: no playbook, no host ran)."""
    from deployer import runner
    pb = tmp_path / "ping.yml"     # an absolute path: runner.run joins it to playbooks/ unchanged
    pb.write_text("- hosts: localhost\n  gather_facts: false\n  tasks:\n    - ansible.builtin.debug:\n"
                  "        msg: hello\n")
    events = []
    res = runner.run(str(pb), "localhost,", {"ansible_connection": "local"}, on_event=events.append)
    assert res.rc == 0 and res.exit_code() == runner.Exit.OK, (res, [e.get("stdout") for e in events][-5:])
    assert "localhost" in res.processed()

