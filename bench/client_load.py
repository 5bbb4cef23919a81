#!/usr/bin/env python3
"""A bounded client load through the balancer: a few chat completions a second, for a fixed time, then it stops.

Only for the sandbox's own addresses (private or loopback; anything else is refused): it is a test load, not a
load generator.  Every request's outcome is one JSON line on stdout: {t, status, served_by, error, seconds}; the
last line is the summary {requests, failures, by_host}.  Used by tests/integration/test_fleet.py during rolling
deploys and by hand:

    bench/client_load.py --url http://10.85.0.14:8000 --key-file /var/lib/deployer-sandbox/api_key --seconds 60
"""
import argparse
import ipaddress
import json
import os
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request


def allowed(url):
    host = urllib.parse.urlparse(url).hostname or ""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host == "localhost"
    return ip.is_private or ip.is_loopback


def one(url, key, model, out, lock, t0):
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "ping"}], "max_tokens": 8}).encode()
    req = urllib.request.Request(url.rstrip("/") + "/v1/chat/completions", data=body, method="POST",
                                 headers={"content-type": "application/json", "Authorization": "Bearer " + key})
    s = time.time()
    rec = {"t": round(s - t0, 3), "status": None, "served_by": None, "error": None}
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            rec["status"], rec["served_by"] = r.status, r.headers.get("X-Served-By")
            reply = json.loads(r.read() or b"{}")
            if not reply.get("choices"):
                rec["error"] = "no choices in the reply"
    except urllib.error.HTTPError as e:
        rec["status"], rec["served_by"], rec["error"] = e.code, e.headers.get("X-Served-By"), str(e)
    except (OSError, ValueError) as e:
        rec["error"] = "%s: %s" % (type(e).__name__, e)
    rec["seconds"] = round(time.time() - s, 3)
    with lock:
        out.append(rec)
        sys.stdout.write(json.dumps(rec) + "\n")
        sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--key-file", required=True)
    ap.add_argument("--model", default="kimi-k2.5")
    ap.add_argument("--rate", type=float, default=3.0, help="requests per second (at most 20)")
    ap.add_argument("--seconds", type=float, default=60.0, help="stop after this long (at most 1800)")
    ap.add_argument("--stop-file", default="", help="stop early when this file exists")
    a = ap.parse_args()
    if not allowed(a.url):
        sys.exit("client_load: %s is not a sandbox address (private or loopback only)" % a.url)
    rate, seconds = min(max(a.rate, 0.1), 20.0), min(max(a.seconds, 1.0), 1800.0)
    with open(a.key_file) as f:
        key = f.read().strip()
    out, lock, threads, t0 = [], threading.Lock(), [], time.time()
    n = 0
    while time.time() - t0 < seconds and not (a.stop_file and os.path.exists(a.stop_file)):
        th = threading.Thread(target=one, args=(a.url, key, a.model, out, lock, t0))
        th.start()
        threads.append(th)
        n += 1
        time.sleep(max(0.0, t0 + n / rate - time.time()))
    for th in threads:
        th.join()
    by_host = {}
    for r in out:
        by_host[r["served_by"] or "-"] = by_host.get(r["served_by"] or "-", 0) + 1
    fails = [r for r in out if r["status"] != 200 or r["error"]]
    sys.stdout.write(json.dumps({"summary": True, "requests": len(out), "failures": len(fails),
                                 "by_host": by_host, "seconds": round(time.time() - t0, 1)}) + "\n")
    return 0 if not fails else 1


if __name__ == "__main__":
    sys.exit(main())
