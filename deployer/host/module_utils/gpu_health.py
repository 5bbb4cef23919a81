# -*- coding: utf-8 -*-
"""Whether each GPU is healthy enough for a 25-minute load, from what the driver says: the kernel log since boot
(NVIDIA's Xid events) and nvidia-smi's health fields.  Reading is ``read``; judging is ``judge``, a pure function
(tests/unit/test_gpu_health.py).  Standard library only (it runs on the host, inside preflight_facts).

A finding is a refusal when the load would fail on that GPU (it must be reset, the host rebooted or the card
reseated first), a warning when the load would only be slower:

==========================================  ==========  ====================================================
evidence                                    verdict     what to do
==========================================  ==========  ====================================================
Xid 8, 48, 62, 64, 79, 95, 109, 119, 120,   refuse      per Xid (XID_ACTIONS): reset the GPU, reboot, reseat
140, 154 in the kernel log since boot
(or since ``since_epoch``)
``reset_status.reset_required`` Yes, or     refuse      ``nvidia-smi -r -i N`` with nothing on the GPU, or
``gpu_recovery_action`` not None                        what the driver's recovery action says
``remapped_rows.pending`` Yes               refuse      reset the GPU (the remapping applies at reset)
``remapped_rows.failure`` Yes               refuse      the GPU needs service (rows could not be remapped)
uncorrected volatile ECC errors > 0         refuse      reset the GPU (the count clears; rising again: service)
temperature >= 90 C before the load         refuse      cooling: above 90 C these cards lock up under load
any other Xid (not an application's)        warn        NVIDIA's Xid catalog
PCIe link narrower than the GPU's maximum   warn        reseat the card (weights load and NCCL ride PCIe)
slot's PCIe generation below the GPU's      warn        the slot or a riser limits it
thermal or power-brake slowdown active      warn        cooling or power delivery
==========================================  ==========  ====================================================

A field the driver does not know (an older driver) or reports as ``[N/A]`` / ``[Not Supported]`` (ECC off) is not
judged.  Xid 13, 31, 43 and 45 are an application's own faults (an illegal address, a killed context) and say
nothing of the GPU: not judged.
"""
from __future__ import annotations

import json
import re
import subprocess

FIELDS = ("index", "pci.bus_id", "temperature.gpu", "clocks_event_reasons.hw_thermal_slowdown",
          "clocks_event_reasons.sw_thermal_slowdown", "clocks_event_reasons.hw_power_brake_slowdown",
          "pcie.link.width.current", "pcie.link.width.max", "pcie.link.gen.max", "pcie.link.gen.gpumax",
          "ecc.errors.uncorrected.volatile.total", "remapped_rows.pending", "remapped_rows.failure",
          "reset_status.reset_required", "gpu_recovery_action")
# the kernel's line: "NVRM: Xid (PCI:0000:1b:00): 79, pid=1234, name=python3, GPU has fallen off the bus."
XID_LINE = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})\): (\d+),\s*(.*)")
APPLICATION_XIDS = frozenset((13, 31, 43, 45))
XID_ACTIONS = {
    8: ("the GPU stopped processing (timeout)", "reset the GPU"),
    48: ("a double-bit ECC error", "reset the GPU; if it comes back, service"),
    62: ("an internal micro-controller halt", "reset the GPU; if it comes back, reboot"),
    64: ("row remapping could not be recorded", "the GPU needs service"),
    79: ("the GPU fell off the bus", "reboot the host; if it comes back, reseat the card and check its power"),
    95: ("an uncontained ECC error", "reset the GPU"),
    109: ("a context-switch timeout", "reset the GPU; if it comes back, reboot"),
    119: ("a GSP RPC timeout (the GPU's firmware stopped answering)", "reset the GPU, else reboot the host"),
    120: ("a GSP error (the GPU's firmware)", "reset the GPU, else reboot the host"),
    140: ("an unrecovered ECC error", "reset the GPU"),
    154: ("the driver changed the GPU's recovery action", "do what the line says (reset, reboot or drain)"),
}
TEMPERATURE_REFUSE_C = 90
YES = ("yes", "1", "true", "active")
UNKNOWN = ("", "[n/a]", "n/a", "[not supported]", "[unknown error]", "[insufficient permissions]")


