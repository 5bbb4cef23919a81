#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import annotations

DOCUMENTATION = r"""
---
module: safetensors_check
short_description: Find checkpoint shards that are truncated or not safetensors files, before a 25-minute load
description:
  - Reads the header of every shard in I(files) under I(dir) (8 bytes, then the JSON header; never the
    tensors) and compares the file's size with the size its own header declares (8 + header length + the
    end of the last tensor's C(data_offsets)).  A partial download, a shard truncated to 0 bytes, or a file
    that is not safetensors at all is found in seconds instead of by the engine after minutes of loading.
  - Read-only.
options:
  dir:
    description: The checkpoint directory.
    type: path
    required: true
  files:
    description: Shard file names, relative to I(dir) (the values of C(model.safetensors.index.json)'s weight_map).
    type: list
    elements: str
    required: true
  max_header_mib:
    description: A declared header longer than this, MiB, is not believed (a corrupt length field).
    type: int
    default: 100
attributes:
  check_mode:
    support: full
    description: The same read-only check.
  diff_mode:
    support: none
    description: Returns no diff.
author:
  - deployer maintainers (@deployer)
"""

EXAMPLES = r"""
- name: Check every shard against its own header.
  safetensors_check:
    dir: /srv/models/Kimi-K2.5
    files: "{{ index.weight_map.values() | unique | list }}"
  register: shards
"""

RETURN = r"""
checked:
  description: Number of shards checked.
  returned: always
  type: int
bad:
  description: One entry per bad shard (file, measured size in bytes, expected size in bytes or null, why).
  returned: always
  type: list
  elements: dict
tensor_bytes:
  description: Sum of the tensors' bytes over the good shards.
  returned: always
  type: int
"""

import json
import os
import struct

from ansible.module_utils.basic import AnsibleModule


def check_shard(path, max_header=100 << 20):
    """(expected file size or None, why it is bad or None, tensor bytes) for one safetensors file."""
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
    except (ValueError, UnicodeDecodeError):
        return None, "header is not JSON (not a safetensors file)", 0
    if not isinstance(header, dict):
        return None, "header is not a JSON object (not a safetensors file)", 0
    ends = [t.get("data_offsets", [0, 0])[1] for k, t in header.items() if k != "__metadata__" and isinstance(t, dict)]
    expected = 8 + n + max(ends or [0])
    if size != expected:
        return expected, "truncated" if size < expected else "longer than its header declares", 0
    return expected, None, max(ends or [0])


def main():
    m = AnsibleModule(argument_spec=dict(
        dir=dict(type="path", required=True),
        files=dict(type="list", elements="str", required=True),
        max_header_mib=dict(type="int", default=100),
    ), supports_check_mode=True)
    p = m.params
    bad, total = [], 0
    for name in sorted(set(p["files"])):
        path = os.path.join(p["dir"], name)
        expected, why, tensor_bytes = check_shard(path, p["max_header_mib"] << 20)
        total += tensor_bytes
        if why:
            try:
                size = os.path.getsize(path)
            except OSError:
                size = None
            bad.append(dict(file=name, size=size, expected=expected, why=why))
    m.exit_json(changed=False, checked=len(set(p["files"])), bad=bad, tensor_bytes=total)


if __name__ == "__main__":
    main()
