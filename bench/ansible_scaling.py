#!/usr/bin/env python3
"""Ansible's own cost of going from 1 host to N, with nothing of the deployer in it (issue 24's floor).

    python bench/ansible_scaling.py [--tasks 51] [--hosts 8] [--runs 3] [--cpus 0-1]

Plain ``ansible-playbook`` runs ``--tasks`` ``ansible.builtin.ping`` tasks (each a worker process on the controller
and a module's Python on the host, as each of a deploy's remote tasks is) against 1 host and against ``--hosts``
hosts, best of ``--runs``, and prints the ratio.  The hosts are this machine under other names with
``ansible_connection=local``: no SSH, no containers, so the figure is the controller's and the hosts' Python work
alone and runs anywhere ansible-core does (the GPU machine too, which has neither sshd nor systemd).  ``--cpus``
pins the whole run to those CPUs (``taskset``), so that one machine shows the ratio on 2 cores and on all of its
cores.  51 tasks: the cold sandbox deploy's remote tasks (``bench/ratios.py`` counts them from the run's events).
Prints one JSON object; ``--out FILE`` also writes it.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def ansible_playbook():
    here = Path(sys.executable).parent / "ansible-playbook"
    return str(here) if here.exists() else shutil.which("ansible-playbook")


def run(work, hosts, cpus):
    inv = work / f"inv-{hosts}.ini"
    inv.write_text("[gpu]\n" + "".join(f"h{i} ansible_connection=local ansible_python_interpreter={sys.executable}\n"
                                       for i in range(1, hosts + 1)))
    argv = [sys.executable, ansible_playbook(), "-i", str(inv), str(work / "pings.yml")]
    if cpus:
        argv = ["taskset", "-c", cpus] + argv
    env = dict(os.environ, ANSIBLE_FORKS="20", ANSIBLE_GATHERING="explicit", ANSIBLE_LOCAL_TEMP=str(work / "tmp"),
               ANSIBLE_HOME=str(work / "home"), ANSIBLE_NOCOLOR="1", ANSIBLE_RETRY_FILES_ENABLED="False")
    t0 = time.time()
    subprocess.run(argv, check=True, capture_output=True, env=env, cwd=work)
    return time.time() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=51)
    ap.add_argument("--hosts", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cpus", default="", help="taskset CPU list for the whole run, e.g. 0-1 (default: all)")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        (work / "pings.yml").write_text("- hosts: gpu\n  gather_facts: false\n  tasks:\n" + "".join(
            f"    - name: ping {i}\n      ansible.builtin.ping:\n" for i in range(a.tasks)))
        one = min(run(work, 1, a.cpus) for _ in range(a.runs))
        many = min(run(work, a.hosts, a.cpus) for _ in range(a.runs))
    cpus = len(os.sched_getaffinity(0)) if not a.cpus else a.cpus
    out = {"tasks": a.tasks, "hosts": a.hosts, "cpus": cpus, "machine_cpus": os.cpu_count(),
           "one_host_seconds": round(one, 2), "hosts_seconds": round(many, 2), "ratio": round(many / one, 2)}
    print(json.dumps(out))
    if a.out:
        Path(a.out).write_text(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
