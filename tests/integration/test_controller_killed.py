"""The controller dies (SIGKILL of `deployer up` and every process it started) in the middle of a stage (issue #12).

For each stage where a deploy is changing the host, a run is killed while that stage works; then the same `up` is
run again, with no manual cleanup.  Guards: the rerun reports the dead run's lock as stale (with the holder) and
takes it over; it finishes the job (exit 0, the new release live and serving); nothing half-done was used: the venv
a killed install left is redone before use, the unit systemd runs is `current`'s own, and no second lock, staging
directory or half-written release is left behind.
"""
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from sandbox_helpers import FAST, ROOT, SVC, flat, health, needs_sandbox, sandbox_hosts, sh, up

pytestmark = [pytest.mark.sandbox, needs_sandbox]
H = "sbx1"


@pytest.fixture(scope="module", autouse=True)
def sandbox():
    for sb in sandbox_hosts(1, engines=("vllm-0.18.0",)):
        r = up(*FAST)
        assert r.returncode == 0, r.stdout + r.stderr
        yield sb


def kill_during(role, args, task="", until=None, timeout=600):
    """Run `up --json` and SIGKILL its whole process group once a task of ``role`` (whose name starts with ``task``)
    has run and, with ``until`` (a shell command on the host), once that command prints something; the events."""
    p = subprocess.Popen([sys.executable, "-m", "deployer.cli", "up", "--sandbox", "--json", *args],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT,
                         start_new_session=True)
    seen, t0, killed = [], time.time(), False
    try:
        for line in p.stdout:
            if line.startswith("{"):
                ev = json.loads(line)
                seen.append(ev)
                if ev.get("event") in ("task_ok", "task_skipped") and ev.get("role") == role \
                        and str(ev.get("task") or "").startswith(task):
                    for _ in range(600 if until else 0):      # e.g. until uv runs on the host
                        if sh(H, until, check=False):
                            break
                        time.sleep(0.1)
                    playbook = playbook_of(p.pid)
                    os.killpg(p.pid, signal.SIGKILL)
                    killed = True
                    # the whole controller dies: ansible-playbook too, although it runs in a session of its own
                    # (under ansible-runner it ran on, unwatched, and the rerun took its lock over as stale while
                    # it still acted on the host)
                    assert gone(playbook), f"ansible-playbook {playbook} outlived its deployer"
                    break
            if time.time() - t0 > timeout:
                break
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait(30)
    assert any(e.get("role") == role for e in seen), f"stage {role} never ran: {seen[-5:]}"
    assert killed, f"no task of {role} starting with {task!r} ran (renamed?): the run was not killed"
    return seen


def playbook_of(cli_pid):
    """The pid of the ansible-playbook a `deployer` process started (its child, in a session of its own)."""
    for _ in range(100):
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    stat = open(f"/proc/{d}/stat").read()
                    cmd = open(f"/proc/{d}/cmdline", "rb").read()
                except OSError:
                    continue
                if int(stat.rsplit(")", 1)[1].split()[1]) == cli_pid and b"ansible-playbook" in cmd:
                    return int(d)
        time.sleep(0.1)
    raise AssertionError(f"no ansible-playbook under deployer pid {cli_pid}")


def gone(pid, seconds=10):
    for _ in range(int(seconds * 10)):
        try:
            if open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except OSError:
            return True
        time.sleep(0.1)
    return False


