#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import annotations

DOCUMENTATION = r"""
---
module: release_record
short_description: Record a deploy outcome in a release manifest (release.json)
description:
  - Sets C(result), the time and extra facts (phase durations, acceptance) in C(release.json), atomically.
options:
  release_dir:
    description: The release directory.
    type: path
    required: true
  result:
    description: Outcome of the deploy of this release.
    type: str
    required: true
    choices: [live, failed, rolled_back_from, superseded]
  facts:
    description: Extra keys merged into the manifest.
    type: dict
    default: {}
attributes:
  check_mode:
    support: full
    description: Reports what would change and changes nothing.
  diff_mode:
    support: full
    description: Returns a before/after diff of what it changes.
author:
  - deployer maintainers (@deployer)
"""

EXAMPLES = r"""
- name: Mark the release live.
  release_record:
    release_dir: /opt/deployer/releases/0123456789ab
    result: live
"""

RETURN = r"""
release:
  description: The manifest after the change.
  returned: always
  type: dict
"""

import json

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.releases import record


def main():
    m = AnsibleModule(argument_spec=dict(release_dir=dict(type="path", required=True),
                                         result=dict(type="str", required=True,
                                                     choices=["live", "failed", "rolled_back_from", "superseded"]),
                                         facts=dict(type="dict", default={})),
                      supports_check_mode=True)
    changed, before, after = record(m.params["release_dir"], m.params["result"], m.params["facts"], m.check_mode)
    out = dict(changed=changed, release=after)
    if m._diff:
        out["diff"] = {"before": json.dumps(before, indent=2, sort_keys=True) + "\n",
                       "after": json.dumps(after, indent=2, sort_keys=True) + "\n"}
    m.exit_json(**out)


if __name__ == "__main__":
    main()
