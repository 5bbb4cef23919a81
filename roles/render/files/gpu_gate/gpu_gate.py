"""The GPU health gate before every start of the engine, systemd's own restarts included: run as root by the unit's
drop-in (``ExecStartPre=+``, written by the render stage, deployer/plan.py ``gpu_gate``), it reads what the
preflight reads (module_utils/gpu_health.py: the kernel's Xid events, a pending reset or row remapping, uncorrected
ECC errors, heat) and, when a GPU is one the driver has given up on, refuses the start and stops the unit: a crash
loop does not restart a 25-minute load into a dead GPU forever.  What it found is the journal's last word for this
start (``deployer GPU gate: refused ...``: root_causes names it), and ``deployer status`` shows it.

Usage: gpu_gate.py --service S [--since-epoch N] (the preflight's own ``preflight_gpu_health_since_epoch``: the boot's
Xid events from before a GPU reset do not count).  Exit 0 when every GPU may load; 1 after it stopped the unit.
"""
import argparse
import os
import subprocess
import sys

# -I leaves this folder off sys.path: it is root's, so it goes first, explicitly
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ansible.module_utils.gpu_health import judge, read  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--service", required=True)
    ap.add_argument("--since-epoch", type=int, default=0)
    a = ap.parse_args(argv)
    rows, events, _notes = read(a.since_epoch)
    refusals, _warnings = judge(rows, events)
    if not refusals:
        return 0
    for f in refusals:
        print("deployer GPU gate: refused to start %s: %s" % (a.service, f["line"]), flush=True)
    # --no-block: this runs inside the unit's own start job; the stop is queued behind it and ends the restarts
    subprocess.run(["systemctl", "--no-block", "stop", a.service + ".service"], check=False)
    return 1


if __name__ == "__main__":
    sys.exit(main())
