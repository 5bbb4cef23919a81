#!/usr/bin/env python3
"""Rolling deploy of a sandbox fleet behind HAProxy under client load (issue #15), measured.

    python bench/fleet_roll.py [--hosts 3] [--rate 4]      (starts and stops its own sandbox hosts)

Prints per host: drain seconds (HAProxy drain until no request in flight), the host's downtime (its own server's
last answer to its new one's first: clients did not see it, the balancer sent them elsewhere), its load; then the
whole roll's seconds, the requests the client load sent through the balancer, how each host shared them, and the
failures (the goal: 0).  Results also go to bench/results/fleet_roll.json.
"""
import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from deployer.sandbox import hosts as sb  # noqa: E402


def cli(*args):
    t0 = time.time()
    r = subprocess.run([sys.executable, "-m", "deployer.cli", *args, "--json"], capture_output=True, text=True,
                       cwd=ROOT)
    if r.returncode != 0:
        raise SystemExit(f"deployer {' '.join(args)} failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    res = [json.loads(x) for x in r.stdout.splitlines() if x.startswith('{"event": "result"')]
    return time.time() - t0, res[-1]["hosts"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=3)
    ap.add_argument("--rate", type=float, default=4.0)
    a = ap.parse_args()
    sb.stop()
    sb.start(a.hosts, balancer=True)
    try:
        cli("up", "--sandbox", "-e", "verify_enabled=false")
        stop = ROOT / ".fleet-roll-stop"
        stop.unlink(missing_ok=True)
        client = subprocess.Popen([sys.executable, str(ROOT / "bench/client_load.py"), "--url",
                                   f"http://{sb.host(a.hosts + 1).ip}:8000", "--key-file", str(sb.STATE / "api_key"),
                                   "--rate", str(a.rate), "--seconds", "1200", "--stop-file", str(stop)],
                                  stdout=subprocess.PIPE, text=True)
        time.sleep(2)
        roll_s, hosts = cli("up", "--sandbox", "--serial", "1", "-e", "verify_enabled=false",
                            "-e", "deployer_max_model_len=65536")
        time.sleep(2)
        stop.touch()
        out, _ = client.communicate(timeout=120)
        stop.unlink(missing_ok=True)
        summary = json.loads(out.splitlines()[-1])
    finally:
        sb.stop()
    rows = {h: {"drain_s": (r.get("stage_seconds") or {}).get("balancer"), "downtime_s": r.get("downtime_seconds"),
                "load_s": r.get("load_seconds")} for h, r in sorted(hosts.items())}
    res = {"hosts": rows, "roll_seconds": round(roll_s, 1), "requests": summary["requests"],
           "failures": summary["failures"], "by_host": summary["by_host"], "rate_per_second": a.rate}
    print(f"{'host':8} {'drain s':>8} {'down s':>8} {'load s':>8}")
    for h, r in rows.items():
        print(f"{h:8} {r['drain_s'] if r['drain_s'] is not None else '-':>8} {r['downtime_s'] or '-':>8} "
              f"{r['load_s'] or '-':>8}")
    print(f"roll {res['roll_seconds']} s; {res['requests']} requests through the balancer, "
          f"{res['failures']} failed; served by {res['by_host']}")
    (ROOT / "bench/results").mkdir(exist_ok=True)
    (ROOT / "bench/results/fleet_roll.json").write_text(json.dumps(res, indent=2) + "\n")
    return 0 if res["failures"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
