"""The NVIDIA driver an installed engine needs on these GPUs, read from the engine itself (issue 42): the CUDA major
version its torch was built for, and the PTX its CUDA libraries carry where they have no machine code (SASS) for the
GPU - the driver JIT-compiles that PTX at load, and only a driver that knows its PTX ISA can (vLLM 0.16/0.18's INT4
Marlin MoE, ``gptq_marlin_repack`` and FA2 are PTX 8.8 only on sm_120: "the provided PTX was compiled with an
unsupported toolchain" on driver 570.133.20 right after the 64 shards loaded, vllm#38619).  Pure logic; the verify
role feeds it what the cuda_floor module read on the host.

Versions: NVIDIA's CUDA Toolkit release notes (table "CUDA Toolkit and Corresponding Driver Versions", Linux x86_64,
the GA of each toolkit) and the PTX ISA release notes (which toolkit introduced each PTX ISA version).
"""
from __future__ import annotations

# PTX ISA version -> the CUDA toolkit that introduced it (PTX ISA documentation, "Release Notes")
# (8.6 came with no public toolkit: counted as the next one's, 12.8)
PTX_ISA_CUDA = {(8, 0): (12, 0), (8, 1): (12, 1), (8, 2): (12, 2), (8, 3): (12, 3), (8, 4): (12, 4), (8, 5): (12, 5),
                (8, 6): (12, 8), (8, 7): (12, 8), (8, 8): (12, 9), (9, 0): (13, 0), (9, 1): (13, 1)}
# CUDA toolkit (GA) -> the lowest Linux driver that runs it, and so JIT-compiles its PTX
CUDA_DRIVER = {(12, 0): "525.60.13", (12, 1): "530.30.02", (12, 2): "535.54.03", (12, 3): "545.23.06",
               (12, 4): "550.54.14", (12, 5): "555.42.02", (12, 6): "560.28.03", (12, 8): "570.26",
               (12, 9): "575.51.03", (13, 0): "580.65.06", (13, 1): "590.44.01"}
# A CUDA runtime of major M runs on any driver of that major's first release (CUDA minor version compatibility) -
# except for PTX, which needs the driver of its own toolkit (above).
MAJOR_DRIVER = {12: "525.60.13", 13: "580.65.06"}
UNKNOWN = "999"      # a version this deployer cannot place: refused until it knows it


def _v(s: str) -> tuple[int, ...]:
    return tuple(int(x) for x in str(s).split(".") if x.isdigit())


def _mm(s: str) -> tuple[int, int]:
    t = _v(s)
    return (t + (0, 0))[:2]


def floor(libraries: list[dict], torch_cuda: str | None, gpu_floor: str = "0") -> dict:
    """The lowest driver the engine needs: ``driver`` and ``constraints`` (each {driver, why}, the binding one first).
    ``libraries``: the cuda_floor module's per-library counts; ``gpu_floor``: what the GPUs themselves need
    (preflight_driver_min_version)."""
    out = [(gpu_floor, f"these GPUs need >= {gpu_floor} (preflight_driver_min_version)", None)] \
        if _v(gpu_floor) > (0,) else []
    if torch_cuda:
        need = MAJOR_DRIVER.get(_mm(torch_cuda)[0])
        out.append((need or UNKNOWN, f"torch is built for CUDA {torch_cuda}"
                    + (f": >= {need}" if need else ", a major this deployer does not know"), None))
    for lib in libraries:
        name = lib["file"] + (f" ({lib['label']})" if lib.get("label") else "")
        if lib.get("error"):
            out.append((UNKNOWN, f"{name}: unreadable ({lib['error']})", None))
            continue
        isa = lib.get("ptx_isa")
        if not isa or not lib.get("ptx_only"):
            continue
        cuda = PTX_ISA_CUDA.get(_mm(isa))
        need = CUDA_DRIVER.get(cuda) if cuda else None
        jit = f"{name}: {lib['ptx_only']} of {lib['units']} CUDA units"
        what = (f"{jit} carry no machine code for sm_{str(lib.get('compute_cap', '')).replace('.', '')}, "
                f"only PTX ISA {isa}")
        out.append((need or UNKNOWN, f"{what} (CUDA {cuda[0]}.{cuda[1]}), which the driver compiles at load: >= {need}"
                    if need else f"{what}, a PTX ISA this deployer does not know", jit))
    out.sort(key=lambda r: _v(r[0]), reverse=True)     # stable: the GPUs' own floor first among equals
    return {"driver": out[0][0] if out else "0",
            "constraints": [{"driver": d, "why": w} | ({"jit": j} if j else {}) for d, w, j in out]}


def refusal(result: dict, driver: str) -> str | None:
    """Why ``driver`` cannot run the engine (every constraint it misses), or None."""
    missed = [c["why"] for c in result["constraints"] if _v(driver) < _v(c["driver"])]
    if not missed:
        return None
    return (f"NVIDIA driver: measured {driver}, expected >= {result['driver']} for this engine release on these GPUs: "
            + "; ".join(missed) + " (upgrade the driver, or pin a release built for this one: deployer versions)")


def note(result: dict, driver: str) -> str:
    """What a driver that meets the floor is told: the floor, and which libraries it must JIT-compile from PTX at the
    first load, before anything is served (the GPU canary's probes compile what they call first, into the server's
    cache)."""
    jit = [c["jit"] for c in result["constraints"] if c.get("jit")]
    out = f"driver {driver} >= {result['driver']} (this release's floor on these GPUs)"
    if jit:
        out += ("; PTX only, compiled by the driver at the first load (the canary's kernel probes compile the "
                "ones they call first, into the server's cache; `deployer versions` shows the releases with "
                "machine code for these GPUs): " + "; ".join(jit))
    return out
