"""Judgements of what preflight reads of a GPU host's kernel setup (module preflight_facts: ``nvidia_nodes``,
``iommu`` with its ``acs``: module_utils/pci_acs.py), pure: what would make the load hang or CUDA fail after the
restart, said before it.

- PCIe peer-to-peer through an IOMMU that translates DMA: NCCL's first all-reduce hangs with no log line on many
  multi-GPU PCIe hosts (vllm#33041, a TP=2 RTX PRO 6000 hang fixed by amd_iommu=off / ACS off, or worked around with
  NCCL_P2P_DISABLE=1); the deployer's default NCCL_P2P_LEVEL=SYS asks for P2P across every switch.
- nvidia_uvm's heterogeneous memory management: the RTX PRO 6000 community sets ``uvm_disable_hmm=1`` on these
  multi-GPU hosts against the same start-up deadlock.
- ``nvidia-smi topo -p2p r``, the driver's own word on which GPU pairs can read each other's memory: a pair it
  does not report OK (CNS chipset, GNS GPU, TNS topology not supported) is never peer-to-peer for NCCL, which moves
  that pair's traffic through host memory (a slower all-reduce, not a hang); OK everywhere does not rule the IOMMU
  hang out (local-inference-lab/rtx6kpro#15: it hung with OK everywhere), the canary's all-reduce does.
- The device nodes: the hardened unit can neither load a module nor create a node (NoNewPrivileges stops the setuid
  nvidia-modprobe), so /dev/nvidiactl, /dev/nvidia-uvm and one /dev/nvidiaN per GPU must exist before it starts.
"""
from __future__ import annotations

import re

# kernel parameters under which devices' DMA is not translated (passthrough) or the IOMMU is off
IOMMU_PASS = re.compile(r"(^|\s)(iommu=(pt|off)|amd_iommu=off|intel_iommu=off)(\s|$)")


# nvidia-smi's legend for the P2P status matrix (`nvidia-smi topo -p2p r`)
P2P_STATUS = {"OK": "Status Ok", "CNS": "Chipset not supported", "GNS": "GPU not supported",
              "TNS": "Topology not supported", "NS": "Not supported", "U": "Unknown"}


def p2p_matrix(text: str | None) -> dict | None:
    """``nvidia-smi topo -p2p r`` read: {"gpus": [GPU0, ...], "pairs": {(i, j): status}} for every pair i < j (the
    status both ways when they differ, 'OK/CNS'), None when the text holds no matrix (an older driver, no GPUs).
    What nvidia-smi prints is data: only the legend's codes are kept, anything else is 'U'."""
    rows = {}
    head = None
    for line in (text or "").splitlines():
        cells = line.split()
        if not cells:
            if head and rows:
                break
            continue
        if head is None and all(re.fullmatch(r"GPU\d{1,3}", c) for c in cells):
            head = cells
            continue
        if head and re.fullmatch(r"GPU\d{1,3}", cells[0]) and len(cells) == len(head) + 1:
            rows[cells[0]] = cells[1:]
    if not head or set(rows) != set(head):
        return None
    pairs = {}
    for i, a in enumerate(head):
        for j in range(i + 1, len(head)):
            there, back = (rows[a][j], rows[head[j]][i])
            there, back = (x if x in P2P_STATUS else "U" for x in (there, back))
            pairs[(i, j)] = there if there == back else f"{there}/{back}"
    return {"gpus": head, "pairs": pairs}


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
    acs = iommu.get("acs") or {}
    bridges = {}
    for r in acs.get("redirecting") or []:
        bridges.setdefault(r.get("bridge"), r)
    if bridges and not p2p_off:
        translated = int(iommu.get("devices") or 0) > 0 and not IOMMU_PASS.search(cmdline)
        shown = ", ".join(f"{b} ({r.get('port') or 'bridge'}: {' '.join(r.get('flags') or [])})"
                          for b, r in sorted(bridges.items())[:4]) + (" ..." if len(bridges) > 4 else "")
        out.append(f"NCCL: PCIe ACS redirects peer-to-peer on {len(bridges)} bridge(s) above the GPUs (measured: "
                   f"{shown}): GPU-to-GPU traffic goes up to the root complex"
                   f"{', through the IOMMU that translates DMA here' if translated else ''}, where on many PCIe hosts "
                   "NCCL's first all-reduce hangs with no log line. Disable ACS on them (as root: setpci -s <bridge> "
                   "ECAP_ACS+0x6.w=0000, or in the BIOS), or set NCCL_P2P_DISABLE: '1' in deployer_nccl_env")
    if acs.get("gpus") and acs.get("unreadable") and not p2p_off:
        out.append(f"PCIe ACS: not measured on {len(acs['unreadable'])} bridge(s) above the GPUs (configuration space "
                   f"unreadable: {', '.join(acs['unreadable'][:4])})")
    topo = p2p_matrix(iommu.get("topo_p2p"))
    bad = {k: v for k, v in (topo or {}).get("pairs", {}).items() if v != "OK"}
    if bad and not p2p_off:
        shown = ", ".join(f"GPU{i}-GPU{j} {v}" for (i, j), v in sorted(bad.items())[:6]) + (" ..." if len(bad) > 6
                                                                                           else "")
        legend = ", ".join(f"{c} = {P2P_STATUS[c]}" for c in sorted({c for v in bad.values() for c in v.split("/")
                                                                     if c != "OK"}))
        out.append(f"NCCL: nvidia-smi topo -p2p r reports no peer-to-peer reads for {len(bad)} of "
                   f"{len(topo['pairs'])} GPU pairs (measured: {shown}; {legend}), expected OK for every pair: "
                   "NCCL moves those pairs' traffic through host memory, a slower all-reduce (the canary measures "
                   "its bus bandwidth), not a hang")
    hmm = iommu.get("uvm_disable_hmm")
    if hmm is not None and str(hmm) not in ("1", "Y", "y"):
        out.append(f"nvidia_uvm: measured uvm_disable_hmm={hmm}; multi-GPU RTX PRO 6000 hosts are run with 1 "
                   "against a start-up deadlock (options nvidia_uvm uvm_disable_hmm=1 in /etc/modprobe.d, then reload "
                   "the module)")
    return out


