#!/usr/bin/env python3
"""Recovery time per fault (issue #12): what clients of the host see while a fault is handled.

    python bench/recovery.py [--slot N] [--only NAME ...]    (starts its own sandbox host, stops it at the end)

For each fault of docs/reliability.md's matrix that changes what serves, one run against one sandbox host
(real sshd, real systemd, the stand-in's ~10 s load instead of the real ~25 min).  A probe ON THE HOST asks
/health every 0.2 s for the whole case (a client next to the server: it sees through an SSH outage), so the
figures are the server's own availability, not the controller's view:

- ``outage_s``: the longest stretch without a 200 (what a client without a balancer waits through);
- ``wall_s``: the deploy command(s) from the fault to done, including any rerun needed to converge;
- ``exit``: the exit codes, in order.

A successful deploy's own restart is the first row: a rollback can never be shorter than one load of the
previous release.  With the real model every outage that contains a load is ~25 minutes longer.
Results go to bench/results/recovery.json; docs/reliability.md carries the table.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
FAST = ["-e", "verify_enabled=false"]
PROBE = ("systemd-run --unit deployer-recovery-probe --collect /bin/sh -c 'while :; do "
         "echo $(date +%s.%N) $(curl -s -m 1 -o /dev/null -w %{http_code} http://127.0.0.1:8000/health); "
         "sleep 0.2; done > /run/recovery-probe.log'")


def sb():
    from deployer.sandbox import hosts
    return hosts


def sh(cmd, check=True):
    return sb().ssh("sbx1", cmd, check=check).stdout.strip()


def cli(*args, wait=True):
    cmd = [sys.executable, "-m", "deployer.cli", *args]
    if not wait:
        return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True).returncode


def up(*args, wait=True):
    return cli("up", "--sandbox", *args, *FAST, wait=wait)


def knobs(**kw):
    sb().set_knobs("sbx1", standin=kw)


def outage(lines):
    """The longest stretch without a 200 in the probe's lines (seconds), and when the probe ran."""
    worst, down_since, samples = 0.0, None, 0
    for line in lines:
        try:
            t, code = line.split()
            t = float(t)
        except ValueError:
            continue
        samples += 1
        if code != "200" and down_since is None:
            down_since = t
        elif code == "200" and down_since is not None:
            worst, down_since = max(worst, t - down_since), None
    if down_since is not None:
        worst = float("inf")
    return worst, samples


def wait_for(cmd, seconds=300):
    for _ in range(int(seconds * 10)):
        if sh(cmd, check=False):
            return True
        time.sleep(0.1)
    return False


# ---- the cases: each returns the exit codes; the probe runs around it
def c_good_deploy():
    return [up("-e", "deployer_gpu_memory_utilization=0.9561")]


def _fail(arg, *extra, **knob):
    knobs(only_if_arg=arg, **knob)
    try:
        return [up("-e", f"deployer_gpu_memory_utilization={arg}", *extra)]
    finally:
        knobs()


def c_crash_in_weights():
    return _fail("0.9501", crash_phase="weights", load_seconds=3)


def c_crash_in_api():
    return _fail("0.9506", crash_phase="api", load_seconds=3)


def c_stall_in_kv_cache():
    return _fail("0.9512", "-e", "watch_stall_seconds={'default': 20}", "-e", "watch_budget_seconds=600",
                 stall_phase="kv_cache")


def c_fatal_line_oom():
    return _fail("0.9522", "-e", "watch_stall_seconds={'default': 600}", fatal_line_phase="kv_cache")


def c_smoke_fails():
    return _fail("0.9523", "-e", "watch_budget_seconds=40", unhealthy_after_ready_seconds=0)


def c_controller_killed_in_watch():
    knobs(load_seconds=12)
    try:
        p = up("-e", "deployer_gpu_memory_utilization=0.9572", wait=False)
        wait_for("grep -l 0.9572 /run/deployer-standin/argv.json 2>/dev/null")
        time.sleep(2)
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    finally:
        knobs()
    return [-9, up("-e", "deployer_gpu_memory_utilization=0.9572")]


