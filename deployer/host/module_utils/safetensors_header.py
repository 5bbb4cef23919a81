# -*- coding: utf-8 -*-
"""A safetensors shard checked against its own header (8 bytes, then the JSON header; never the tensors): its size
must be 8 + header length + the end of the last tensor's data_offsets.  A partial download, a shard truncated to 0
bytes, or a file that is not safetensors at all is found in seconds instead of by the engine after minutes of
loading (the preflight_facts module; docs/reliability.md).  Standard library only."""
from __future__ import annotations

import json
import os
import re
import struct

# a tensor name with its layer and expert numbers folded (model.layers.7.mlp.experts.12.w -> model.layers.N.mlp.
# experts.N.w): a 1T MoE checkpoint's ~200,000 tensors become ~100 groups the controller's memory plan reads
_INDEX = re.compile(r"\.\d+(?=\.|$)")
MAX_GROUPS = 4096


def template(name):
    """The group a tensor's bytes are counted in: its name with every numeric component as N."""
    return _INDEX.sub(".N", name)


def check_shard(path, max_header=100 << 20, groups=None):
    """(expected file size or None, why it is bad or None, tensor bytes) for one safetensors file; with ``groups`` (a
    dict), each tensor's bytes are added to it under its name's template (a good shard's only)."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return None, "shorter than a safetensors header (8 bytes)", 0
            (n,) = struct.unpack("<Q", head)
            if n > max_header or 8 + n > size:
                return None, "declares a %d-byte header, beyond the file's end (truncated or not safetensors)" % n, 0
            header = json.loads(f.read(n).decode("utf-8"))
    except OSError as e:
        return None, "unreadable: %s" % e, 0
    except (ValueError, UnicodeDecodeError, RecursionError):   # RecursionError: a header nested beyond reason
        return None, "header is not JSON (not a safetensors file)", 0
    if not isinstance(header, dict):
        return None, "header is not a JSON object (not a safetensors file)", 0
    end, sizes, sub = 0, {}, _INDEX.sub
    for name, t in header.items():   # ~3,000 tensors a shard, 200,000 a checkpoint: kept to plain operations
        if name == "__metadata__":
            continue
        offsets = t.get("data_offsets") if type(t) is dict else None
        # type() is int: an int and not a bool (size_int), without a call per offset
        if not (type(offsets) is list and len(offsets) == 2 and type(offsets[0]) is int
                and type(offsets[1]) is int and 0 <= offsets[0] <= offsets[1]):
            return None, "tensor %s: data_offsets is not two ascending non-negative integers" % _shown(name), 0
        if offsets[1] > end:
            end = offsets[1]
        key = sub(".N", name)
        sizes[key] = sizes.get(key, 0) + offsets[1] - offsets[0]
    expected = 8 + n + end
    if size != expected:
        return expected, "truncated" if size < expected else "longer than its header declares", 0
    if groups is not None:
        for key, b in sizes.items():
            if key not in groups and len(groups) >= MAX_GROUPS:
                key = "(other)"
            groups[key] = groups.get(key, 0) + b
    return expected, None, end


def size_int(x):
    """A header's integer (an offset, a dimension): an int, not a bool, not negative."""
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _shown(name):
    """A tensor name from a header as a message may quote it: repr, at most 80 characters."""
    return repr(name[:80])


def check_shards(directory, files, max_header=100 << 20, groups=None):
    """(bad, checked, tensor_bytes) for the shard names ``files`` under ``directory``: bad is one dict per bad
    shard (file, measured size in bytes or None, expected size in bytes or None, why); ``groups`` as check_shard."""
    bad, total = [], 0
    names = sorted(set(files))
    for name in names:
        path = os.path.join(directory, name)
        expected, why, tensor_bytes = check_shard(path, max_header, groups)
        total += tensor_bytes
        if why:
            try:
                size = os.path.getsize(path)
            except OSError:
                size = None
            bad.append(dict(file=name, size=size, expected=expected, why=why))
    return bad, len(names), total
