#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import annotations

DOCUMENTATION = r"""
---
module: deploy_lock
short_description: A host-side deploy lock (who, when, what, pid) taken by up and rollback
description:
  - C(present) takes the lock atomically (C(mkdir)); if another run holds it, fails and returns the holder.
  - Deciding whether a holder is stale (its controller process is gone) is the controller's job; the
    holder record says which controller and pid to ask.
  - C(absent) releases it, only if I(token) matches, unless I(force).
options:
  path:
    description: Lock directory.
    type: path
    required: true
  state:
    description: Take or release.
    type: str
    choices: [present, absent]
    default: present
  token:
    description: Unique id of this run; only its owner releases a lock without I(force).
    type: str
    required: true
  owner:
    description: Facts about the holder (user, controller, pid, command).
    type: dict
    default: {}
  force:
    description: Release whoever holds it (C(deployer unlock)).
    type: bool
    default: false
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
- name: Acquire the deploy lock.
  deploy_lock:
    path: /opt/deployer/.lock
    token: "{{ deployer_run_id }}"
    owner: {user: alice, controller: laptop, pid: 4242, command: up}
"""

RETURN = r"""
holder:
  description: The lock record (ours after C(present), the other run's on conflict, the removed one after C(absent)).
  returned: always
  type: dict
"""

import json
import os
import shutil
import time

from ansible.module_utils.basic import AnsibleModule


def read(path):
    try:
        with open(os.path.join(path, "holder.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def main():
    m = AnsibleModule(argument_spec=dict(path=dict(type="path", required=True),
                                         state=dict(type="str", choices=["present", "absent"], default="present"),
                                         token=dict(type="str", required=True, no_log=False),
                                         owner=dict(type="dict", default={}),
                                         force=dict(type="bool", default=False)),
                      supports_check_mode=True)
    p = m.params
    path = p["path"]
    holder = read(path)
    if p["state"] == "present":
        if holder is not None or os.path.isdir(path):
            holder = holder or {"token": "?", "note": "lock directory without a holder record"}
            if holder.get("token") == p["token"]:
                m.exit_json(changed=False, holder=holder)
            age = time.time() - float(holder.get("since", time.time()))
            m.fail_json(msg="host is locked by %s@%s (pid %s, `%s`) since %s (%.0f s ago)"
                        % (holder.get("user", "?"), holder.get("controller", "?"), holder.get("pid", "?"),
                           holder.get("command", "?"), holder.get("since_iso", "?"), age),
                        holder=holder, locked=True)
        rec = dict(p["owner"], token=p["token"], since=time.time(),
                   since_iso=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        if m.check_mode:
            m.exit_json(changed=True, holder=rec)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            os.mkdir(path, 0o755)  # atomic: exactly one concurrent run wins
        except FileExistsError:
            m.fail_json(msg="host is locked by a concurrent run (lost the race)", holder=read(path) or {}, locked=True)
        tmp = os.path.join(path, ".holder.tmp")
        with open(tmp, "w") as f:
            json.dump(rec, f)
        os.rename(tmp, os.path.join(path, "holder.json"))
        m.exit_json(changed=True, holder=rec)
    # absent
    if not os.path.isdir(path):
        m.exit_json(changed=False, holder=None)
    if holder is not None and holder.get("token") != p["token"] and not p["force"]:
        m.exit_json(changed=False, holder=holder, msg="lock held by another run; left in place")
    if not m.check_mode:
        shutil.rmtree(path)
    m.exit_json(changed=True, holder=holder)


if __name__ == "__main__":
    main()
