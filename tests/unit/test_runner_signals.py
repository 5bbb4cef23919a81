"""The playbook never outlives the deployer (deployer/runner.py): it runs in a session of its own (so that a stop
can kill its whole process group), so a `deployer` killed outright would leave it running unwatched (and its lock,
which names the dead deployer, would be taken over as stale while it still acted on the host)."""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

from deployer.events import HIDDEN, Exit
from helpers import ROOT

DRIVER = """
import os, subprocess, sys, time
sys.path.insert(0, sys.argv[3])
from deployer.bound_process import spawn_bound
argv = [sys.argv[2] + "/ansible-playbook", "-i", "inventory"]
if sys.argv[4] == "bound":
    child = spawn_bound(argv, dict(os.environ))
else:   # its own session and nothing more (as ansible-runner's pexpect child was, SIGHUP ignored too)
    child = subprocess.Popen(argv, start_new_session=True)
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


def test_a_playbook_in_its_own_session_outlives_a_killed_deployer_unless_bound(tmp_path):
    """The hazard itself (what happened under ansible-runner, before the death signal): a child in its own session
    runs on."""
    _pid, survived = playbook_after_deployer_killed(tmp_path, "direct")
    assert survived


def test_the_deployers_playbook_dies_with_it(tmp_path):
    _pid, survived = playbook_after_deployer_killed(tmp_path, "bound")
    assert not survived


def test_the_bound_child_runs_the_command_with_its_arguments_and_never_without_its_deployer(tmp_path):
    from deployer import bound_process, pdeathsig
    out = bound_process.spawn_bound(["printf", "%s|", "-i", "a b", "--check", "it's.yml"], dict(os.environ))
    assert out.wait(timeout=30) == 0 and out.stdout.read() == b"-i|a b|--check|it's.yml|"
    out.stdout.close()
    # a child whose deployer is not its parent (it died before the death signal was set) refuses to run
    prctl, gone = pdeathsig.prctl(), os.getpid() + 1_000_000
    r = subprocess.run(["sh", "-c", f"echo ran > {tmp_path}/ran"], preexec_fn=lambda: pdeathsig.bind_to(gone, prctl))
    assert r.returncode == 137 and not (tmp_path / "ran").exists()


def test_a_real_playbook_runs_bound_with_its_events(tmp_path):
    """A real ansible-playbook started bound: the playbook runs and its event stream (deployer_events) arrives,
    stage-bearing fields included; its own output arrives as verbose events."""
    from deployer import runner
    pb = tmp_path / "ping.yml"     # an absolute path: runner.run joins it to playbooks/ unchanged
    pb.write_text("- hosts: localhost\n  gather_facts: false\n  tasks:\n    - ansible.builtin.debug:\n"
                  "        msg: hello\n")
    events = []
    res = runner.run(str(pb), "localhost,", {"ansible_connection": "local"}, on_event=events.append)
    assert res.rc == 0 and res.exit_code() == Exit.OK, (res, [e.get("stdout") for e in events][-5:])
    assert "localhost" in res.processed()
    ok = [e["event_data"] for e in events if e.get("event") == "runner_on_ok"]
    assert [(d["host"], d["task_action"], d["res"].get("msg")) for d in ok] == [
        ("localhost", "ansible.builtin.debug", "hello")], ok
    assert ok[0]["duration"] >= 0 and ok[0]["task_path"].startswith(str(pb))
    assert [e["event"] for e in events if e["event"] != "verbose"] == ["runner_on_start", "runner_on_ok",
                                                                       "playbook_on_stats"]
    assert any("PLAY RECAP" in e.get("stdout", "") for e in events if e["event"] == "verbose")



def test_a_no_log_result_reaches_the_cli_censored(tmp_path):
    """The event stream carries what ansible-core gives callbacks: a no_log task's result, a failed one too, arrives
    censored (the Collector then says the output is hidden); the secret is in no event and no output line."""
    import json

    from deployer import runner
    pb = tmp_path / "secret.yml"
    pb.write_text("- hosts: localhost\n  gather_facts: false\n  tasks:\n"
                  "    - ansible.builtin.command: echo {{ token }}\n      no_log: true\n"
                  "    - ansible.builtin.command: sh -c 'echo {{ token }}; exit 3'\n      no_log: true\n")
    events = []
    res = runner.run(str(pb), "localhost,", {"ansible_connection": "local", "token": "s3cr3t-T0KEN"},
                     on_event=events.append)
    assert res.exit_code() == Exit.FAILED and [f.msg for f in res.failures] == [HIDDEN], res
    assert "s3cr3t-T0KEN" not in json.dumps(events)
    assert [e["event_data"]["res"].get("censored", "") != "" for e in events
            if e["event"] in ("runner_on_ok", "runner_on_failed")] == [True, True]


KILLED_RUN = """
import sys
sys.path.insert(0, sys.argv[1])
from deployer import runner
runner.run(sys.argv[2], "localhost,", {"ansible_connection": "local", "deployer_api_key": "s3cr3t-K1LL",
                                       "marker": sys.argv[3]})