# What compiles at run time, as each engine's own code finds it (the verify stage's probe reads it as the service
# user in the unit's environment): Triton's C compiler and Python.h (triton/runtime/build.py), and for an engine that
# declares ``jit_toolchain``, FlashInfer's nvcc (CUDA_HOME, CUDA_PATH, nvcc on PATH, /usr/local/cuda), ninja (on PATH)
# and C++ compiler (CXX, else c++) (flashinfer/jit/cpp_ext.py), and cuRAND's headers in that toolkit's include
# directory, the only CUDA include path its JIT passes (flashinfer/include/flashinfer/sampling.cuh includes them).
JIT_ADVICE = {
    "nvcc": "the CUDA toolkit (its nvcc), or CUDA_HOME in deployer_env_extra",
    "ninja": "ninja on the unit's PATH (the venv's own, from the ninja wheel, is first there)",
    "c++": "a C++ compiler (install g++, or set CXX in deployer_env_extra)",
    "curand": "cuRAND's headers in the CUDA toolkit's include directory (its development package, of nvcc's CUDA "
              "version; FlashInfer's sampling kernels include them and its JIT looks nowhere else)",
}


def toolchain_refusal(tc: dict, engine: dict, user: str) -> str | None:
    """The verify stage's refusal for a run-time toolchain the engine's kernels cannot be compiled with, None when
    everything it needs is there.  ``tc``: the probe's report (cc, cc_found, include, python_h, path, python,
    programs {name: {found, how}})."""
    tc = tc or {}
    parts = []
    if not tc.get("cc_found"):
        cc = tc.get("cc")
        parts.append("C compiler: measured " + (f"CC={cc}, not found" if cc else
                                                f"none (CC unset; no gcc or clang on {tc.get('path')})")
                     + ", expected one (install gcc, or set CC in deployer_env_extra); ")
    if not tc.get("python_h"):
        parts.append(f"Python.h: measured none in {tc.get('include')}, expected it there (install the python3-dev "
                     f"package of {tc.get('python')}); ")
    triton = bool(parts)
    programs = tc.get("programs") or {}
    jit = []
    for name in (engine or {}).get("jit_toolchain") or []:
        got = programs.get(name) or {}
        if not got.get("found"):
            jit.append(f"{name}: measured none ({got.get('how') or 'not looked for'}), expected "
                       f"{JIT_ADVICE.get(name, name)}; ")
    if not parts and not jit:
        return None
    return (f"run-time toolchain, as the service user {user} in the unit's environment: " + "".join(parts)
            + ("Triton compiles its kernels' launchers with them at run time (triton/runtime/build.py), after the "
               "load. " if triton else "")
            + "".join(jit)
            + (f"{(engine or {}).get('label', 'the engine')}'s FlashInfer compiles its kernels at run time with them "
               "(flashinfer/jit/cpp_ext.py), after the load." if jit else "")).strip()
