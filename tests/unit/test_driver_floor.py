"""The driver an engine release needs on these GPUs (deployer/driver_floor.py), from the GPU code its libraries carry
(module_utils/fatbin.py): a synthetic library here; the prepared venvs' real wheels in
tests/vllm/test_wheel_gpu_code.py."""
import struct

import pytest

from deployer import driver_floor as df
from deployer.ansible_plugins.filter_plugins.deployer_filters import driver_floor, driver_refusal
from deployer.host.module_utils import fatbin
from helpers import ROOT


def fatbin_container(entries):
    """A fatbin container: its 16-byte header, then one 64-byte entry header (+ 8 payload bytes) per entry."""
    body = b""
    for kind, arch, major, minor in entries:
        body += struct.pack("<HHIQIIHHIIIQQQ", kind, 0, 64, 8, 0, 0, minor, major, arch, 0, 0, 0x11, 0, 0) + b"\0" * 8
    return struct.pack("<IHHQ", fatbin.FATBIN_MAGIC, 1, 16, len(body)) + body


def elf_with_fatbin(path, containers):
    """A 64-bit little-endian ELF file whose only sections are .shstrtab and .nv_fatbin."""
    names = b"\0.shstrtab\0.nv_fatbin\0"
    fat = b"".join(fatbin_container(c) + b"\0" * (-len(fatbin_container(c)) % 8) for c in containers)
    shoff = 64 + len(names) + (-len(names) % 8) + len(fat)
    head = bytearray(64)
    head[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<Q", head, 0x28, shoff)
    struct.pack_into("<HHH", head, 0x3A, 64, 3, 1)
    data = bytes(head) + names + b"\0" * (-len(names) % 8)
    fat_off = len(data)
    data += fat

    def sh(name, off, size):
        return struct.pack("<IIQQQQIIQQ", name, 1, 0, 0, off, size, 0, 0, 1, 0)
    data += sh(0, 0, 0) + sh(1, 64, len(names)) + sh(11, fat_off, len(fat))
    path.write_bytes(data)
    return path


PTX, ELF = fatbin.KIND_PTX, fatbin.KIND_ELF


def test_units_for_a_gpu(tmp_path):
    lib = elf_with_fatbin(tmp_path / "_moe_C.abi3.so", [
        [(ELF, 80, 1, 7), (ELF, 120, 1, 8)],          # machine code for sm_120
        [(ELF, 80, 1, 7), (PTX, 80, 8, 8)],           # Marlin MoE as vLLM 0.16 ships it: PTX only for sm_120
        [(ELF, 80, 1, 7), (PTX, 80, 8, 7)],
        [(ELF, 90, 1, 7)],                            # Hopper-only: nothing sm_120 can run
        [(ELF, 100, 1, 8), (PTX, 121, 9, 0)],         # PTX for a later architecture than the GPU: unusable
    ])
    u = fatbin.units(str(lib))
    assert len(u) == 5
    assert fatbin.for_gpu(u, 12, 0) == {"units": 5, "sass": 1, "ptx_only": 2, "none": 2, "ptx_isa": "8.8"}
    # sm_121 runs sm_120 SASS (same major, later minor) and the compute_121 PTX; sm_90 its own SASS only
    assert fatbin.for_gpu(u, 12, 1) == {"units": 5, "sass": 1, "ptx_only": 3, "none": 1, "ptx_isa": "9.0"}
    assert fatbin.for_gpu(u, 9, 0) == {"units": 5, "sass": 1, "ptx_only": 2, "none": 2, "ptx_isa": "8.8"}


def test_a_file_without_gpu_code_or_not_elf(tmp_path):
    assert fatbin.units(str(elf_with_fatbin(tmp_path / "a.so", []))) == []
    (tmp_path / "b.so").write_bytes(b"#!/bin/sh\n" * 10)
    with pytest.raises(fatbin.FatbinError):
        fatbin.units(str(tmp_path / "b.so"))


MOE = {"file": "vllm/_moe_C.abi3.so", "pattern": "vllm/_moe_C*.so", "compute_cap": "12.0", "units": 33, "sass": 11,
       "ptx_only": 15, "none": 7, "ptx_isa": "8.8", "error": None}
ENGINE = {"cuda_libraries": {"vllm/_moe_C*.so": "fused MoE, Kimi's INT4 Marlin MoE among them"}}


def test_vllm_016_on_driver_570_is_refused_naming_the_kernels_and_the_floor():
    floor = driver_floor({"libraries": [MOE], "torch_cuda": "12.8"}, ENGINE)
    assert floor["driver"] == "575.51.03"
    why = driver_refusal(floor, "570.133.20")
    assert why == ("NVIDIA driver: measured 570.133.20, expected >= 575.51.03 for this engine release on these GPUs: "
                   "vllm/_moe_C.abi3.so (fused MoE, Kimi's INT4 Marlin MoE among them): 15 of 33 CUDA units carry no "
                   "machine code for sm_120, only PTX ISA 8.8 (CUDA 12.9), which the driver compiles at load: "
                   ">= 575.51.03 (upgrade the driver, or pin a release built for this one: deployer versions)")
    assert driver_refusal(floor, "575.51.03") is None and driver_refusal(floor, "580.126.09") is None


def test_cuda_13_torch_needs_580_and_unknown_versions_are_refused():
    floor = df.floor([dict(MOE, ptx_isa="9.0")], "13.0")
    assert floor["driver"] == "580.65.06" and len(floor["constraints"]) == 2
    assert "torch is built for CUDA 13.0: >= 580.65.06" in df.refusal(floor, "575.64")
    odd = df.floor([dict(MOE, ptx_isa="9.9")], "12.8")
    assert "a PTX ISA this deployer does not know" in df.refusal(odd, "600.1")
    broken = df.floor([dict(MOE, error="not a 64-bit little-endian ELF file")], None)
    assert "unreadable (not a 64-bit little-endian ELF file)" in df.refusal(broken, "580.126.09")


def test_a_library_with_machine_code_for_the_gpu_sets_no_floor():
    floor = df.floor([dict(MOE, ptx_only=0, ptx_isa=None, sass=33)], "12.8", gpu_floor="570.0")
    assert floor["driver"] == "570.0" and df.refusal(floor, "570.133.20") is None


def test_a_driver_that_meets_the_floor_is_told_which_kernels_it_compiles_from_ptx_at_the_first_load():
    """Not a refusal but what the verify stage shows: the floor, and each library the driver JIT-compiles from PTX
    (vLLM 0.16/0.18's Marlin MoE on sm_120); a release with machine code for the GPUs gets the floor alone."""
    libs = [{"file": "vllm/_moe_C.abi3.so", "label": "fused MoE", "ptx_only": 15, "units": 33, "ptx_isa": "8.8",
             "compute_cap": "12.0"}, {"file": "vllm/_C.abi3.so", "ptx_only": 0, "units": 106, "ptx_isa": None}]
    result = df.floor(libs, "12.8")
    assert df.refusal(result, "580.95.05") is None
    note = df.note(result, "580.95.05")
    assert note.startswith("driver 580.95.05 >= 575.51.03 (this release's floor on these GPUs); PTX only, compiled "
                           "by the driver at the first load"), note
    assert note.endswith("): vllm/_moe_C.abi3.so (fused MoE): 15 of 33 CUDA units"), note
    assert "_C.abi3.so:" not in note
    assert df.note(df.floor([], "13.0"), "580.95.05") == ("driver 580.95.05 >= 580.65.06 (this release's floor on "
                                                          "these GPUs)")


def test_a_hostile_fatbin_ends_the_read_it_never_loops(tmp_path):
    """Issue 53 N9: a container with the fatbin magic and header and payload sizes of 0 never moved the reader on:
    root (the verify stage's cuda_floor, every vllm/_C*.so of a wheel) looped forever, the deploy lock held.
    Run in a child with a deadline, so that the old code fails this test instead of hanging the suite."""
    import subprocess
    import sys
    empty = struct.pack("<IHHQ", fatbin.FATBIN_MAGIC, 1, 0, 0)
    cut = struct.pack("<IHHQ", fatbin.FATBIN_MAGIC, 1, 16, 1 << 40)      # claims far more than its section holds
    for name, containers in (("zero.so", empty * 4), ("cut.so", cut + b"\0" * 48)):
        lib = elf_with_fatbin(tmp_path / name, [])
        data = bytearray(lib.read_bytes())
        # the .nv_fatbin section is empty in this file: put the hostile bytes where it says it starts, and its size
        shoff = struct.unpack_from("<Q", data, 0x28)[0]
        fat_off = shoff
        data[shoff:shoff] = containers
        struct.pack_into("<Q", data, 0x28, shoff + len(containers))
        struct.pack_into("<QQ", data, shoff + len(containers) + 2 * 64 + 0x18, fat_off, len(containers))
        lib.write_bytes(bytes(data))
        code = ("import sys; sys.path.insert(0, %r); from deployer.host.module_utils import fatbin; "
                "print(fatbin.units(%r))" % (str(ROOT), str(lib)))
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=20)
        assert r.returncode == 0 and r.stdout.strip() == "[]", (name, r.stdout, r.stderr[-500:])