"""


def killed_run(tmp_path):
    """A deployer (TMPDIR: tmp_path/tmp) SIGKILLed while its playbook runs a task: (that TMPDIR, its Popen)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    marker = tmp_path / "started"
    pb = tmp_path / "slow.yml"
    pb.write_text("- hosts: localhost\n  gather_facts: false\n  tasks:\n"
                  "    - ansible.builtin.command: touch {{ marker }}\n"
                  "    - ansible.builtin.command: sleep 300\n")
    p = subprocess.Popen([sys.executable, "-c", KILLED_RUN, str(ROOT), str(pb), str(marker)],
                         env=dict(os.environ, TMPDIR=str(tmp)))
    for _ in range(300):
        if marker.exists():
            break
        time.sleep(0.1)
    assert marker.exists(), "the playbook never ran its first task"
    p.send_signal(signal.SIGKILL)
    p.wait()
    return tmp, p


def test_a_deployer_killed_outright_leaves_no_secret_on_disk(tmp_path):
    """The extra vars hold the API key and HF token: a deployer killed outright (SIGKILL, the OOM killer) runs no
    clean-up, so they must never have been a file (found: a SIGKILLed run left /tmp/deployer-run-*/extravars.json)."""
    tmp, p = killed_run(tmp_path)
    left = {str(f.relative_to(tmp)): f.read_bytes() for f in tmp.rglob("*") if f.is_file()}
    assert not [name for name, data in left.items() if b"s3cr3t-K1LL" in data], sorted(left)


def test_the_next_run_removes_what_a_killed_run_left_and_nothing_else(tmp_path, monkeypatch):
    """A deployer killed outright leaves its run directory (its extra vars: settings and paths, no secret since
    secrets_to_env); the suite's controller-killed tests left 21 on this machine in one session.  The next run
    removes those of this user whose deployer is gone, and leaves a live run's directory, another user's, and a
    symlink named like one (never followed: /tmp is everyone's)."""
    from deployer import runner
    tmp, p = killed_run(tmp_path)
    left = sorted(d.name for d in tmp.glob("deployer-run-*"))
    assert len(left) == 1 and left[0].startswith(f"deployer-run-{p.pid}-"), left
    live = tmp / f"deployer-run-{os.getpid()}-live"          # a run in progress (this process is alive)
    live.mkdir()
    target = tmp_path / "not-ours"
    target.mkdir()
    (target / "keep").write_text("x")
    (tmp / f"deployer-run-{p.pid}-link").symlink_to(target)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    ok = tmp_path / "ok.yml"
    ok.write_text("- hosts: localhost\n  gather_facts: false\n  tasks:\n    - ansible.builtin.ping:\n")
    res = runner.run(str(ok), "localhost,", {"ansible_connection": "local"})
    assert res.exit_code() == Exit.OK, res
    assert {d.name for d in tmp.glob("deployer-run-*")} == {f"deployer-run-{os.getpid()}-live",
                                                             f"deployer-run-{p.pid}-link"}
    assert (target / "keep").exists()


def test_secrets_reach_the_playbook_as_given(tmp_path):
    """A secret travels in the playbook's environment (secrets_to_env): it arrives with the extra vars' precedence
    (over an inventory value), as the string given (0777 is not 511) and not templated again."""
    from deployer import runner
    pb = tmp_path / "secrets.yml"
    pb.write_text("- hosts: localhost\n  gather_facts: false\n  tasks:\n"
                  "    - ansible.builtin.assert:\n        that:\n"
                  "          - deployer_api_key is string\n          - deployer_api_key == '0777'\n"
                  "          - deployer_hf_token == 'hf_' + '{' + '{x}}'\n")
    res = runner.run(str(pb), "localhost,", {"ansible_connection": "local", "deployer_api_key": "0777",
                                             "deployer_hf_token": "hf_{{x}}"})
    assert res.exit_code() == Exit.OK, res


