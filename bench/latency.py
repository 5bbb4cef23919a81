#!/usr/bin/env python3
"""Crash-detection and readiness-detection latency of `deployer up` against a sandbox host.

crash:  the stand-in dies during weight loading (it records `died_at`); latency = the time the CLI's
        watch reports `crashed` (JSON event `watch_done`, controller clock) minus `died_at`.
ready:  the stand-in records `ready_at` when it listens; latency = `watch_done` (ready) minus `ready_at`.
Both clocks are this machine's (sandbox hosts share the kernel clock).  Each run deploys a new release.
Usage: python bench/latency.py [--runs 5]   (needs a running sandbox host sbx1 with a live release)
"""
import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from deployer.sandbox import hosts as sb  # noqa: E402


def up(*extra):
    r = subprocess.run([sys.executable, "-m", "deployer.cli", "up", "--sandbox", "--json", *extra],
                       capture_output=True, text=True, cwd=ROOT)
    events = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    return r.returncode, events


def host_time(name):
    return float(sb.ssh("sbx1", f"cat /run/deployer-standin/{name}").stdout.strip())


def one(kind, i):
    gmu = f"0.95{71 + i:02d}" if kind == "ready" else f"0.95{51 + i:02d}"  # never a trailing 0: argv says 0.5, not 0.50
    if kind == "crash":
        sb.set_knobs("sbx1", standin={"crash_phase": "weights", "only_if_arg": gmu})
    try:
        rc, events = up("-e", f"deployer_gpu_memory_utilization={gmu}")
    finally:
        sb.set_knobs("sbx1", standin={})
    done = [e for e in events if e["event"] == "watch_done"]
    first = done[0]
    want = "crashed" if kind == "crash" else "ready"
    assert first["state"] in (want, "fatal"), (rc, first)
    return first["ts"] - host_time("died_at" if kind == "crash" else "ready_at")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    out = {}
    for kind in ("crash", "ready"):
        vals = [one(kind, i) for i in range(a.runs)]
        out[kind] = {"runs": a.runs, "median_s": round(statistics.median(vals), 3),
                     "min_s": round(min(vals), 3), "max_s": round(max(vals), 3), "all_s": [round(v, 3) for v in vals]}
        print(kind, out[kind], flush=True)
    (ROOT / "bench/results").mkdir(exist_ok=True)
    (ROOT / "bench/results/latency.json").write_text(json.dumps(dict(out, at=time.time()), indent=2))


if __name__ == "__main__":
    main()
