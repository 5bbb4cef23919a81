# -*- coding: utf-8 -*-
"""PCIe Access Control Services on the way up from each NVIDIA GPU, read from sysfs as root (preflight): a bridge
whose ACS redirects peer-to-peer requests or completions sends NCCL's GPU-to-GPU traffic up to the root complex,
through the IOMMU - where on many PCIe hosts the first all-reduce hangs with no log line (NCCL's troubleshooting
guide: disable ACS, ``setpci -s <bridge> ECAP_ACS+0x6.w=0000``; vllm#33041 on RTX PRO 6000 hosts).

The register layout is the PCIe specification's, as Linux names it (include/uapi/linux/pci_regs.h): extended
capabilities from offset 0x100 of a device's configuration space, each header ``id | version << 16 | next << 20``;
ACS is id 0x000D, its control register at +6 (``PCI_ACS_CTRL``), bits SrcValid, TransBlk, ReqRedir, CmpltRedir,
UpstreamFwd, EgressCtrl, DirectTrans (lspci's ``ACSCtl:`` line).  Only root reads past the first 64 bytes of
``config``: a shorter read is said, never taken for "no ACS".  Standard library only."""
from __future__ import annotations

import os
import re

ACS_ID = 0x000D
ACS_CTRL = 6
FLAGS = ("SrcValid", "TransBlk", "ReqRedir", "CmpltRedir", "UpstreamFwd", "EgressCtrl", "DirectTrans")
REDIRECT = 0x0004 | 0x0008          # ReqRedir, CmpltRedir: peer-to-peer sent up to the root complex
NVIDIA = "0x10de"
GPU_CLASSES = ("0x0300", "0x0302")  # VGA-compatible and 3D controllers
_BDF = re.compile(r"^[0-9a-f]{4,}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


def ext_capability(config, cap_id):
    """Offset of extended capability ``cap_id`` in ``config`` (bytes), or None; a loop in the list ends the walk."""
    off, seen = 0x100, set()
    while off >= 0x100 and off + 4 <= len(config) and off not in seen:
        seen.add(off)
        header = int.from_bytes(config[off:off + 4], "little")
        if header in (0, 0xFFFFFFFF):
            return None
        if header & 0xFFFF == cap_id:
            return off
        off = (header >> 20) & 0xFFC
    return None


def acs_control(config):
    """The ACS control register (an int), or None when the device has no ACS capability."""
    off = ext_capability(config, ACS_ID)
    if off is None or off + ACS_CTRL + 2 > len(config):
        return None
    return int.from_bytes(config[off + ACS_CTRL:off + ACS_CTRL + 2], "little")


# the PCI Express capability's device/port type (its capabilities register, bits 7:4)
PORT_TYPES = {0x4: "root port", 0x5: "switch upstream port", 0x6: "switch downstream port",
              0x7: "PCIe-to-PCI bridge", 0x8: "PCI-to-PCIe bridge"}


def port_type(config):
    """The bridge's PCIe port type in words ("" when its standard capability list does not say)."""
    if len(config) < 0x40 or not int.from_bytes(config[6:8], "little") & 0x10:
        return ""
    off, seen = config[0x34] & 0xFC, set()
    while off >= 0x40 and off + 4 <= len(config) and off not in seen:
        seen.add(off)
        if config[off] == 0x10:
            return PORT_TYPES.get(int.from_bytes(config[off + 2:off + 4], "little") >> 4 & 0xF, "")
        off = config[off + 1] & 0xFC
    return ""


def flags(ctrl):
    return [name for bit, name in enumerate(FLAGS) if ctrl >> bit & 1]


def _read(path, limit=4096):
    try:
        with open(path, "rb") as f:
            return f.read(limit)
    except OSError:
        return None


def _text(path):
    data = _read(path, 64)
    return data.decode("ascii", "replace").strip() if data is not None else ""


def gpu_bridges(devices="/sys/bus/pci/devices"):
    """{GPU address: [the bridges above it, nearest first]} for every NVIDIA display or 3D controller."""
    try:
        names = sorted(os.listdir(devices))
    except OSError:
        return {}
    out = {}
    for name in names:
        d = os.path.join(devices, name)
        if _text(os.path.join(d, "vendor")) != NVIDIA or not _text(os.path.join(d, "class")).startswith(GPU_CLASSES):
            continue
        chain = [p for p in os.path.realpath(d).split(os.sep) if _BDF.match(p)]
        out[name] = list(reversed(chain[:-1]))
    return out


def acs_report(devices="/sys/bus/pci/devices"):
    """What preflight shows and judges: the GPUs found, each bridge above one whose ACS redirects peer-to-peer
    (gpu, bridge, port type, flags), and the bridges whose configuration space could not be read whole (not root)."""
    gpus = gpu_bridges(devices)
    redirecting, unreadable, seen = [], [], set()
    for gpu, bridges in sorted(gpus.items()):
        for bridge in bridges:
            config = _read(os.path.join(devices, bridge, "config"))
            if config is None or len(config) <= 0x100:
                if bridge not in seen:
                    unreadable.append(bridge)
            else:
                ctrl = acs_control(config)
                if ctrl is not None and ctrl & REDIRECT:
                    redirecting.append({"gpu": gpu, "bridge": bridge, "port": port_type(config),
                                        "flags": flags(ctrl)})
            seen.add(bridge)
    return {"gpus": len(gpus), "redirecting": redirecting, "unreadable": unreadable}
