#!/usr/bin/env python3
"""CPU-seconds of one deploy on the controller and on the host, and its task count, against `ansible -m ping`.

    python bench/deploy_cpu.py [--runs 3] [--ref COMMIT]      (a running sandbox: deployer sandbox start)

Cases, each on the sandbox's first host: `ansible -m ping` (the baseline), a changed `up` with vLLM's checks off
(deployer_max_model_len flips between two values, so every run makes a new release and restarts the stand-in),
the same `up` again (a no-op: its release is live), and a `rollback`.  Per case, the median of --runs: controller
CPU-s (the CLI and every process it waited for: ansible-playbook, its workers, ssh), host CPU-s (every process of
the sandbox host, read from its /proc before and after: what a process waited for is in its parent's
cutime/cstime, so live processes' four counters add up to all the host's work), wall seconds, and the tasks the
run's trace lists.  The ratios to ping hold across machines; seconds do not.

--ref COMMIT (repeatable) runs the same cases from a worktree of COMMIT in the same run, interleaved with this
tree's (or only the refs: --refs-only), so that a change is measured against what it replaces on the same machine
at the same time.  Results also go to bench/results/deploy_cpu.json.
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from deployer import tools  # noqa: E402
from deployer.sandbox import hosts as sb  # noqa: E402

# Every process of the host: pid, utime, stime, cutime, cstime (clock ticks); the comm field may hold spaces
# and parentheses, so the counters are read after its last ')'.
HOST_CPU = ("python3 -c 'import os,glob\n"
            "t=0\n"
            "for p in glob.glob(\"/proc/[0-9]*/stat\"):\n"
            "  try: f=open(p).read().rsplit(\")\",1)[1].split()\n"
            "  except OSError: continue\n"
            "  t+=sum(int(x) for x in f[11:15])\n"
            "print(t/os.sysconf(\"SC_CLK_TCK\"))'")


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def host_cpu(host):
    return float(sb.ssh(host, HOST_CPU).stdout.strip())


def measure(argv, cwd, host, env=None):
    """(controller CPU-s, host CPU-s, wall s, tasks) of one command."""
    with tempfile.NamedTemporaryFile("r", suffix=".jsonl", delete=False) as f:
        trace = f.name
    h0, c0, t0 = host_cpu(host), children_cpu(), time.time()
    r = subprocess.run(argv, cwd=cwd, capture_output=True, text=True,
                       env=dict(os.environ, DEPLOYER_TRACE_FILE=trace, **(env or {})))
    wall, c1 = time.time() - t0, children_cpu()
    h1 = host_cpu(host)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    lines = [json.loads(x) for x in Path(trace).read_text().splitlines() if x.strip()]
    tasks = {(x.get("role"), x.get("task"), x.get("uuid")) for x in lines}
    os.unlink(trace)
    return c1 - c0, h1 - h0, wall, len(tasks)


def cases():
    """Each case's argv, made when it runs; the no-op repeats the last changed up (its release is then live)."""
    cli = [sys.executable, "-m", "deployer.cli"]
    flip = iter(["65536", "32768"] * 1000)
    last = {}

    def changed():
        last["up"] = [*cli, "up", "--sandbox", "-e", "verify_enabled=false", "-e",
                      f"deployer_max_model_len={next(flip)}"]
        return last["up"]
    return {
        "ping": lambda: [tools.venv_bin("ansible"), "-i", str(sb.STATE / "inventory.yml"), "gpu", "-m",
                         "ansible.builtin.ping", "-o"],
        "changed up (vLLM's checks off)": changed,
        "no-op up": lambda: last["up"],
        "rollback": lambda: [*cli, "rollback", "--sandbox"],
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--ref", action="append", default=[], help="a commit to measure beside this tree, interleaved "
                    "(repeatable)")
    ap.add_argument("--refs-only", action="store_true", help="measure only the --ref commits (this tree may change "
                    "while the bench runs)")
    a = ap.parse_args()
    host = "sbx1"
    trees = {} if a.refs_only else {"this tree": ROOT}
    tmps = []
    for ref in a.ref:
        tmps.append(tempfile.mkdtemp(prefix="deployer-bench-ref-"))
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", tmps[-1], ref], check=True,
                       capture_output=True)
        trees[ref[:10]] = Path(tmps[-1])
    env = {"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")}
    try:
        made = {name: cases() for name in trees}
        got = {name: {case: [] for case in made[name]} for name in trees}
        # per tree in turn: changed up, its no-op (the same argv: nothing to do), rollback; the trees interleave
        for _ in range(a.runs):
            for name, tree in trees.items():
                for case in made[name]:
                    got[name][case].append(measure(made[name][case](), tree, host, env))
    finally:
        for tmp in tmps:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", tmp], capture_output=True)
    out = {}
    print("| tree | case | controller CPU-s | host CPU-s | wall s | tasks | controller CPU / ping's | wall / ping's |")
    print("|---|---|---|---|---|---|---|---|")
    for name in trees:
        med = {case: [statistics.median(x[i] for x in runs) for i in range(4)] for case, runs in got[name].items()}
        ping = med["ping"]
        for case, (c, h, w, t) in med.items():
            print(f"| {name} | {case} | {c:.2f} | {h:.2f} | {w:.2f} | {t} | {c / ping[0]:.2f} | {w / ping[2]:.2f} |")
        out[name] = med
    res = ROOT / "bench" / "results"
    res.mkdir(exist_ok=True)
    (res / "deploy_cpu.json").write_text(json.dumps({"runs": a.runs, "results": out}, indent=1))


if __name__ == "__main__":
    main()
