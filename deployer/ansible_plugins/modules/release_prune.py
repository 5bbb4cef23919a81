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
  - With I(venvs_dir) / I(drafters_dir), the venvs and drafters no kept release names (and that are not
    in I(in_use)) are removed too, so the disk a pruned release held is given back.
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
  venvs_dir:
    description: The shared venv store; venvs no kept release uses are removed. Omit to keep all.
    type: path
  drafters_dir:
    description: The shared drafter store; drafters no kept release uses are removed. Omit to keep all.
    type: path
  in_use:
    description: Paths the running deploy needs (its venv and drafter), never removed.
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
    venvs_dir: /opt/deployer/venvs
    drafters_dir: /opt/deployer/drafters
    in_use: [/opt/deployer/venvs/vllm-0.16.0-p1a2b3c4d]
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
collected:
  description: Venv and drafter directories removed because no kept release uses them.
  returned: always
  type: list
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.releases import prune


def main():
    m = AnsibleModule(argument_spec=dict(releases_dir=dict(type="path", required=True),
                                         keep=dict(type="int", default=5),
                                         protect=dict(type="list", elements="path", default=[]),
                                         venvs_dir=dict(type="path"), drafters_dir=dict(type="path"),
                                         in_use=dict(type="list", elements="path", default=[])),
                      supports_check_mode=True)
    q = m.params
    removed, kept, collected = prune(q["releases_dir"], q["keep"], q["protect"], q["venvs_dir"], q["drafters_dir"],
                                     q["in_use"], m.check_mode)
    m.exit_json(changed=bool(removed or collected), removed=removed, collected=collected, kept=kept)


if __name__ == "__main__":
    main()