def pci_key(bus_id):
    """``00000000:1B:00.0`` (nvidia-smi) and ``0000:1b:00`` (the kernel's Xid line) to one key: ``0000:1b:00``."""
    parts = str(bus_id).lower().split(":")
    if len(parts) < 3:
        return str(bus_id).lower()
    return "%s:%s:%s" % (parts[-3][-4:], parts[-2], parts[-1].split(".")[0])


def xid_events(lines):
    """[{pci, xid, text}] of the kernel's Xid lines, in order."""
    out = []
    for line in lines:
        m = XID_LINE.search(line)
        if m:
            out.append({"pci": pci_key(m.group(1)), "xid": int(m.group(2)), "text": m.group(3).strip()[:200]})
    return out


def parse_rows(csv_text, fields=FIELDS):
    """nvidia-smi ``--format=csv,noheader,nounits`` rows as dicts (values stripped; an unknown one is None)."""
    rows = []
    for line in csv_text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) == len(fields):
            rows.append({f: (None if cells[i].lower() in UNKNOWN else cells[i]) for i, f in enumerate(fields)})
    return rows


def _num(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _yes(v):
    return v is not None and v.strip().lower() in YES


def line(f):
    """One finding as the preflight prints it: ``GPU 3: what (evidence): action``."""
    who = "GPU %s" % f["gpu"] if f["gpu"] is not None else "a GPU nvidia-smi does not list"
    return "%s: %s (%s): %s" % (who, f["what"], f["evidence"], f["action"])


def judge(rows, events):
    """(refusals, warnings): lists of {gpu, what, evidence, action, line}; ``gpu`` the index (None: a PCI address
    nvidia-smi does not list, as after the GPU fell off the bus)."""
    refuse, warn = _judge(rows, events)
    for f in refuse + warn:
        f["line"] = line(f)
    return refuse, warn


def _judge(rows, events):
    refuse, warn = [], []
    by_pci = {pci_key(r.get("pci.bus_id") or ""): r.get("index") for r in rows}
    seen = set()
    for e in events:
        if e["xid"] in APPLICATION_XIDS or (e["pci"], e["xid"]) in seen:
            continue
        seen.add((e["pci"], e["xid"]))
        gpu = by_pci.get(e["pci"])
        evidence = "Xid %d at PCI %s since boot: %s" % (e["xid"], e["pci"], e["text"])
        if e["xid"] in XID_ACTIONS:
            what, action = XID_ACTIONS[e["xid"]]
            refuse.append(dict(gpu=gpu, what=what, evidence=evidence, action=action))
        else:
            warn.append(dict(gpu=gpu, what="Xid %d" % e["xid"], evidence=evidence,
                             action="look it up in NVIDIA's Xid catalog"))
    for r in rows:
        gpu = r.get("index")
        if _yes(r.get("reset_status.reset_required")):
            refuse.append(dict(gpu=gpu, what="the driver says the GPU needs a reset",
                               evidence="reset_status.reset_required: %s" % r["reset_status.reset_required"],
                               action="nvidia-smi -r -i %s with nothing running on it, else reboot" % gpu))
        action = r.get("gpu_recovery_action")
        if action is not None and action.lower() not in ("none", "0"):
            refuse.append(dict(gpu=gpu, what="the driver asks for a recovery action",
                               evidence="gpu_recovery_action: %s" % action, action="do it: %s" % action))
        if _yes(r.get("remapped_rows.failure")):
            refuse.append(dict(gpu=gpu, what="memory rows could not be remapped",
                               evidence="remapped_rows.failure: %s" % r["remapped_rows.failure"],
                               action="the GPU needs service"))
        elif _yes(r.get("remapped_rows.pending")):
            refuse.append(dict(gpu=gpu, what="a memory row remapping is pending",
                               evidence="remapped_rows.pending: %s" % r["remapped_rows.pending"],
                               action="reset the GPU (nvidia-smi -r -i %s): the remapping applies then" % gpu))
        ecc = _num(r.get("ecc.errors.uncorrected.volatile.total"))
        if ecc:
            refuse.append(dict(gpu=gpu, what="uncorrected ECC errors since the driver loaded",
                               evidence="ecc.errors.uncorrected.volatile.total: %d" % ecc,
                               action="reset the GPU; if they come back, service"))
        temp = _num(r.get("temperature.gpu"))
        if temp is not None and temp >= TEMPERATURE_REFUSE_C:
            refuse.append(dict(gpu=gpu, what="the GPU is at %d C before the load" % temp,
                               evidence="temperature.gpu: %d C (refused from %d C: these cards lock up above it "
                               "under load)" % (temp, TEMPERATURE_REFUSE_C), action="fix the cooling first"))
        width, width_max = _num(r.get("pcie.link.width.current")), _num(r.get("pcie.link.width.max"))
        if width and width_max and width < width_max:
            warn.append(dict(gpu=gpu, what="PCIe link x%d of x%d" % (width, width_max),
                             evidence="pcie.link.width.current %d, pcie.link.width.max %d" % (width, width_max),
                             action="reseat the card: weights and NCCL ride this link"))
        gen, gen_gpu = _num(r.get("pcie.link.gen.max")), _num(r.get("pcie.link.gen.gpumax"))
        if gen and gen_gpu and gen < gen_gpu:
            warn.append(dict(gpu=gpu, what="PCIe Gen%d slot for a Gen%d GPU" % (gen, gen_gpu),
                             evidence="pcie.link.gen.max %d, pcie.link.gen.gpumax %d" % (gen, gen_gpu),
                             action="the slot or a riser limits the link"))
        slow = [f.split(".", 1)[1] for f in ("clocks_event_reasons.hw_thermal_slowdown",
                                             "clocks_event_reasons.sw_thermal_slowdown",
                                             "clocks_event_reasons.hw_power_brake_slowdown") if _yes(r.get(f))]
        if slow:
            warn.append(dict(gpu=gpu, what="clocks held down: " + ", ".join(slow),
                             evidence=", ".join("%s Active" % s for s in slow), action="check cooling and power"))
    return refuse, warn


def _run(argv, limit=4 << 20):
    try:
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        return 127, str(e)
    return p.returncode, p.stdout[-limit:].decode("utf-8", "replace")


def read(since_epoch=0):
    """What ``judge`` takes, read on the host: (rows, events, notes).  Fields this driver does not know are asked
    one by one and left out; the kernel log is the journal's since boot (``journalctl -k -b``), from
    ``since_epoch`` when set (after a GPU reset the boot's old Xids stay in the log)."""
    notes = []
    fmt = "--format=csv,noheader,nounits"
    rc, out = _run(["nvidia-smi", "--query-gpu=" + ",".join(FIELDS), fmt])
    if rc == 0:
        rows = parse_rows(out)
    elif "is not a valid field" not in out:       # no driver, no GPU: nothing to judge (the preflight says so)
        rows = []
        notes.append("nvidia-smi answered exit %d: %s" % (rc, out.strip()[:200]))
    else:
        known = [f for f in FIELDS if _run(["nvidia-smi", "--query-gpu=" + f, fmt])[0] == 0]
        rc, out = _run(["nvidia-smi", "--query-gpu=" + ",".join(known), fmt]) if known else (1, "")
        rows = parse_rows(out, tuple(known)) if rc == 0 else []
        notes.append("this driver's nvidia-smi does not know: %s" % ", ".join(f for f in FIELDS if f not in known))
    argv = ["journalctl", "-k", "-b", "-o", "json", "--no-pager", "--output-fields=MESSAGE"]
    if since_epoch:
        argv += ["--since", "@%d" % int(since_epoch)]
    rc, out = _run(argv, limit=64 << 20)
    lines = []
    for raw in out.splitlines():
        if "Xid" not in raw:
            continue
        try:
            msg = json.loads(raw).get("MESSAGE")
        except ValueError:
            continue
        if isinstance(msg, list):       # the journal gives a non-UTF-8 message as its bytes
            msg = bytes(b & 0xFF for b in msg if isinstance(b, int)).decode("utf-8", "replace")
        if isinstance(msg, str):
            lines.append(msg)
    if rc != 0:
        notes.append("the kernel log could not be read (journalctl -k: exit %d)" % rc)
    return rows, xid_events(lines), notes