def test_the_playbooks_workers_die_with_the_deployer_too(tmp_path):
    """ansible-core's workers call setsid() (WorkerProcess._detach) and a death signal is not inherited across a
    fork: a SIGKILLed deployer took its ansible-playbook with it, but the worker running the current task lived on
    (found: a worker of a killed run still running its 25 s task a minute later), acting on the host while the
    next `up` took the dead run's lock over as stale.  The deployer_events callback binds each worker to the
    playbook (os.register_at_fork): the playbook dies with the deployer, its workers with the playbook."""
    marker = tmp_path / "started"
    pb = tmp_path / "slow-workers.yml"
    pb.write_text("- hosts: localhost\n  gather_facts: false\n  tasks:\n"
                  "    - ansible.builtin.command: sh -c 'touch {{ marker }}; exec sleep 60'\n")
    p = subprocess.Popen([sys.executable, "-c", KILLED_RUN, str(ROOT), str(pb), str(marker)])

    def ours():
        found = []
        for d in os.listdir("/proc"):
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            if any(a.endswith(b"ansible-playbook") for a in argv[:2]) and str(pb).encode() in argv and alive(d):
                found.append(int(d))
        return found
    for _ in range(300):
        if marker.exists() and len(ours()) >= 2:      # the playbook and the worker running its task
            break
        time.sleep(0.1)
    assert len(ours()) >= 2, ours()
    p.send_signal(signal.SIGKILL)
    p.wait()
    for _ in range(50):
        if not ours():
            break
        time.sleep(0.1)
    left = ours()
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"{len(left)} ansible-playbook process(es) outlived the deployer"


def test_a_run_directory_named_by_another_user_never_stops_a_deployer(tmp_path):
    """Anyone may create names in /tmp: a pid beyond the kernel's range (OverflowError in os.kill), a name that is
    a file, a directory of ours with a huge pid - every deployer command ran the reaper first and died (issue 40,
    F7).  Nothing but our own dead runs' directories is removed."""
    from deployer.runner import reap_run_dirs
    for name in ("deployer-run-2147483648-x", "deployer-run-99999999999999999999-x", "deployer-run-0-x"):
        (tmp_path / name).mkdir()
    (tmp_path / "deployer-run-4194305-file").write_text("")
    gone = reap_run_dirs(str(tmp_path))
    assert gone == []                      # none is a run of ours (no pid is that large)
    assert (tmp_path / "deployer-run-0-x").exists() and (tmp_path / "deployer-run-4194305-file").exists()


def test_ssh_options_in_the_environment_cannot_turn_the_host_key_check_off(tmp_path):
    """Ansible puts ANSIBLE_SSH_ARGS before its own options and ssh keeps an option's first value: the caller's
    '-o StrictHostKeyChecking=no' would beat the forced check.  Refused (exit 2), nothing run, nothing contacted."""
    env = dict(os.environ, ANSIBLE_SSH_ARGS="-o ControlMaster=auto -o StrictHostKeyChecking=no",
               XDG_STATE_HOME=str(tmp_path))
    r = subprocess.run([sys.executable, "-m", "deployer.cli", "up", "--host", "192.0.2.1", "--json"], env=env,
                       capture_output=True, text=True, timeout=60)
    out = json.loads(r.stdout.splitlines()[-1])
    assert r.returncode == 2 and out["processed"] == [] and "ANSIBLE_SSH_ARGS sets StrictHostKeyChecking" in \
        out["errors"][0]
    r = subprocess.run([sys.executable, "-m", "deployer.cli", "up", "--host", "192.0.2.1"], capture_output=True,
                       text=True, timeout=60, env=dict(env, ANSIBLE_SSH_ARGS="", ANSIBLE_SSH_COMMON_ARGS=(
                           "-o UserKnownHostsFile=/dev/null")))
    from deployer.runner import host_key_overrides
    assert host_key_overrides({"ANSIBLE_SSH_ARGS": "-o UserKnownHostsFile=/root/kh -o StrictHostKeyChecking=accept-new"
                                                    " -o ControlMaster=auto"}) == []        # still checked
    assert host_key_overrides({"ANSIBLE_SSH_EXTRA_ARGS": "-o 'StrictHostKeyChecking no'"})
    # issue 53 N7: what the regex let through, read now as ssh reads its options
    for value in ("-F /tmp/cfg", "-F/tmp/cfg", "-o UserKnownHostsFile=/dev//null",
                  "-o 'UserKnownHostsFile /dev/./null'",
                  "-o UserKnownHostsFile=/proc/self/fd/NONE -o StrictHostKeyChecking=accept-new", "-o 'x"):
        assert host_key_overrides({"ANSIBLE_SSH_ARGS": value}), value
    assert host_key_overrides({"ANSIBLE_SSH_EXECUTABLE": str(tmp_path / "wrapper")})
    assert host_key_overrides({"ANSIBLE_SSH_EXECUTABLE": "ssh"}) == []     # the system's own, by name
    assert r.returncode == 2 and "ANSIBLE_SSH_COMMON_ARGS sets UserKnownHostsFile" in " ".join(r.stderr.split())
    assert "refused before any playbook ran" in r.stderr