def c_link_down_20s_in_watch():
    knobs(load_seconds=30)
    try:
        p = up("-e", "deployer_gpu_memory_utilization=0.9573", wait=False)
        wait_for("grep -l 0.9573 /run/deployer-standin/argv.json 2>/dev/null")
        veth = f"dps{sb().SLOT or ''}-sbx1"
        subprocess.run(["ip", "link", "set", "dev", veth, "down"], check=True)
        time.sleep(20)
        subprocess.run(["ip", "link", "set", "dev", veth, "up"], check=True)
        p.communicate()
    finally:
        knobs()
    return [p.returncode]


OVERRIDE = {}


def c_reboot_after_live():
    """The probe dies with the host: the outage is measured from here, from the reboot to the first 200."""
    t0 = time.time()
    sb().reboot("sbx1")
    for _ in range(600):        # until systemd brought the live release back by itself
        if sh("curl -s -o /dev/null -w %{http_code} http://127.0.0.1:8000/health", check=False) == "200":
            break
        time.sleep(0.5)
    OVERRIDE["outage_s"] = round(time.time() - t0, 1)
    return [up()]


def c_preflight_refusal_7_gpus():
    sb().set_knobs("sbx1", gpus={"count": 7})
    try:
        return [up("-e", "deployer_gpu_memory_utilization=0.9574")]
    finally:
        sb().set_knobs("sbx1", gpus={})


def c_drafter_tampered():
    d = json.loads(sh("cat /opt/deployer/current/release.json"))["drafter_dir"]
    sh(f"printf X | dd of={d}/model.safetensors bs=1 seek=4096 conv=notrunc status=none")
    return [up()]


CASES = [c_good_deploy, c_crash_in_weights, c_crash_in_api, c_stall_in_kv_cache, c_fatal_line_oom, c_smoke_fails,
         c_controller_killed_in_watch, c_link_down_20s_in_watch, c_reboot_after_live, c_preflight_refusal_7_gpus,
         c_drafter_tampered]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--slot", type=int, default=int(os.environ.get("DEPLOYER_SANDBOX_SLOT", "0") or 0))
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--keep", action="store_true", help="leave the sandbox host running")
    a = ap.parse_args()
    if a.slot:
        os.environ["DEPLOYER_SANDBOX_SLOT"] = str(a.slot)
    hosts = sb()
    hosts.start(1)
    rows = []
    try:
        if up() != 0:
            raise SystemExit("the first deploy failed")
        for case in CASES:
            name = case.__name__[2:]
            if a.only and name not in a.only:
                continue
            OVERRIDE.clear()
            sh(PROBE)
            wait_for("test -s /run/recovery-probe.log && echo ok", 10)
            t0 = time.time()
            codes = case()
            wall = time.time() - t0
            time.sleep(1)
            sh("systemctl stop deployer-recovery-probe", check=False)
            worst, samples = outage(sh("cat /run/recovery-probe.log; rm -f /run/recovery-probe.log").splitlines())
            row = {"case": name, "exit": codes, "wall_s": round(wall, 1),
                   "outage_s": round(worst, 1) if worst != float("inf") else None, "samples": samples, **OVERRIDE}
            rows.append(row)
            print(json.dumps(row), flush=True)
            if up() != 0:   # back to the defaults, serving, for the next case
                raise SystemExit(f"after {name}: the defaults did not deploy")
    finally:
        if not a.keep:
            hosts.stop()
    out = ROOT / "bench" / "results" / "recovery.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=1))
    print("\n| fault | exit | outage (s) | wall (s) |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['case']} | {' then '.join(map(str, r['exit']))} | {r['outage_s']} | {r['wall_s']} |")


if __name__ == "__main__":
    main()
