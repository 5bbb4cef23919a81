"""Judgements of what preflight reads of a GPU host's kernel setup (module preflight_facts: ``nvidia_nodes``,
``iommu``), pure: what would make the load hang or CUDA fail after the restart, said before it.

- PCIe peer-to-peer through an IOMMU that translates DMA: NCCL's first all-reduce hangs with no log line on many
  multi-GPU PCIe hosts (vllm#33041, a TP=2 RTX PRO 6000 hang fixed by amd_iommu=off / ACS off, or worked around with
  NCCL_P2P_DISABLE=1); the deployer's default NCCL_P2P_LEVEL=SYS asks for P2P across every switch.
- nvidia_uvm's heterogeneous memory management: the RTX PRO 6000 community sets ``uvm_disable_hmm=1`` on these
  multi-GPU hosts against the same start-up deadlock.
- The device nodes: the hardened unit can neither load a module nor create a node (NoNewPrivileges stops the setuid
  nvidia-modprobe), so /dev/nvidiactl, /dev/nvidia-uvm and one /dev/nvidiaN per GPU must exist before it starts.
"""
from __future__ import annotations

import re

# kernel parameters under which devices' DMA is not translated (passthrough) or the IOMMU is off
IOMMU_PASS = re.compile(r"(^|\s)(iommu=(pt|off)|amd_iommu=off|intel_iommu=off)(\s|$)")


def missing_nodes(nodes: list[str], gpu_count: int) -> list[str]:
    """The /dev nodes CUDA opens that are absent."""
    want = ["nvidiactl", "nvidia-uvm"] + [f"nvidia{i}" for i in range(gpu_count)]
    return [f"/dev/{n}" for n in want if n not in set(nodes or [])]


def p2p_risks(iommu: dict, env: dict) -> list[str]:
    """Warnings, each with what was measured and what to change; [] when nothing is at risk."""
    out = []
    iommu = iommu or {}
    p2p_off = str(env.get("NCCL_P2P_DISABLE", "")) == "1"
    cmdline = str(iommu.get("cmdline") or "")
    if int(iommu.get("devices") or 0) > 0 and not IOMMU_PASS.search(cmdline) and not p2p_off:
        level = env.get("NCCL_P2P_LEVEL")
        out.append(f"NCCL: the IOMMU translates DMA on this host (measured {iommu['devices']} IOMMU devices in "
                   "/sys/class/iommu, no iommu=pt or iommu=off on the kernel command line) and NCCL uses PCIe "
                   f"peer-to-peer{' at NCCL_P2P_LEVEL=' + str(level) if level else ''}: on many PCIe hosts its first "
                   "all-reduce then hangs with no log line (vllm#33041; the watch's 'starting' limit rolls it back). "
                   "Boot with iommu=pt (and ACS off), or set NCCL_P2P_DISABLE: '1' in deployer_nccl_env")
    hmm = iommu.get("uvm_disable_hmm")
    if hmm is not None and str(hmm) not in ("1", "Y", "y"):
        out.append(f"nvidia_uvm: measured uvm_disable_hmm={hmm}; multi-GPU RTX PRO 6000 hosts are run with 1 "
                   "against a start-up deadlock (options nvidia_uvm uvm_disable_hmm=1 in /etc/modprobe.d, then reload "
                   "the module)")
    return out
