#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import annotations

DOCUMENTATION = r"""
---
module: deployer_state
short_description: Read everything the deployer keeps on a host, in one round trip
description:
  - Returns the releases (newest first), which one is C(current) and C(previous), the deploy lock's holder,
    the live release's manifest and the checksum of the unit systemd runs now.
  - With I(target), also one release (empty string = C(previous)) and the files it still needs
    (venv and drafter completion markers); with I(want_secrets), that release's API key, read back from
    its environment file by the same code that writes it (module_utils C(envfile)).
  - Only reads.
options:
  root:
    description: The deploy root (C(deployer_root)).
    type: path
    required: true
  service:
    description: The systemd unit name of the server.
    type: str
    required: true
  target:
    description: A release id to describe as C(target); an empty string means C(previous).
    type: str
  want_secrets:
    description: Also return the target release's API key (use C(no_log) on the task).
    type: bool
    default: false
  secrets:
    description:
      - With I(probe), the live secret files as the deploy would write them (file name in C(root/secrets) ->
        content); compared on the host, returned only as C(probe.secrets_current), never logged.
    type: dict
  probe:
    description:
      - Also return what a no-op deploy must check (returned as C(probe)), for this venv, drafter directory
        and port (keys C(venv), C(drafter_dir), C(port), C(host) - the address to ask; C(patchable) false says
        the engine is never patched, its venv is C(native) without a look); key C(files), a list
        of paths, adds their sha256 (C(files_sha256), null for a missing file); with key C(live) true also the server's
        C(metrics) text and C(gpu_memory_used_mib).
    type: dict
  status_crash_loop_restarts:
    description:
      - Also return C(status), what C(deployer status) and C(deployer releases) show, assembled on the host
        (module_utils/host_probe.py status_view); the unit counts as crash-looping at this many restarts.
    type: int
attributes:
  check_mode:
    support: full
    description: Only reads; runs the same in check mode.
  diff_mode:
    support: none
    description: Returns no diff.
author:
  - deployer maintainers (@deployer)
"""

EXAMPLES = r"""
- name: Read the host's releases, links, lock and live release
  deployer_state:
    root: /opt/deployer
    service: deployer-engine
  register: host

- name: Read the rollback target (the previous release) with its API key
  deployer_state:
    root: /opt/deployer
    service: deployer-engine
    target: ""
    want_secrets: true
  register: host
  no_log: true
"""

RETURN = r"""
releases:
  description: Release summaries, newest first.
  returned: always
  type: list
  elements: dict
current:
  description: Id of the live release, or null.
  returned: always
  type: str
previous:
  description: Id of the release before it (the rollback target), or null.
  returned: always
  type: str
lock:
  description: The deploy lock's holder (user, controller, pid, command, since), or null.
  returned: always
  type: dict
live:
  description: The live release's manifest, or null.
  returned: always
  type: dict
unit_sha256:
  description: sha256 of the unit file systemd runs now, or null.
  returned: always
  type: str
target:
  description: The release asked for with I(target) (id, found, dir, manifest, missing, api_key).
  returned: when target is given
  type: dict
probe:
  description:
    - venv (path, installed, state, fingerprint, patches, error), drafter_complete, live_env_sha256,
      live_unit_sha256, nvidia_devices, unit (ActiveState, SubState, NeedDaemonReload, NRestarts, MainPID),
      health (HTTP status of /health, or null); metrics, gpu_memory_used_mib and last_fatal (kind, line,
      runs_ago, at; the newest root cause in the unit's journal, or null) with live.
  returned: when probe is given
  type: dict
status:
  description:
    - releases, current, previous, lock; with a live probe unit (ActiveState, ActiveEnterTimestamp, NRestarts,
      MainPID), health, last_fatal, crash_loop, spec (EAGLE-3 counters and rates from /metrics) and
      gpu_memory_used_mib (else null, false and []); crash_loop_restarts.
  returned: when status_crash_loop_restarts is given
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.host_probe import probe, probe_host_of, status_view
from ansible.module_utils.releases import host_state, secrets_current


def main():
    m = AnsibleModule(argument_spec=dict(root=dict(type="path", required=True),
                                         service=dict(type="str", required=True),
                                         target=dict(type="str"),
                                         secrets=dict(type="dict", no_log=True),
                                         want_secrets=dict(type="bool", default=False),
                                         probe=dict(type="dict"),
                                         status_crash_loop_restarts=dict(type="int")),
                      supports_check_mode=True)
    p = m.params
    out = host_state(p["root"], p["service"], p["target"], p["want_secrets"])
    if p["probe"] is not None:
        q = p["probe"]
        live = bool(q.get("live"))
        # status asks the live release's own port; the no-op check the planned one
        port = ((out.get("live") or {}).get("port") if live else None) or q.get("port")
        # ... and the address it binds (a server bound to one address answers there only)
        host = probe_host_of((out.get("live") or {}).get("argv")) if live and out.get("live") else \
            (q.get("host") or "127.0.0.1")
        out["probe"] = probe(p["root"], p["service"], q.get("venv"), q.get("drafter_dir"), port, live,
                             [f for f in q.get("files") or [] if f], host, q.get("patchable", True) is not False)
        if p["secrets"] is not None:
            out["probe"]["secrets_current"] = secrets_current(p["root"], p["secrets"])
    if p["status_crash_loop_restarts"] is not None:
        out["status"] = status_view(out, p["status_crash_loop_restarts"])
    m.exit_json(changed=False, **out)


if __name__ == "__main__":
    main()
