#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import annotations

DOCUMENTATION = r"""
---
module: deploy_lock
short_description: A host-side deploy lock (who, when, what, pid) taken by up and rollback
description:
  - C(present) takes the lock atomically (C(mkdir)); if another run holds it, fails and returns the holder.
  - Whether a holder is stale is decided from both sides. The host's view is its declared time-to-live
    (C(owner.ttl_seconds)); on conflict the module returns C(expired). Whether its controller process is
    gone is the controller's to ask (the record names controller and pid).
  - I(take_over) replaces a stale holder atomically, under an exclusive C(flock) on a file beside the lock in
    which the holder is read again (only the holder judged stale is replaced; of two controllers taking over at
    once exactly one wins), and returns it as C(took_over).
  - C(absent) releases it, only if I(token) matches, unless I(force); with I(audit) it first appends the run's
    record to the audit log, so that the record and the release cost one round trip.
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
  take_over:
    description:
      - Take the lock from a stale holder, identified by its C(since) (key C(since)), so that a holder that
        changed in the meantime is never taken over. Only with C(present).
    type: dict
  audit:
    description:
      - With C(absent), append one JSON line (key C(line), a dict, written with sorted keys) to the file at key
        C(path) before releasing the lock; the file is created 0644 if missing. Written whoever holds the lock
        now (it is this run's outcome). Not in check mode.
    type: dict
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

- name: Record the run and release the lock.
  deploy_lock:
    path: /opt/deployer/.lock
    token: "{{ deployer_run_id }}"
    state: absent
    audit:
      path: /opt/deployer/audit.jsonl
      line: {command: up, result: ok}
"""

RETURN = r"""
holder:
  description: The lock record (ours after C(present), the other run's on conflict, the removed one after C(absent)).
  returned: always
  type: dict
expired:
  description: On conflict, whether the holder is older than the time-to-live it declared.
  returned: when locked
  type: bool
took_over:
  description: The stale holder this run replaced.
  returned: when take_over replaced a holder
  type: dict
"""

import fcntl
import json
import os
import shutil
import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.host_io import write_atomic


def read(path):
    try:
        with open(os.path.join(path, "holder.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def append_line(m, audit):
    """Append ``audit['line']`` as one JSON line to ``audit['path']`` (root's alone: 0600, also when an older
    deployer left it 0644; operator names and controller ids are no business of the service user's)."""
    if not audit.get("path") or not isinstance(audit.get("line"), dict):
        m.fail_json(msg="audit: expected keys path (a file) and line (a dict), got %s" % sorted(audit))
    fd = os.open(audit["path"], os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, (json.dumps(audit["line"], sort_keys=True) + "\n").encode())
    finally:
        os.close(fd)
    return True


def main():
    m = AnsibleModule(argument_spec=dict(path=dict(type="path", required=True),
                                         state=dict(type="str", choices=["present", "absent"], default="present"),
                                         token=dict(type="str", required=True, no_log=False),
                                         owner=dict(type="dict", default={}),
                                         force=dict(type="bool", default=False),
                                         take_over=dict(type="dict"),
                                         audit=dict(type="dict")),
                      supports_check_mode=True)
    p = m.params
    path = p["path"]
    holder = read(path)
    took_over = None
    if p["state"] == "present" and p["take_over"] and holder is not None and holder.get("token") != p["token"]:
        # Under a lock on the host (flock on the directory that holds the lock: no file is left behind): re-read
        # the holder and replace it only if it is still the one judged stale; of two controllers taking over at
        # once, exactly one wins, and a holder that changed in the meantime (a third run took it) is never taken
        # over.
        guard = None
        if not m.check_mode:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            guard = os.open(os.path.dirname(path) or ".", os.O_RDONLY | os.O_DIRECTORY)
            fcntl.flock(guard, fcntl.LOCK_EX)
            holder = read(path)
        try:
            if holder is None or str(holder.get("since")) != str(p["take_over"].get("since")):
                m.fail_json(msg="the lock changed hands while deciding it was stale; not taken over",
                            holder=holder or {}, locked=True, expired=False)
            if not m.check_mode:
                aside = "%s.stale-%s" % (path, p["token"])
                try:
                    os.rename(path, aside)
                except OSError:
                    m.fail_json(msg="host is locked by a concurrent run (lost the race)", holder=read(path) or {},
                                locked=True, expired=False)
                shutil.rmtree(aside, ignore_errors=True)
        finally:
            if guard is not None:
                os.close(guard)
        took_over, holder = holder, None
    if p["state"] == "present":
        if (holder is not None or os.path.isdir(path)) and not (took_over and m.check_mode):
            holder = holder or {"token": "?", "note": "lock directory without a holder record"}
            if holder.get("token") == p["token"]:
                m.exit_json(changed=False, holder=holder)
            age = time.time() - float(holder.get("since", time.time()))
            ttl = float(holder.get("ttl_seconds") or 0)
            m.fail_json(msg="host is locked by %s@%s (pid %s, `%s`) since %s (%.0f s ago)"
                        % (holder.get("user", "?"), holder.get("controller", "?"), holder.get("pid", "?"),
                           holder.get("command", "?"), holder.get("since_iso", "?"), age),
                        holder=holder, locked=True, expired=bool(ttl) and age > ttl)
        rec = dict(p["owner"], token=p["token"], since=time.time(),
                   since_iso=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        if m.check_mode:
            m.exit_json(changed=True, holder=rec, took_over=took_over)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            os.mkdir(path, 0o700)  # atomic: exactly one concurrent run wins; root's alone (the holder's ids)
        except FileExistsError:
            m.fail_json(msg="host is locked by a concurrent run (lost the race)", holder=read(path) or {}, locked=True)
        write_atomic(os.path.join(path, "holder.json"), json.dumps(rec), 0o600)
        m.exit_json(changed=True, holder=rec, took_over=took_over)
    # absent
    audited = False
    if p["audit"] and not m.check_mode:
        audited = append_line(m, p["audit"])
    if not os.path.isdir(path):
        m.exit_json(changed=audited, holder=None)
    if holder is not None and holder.get("token") != p["token"] and not p["force"]:
        m.exit_json(changed=audited, holder=holder, msg="lock held by another run; left in place")
    if not m.check_mode:
        shutil.rmtree(path)
    m.exit_json(changed=True, holder=holder)


if __name__ == "__main__":
    main()
