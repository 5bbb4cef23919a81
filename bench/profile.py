#!/usr/bin/env python3
"""Where the seconds of one deployer command go, task by task (issue #13's "profile").

    python bench/profile.py up --sandbox             # any deployer command line; the sandbox must be running
    python bench/profile.py --top 15 status --sandbox

Runs the command once with DEPLOYER_TRACE_FILE set (deployer/runner.py writes one line per finished task and
host) and prints, per task in the order they ran: its wall time (first host's start to last host's end), the
hosts, the slowest host's own duration; then the wall of the whole command, the sum of the task walls, and what
is left (ansible-playbook's start-up, the CLI, the controller's work between tasks).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def ts(s):
    return datetime.fromisoformat(s).timestamp() if s else None


def table(lines):
    """Trace lines -> rows (task, hosts, wall, slowest) in the order the tasks started."""
    by = {}
    for ln in lines:
        start, end = ts(ln.get("start")), ts(ln.get("end"))
        if start is None or end is None:
            continue
        key = (ln.get("role") or "", ln.get("task") or "", ln.get("uuid") or "")   # each run of a task on its own
        r = by.setdefault(key, {"task": (f"{key[0]} : " if key[0] else "") + key[1], "hosts": set(),
                                "start": start, "end": end, "slowest": 0.0, "runs": 0})
        r["hosts"].add(ln.get("host"))
        r["start"], r["end"] = min(r["start"], start), max(r["end"], end)
        r["slowest"] = max(r["slowest"], float(ln.get("duration") or (end - start)))
        r["runs"] += 1
    rows = sorted(by.values(), key=lambda r: r["start"])
    for r in rows:
        r["wall"] = r["end"] - r["start"]
    return rows


def main():
    ap = argparse.ArgumentParser(usage="%(prog)s [--top N] DEPLOYER-ARGS...")
    ap.add_argument("--top", type=int, default=0, help="print only the N slowest tasks")
    a, rest = ap.parse_known_args()
    with tempfile.NamedTemporaryFile("r", suffix=".jsonl", delete=False) as f:
        trace = f.name
    t0 = time.time()
    r = subprocess.run([sys.executable, "-m", "deployer.cli", *rest], cwd=ROOT, capture_output=True, text=True,
                       env=dict(os.environ, DEPLOYER_TRACE_FILE=trace))
    wall = time.time() - t0
    lines = [json.loads(x) for x in Path(trace).read_text().splitlines() if x.strip()]
    os.unlink(trace)
    rows = table(lines)
    shown = sorted(rows, key=lambda r: -r["wall"])[:a.top] if a.top else rows
    print(f"deployer {' '.join(rest)}: exit {r.returncode}, {wall:.2f} s wall, {len(rows)} tasks, "
          f"{sum(x['runs'] for x in rows)} task runs")
    print("| task | hosts | wall s | slowest host s |\n|---|---|---|---|")
    for x in shown:
        print(f"| {x['task']} | {len(x['hosts'])} | {x['wall']:.2f} | {x['slowest']:.2f} |")
    tasks = sum(x["wall"] for x in rows)
    first = min((x["start"] for x in rows), default=t0)
    print(f"\ncommand start -> first task: {first - t0:.2f} s; task walls summed: {tasks:.2f} s; "
          f"between tasks and after the last: {wall - (first - t0) - tasks:.2f} s")


if __name__ == "__main__":
    main()
