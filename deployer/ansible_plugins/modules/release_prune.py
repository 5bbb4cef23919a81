#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import annotations

DOCUMENTATION = r"""
---
module: release_prune
short_description: Keep the newest N release directories, never the live one or the one before it
description:
  - Release directories hold only small files (argv, env, unit, manifest); venvs and drafters are shared
    and content-addressed, so pruning a release never deletes what another release uses.
options:
  releases_dir:
    description: Directory holding one sub-directory per release.
    type: path
    required: true
  keep:
    description: How many releases to keep (at least 2).
    type: int
    default: 5
  protect:
    description: Symlinks (e.g. current, previous) whose targets are never pruned.
    type: list
    elements: path
    default: []
attributes:
  check_mode:
    support: full
    description: Reports what would change and changes nothing.
  diff_mode:
    support: none
    description: Returns no diff.
author:
  - deployer maintainers (@deployer)
"""

EXAMPLES = r"""
- name: Prune old releases.
  release_prune:
    releases_dir: /opt/deployer/releases
    keep: 5
    protect: [/opt/deployer/current, /opt/deployer/previous]
"""

RETURN = r"""
removed:
  description: Release ids removed (or that would be, in check mode).
  returned: always
  type: list
kept:
  description: Release ids kept.
  returned: always
  type: list
"""

import os
import shutil

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.releases import plan_prune, read_release


def main():
    m = AnsibleModule(argument_spec=dict(releases_dir=dict(type="path", required=True),
                                         keep=dict(type="int", default=5),
                                         protect=dict(type="list", elements="path", default=[])),
                      supports_check_mode=True)
    root = m.params["releases_dir"]
    if not os.path.isdir(root):
        m.exit_json(changed=False, removed=[], kept=[])
    releases = []
    for name in sorted(os.listdir(root)):
        d = os.path.join(root, name)
        if os.path.isdir(d) and not name.startswith("."):
            r = read_release(d)
            r["id"] = name
            r.setdefault("created_at", os.stat(d).st_mtime)
            releases.append(r)
    protected = set()
    for link in m.params["protect"]:
        if os.path.islink(link):
            protected.add(os.path.basename(os.path.realpath(link)))
    removed = plan_prune(releases, m.params["keep"], protected)
    if not m.check_mode:
        for rid in removed:
            shutil.rmtree(os.path.join(root, rid))
    m.exit_json(changed=bool(removed), removed=removed,
                kept=sorted(r["id"] for r in releases if r["id"] not in removed))


if __name__ == "__main__":
    main()
