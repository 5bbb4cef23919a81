"""Releases, no-op, rollback, locking, pruning, audit and scheduled redeploys on a sandbox host."""
import json
import os
import socket
import subprocess
import sys
import time

import pytest

from helpers import CACHE, need
from sandbox_helpers import (
    FAST,
    ROOT,
    SVC,
    auth,
    deployer,
    flat,
    main_pid,
    needs_sandbox,
    sandbox_hosts,
    sh,
    stages,
    up,
    venv,
)

pytestmark = [pytest.mark.sandbox, needs_sandbox]
H = "sbx1"


@pytest.fixture(scope="module", autouse=True)
def sandbox():
    yield from sandbox_hosts(1, package_cache=False)   # installs nothing: no package cache to link


def releases():
    return sorted(sh(H, "ls /opt/deployer/releases").split())


def audit():
    return [json.loads(x) for x in sh(H, "cat /opt/deployer/audit.jsonl").splitlines()]


def test_up_then_noop_with_its_audit_and_views():
    """A deploy, then the same again: no new release, nothing restarted, one audit line each (root's alone).  A
    changed flag as a new release and the rollback to the first: the real engine's, tests/integration/
    test_real_engine.py (the same job on the real vLLM; here it cost ~35 s more of the suite)."""
    r = up()
    assert r.returncode == 0, r.stderr
    first = sh(H, "readlink /opt/deployer/current")
    pid = main_pid(H)

    r = up()  # no-op: no new release, nothing restarted
    assert r.returncode == 0 and "unchanged, nothing restarted" in r.stdout
    assert releases() == [first.rsplit("/", 1)[1]] and main_pid(H) == pid
    assert audit()[-1]["changed"] is False and audit()[-1]["result"] == "ok"
    assert audit()[-2]["command"] == "up" and audit()[-2]["changed"] is True and "watch" in audit()[-2]["stage_seconds"]
    assert sh(H, "stat -c %a /opt/deployer/audit.jsonl") == "600"   # the no-op's own append: root's alone

    r = deployer("releases", "--sandbox", "--json")
    data = json.loads(r.stdout)[H]
    assert data["current"] == first.rsplit("/", 1)[1] and len(data["releases"]) == 1
    r = deployer("status", "--sandbox", "--json")
    st = json.loads(r.stdout)[H]
    assert st["health"] == 200 and st["spec"]["acceptance_rate"] > 0 and len(st["gpu_memory_used_mib"]) == 8