def test_sigterm_or_ctrl_c_stops_the_playbook_says_so_and_the_next_up_finishes_the_job():
    """cron's `timeout` or systemd sends SIGTERM, an operator presses Ctrl-C (SIGINT), a closed terminal SIGHUP: the
    deployer stops its playbook (the playbook's process group is killed) instead of dying
    and leaving it running unwatched, says where that leaves the host, and exits 7; the next `up` finishes the job."""
    sh(H, "echo '{\"load_seconds\": 20}' > /etc/deployer-sandbox/standin.json")
    args = ["-e", "deployer_gpu_memory_utilization=0.9569"]
    p = subprocess.Popen([sys.executable, "-m", "deployer.cli", "up", "--sandbox", "--json", *args, *FAST],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                         start_new_session=True)
    try:
        playbook, t_sig = None, None
        for line in p.stdout:
            if line.startswith("{") and json.loads(line).get("event") == "phase":   # the new server is loading
                playbook = playbook_of(p.pid)
                p.send_signal(signal.SIGTERM)         # to the deployer alone, as `timeout` does
                t_sig = time.time()
                break
        assert playbook, "the load never began"
        out, _err = p.communicate(timeout=60)
        took = time.time() - t_sig
    finally:
        sh(H, "echo '{}' > /etc/deployer-sandbox/standin.json")
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 7, (p.returncode, out[-2000:])
    result = json.loads(out.strip().splitlines()[-1])
    assert result["exit_code"] == 7 and "interrupted by SIGTERM" in result["interrupted"], result
    assert "the next `deployer up` finishes the job" in result["interrupted"]
    assert gone(playbook, 5), "ansible-playbook outlived its deployer's SIGTERM"
    assert took < 15, took
    r = up(*args, *FAST)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "took over a stale lock of" in flat(r.stderr), r.stderr
    assert "0.9569" in sh(H, "cat /opt/deployer/current/argv.json") and health() == "200"


# (role whose task is under way when the controller dies, the settings of the new release)
CASES = [
    ("install", ["-e", "deployer_vllm_version=0.18.0"]),      # a new venv, uv installing into it
    ("start", ["-e", "deployer_gpu_memory_utilization=0.9571"]),    # unit installed, server restarting
    ("watch", ["-e", "deployer_gpu_memory_utilization=0.9572"]),    # the new server loading, current not moved
    ("release", ["-e", "deployer_gpu_memory_utilization=0.9573"]),  # smoke passed, current being moved
]


@pytest.mark.parametrize("role,args", CASES, ids=[c[0] for c in CASES])
def test_killed_in_a_stage_then_the_same_up_finishes_the_job(role, args):
    if role == "watch":      # a load long enough to be killed in
        sh(H, "echo '{\"load_seconds\": 12}' > /etc/deployer-sandbox/standin.json")
    installing = "pgrep -f '[p]ip install --python /opt/deployer/venvs/vllm-0.18.0' || true"   # [p]: not this shell
    try:
        if role == "install":    # killed while uv installs: the install goes on without its controller
            kill_during(role, [*args, *FAST], task="Create the venv", until=installing)
            left = sh(H, installing).split()
            assert left, "the install did not outlive its controller: nothing to guard here"
            # hold it, so that it is certainly still going when the rerun comes (offline it would end in seconds)
            sh(H, f"kill -STOP {' '.join(left)}")
        else:
            kill_during(role, [*args, *FAST])
    finally:
        sh(H, "echo '{}' > /etc/deployer-sandbox/standin.json")
    assert sh(H, "test -d /opt/deployer/.lock && echo held || true") == "held"        # the dead run's lock
    t0 = time.time()
    r = up(*args, *FAST)
    took = time.time() - t0
    assert r.returncode == 0, r.stdout + r.stderr
    assert "took over a stale lock of" in flat(r.stderr) and "is gone from this controller" in flat(r.stderr), r.stderr
    # the new release is live, serving, and systemd runs its unit
    argv = json.loads(sh(H, "cat /opt/deployer/current/argv.json"))
    assert args[1].split("=", 1)[1] in " ".join(argv) and health() == "200"
    assert sh(H, f"cmp -s /etc/systemd/system/{SVC}.service /opt/deployer/current/{SVC}.service && echo same",
              check=False) == "same"
    # nothing half-done left in use or lying about
    if role == "install":   # the half-installed venv was finished (or redone) before any release used it
        venv = json.loads(sh(H, "cat /opt/deployer/current/release.json"))["venv"]
        assert "/venvs/vllm-0.18.0" in venv and argv[0].startswith(venv + "/"), (venv, argv[:2])
        assert sh(H, f"cat {venv}/.deployer-installed") == "0.18.0"
        assert sh(H, f"{venv}/bin/python -c 'import importlib.metadata as m; print(m.version(\"vllm\"))'") == "0.18.0"
        assert sh(H, installing) == ""    # the left-over install was stopped, not left writing into the venv
        assert re.search(r"stopped a left-over install \(pid \d+\); removed /opt/deployer/venvs/vllm-0\.18\.0",
                         flat(r.stderr)), r.stderr
    assert sh(H, "ls -d /opt/deployer/.lock* 2>/dev/null || true") == ""
    assert sh(H, "ls -a /opt/deployer/drafters | grep -c '^.incoming-' || true") == "0"
    print(f"killed in {role}: the rerun finished the job in {took:.1f} s")


