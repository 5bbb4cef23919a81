#!/usr/bin/env python3
"""Orchestration cost next to its goals (issue #13), every figure measured in this one run.

    python bench/ratios.py [--hosts 8] [--runs 3]      (starts and stops its own sandbox hosts)

Prints one table: measurement, seconds, goal, ratio, met.  Baseline: `ansible -m ping` of the same
inventory, best of --runs, measured in the same run.  The stand-in's load (what a real GPU spends ~25 min on)
and vLLM's own checks are measured from the run's JSON events and reported separately, as the goals exclude
them.  Results also go to bench/results/ratios.json.
"""
import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from deployer import tools  # noqa: E402
from deployer.sandbox import hosts as sb  # noqa: E402


def cli(*args):
    t0 = time.time()
    r = subprocess.run([sys.executable, "-m", "deployer.cli", *args, "--json"], capture_output=True, text=True,
                       cwd=ROOT)
    dt = time.time() - t0
    if r.returncode != 0:
        raise SystemExit(f"deployer {' '.join(args)} failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return dt, [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]


def ping(limit=None):
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"))
    args = [tools.venv_bin("ansible"), "-i", str(sb.STATE / "inventory.yml"), "gpu", "-m", "ansible.builtin.ping",
            "-o"] + (["--limit", limit] if limit else [])
    t0 = time.time()
    subprocess.run(args, check=True, capture_output=True, env=env, cwd=ROOT)
    return time.time() - t0


# Actions that run in the controller's playbook process and never reach a host (every other task is a round trip
# and a Python start on the host).
LOCAL_ACTIONS = {"set_fact", "assert", "debug", "fail", "meta", "include_tasks", "include_role", "import_tasks",
                 "add_host", "group_by", "include_vars"}


def remote_tasks(events, host):
    """How many tasks of the run reached ``host`` (ran a module there), from the --json task events."""
    return sum(1 for e in events if e.get("event") in ("task_ok", "task_failed") and e.get("host") == host
               and (e.get("action") or "").split(".")[-1] not in LOCAL_ACTIONS)


def ansible_tasks(k, limit=None):
    """Plain ansible-playbook running ``k`` ping tasks (each a module run on the host, like a deploy's remote
    tasks) on the sandbox's gpu hosts: what Ansible itself costs for that many round trips."""
    pb = sb.STATE / f"bench-{k}-pings.yml"
    pb.write_text("- hosts: gpu\n  gather_facts: false\n  tasks:\n"
                  + "".join(f"    - name: ping {i}\n      ansible.builtin.ping:\n" for i in range(k)))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"))
    args = [tools.venv_bin("ansible-playbook"), "-i", str(sb.STATE / "inventory.yml"), str(pb)] + \
        (["--limit", limit] if limit else [])
    t0 = time.time()
    subprocess.run(args, check=True, capture_output=True, env=env, cwd=ROOT)
    return time.time() - t0


def best(fn, runs):
    return min(fn() for _ in range(runs))


def excluded(events):
    """Seconds the goals exclude, the longest host: the vLLM install and the load (their stages' seconds) and vLLM's
    own checks - the verifier's own run (deployer_result.verify_seconds), not the verify stages: the checks run
    while the drafter is copied, so what is left of those stages (starting the checks, waiting on a copy that
    outlasted them) is the deployer's overhead.  Stages run in parallel across hosts: the longest host's sum is
    what the wall saw."""
    per = {}
    for e in events:
        if e.get("event") == "stage" and e.get("stage") in ("install", "watch"):
            per[e["host"]] = per.get(e["host"], 0.0) + float(e.get("seconds") or 0)
        if e.get("event") == "result":
            for host, r in (e.get("hosts") or {}).items():
                per[host] = per.get(host, 0.0) + float(r.get("verify_seconds") or 0)
    return max(per.values() or [0.0])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--one-host-only", action="store_true", help="skip the fleet figures (minutes of cold installs)")
    a = ap.parse_args()
    rows = []

    def row(name, seconds, goal_text, ratio=None, limit=None):
        rows.append({"measurement": name, "seconds": round(seconds, 2), "goal": goal_text,
                     "ratio": None if ratio is None else round(ratio, 2),
                     "met": None if limit is None else bool((ratio if ratio is not None else seconds) <= limit)})

    sb.stop()
    sb.start(1)
    cold, ev = cli("up", "--sandbox")
    cold_excl = excluded(ev)
    ping1 = best(ping, a.runs)
    noop1 = best(lambda: cli("up", "--sandbox")[0], a.runs)
    check1 = best(lambda: cli("up", "--sandbox", "--check")[0], a.runs)
    status1 = best(lambda: cli("status", "--sandbox")[0], a.runs)
    releases1 = best(lambda: cli("releases", "--sandbox")[0], a.runs)
    cli("up", "--sandbox", "-e", "deployer_max_model_len=65536")
    rollbacks = []
    for _ in range(a.runs):        # each rollback goes back to the other release: every run is a real one
        rb, ev = cli("rollback", "--sandbox")
        rollbacks.append((rb - excluded(ev), excluded(ev)))
    rb_orch, rb_load = min(rollbacks)
    row("ansible -m ping, 1 host (baseline)", ping1, "-")
    row("no-op up, 1 host", noop1, "<= 3x ping", noop1 / ping1, 3)
    row("up --check (nothing to change), 1 host", check1, "<= 3x ping", check1 / ping1, 3)
    row("status, 1 host", status1, "<= 2 s", None, 2)
    row("releases, 1 host", releases1, "<= 2 s", None, 2)
    row(f"rollback, orchestration (load excluded), best of {a.runs}", rb_orch, "<= 5 s", None, 5)
    row("rollback, the stand-in's load", rb_load, "(excluded)")
    row("cold up, overhead (install, vLLM checks, load excluded)", cold - cold_excl, "<= 20 s", None, 20)
    row("cold up, install + vLLM checks + load", cold_excl, "(excluded)")
    sb.stop()
    if a.one_host_only:
        return report(rows)

    n = a.hosts
    sb.start(n)
    coldn, ev = cli("up", "--sandbox")
    coldn_excl = excluded(ev)
    pingn = best(ping, a.runs)
    noopn = best(lambda: cli("up", "--sandbox")[0], a.runs)
    row(f"ansible -m ping, {n} hosts", pingn, "-")
    row(f"no-op up, {n} hosts", noopn, f"<= 1.5x no-op of 1 host; <= 3x ping of {n}", noopn / noop1, 1.5)
    row(f"no-op up, {n} hosts / their ping", noopn, "<= 3x ping (#13)", noopn / pingn, 3)
    row(f"no-op up, {n} hosts / their ping", noopn, "<= 2x ping (#24)", noopn / pingn, 2)
    row(f"cold up, {n} hosts, overhead", coldn - coldn_excl, "<= 2x one host's overhead",
        (coldn - coldn_excl) / max(0.01, cold - cold_excl), 2)
    row(f"cold up, {n} hosts, install + vLLM checks + load (longest host)", coldn_excl, "(excluded)")
    # Ansible's own scaling for as many round trips as the cold deploy made on one host, on this machine: the
    # floor under the ratio above (the hosts' module runs share the controller's cores here).
    k = remote_tasks(ev, "sbx1")
    base1 = best(lambda: ansible_tasks(k, "sbx1"), a.runs)
    basen = best(lambda: ansible_tasks(k), a.runs)
    row(f"ansible-playbook, {k} ping tasks (the cold deploy's remote tasks), 1 host", base1, "-")
    row(f"ansible-playbook, {k} ping tasks, {n} hosts / 1 host (Ansible's own scaling here)", basen, "-",
        basen / base1)
    row("cold up overhead's scaling / Ansible's own (1: the deployer scales as Ansible does)", coldn - coldn_excl,
        "-", ((coldn - coldn_excl) / max(0.01, cold - cold_excl)) / (basen / base1))
    sb.stop()
    report(rows)


def report(rows):
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "ratios.json").write_text(json.dumps({"at": time.strftime("%Y-%m-%d %H:%M"), "rows": rows}, indent=2))
    print("| measurement | seconds | goal | ratio | met |\n|---|---|---|---|---|")
    for r in rows:
        met = "" if r["met"] is None else ("yes" if r["met"] else "**no**")
        print(f"| {r['measurement']} | {r['seconds']} | {r['goal']} | {r['ratio'] if r['ratio'] is not None else ''} "
              f"| {met} |")


if __name__ == "__main__":
    main()
