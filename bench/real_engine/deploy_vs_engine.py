#!/usr/bin/env python3
"""`deployer up` against the real engine's own start, on one real-engine sandbox host (issue 41, item 6).

In one run, on a fresh `--real-engine` host (vLLM 0.32.0's CPU build, the tiny real Kimi-K2.5, EAGLE-3):

1. a cold `deployer up --sandbox` (install from the package cache, vLLM's own checks, drafter, start, watch, smoke,
   release): its wall time;
2. the engine's own cold start: the same unit started by systemd alone, every cache it writes emptied (a fresh
   host's), to /health 200;
3. the engine's own warm restart: `systemctl restart`, to /health 200;
4. a redeploy (`deployer up` with one flag changed): the downtime the release records (the old server's last
   good /health to the new one's first).

Goals on this machine (docs/benchmarks.md): a redeploy's downtime at most 5 s above the engine's own warm restart
(the physical limit on one host without a weight cache), a cold deploy at most 45 s above the engine's own cold start
(vLLM's own checks included).

    sudo .venv/bin/python bench/real_engine/deploy_vs_engine.py      # ~6 min on 2 cores; prints one JSON object
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
os.environ.setdefault("DEPLOYER_SANDBOX_SLOT", "9")       # its own sandbox: never the tests' or the demo's
sys.path.insert(0, str(ROOT))

from deployer.sandbox import hosts as sb  # noqa: E402
from deployer.sandbox.inventory import api_key  # noqa: E402

H, SVC = "sbx1", "deployer-engine"


def deployer(*args):
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "deployer.cli", *args], capture_output=True, text=True, cwd=ROOT)
    if r.returncode != 0:
        raise SystemExit(f"deployer {' '.join(args)}: exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return time.monotonic() - t0


def to_health(start: str, before: str = "true") -> float:
    """Run ``before``, then ``start`` on the host: seconds from ``start`` until /health answers 200 (polled every
    0.2 s on the host itself)."""
    poll = "until [ \"$(curl -s -o /dev/null -w '%{http_code}' localhost:8000/health)\" = 200 ]; do sleep 0.2; done"
    script = f"{before}; t0=$(date +%s.%N); {start}; {poll}; echo $(date +%s.%N) $t0"
    end, t0 = map(float, sb.ssh(H, script, timeout=900).stdout.split())
    return end - t0


def main() -> int:
    sb.stop()
    sb.start(1, real_engine=True)
    try:
        cold_up = deployer("up", "--sandbox")
        # cold as on a fresh host: every cache the server writes emptied (its directories kept, as install made them)
        empty = f"systemctl stop {SVC}; find /opt/deployer/cache/server -mindepth 2 -delete; sync"
        engine_cold = to_health(f"systemctl start {SVC}", before=empty)
        engine_warm = to_health(f"systemctl restart {SVC}")
        deployer("up", "--sandbox", "-e", "deployer_num_speculative_tokens=2")
        rel = json.loads(sb.ssh(H, "cat /opt/deployer/current/release.json").stdout)
        key = api_key()
        assert sb.ssh(H, f"curl -s -o /dev/null -w '%{{http_code}}' -H 'Authorization: Bearer {key}' "
                         "localhost:8000/v1/models").stdout == "200"
        out = {"cold_up_seconds": round(cold_up, 1), "engine_cold_start_seconds": round(engine_cold, 1),
               "cold_overhead_seconds": round(cold_up - engine_cold, 1),
               "engine_warm_restart_seconds": round(engine_warm, 1),
               "redeploy_downtime_seconds": rel["downtime"]["seconds"], "redeploy_load_seconds": rel["load_seconds"],
               "downtime_over_warm_restart_seconds": round(rel["downtime"]["seconds"] - engine_warm, 1),
               "cpus": os.cpu_count()}
        out["goals_met"] = {"cold": out["cold_overhead_seconds"] <= 45,
                            "redeploy": out["downtime_over_warm_restart_seconds"] <= 5}
        print(json.dumps(out, indent=1))
    finally:
        sb.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
