#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import annotations

DOCUMENTATION = r"""
---
module: release_render
short_description: Write a release's files, check its unit with systemd's own parser, say whether it is live
description:
  - One round trip for the render stage (issue 24, the fleet lever, 7 writes become 1).  The controller renders
    the files (templates, JSON); this module writes each one that differs (a temporary file in the same
    directory, then a rename, so a reader never sees half a file), runs C(systemd-analyze verify) on the unit,
    records the sha256 of what it wrote, writes the release manifest only when the release has none (its result
    is filled in later), and compares the unit with the one systemd runs now.
  - Nothing the service user can write is touched; the release directory is root's (mode 0750).
options:
  dir:
    description: The release directory (made, mode 0750, when missing).
    type: path
    required: true
  files:
    description: The release's files, each C(name) (a plain file name), C(content) and C(mode) (octal string).
    type: list
    elements: dict
    required: true
  extra_files:
    description: Files outside the release directory (the log-line wrapper), each C(path), C(content), C(mode); root's.
    type: list
    elements: dict
    default: []
  checksums:
    description: Names from I(files) whose sha256 goes into C(.deployer-sha256sums) (sha256sum's own format).
    type: list
    elements: str
    default: []
  manifest:
    description: The release manifest (C(release.json)), written only when the release has none.
    type: dict
    required: true
  unit:
    description: The unit's file name among I(files).
    type: str
    required: true
  live_unit_path:
    description: The unit systemd runs now (C(/etc/systemd/system/NAME.service)).
    type: path
    required: true
  verify_unit:
    description: Run C(systemd-analyze verify) on the written unit and fail, naming systemd's words, if it refuses.
    type: bool
    default: true
attributes:
  check_mode:
    support: full
    description: Reports what would be written (with the diff under --diff) and writes nothing.
  diff_mode:
    support: full
    description: One diff per file that changes.
author:
  - deployer maintainers (@deployer)
"""

EXAMPLES = r"""
- name: Write the release.
  release_render:
    dir: /opt/deployer/releases/0123456789ab
    files:
      - {name: argv.json, content: "[]\n", mode: "0644"}
      - {name: deployer-engine.service, content: "{{ lookup('template', 'engine.service.j2') }}", mode: "0644"}
    checksums: [argv.json, deployer-engine.service]
    manifest: {id: 0123456789ab}
    unit: deployer-engine.service
    live_unit_path: /etc/systemd/system/deployer-engine.service
"""

RETURN = r"""
written:
  description: Paths written (or that would be, in check mode).
  returned: always
  type: list
  elements: str
is_live:
  description: Whether the unit systemd runs now is this release's unit, byte for byte.
  returned: always
  type: bool
unit_text:
  description: The release's unit file as rendered (I(unit) of I(files)), for what runs with its lines.
  returned: always
  type: str
"""

import hashlib
import json
import os
import subprocess

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.releases import write_atomic


def read(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def main():
    m = AnsibleModule(argument_spec=dict(
        dir=dict(type="path", required=True),
        files=dict(type="list", elements="dict", required=True),
        extra_files=dict(type="list", elements="dict", default=[]),
        checksums=dict(type="list", elements="str", default=[]),
        manifest=dict(type="dict", required=True),
        unit=dict(type="str", required=True),
        live_unit_path=dict(type="path", required=True),
        verify_unit=dict(type="bool", default=True),
    ), supports_check_mode=True)
    p = m.params
    d = p["dir"]
    written, diffs, contents = [], [], {}
    if not os.path.isdir(d):
        written.append(d)
        if not m.check_mode:
            os.makedirs(d, 0o750)
            os.chmod(d, 0o750)
    elif os.stat(d).st_mode & 0o7777 != 0o750:
        written.append(d)
        if not m.check_mode:
            os.chmod(d, 0o750)
    targets = []
    for f in p["files"]:
        name = f["name"]
        if "/" in name or name in ("", ".", ".."):
            m.fail_json(msg="render: %r is not a plain file name" % name)
        targets.append((os.path.join(d, name), f))
        contents[name] = f["content"].encode("utf-8")
    targets += [(f["path"], f) for f in p["extra_files"]]
    for path, f in targets:
        data = f["content"].encode("utf-8")
        mode = int(str(f.get("mode") or "0644"), 8)
        before = read(path)
        try:
            same_mode = before is not None and (os.stat(path).st_mode & 0o7777) == mode
        except OSError:
            same_mode = False
        if before == data and same_mode:
            continue
        written.append(path)
        if m._diff and before != data:
            diffs.append(dict(before_header=path, after_header=path,
                              before=(before or b"").decode("utf-8", "replace"), after=f["content"]))
        if not m.check_mode:
            if not os.path.isdir(os.path.dirname(path)):   # a content-named folder of root's bin/ (the state keeper)
                os.makedirs(os.path.dirname(path), 0o755)
            write_atomic(path, data, mode)
    unit_file = os.path.join(d, p["unit"])
    if p["verify_unit"] and not m.check_mode:
        r = subprocess.run(["systemd-analyze", "verify", unit_file], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           universal_newlines=True)
        if r.returncode != 0:
            m.fail_json(msg="render: systemd-analyze verify refused %s (exit %d; nothing was installed or "
                        "restarted): %s" % (unit_file, r.returncode, (r.stderr + " " + r.stdout).strip()),
                        written=written)
    if p["checksums"] and not m.check_mode:
        sums = "".join("%s  %s\n" % (hashlib.sha256(contents[n]).hexdigest(), n) for n in p["checksums"])
        path = os.path.join(d, ".deployer-sha256sums")
        if read(path) != sums.encode():
            write_atomic(path, sums.encode(), 0o644)
    manifest = os.path.join(d, "release.json")
    if not os.path.exists(manifest):   # same id, same identity: never wipe the outcome an earlier run recorded
        written.append(manifest)
        if not m.check_mode:
            write_atomic(manifest, (json.dumps(p["manifest"], indent=4, sort_keys=True) + "\n").encode(), 0o644)
    live = read(p["live_unit_path"])
    is_live = live is not None and live == contents.get(p["unit"]) and (m.check_mode or read(unit_file) == live)
    res = dict(changed=bool(written), written=written, is_live=is_live,
               unit_text=contents.get(p["unit"], b"").decode("utf-8"))
    if diffs:
        res["diff"] = diffs
    m.exit_json(**res)


if __name__ == "__main__":
    main()
