#!/usr/bin/env python3
"""Wall times of the deploy itself on sandbox hosts (orchestration, not the model load).

Measures: cold `up` (fresh host: install from the pre-seeded cache, patch, drafter, verify, load),
warm no-op `up` on 1 and 3 hosts, and `rollback` (total and minus the stand-in's load time).
Usage: python bench/deploy_times.py   (stops and starts sandbox hosts itself)
"""
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from deployer.sandbox import hosts as sb  # noqa: E402


def run(*args):
    t0 = time.time()
    r = subprocess.run([sys.executable, "-m", "deployer.cli", *args], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    return time.time() - t0, r


def load_seconds(r):
    events = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    return sum(e.get("elapsed_seconds") or 0 for e in events if e.get("event") == "watch_done")


def main():
    res = {}
    sb.stop()
    t0 = time.time()
    sb.start(1)
    res["sandbox_start_1_host_s"] = round(time.time() - t0, 2)
    res["up_cold_1_host_s"] = round(run("up", "--sandbox")[0], 2)
    res["up_noop_1_host_s"] = round(min(run("up", "--sandbox")[0] for _ in range(3)), 2)
    run("up", "--sandbox", "-e", "deployer_max_model_len=65536")
    t, r = run("rollback", "--sandbox", "--json")
    res["rollback_total_s"] = round(t, 2)
    res["rollback_excluding_load_s"] = round(t - load_seconds(r), 2)
    sb.stop()
    t0 = time.time()
    sb.start(3)
    res["sandbox_start_3_hosts_s"] = round(time.time() - t0, 2)
    res["up_cold_3_hosts_s"] = round(run("up", "--sandbox")[0], 2)
    res["up_noop_3_hosts_s"] = round(min(run("up", "--sandbox")[0] for _ in range(3)), 2)
    sb.stop()
    for k, v in res.items():
        print(f"{k}: {v}")
    (ROOT / "bench/results").mkdir(exist_ok=True)
    (ROOT / "bench/results/deploy_times.json").write_text(json.dumps(dict(res, at=time.time()), indent=2))


if __name__ == "__main__":
    main()