def test_killed_in_each_remaining_stage_in_turn_then_the_next_up_finishes_the_job(tmp_path):
    """The other stages, one run each, every rerun killed in the next stage: drafter copy (a new drafter), render
    (once the release is written, before it is compared with the live one), verify (vLLM's own checks running),
    smoke (the new server up, `current` not moved).  Each rerun takes over the lock the run before it left; the
    last one finishes.  Guards: nothing a killed run left half-done (staging directory, a release directory without
    its manifest, an unverified launch) is used as it is; the end state is exactly a clean deploy's."""
    import shutil

    from deployer.sandbox import checkpoints
    from deployer.sandbox import hosts as sb
    src = tmp_path / "drafter"
    shutil.copytree(sb.STATE / "drafter", src)
    # a new drafter (header-true: the drafter check reads it)
    (src / "model.safetensors").write_bytes(checkpoints.drafter_weights_bytes(checkpoints.drafter_tensors(), 1 << 20))
    args = ["-e", f"deployer_drafter_src_dir={src}", "-e", "deployer_gpu_memory_utilization=0.9574"]
    stages = [("drafter", "Ensure the staging directory exists", None), ("render", "Write the release", None),
              ("verify", "Ship the verifier", "pgrep -f '[v]llm_verify' || true"),     # vLLM's own checks running
              ("smoke", "Ask for one chat completion", None)]
    t0 = time.time()
    for i, (role, task, until) in enumerate(stages):
        seen = kill_during(role, args, task=task, until=until)
        if i:   # the run before this one was killed: this one took its lock over
            assert any("took over a stale lock of" in json.dumps(e) for e in seen), (role, seen[-8:])
        assert sh(H, "test -d /opt/deployer/.lock && echo held || true") == "held", role
    r = up(*args)
    took = time.time() - t0
    assert r.returncode == 0, r.stdout + r.stderr
    assert "took over a stale lock of" in flat(r.stderr), r.stderr
    rel = sh(H, "readlink -f /opt/deployer/current")
    argv = json.loads(sh(H, f"cat {rel}/argv.json"))
    assert "0.9574" in " ".join(argv) and health() == "200"
    assert sh(H, f"cmp -s /etc/systemd/system/{SVC}.service {rel}/{SVC}.service && echo same", check=False) == "same"
    assert sh(H, f"cd {rel} && sha256sum --quiet -c .deployer-sha256sums && test -s release.json && echo whole") == \
        "whole"
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert sh(H, f"test -f {spec['model']}/.deployer-complete && echo complete") == "complete"
    from deployer.drafter import tree_manifest
    assert spec["model"].endswith(tree_manifest(src)["tree_sha256"][:16])
    assert sh(H, "ls -d /opt/deployer/.lock* 2>/dev/null || true") == ""
    assert sh(H, "ls -a /opt/deployer/drafters | grep -c '^.incoming-' || true") == "0"
    assert sh(H, "for d in /opt/deployer/releases/*/; do test -f $d/release.json || echo $d; done") == ""
    print(f"killed in 4 stages in turn, then finished: {took:.1f} s in all")