def test_plain_ansible_playbook_without_this_package():
    """The README's plain `ansible-playbook` works from a Python that has ansible-core and nothing else."""
    from deployer.sandbox import hosts as sb
    bin_ = CACHE / "venvs" / "ansible-core-only" / "bin"
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
           "HOME": str(__import__("pathlib").Path.home()), "LANG": "C.UTF-8"}
    probe = subprocess.run([str(bin_ / "python"), "-c", "import deployer"], capture_output=True, text=True, env=env,
                           cwd="/")
    assert probe.returncode != 0, "the plain-Ansible Python must not have the deployer package"
    live = sh(H, "basename $(readlink /opt/deployer/current)")
    inv = str(sb.STATE / "inventory.yml")
    lines = len(audit())
    r = subprocess.run([str(bin_ / "ansible-playbook"), "-i", inv, "playbooks/up.yml", "--check"],
                       capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"release {live} is already live and serving" in flat(r.stdout), r.stdout[-3000:]
    assert len(audit()) == lines, "a --check no-op writes nothing, not even an audit line"
    # ... and a real deploy of a changed release, every stage, with no deployer package anywhere (issue 24 item 6:
    # only the no-op shortcut was ever run this way)
    pid = main_pid(H)
    r = subprocess.run([str(bin_ / "ansible-playbook"), "-i", inv, "playbooks/up.yml",
                        "-e", "deployer_max_model_len=20480", "-e", "verify_enabled=false"],
                       capture_output=True, text=True, cwd=ROOT, env=env, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    new = sh(H, "basename $(readlink /opt/deployer/current)")
    assert new != live and main_pid(H) != pid
    assert "20480" in json.loads(sh(H, "cat /opt/deployer/current/release.json"))["argv"]
    assert json.loads(sh(H, "cat /opt/deployer/current/release.json"))["result"] == "live"
    assert sh(H, "curl -s -o /dev/null -w '%{http_code}' " + auth() + " localhost:8000/v1/models") == "200"
    r = subprocess.run([str(bin_ / "ansible-playbook"), "-i", inv, "playbooks/releases.yml", "-v"],
                       capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"current: {new}" in r.stdout, r.stdout[-3000:]


def test_rollback_to_unknown_release_is_refused():
    r = deployer("rollback", "--sandbox", "--to", "nosuchrelease")
    assert r.returncode == 3          # refused before anything changed
    assert "release nosuchrelease not found" in flat(r.stderr)


def test_concurrent_up_one_refused():
    env_args = ["-e", "deployer_max_model_len=32768", *FAST]  # a restart makes the first run long
    p1 = subprocess.Popen([sys.executable, "-m", "deployer.cli", "up", "--sandbox", *env_args], cwd=ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for _ in range(600):   # the first run holds the lock once it is past its first task
        if sh(H, "test -f /opt/deployer/.lock/holder.json && echo held || echo free") == "held":
            break
        time.sleep(0.1)
    r2 = up()
    o1, e1 = p1.communicate(timeout=600)
    assert p1.returncode == 0, e1
    assert r2.returncode == 6, r2.stderr
    assert "host is locked by" in flat(r2.stderr) and "`up`" in flat(r2.stderr)
    assert "held by a live deploy on this machine" in flat(r2.stderr)
    assert sh(H, "test -d /opt/deployer/.lock && echo held || echo free") == "free"   # released after


def test_stale_lock_reported_and_unlock():
    from deployer import controller_id
    me = controller_id.identity(os.getpid())

    def hold(controller, pid, age, ttl=600, machine_id=None, pid_start=""):
        rec = {"token": "x", "user": "ghost", "controller": controller, "pid": pid, "command": "up",
               "since": time.time() - age, "since_iso": f"{age} s ago", "ttl_seconds": ttl,
               "machine_id": me["machine_id"] if machine_id is None else machine_id, "boot_id": me["boot_id"],
               "pid_start": pid_start}
        sh(H, f"rm -rf /opt/deployer/.lock; mkdir -p /opt/deployer/.lock && "
              f"echo '{json.dumps(rec)}' > /opt/deployer/.lock/holder.json")
    # a live lock from another controller, within its time-to-live: refused, naming the holder (exit 6)
    hold("other-controller", 1, age=5)
    r = up()
    assert r.returncode == 6 and "ghost@other-controller" in r.stderr, r.stderr
    r = deployer("unlock", "--sandbox")
    assert r.returncode == 0 and "removed lock of ghost@" in flat(r.stderr)
    # guards: a dead run's lock does not need a human - its process gone from this controller, or (the host's
    # view) older than the time-to-live it declared: the next run takes it over and says whose it was
    hold(socket.gethostname(), 2 ** 22 + 12345, age=5)
    r = up()
    assert r.returncode == 0, r.stdout + r.stderr
    assert "took over a stale lock of ghost@" in flat(r.stderr) and "is gone from this controller" in flat(r.stderr)
    # guards (issue 20, item 4): a controller with the same host name but another machine (cloud images,
    # containers) is not this one: its pid says nothing here, so its lock is never taken over but by its TTL
    hold(socket.gethostname(), 2 ** 22 + 12345, age=5, machine_id="0123456789abcdef0123456789abcdef")
    r = up()
    assert r.returncode == 6 and "ghost@" in r.stderr, r.stdout + r.stderr
    # ... and a pid of this machine that now names another process (its start time differs) is a dead holder
    hold(socket.gethostname(), os.getpid(), age=5, pid_start="1")
    r = up()
    assert r.returncode == 0 and "the pid now names another process" in flat(r.stderr), r.stdout + r.stderr
    hold("other-controller", 1, age=700, ttl=600)
    r = up("-e", "deployer_noop_check=false")
    assert r.returncode == 0 and "older than its time-to-live (600 s)" in flat(r.stderr), r.stdout + r.stderr
    assert sh(H, "test -e /opt/deployer/.lock && echo held || echo free") == "free"


def test_pruning_keeps_exactly_n():
    for i in range(6):
        sh(H, f"mkdir -p /opt/deployer/releases/old{i} && echo '{{\"deployed_at\": {1000 + i}}}' "
              f"> /opt/deployer/releases/old{i}/release.json")
    r = up("-e", "release_keep=3", "-e", "deployer_noop_check=false")   # a no-op changes nothing, prunes nothing
    assert r.returncode == 0, r.stderr
    left = releases()
    assert len(left) == 3, left
    assert sh(H, "basename $(readlink /opt/deployer/current)") in left
    assert sh(H, "basename $(readlink /opt/deployer/previous)") in left
    assert not any(x.startswith("old") for x in left)


def webhook():
    """A webhook receiver on this machine: (server, the JSON bodies it got, its URL)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    got = []

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self):
            got.append(json.loads(self.rfile.read(int(self.headers["content-length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *a):
            pass
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, got, f"http://127.0.0.1:{srv.server_address[1]}/hook"


def schedule_env(tmp_path):
    return dict(os.environ, XDG_CONFIG_HOME=str(tmp_path / "cfg"), XDG_STATE_HOME=str(tmp_path / "st"))


def test_scheduled_if_changed_does_nothing_when_nothing_changed(tmp_path):
    srv, got, url = webhook()
    env = schedule_env(tmp_path)
    r = deployer("schedule", "add", "--sandbox", "--at", "Sun 03:00", "--if-changed", "--webhook", url, env=env)
    assert r.returncode == 0, r.stderr
    sid = r.stdout.split()[1].rstrip(":")
    assert "0 3 * * 0 /usr/bin/env" in subprocess.run(["crontab", "-l"], capture_output=True, text=True).stdout
    try:
        pid, n = main_pid(H), len(releases())
        tokens = sh(H, "curl -s localhost:8000/metrics | grep '^vllm:prompt_tokens_total'")
        r = deployer("schedule", "run", sid, env=env)
        assert r.returncode == 0, r.stderr
        ev = json.loads(r.stdout.strip().splitlines()[-1])
        assert ev["reason"] == "nothing changed; did nothing" and ev["hosts"] == [H]
        assert main_pid(H) == pid and len(releases()) == n
        # --if-changed did nothing at all: not even the smoke test's request (a plain `up` would send one)
        assert sh(H, "curl -s localhost:8000/metrics | grep '^vllm:prompt_tokens_total'") == tokens
        log = (tmp_path / "st" / "deployer" / f"schedule-{sid}.log").read_text()
        assert '"event": "result"' in log and '"scheduled_up"' in log
        assert got and got[-1]["reason"] == "nothing changed; did nothing" and got[-1]["exit_code"] == 0
    finally:
        deployer("schedule", "remove", sid, env=env)
        srv.shutdown()
    assert f"deployer-schedule:{sid}" not in subprocess.run(["crontab", "-l"], capture_output=True, text=True).stdout


def test_schedule_outside_window_does_nothing(tmp_path):
    import datetime
    env = dict(__import__("os").environ, XDG_CONFIG_HOME=str(tmp_path / "cfg"), XDG_STATE_HOME=str(tmp_path / "st"))
    now = datetime.datetime.now()
    w = f"{(now.hour + 2) % 24:02d}:00-{(now.hour + 3) % 24:02d}:00"
    r = deployer("schedule", "add", "--sandbox", "--at", "daily 03:00", "--window", w, env=env)
    sid = r.stdout.split()[1].rstrip(":")
    try:
        r = deployer("schedule", "run", sid, env=env)
        assert r.returncode == 0
        assert f"outside window {w}" in r.stdout
    finally:
        deployer("schedule", "remove", sid, env=env)


def test_unlock_without_a_lock_says_so():
    r = deployer("unlock", "--sandbox")
    assert r.returncode == 0, r.stderr
    assert "no lock" in flat(r.stderr)


def test_watch_logs_and_status_commands():
    r = deployer("watch", "--sandbox")
    assert r.returncode == 0, r.stderr
    assert stages(r.stderr, H).get("watch") == "unchanged" and "ready after" in r.stderr
    r = deployer("logs", "--sandbox", "-n", "400")
    assert r.returncode == 0 and "Application startup complete" in r.stdout, r.stdout[-2000:] + r.stderr
    r = deployer("status", "--sandbox")
    assert r.returncode == 0, r.stderr
    live = sh(H, "basename $(readlink /opt/deployer/current)")
    assert f"{H}: release {live}" in flat(r.stdout) and "health 200" in r.stdout and "over 8 GPUs" in r.stdout
    sh(H, "systemctl stop deployer-engine")
    try:
        r = deployer("status", "--sandbox")
        assert r.returncode == 1, r.stdout + r.stderr             # a cron job can act on it
        assert "unit inactive" in flat(r.stdout) and "health 200" not in r.stdout
    finally:
        sh(H, "systemctl start deployer-engine")
    assert deployer("watch", "--sandbox").returncode == 0


def test_rollback_to_a_named_release_and_one_whose_venv_is_gone():
    rels = releases()
    live = sh(H, "basename $(readlink /opt/deployer/current)")
    other = [x for x in rels if x != live][0]
    r = deployer("rollback", "--sandbox", "--to", other)
    assert r.returncode == 0, r.stderr
    assert sh(H, "basename $(readlink /opt/deployer/current)") == other
    assert sh(H, "basename $(readlink /opt/deployer/previous)") == live
    # a target whose venv is gone is refused before anything restarts
    pid = main_pid(H)
    sh(H, f"mv {venv()}/.deployer-installed /root/marker")
    try:
        r = deployer("rollback", "--sandbox", "--to", live)
    finally:
        sh(H, f"mv /root/marker {venv()}/.deployer-installed")
    assert r.returncode == 3, r.stderr    # refused before anything changed
    assert f"rollback target needs files that are gone: {venv()}/.deployer-installed" in flat(r.stderr)
    assert main_pid(H) == pid and sh(H, "basename $(readlink /opt/deployer/current)") == other


def test_a_changed_drafter_is_a_new_release_and_is_shipped(tmp_path):
    from deployer.sandbox import hosts as sb
    live = sh(H, "basename $(readlink /opt/deployer/current)")
    stores = set(sh(H, "ls /opt/deployer/drafters").split())
    extra = sb.STATE / "drafter" / "generation_config.json"
    extra.write_text('{"max_new_tokens": 1}\n')
    vars_file = tmp_path / "vars.yml"
    vars_file.write_text("deployer_max_model_len: 65536\nverify_enabled: false\n")   # the checks: test_real_host
    try:
        r = up("-e", f"@{vars_file}", "--limit", H)
    finally:
        extra.unlink()
    assert r.returncode == 0, r.stderr
    assert stages(r.stderr, H)["drafter"] == "changed"
    new = set(sh(H, "ls /opt/deployer/drafters").split()) - stores
    assert len(new) == 1, new
    argv = json.loads(sh(H, "cat /opt/deployer/current/argv.json"))
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec["model"] == f"/opt/deployer/drafters/{new.pop()}" and "65536" in argv
    assert sh(H, f"cat {spec['model']}/generation_config.json") == '{"max_new_tokens": 1}'
    assert sh(H, "basename $(readlink /opt/deployer/current)") != live
    # a --limit that matches nothing is bad input, never a silent success
    r = up("--limit", "no-such-host")
    assert r.returncode == 2 and "no host matched" in flat(r.stderr)


def test_a_drafter_checksum_mismatch_on_the_host_is_refused_before_any_restart(tmp_path):
    """The host checks every drafter file against the controller's sha256; a mismatch ships nothing into the store.
    The wrong sha256 comes from a poisoned copy of the controller's hash cache (XDG_CACHE_HOME of this one run):
    the shared cache is never touched, so a run killed here leaves no poison behind (it once did: every later deploy
    of that sandbox slot failed its drafter check until the cache was cleared)."""
    from deployer import drafter
    from deployer.sandbox import hosts as sb
    data = json.loads(drafter.CACHE.read_text())
    mine = str(sb.STATE / "drafter" / "model.safetensors")      # this sandbox slot's drafter only
    good = {k: v for k, v in data.items() if k.split("|")[0] == mine}
    assert good, "the drafter's hash is cached by the deploys before this test"
    poisoned = tmp_path / "cache" / "deployer" / "hashes.json"
    poisoned.parent.mkdir(parents=True)
    poisoned.write_text(json.dumps(dict(data, **dict.fromkeys(good, "0" * 64))))
    stores, pid = set(sh(H, "ls /opt/deployer/drafters").split()), main_pid(H)
    r = up(env=dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache")))
    assert r.returncode == 1, r.stdout + r.stderr
    assert stages(r.stderr, H)["drafter"] == "failed" and "model.safetensors: FAILED" in r.stderr
    assert set(sh(H, "ls /opt/deployer/drafters").split()) == stores and main_pid(H) == pid   # nothing in use changed
    assert up().returncode == 0


def test_schedule_through_a_real_systemd_timer():
    """A controller with systemd gets a timer; its service runs `deployer schedule run` (here: outside the window,
    so it only logs).  Run on a sandbox host, which boots systemd (the build machine does not)."""
    deployer_bin = ROOT / ".venv" / "bin" / "deployer"
    need(deployer_bin.exists(), "needs the project's .venv (scripts/dev.sh)")
    now = time.localtime()
    window = f"{(now.tm_hour + 2) % 24:02d}:00-{(now.tm_hour + 3) % 24:02d}:00"
    out = sh(H, f"{deployer_bin} schedule add --host 192.0.2.7 --at 'Mon,Thu 02:30' --window {window}")
    sid = out.split()[1].rstrip(":")
    assert f"systemd timer deployer-schedule-{sid}.timer (OnCalendar=Mon,Thu *-*-* 02:30:00)" in flat(out)
    try:
        assert sh(H, f"systemctl is-enabled deployer-schedule-{sid}.timer") == "enabled"
        assert "Mon,Thu *-*-* 02:30:00" in sh(H, f"systemctl show -p TimersCalendar deployer-schedule-{sid}.timer")
        sh(H, f"systemctl start deployer-schedule-{sid}.service")    # what the timer fires (oneshot: waits)
        log = sh(H, f"cat /root/.local/state/deployer/schedule-{sid}.log")
        assert '"event": "skipped"' in log and f"outside window {window}" in log
    finally:
        sh(H, f"{deployer_bin} schedule remove {sid}")
    assert sh(H, f"test -e /etc/systemd/system/deployer-schedule-{sid}.timer && echo left || echo gone") == "gone"


def test_an_interrupted_drafter_copy_is_resumed():
    """A copy cut off half-way leaves the staging dir behind; the next up sends what is missing and checks all."""
    from deployer.drafter import tree_manifest
    from deployer.sandbox import hosts as sb
    src = sb.STATE / "drafter"
    extra = src / "special_tokens_map.json"
    extra.write_text('{"eos_token": "[EOS]"}\n')
    try:
        m = tree_manifest(str(src))
        staging = f"/opt/deployer/drafters/.incoming-{m['tree_sha256'][:16]}"
        weights = (src / "model.safetensors").read_bytes()
        sh(H, f"mkdir -p {staging} && head -c {len(weights) // 2} /dev/zero > {staging}/model.safetensors")
        sb.copy_to(H, src / "config.json", f"{staging}/config.json", mode="0644")
        before = sh(H, f"stat -c %i:%Y {staging}/config.json {staging}/model.safetensors").split()
        r = up()
    finally:
        extra.unlink()
    assert r.returncode == 0, r.stdout + r.stderr
    store = f"/opt/deployer/drafters/{m['tree_sha256'][:16]}"
    assert sh(H, f"cd {store} && sha256sum --quiet -c .deployer-sha256sums && echo intact") == "intact"
    # what was already there whole was not sent again (issue 24 item 8: only the end state was asserted): the copy
    # module replaces a file it sends (a new inode and mtime), the staging dir became the store by a rename
    after = sh(H, f"stat -c %i:%Y {store}/config.json {store}/model.safetensors").split()
    assert after[0] == before[0] and after[1] != before[1], (before, after)
    assert sh(H, f"test -e {staging} && echo left || echo moved") == "moved"
    assert up().returncode == 0


def test_if_changed_skips_even_the_full_path_when_live_and_deploys_what_changed():
    """guards (issue 24, item 2): the no-op shortcut answered before ``deployer_if_changed`` was ever read, so a
    deployer that ignored --if-changed passed the scheduled test; and the half where something changed and it
    deploys was never run.  With the shortcut off, --if-changed must still leave a live release alone (no restart,
    not even the smoke test's request); with a changed setting it deploys."""
    assert up().returncode == 0
    cur, pid = sh(H, "readlink /opt/deployer/current"), main_pid(H)
    tokens = sh(H, "curl -s localhost:8000/metrics | grep '^vllm:prompt_tokens_total'")
    r = up("--if-changed", "-e", "deployer_noop_check=false")
    assert r.returncode == 0, r.stdout + r.stderr
    assert main_pid(H) == pid and sh(H, "readlink /opt/deployer/current") == cur
    assert sh(H, "curl -s localhost:8000/metrics | grep '^vllm:prompt_tokens_total'") == tokens, "a smoke request ran"
    assert "smoke" not in stages(r.stderr, H), r.stderr
    r = up("--if-changed", "-e", "deployer_max_model_len=49152", *FAST)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sh(H, "readlink /opt/deployer/current") != cur and main_pid(H) != pid
    assert "49152" in json.loads(sh(H, "cat /run/deployer-standin/argv.json"))["argv"]
    assert stages(r.stderr, H).get("smoke") in ("ok", "unchanged", "changed"), r.stderr


def test_a_renamed_unit_is_retired_by_the_next_up_and_a_rollback_crosses_the_rename():
    """Hosts deployed before 2026-12 run the unit deployer-vllm; the default is now deployer-engine (or an operator
    renames it).  The next `up` must stop and remove the old unit before it starts the new one - although the old
    server holds the port and GPU memory, which preflight would otherwise refuse - and a rollback to a release
    rendered under the old name runs it under the new one, never bringing the old unit back."""
    from deployer.sandbox import hosts as sbx
    old = "deployer-vllm"
    r = up("-e", f"deployer_service_name={old}", "-e", "deployer_max_model_len=7168", *FAST)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sh(H, f"systemctl is-active {old}") == "active"
    assert sh(H, "ls /etc/systemd/system/deployer-engine.service 2>&1 || true").endswith("No such file or directory")
    r0 = sh(H, "readlink /opt/deployer/current").rsplit("/", 1)[1]
    assert sh(H, f"ls /opt/deployer/releases/{r0}/*.service") == f"/opt/deployer/releases/{r0}/{old}.service"

    sbx.set_knobs(H, gpus={"used_mib": [41234] * 8})   # the old server's memory (the stand-in holds none)
    try:
        r = up("-e", "deployer_max_model_len=7680", *FAST)
    finally:
        sbx.set_knobs(H, gpus={})
    assert r.returncode == 0, r.stdout + r.stderr
    assert sh(H, f"systemctl is-active {SVC}") == "active"
    assert sh(H, f"systemctl is-active {old} || true") in ("inactive", "unknown")
    assert sh(H, f"ls -d /etc/systemd/system/{old}.service* 2>/dev/null || true") == ""
    assert sh(H, f"systemctl is-enabled {old} 2>&1 || true") != "enabled"

    r = deployer("rollback", "--sandbox")       # back to r0, rendered when the unit was deployer-vllm
    assert r.returncode == 0, r.stdout + r.stderr
    assert sh(H, "readlink /opt/deployer/current").endswith(r0)
    assert sh(H, f"systemctl is-active {SVC}") == "active"
    assert sh(H, f"ls -d /etc/systemd/system/{old}.service* 2>/dev/null || true") == ""
    assert sh(H, f"cmp /opt/deployer/releases/{r0}/{old}.service /etc/systemd/system/{SVC}.service && echo same") \
        == "same"
    argv = json.loads(sh(H, "cat /opt/deployer/current/argv.json"))
    assert "7168" in argv and "7680" not in argv, argv


def test_a_schedule_inside_its_window_deploys_what_changed_and_a_failed_one_calls_its_webhook(tmp_path):
    """Issue 24's untested promises: a scheduled `up` inside its window deploys (a changed setting: a new release, the
    server restarted) and says so to its webhook; a scheduled `up` that fails (a read-only check refuses it) exits with
    the failure's code for cron, posts that code to the webhook, and leaves the live release as it was."""
    import datetime
    now = datetime.datetime.now()
    window = f"{(now - datetime.timedelta(hours=1)):%H:%M}-{(now + datetime.timedelta(hours=1)):%H:%M}"
    srv, got, url = webhook()
    env = schedule_env(tmp_path)
    ids = []
    try:
        r = deployer("schedule", "add", "--sandbox", "--at", "daily 03:00", "--window", window, "--webhook", url,
                     "-e", "deployer_max_model_len=9216", *FAST, env=env)
        assert r.returncode == 0, r.stdout + r.stderr
        ids.append(r.stdout.split()[1].rstrip(":"))
        pid, before = main_pid(H), sh(H, "readlink /opt/deployer/current")
        r = deployer("schedule", "run", ids[-1], env=env)
        assert r.returncode == 0, r.stdout + r.stderr
        after = sh(H, "readlink /opt/deployer/current")
        assert after != before and main_pid(H) != pid
        assert "9216" in json.loads(sh(H, "cat /opt/deployer/current/argv.json"))
        assert got and got[-1]["exit_code"] == 0 and got[-1]["reason"] != "nothing changed; did nothing", got

        r = deployer("schedule", "add", "--sandbox", "--at", "daily 03:00", "--window", window, "--webhook", url,
                     "-e", "deployer_max_model_len=9728", "-e", "preflight_disk_margin_gib=100000", *FAST, env=env)
        assert r.returncode == 0, r.stdout + r.stderr
        ids.append(r.stdout.split()[1].rstrip(":"))
        pid = main_pid(H)
        r = deployer("schedule", "run", ids[-1], env=env)
        assert r.returncode == 3, r.stdout + r.stderr          # Exit.PREFLIGHT: a read-only check refused it
        assert got[-1]["exit_code"] == 3 and got[-1]["reason"] == "deploy failed", got[-1]
        assert sh(H, "readlink /opt/deployer/current") == after and main_pid(H) == pid
        log = (tmp_path / "st" / "deployer" / f"schedule-{ids[-1]}.log").read_text()
        assert '"event": "scheduled_up"' in log and '"exit_code": 3' in log
    finally:
        for sid in ids:
            deployer("schedule", "remove", sid, env=env)
        srv.shutdown()
