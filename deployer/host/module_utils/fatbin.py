# -*- coding: utf-8 -*-
"""Which GPU code a CUDA library carries for a GPU: its ``.nv_fatbin`` ELF section read header by header (never the
code itself), one fatbin container per CUDA compilation unit, each holding cubins (SASS: machine code for one sm_XY)
and PTX (compute_XY text the driver compiles at load - and only a driver that knows that PTX ISA version can).
Standard library only (the cuda_floor module, on the GPU host).

The container and entry headers are NVIDIA's fatbin format as ``cuobjdump`` reads it (magic 0xBA55ED50; entry kind 1
PTX, 2 ELF; the PTX ISA or cubin version as major.minor; the sm number).  A unit runs on a GPU of compute capability
X.Y when it has SASS for sm_X0..sm_XY (SASS runs on later minors of its major), or else PTX for compute_<= XY, which the
driver JIT-compiles: the highest PTX ISA among such units sets the driver the library needs on that GPU.
"""
from __future__ import annotations

import struct

FATBIN_MAGIC = 0xBA55ED50
KIND_PTX, KIND_ELF = 1, 2


class FatbinError(ValueError):
    pass


def _sections(f):
    """{name: (offset, size)} of a 64-bit little-endian ELF file's sections."""
    f.seek(0)
    eh = f.read(64)
    if len(eh) < 64 or eh[:4] != b"\x7fELF" or eh[4] != 2 or eh[5] != 1:
        raise FatbinError("not a 64-bit little-endian ELF file")
    (shoff,) = struct.unpack_from("<Q", eh, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", eh, 0x3A)
    if shentsize < 64 or shnum == 0 or shstrndx >= shnum:
        raise FatbinError("ELF section table unreadable")
    f.seek(shoff)
    raw = f.read(shentsize * shnum)
    secs = [struct.unpack_from("<IIQQQQ", raw, i * shentsize) for i in range(shnum)]
    f.seek(secs[shstrndx][4])
    names = f.read(secs[shstrndx][5])
    out = {}
    for s in secs:
        end = names.find(b"\0", s[0])
        out[names[s[0]:end if end >= 0 else None].decode("latin-1")] = (s[4], s[5])
    return out


def units(path):
    """One list per fatbin container (a compilation unit) of (kind, sm, major, minor) entries; [] without GPU code."""
    out = []
    with open(path, "rb") as f:
        sec = _sections(f).get(".nv_fatbin")
        if not sec:
            return out
        pos, end = sec
        end += pos
        while pos + 16 <= end:
            f.seek(pos)
            head = f.read(16)
            if len(head) < 16:              # the section says more than the file holds
                break
            magic, _version, hsize, fsize = struct.unpack("<IHHQ", head)
            # containers are 8-byte aligned, padding between them; one that is empty or claims more than its
            # section holds is not one (a container of size 0 never moved the reader on: root looped forever)
            if magic != FATBIN_MAGIC or hsize < 16 or fsize == 0 or pos + hsize + fsize > end:
                pos += 8
                continue
            entries, e, stop = [], pos + hsize, pos + hsize + fsize
            while e + 40 <= stop:
                f.seek(e)
                head = f.read(40)
                if len(head) < 40:
                    break
                kind, _, ehsize, esize, _, _, minor, major, arch = struct.unpack_from("<HHIQIIHHI", head)
                if ehsize == 0:
                    break
                entries.append((kind, arch, major, minor))
                e += ehsize + esize
            out.append(entries)
            pos = stop
    return out


def for_gpu(unit_list, cc_major, cc_minor):
    """What a GPU of compute capability cc_major.cc_minor gets from these units: counts of units it runs from SASS,
    from PTX only (and the highest PTX ISA among those, "8.8"), and with no code it can run at all."""
    gpu = cc_major * 10 + cc_minor
    sass = ptx = none = 0
    isa = None
    for entries in unit_list:
        if any(k == KIND_ELF and a // 10 == cc_major and a <= gpu for k, a, _, _ in entries):
            sass += 1
            continue
        usable = [(ma, mi) for k, a, ma, mi in entries if k == KIND_PTX and a <= gpu]
        if usable:
            ptx += 1
            top = max(usable)
            isa = top if isa is None or top > isa else isa
        elif entries:
            none += 1
    return dict(units=len(unit_list), sass=sass, ptx_only=ptx, none=none,
                ptx_isa="%d.%d" % isa if isa else None)
