#!/usr/bin/python3
"""SANDBOX ONLY: a simulated ``nvidia-smi`` for an 8x RTX PRO 6000 Blackwell host.

Answers the queries the deployer makes, in nvidia-smi's CSV format:
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  nvidia-smi --query-gpu=index,memory.used,memory.total --format=csv,noheader,nounits
  nvidia-smi -L
  nvidia-smi topo -p2p r      (the P2P read status matrix; "p2p": {"i,j": "CNS", ...} marks pairs not OK)
  nvidia-smi --query-gpu=index,pci.bus_id,temperature.gpu,...,reset_status.reset_required --format=csv,noheader,nounits
                              (the health fields module_utils gpu_health reads)
The GPU set comes from /etc/deployer-sandbox/gpus.json ({"count", "name", "memory_mib",
"driver", "used_mib" and "mig" (one value, or a list per GPU), "driver_loaded"}), so tests can
rehearse a host with 7 GPUs, an old driver, busy GPUs, a GPU in MIG mode, or a driver that is not loaded
(nvidia-smi's own message and exit code 9, as after a kernel update without a reboot).  Health, per GPU index:
"reset_required", "remapped_rows_pending", "remapped_rows_failure", "thermal_slowdown" (lists of indexes),
"temperature_c", "pcie_width", "ecc_uncorrected" ({"3": value}); "xid" ({"3": [79]}) is the kernel's log, which
hosts.set_knobs writes into the host's journal.  A field it does not know is refused as nvidia-smi refuses one.
"""
import json
import sys

CONF = "/etc/deployer-sandbox/gpus.json"
DEFAULT = {"count": 8, "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition", "memory_mib": 97887,
           "driver": "580.126.09", "used_mib": 0, "uuid_prefix": "GPU-5a0d0b1e-0000-4000-8000-00000000000"}


def conf():
    c = dict(DEFAULT)
    try:
        with open(CONF) as f:
            c.update(json.load(f))
    except (OSError, ValueError):
        pass
    return c


NO_DRIVER = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
             "Make sure that the latest NVIDIA driver is installed and running.")


def used(c, i):
    u = c["used_mib"]
    return int(u[i] if isinstance(u, list) and i < len(u) else (0 if isinstance(u, list) else u))


def mig(c, i):
    m = c.get("mig", "Disabled")      # RTX PRO 6000 Blackwell supports MIG; off unless someone turned it on
    return m[i] if isinstance(m, list) and i < len(m) else ("Disabled" if isinstance(m, list) else m)


def per_gpu(c, key, i, default):
    """A knob given per GPU index: {"3": value} (else ``default``), or a list of the indexes it is true for."""
    v = c.get(key)
    if isinstance(v, list):
        return i in v
    return (v or {}).get(str(i), default)


def field(c, i, name, units):
    mib = "" if units else " MiB"
    yes = {True: "Yes", False: "No"}
    active = {True: "Active", False: "Not Active"}
    health = {
        "temperature.gpu": str(per_gpu(c, "temperature_c", i, 41)),
        "clocks_event_reasons.hw_thermal_slowdown": active[per_gpu(c, "thermal_slowdown", i, False) is True],
        "clocks_event_reasons.sw_thermal_slowdown": "Not Active",
        "clocks_event_reasons.hw_power_brake_slowdown": "Not Active",
        "pcie.link.width.current": str(per_gpu(c, "pcie_width", i, 16)), "pcie.link.width.max": "16",
        "pcie.link.gen.max": "5", "pcie.link.gen.gpumax": "5",
        "ecc.errors.uncorrected.volatile.total": str(per_gpu(c, "ecc_uncorrected", i, 0)),
        "remapped_rows.pending": yes[per_gpu(c, "remapped_rows_pending", i, False) is True],
        "remapped_rows.failure": yes[per_gpu(c, "remapped_rows_failure", i, False) is True],
        "reset_status.reset_required": yes[per_gpu(c, "reset_required", i, False) is True],
        "gpu_recovery_action": "None",
    }
    if name in health:
        return health[name]
    return {
        "index": str(i), "name": c["name"], "driver_version": c["driver"],
        "memory.total": "%d%s" % (c["memory_mib"], mib), "memory.used": "%d%s" % (used(c, i), mib),
        "memory.free": "%d%s" % (c["memory_mib"] - used(c, i), mib),
        "uuid": "%s%d" % (c["uuid_prefix"], i), "compute_cap": "12.0", "pci.bus_id": "00000000:%02X:00.0" % (0x18 + i),
        "mig.mode.current": mig(c, i),
    }[name]


P2P_LEGEND = """Legend:

  X    = Self
  OK   = Status Ok
  CNS  = Chipset not supported
  GNS  = GPU not supported
  TNS  = Topology not supported
  NS   = Not supported
  U    = Unknown"""


def topo_p2p(c):
    """nvidia-smi's layout: a tab-separated matrix with a leading blank cell, then its legend."""
    n = c["count"]
    bad = {tuple(sorted(int(x) for x in k.split(","))): v for k, v in (c.get("p2p") or {}).items()}
    print(" \t" + "\t".join("GPU%d" % j for j in range(n)) + "\t")
    for i in range(n):
        cells = ["X" if i == j else bad.get(tuple(sorted((i, j))), "OK") for j in range(n)]
        print(" GPU%d\t" % i + "\t".join(cells) + "\t")
    print("\n" + P2P_LEGEND)
    return 0


def main(argv):
    c = conf()
    if c.get("driver_loaded", True) is False:
        print(NO_DRIVER)
        return 9
    if argv[:3] == ["topo", "-p2p", "r"]:
        return topo_p2p(c)
    if "-L" in argv:
        for i in range(c["count"]):
            print("GPU %d: %s (UUID: %s%d)" % (i, c["name"], c["uuid_prefix"], i))
        return 0
    q = [a.split("=", 1)[1] for a in argv if a.startswith("--query-gpu=")]
    fmt = [a.split("=", 1)[1] for a in argv if a.startswith("--format=")]
    if not q:
        print("Sandbox nvidia-smi: %d x %s, driver %s" % (c["count"], c["name"], c["driver"]))
        return 0
    if c["count"] == 0:
        print("No devices were found")
        return 6
    names = [n.strip() for n in q[0].split(",")]
    for n in names:
        try:
            field(c, 0, n, True)
        except KeyError:
            print('Field "%s" is not a valid field to query.' % n)    # and nothing else, as the real one
            return 2
    opts = fmt[0].split(",") if fmt else ["csv"]
    units = "nounits" in opts
    if "noheader" not in opts:
        print(", ".join(names))
    for i in range(c["count"]):
        print(", ".join(field(c, i, n, units) for n in names))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
