#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import annotations

DOCUMENTATION = r"""
---
module: release_start
short_description: Install a release's unit and (re)start the server only when needed, in one round trip
description:
  - Copies the release's unit file to I(unit_path) when it differs (atomic rename) and reloads systemd.
  - Restarts the server when the unit changed or the server is down (crash-looping in C(auto-restart), or
    C(failed)); starts it when it is merely stopped; enables it.  Otherwise changes nothing.
  - After a (re)start zeroes systemd's count of automatic restarts (C(systemctl reset-failed)), so a crash loop
    is counted from this start on, also when the old server was restarted out of C(auto-restart).
  - Just before a restart asks the old server's C(/health) on I(port) one last time and returns when
    (C(old_server)), so the downtime is measured from the old server's last answer.
  - With I(dropin), installs the unit drop-in that hands the live secrets to whatever release runs; with
    I(secrets), writes the live secret files (0600, root's, in I(secrets_dir), 0700). A changed drop-in or
    secret restarts the server (it reads them at start). Without I(secrets) (a rollback) the live secrets are
    left as they are (an empty environment file is made if there is none, so the drop-in can be read).
options:
  dropin_path:
    description: The drop-in's path (C(/etc/systemd/system/<service>.service.d/deployer-secrets.conf)).
    type: path
  dropin:
    description: The drop-in's content (no secrets in it, only the path of the live secrets file).
    type: str
  secrets_dir:
    description: Root's directory of the live secrets (made 0700 if missing).
    type: path
  secrets_env_file:
    description: The name, in I(secrets_dir), of the environment file the drop-in names.
    type: str
    default: server.env
  secrets:
    description: File name in I(secrets_dir) -> content; never logged, never shown in a diff.
    type: dict
  unit_src:
    description:
      - The release's unit file.  A release rendered under another unit name holds it as C(<that name>.service);
        when I(unit_src) is not there, the one C(*.service) beside it is used (its text does not name the unit).
    type: path
    required: true
  unit_path:
    description: Where systemd reads the unit (C(/etc/systemd/system/<service>.service)).
    type: path
    required: true
  service:
    description: The unit name.
    type: str
    required: true
  host:
    description: The address the server is asked on (the plan's C(probe_host)); loopback when it binds all.
    type: str
    default: 127.0.0.1
  port:
    description: The port the old server answers C(/health) on.
    type: int
    required: true
  keeper:
    description:
      - The host's state keeper's unit name (C(deployer-state)), when the plan keeps the host's state.  Its unit file
        is written by the render stage; when systemd has not loaded it as written (new, or changed), it is reloaded
        and the keeper (re)started, also when the server itself is not restarted (a keeper update reaches a live
        release); a keeper that is not running is started.
    type: str
  deploy_root:
    description:
      - The deploy root.  With it, every other unit of this root still installed (host_io.deployer_units; a unit
        renamed by the operator, or by the default - deployer-vllm became deployer-engine) is stopped, disabled
        and removed with its secrets drop-in before I(service) starts, so that two servers never hold the GPUs and
        the port at once; the old server's C(/health) is then what I(old_server) reports.
    type: path
attributes:
  check_mode:
    support: full
    description: Says whether the unit would change and the server restart; changes nothing.
  diff_mode:
    support: full
    description: The unit file before and after.
author:
  - deployer maintainers (@deployer)
"""

EXAMPLES = r"""
- name: Start the release.
  release_start:
    unit_src: /opt/deployer/releases/0123456789ab/deployer-engine.service
    unit_path: /etc/systemd/system/deployer-engine.service
    service: deployer-engine
    port: 8000
"""

RETURN = r"""
restarted:
  description: The server was (re)started into this unit.
  returned: always
  type: bool
retired:
  description: The other units of I(deploy_root) stopped and removed before the start.
  returned: always
  type: list
  elements: str
unit_changed:
  description: The unit file differed and was replaced.
  returned: always
  type: bool
dropin_changed:
  description: The secrets drop-in differed and was replaced.
  returned: always
  type: bool
secrets_changed:
  description: A live secret file differed and was replaced (its content is never returned).
  returned: always
  type: bool
old_server:
  description: Whether the old server answered /health just before the restart (ok) and when (at, epoch seconds
    on the host); null without a restart.
  returned: always
  type: dict
"""

import os
import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.host_io import UNIT_DIR, deployer_units, systemd_show, write_atomic
from ansible.module_utils.host_probe import http_health


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def secrets_to_write(m, p):
    """{path: content} of the live secret files that differ (or are missing), after making the directory."""
    d = p["secrets_dir"]
    if not d:
        return {}
    st = os.lstat(d) if os.path.lexists(d) else None
    if st is not None and (not os.path.isdir(d) or os.path.islink(d) or st.st_uid != 0):
        m.fail_json(msg="%s: expected root's directory for the live secrets; not touched" % d)
    want = dict(p["secrets"] or {})
    if p["secrets"] is None:   # a rollback: keep the live secrets; only make sure the drop-in's file exists
        env = os.path.join(d, p["secrets_env_file"])
        return {} if os.path.exists(env) else {env: "# no live secrets yet (written by deployer up)\n"}
    out = {}
    for name, content in sorted(want.items()):
        if "/" in name or name in ("", ".", ".."):
            m.fail_json(msg="secrets: expected plain file names, got %r" % name)
        path = os.path.join(d, name)
        if read(path) != content:
            out[path] = content
    return out


def unit_source(path):
    """The release's unit: ``path``, else the one ``*.service`` beside it (a release rendered under another unit
    name: a rollback across a rename installs its unit under today's name; its text does not name the unit)."""
    if os.path.isfile(path):
        return path
    d = os.path.dirname(path)
    try:
        found = [n for n in os.listdir(d) if n.endswith(".service") and os.path.isfile(os.path.join(d, n))]
    except OSError:
        found = []
    return os.path.join(d, found[0]) if len(found) == 1 else path


def retire_units(m, names):
    """Stop, disable and remove each unit in ``names`` (and its secrets drop-in): the server it ran is gone."""
    for name in names:
        m.run_command(["systemctl", "stop", name], check_rc=True)
        m.run_command(["systemctl", "disable", name])          # not enabled: nothing to undo
        dropin = os.path.join(UNIT_DIR, name + ".service.d")
        for path in (os.path.join(UNIT_DIR, name + ".service"), os.path.join(dropin, "deployer-secrets.conf"),
                     os.path.join(dropin, "deployer-gpu-gate.conf")):
            if os.path.lexists(path):
                os.unlink(path)
        if os.path.isdir(dropin) and not os.listdir(dropin):
            os.rmdir(dropin)
    m.run_command(["systemctl", "daemon-reload"], check_rc=True)
    for name in names:
        m.run_command(["systemctl", "reset-failed", name])     # forget its failed state, if any


def main():
    m = AnsibleModule(argument_spec=dict(unit_src=dict(type="path", required=True),
                                         unit_path=dict(type="path", required=True),
                                         service=dict(type="str", required=True),
                                         port=dict(type="int", required=True),
                                         host=dict(type="str", default="127.0.0.1"),
                                         dropin_path=dict(type="path"),
                                         dropin=dict(type="str"),
                                         secrets_dir=dict(type="path"),
                                         secrets_env_file=dict(type="str", default="server.env"),
                                         secrets=dict(type="dict", no_log=True),
                                         deploy_root=dict(type="path"), keeper=dict(type="str")),
                      supports_check_mode=True)
    p = m.params
    retire = [n for n in deployer_units(p["deploy_root"]) if n != p["service"]] if p["deploy_root"] else []
    new, old = read(unit_source(p["unit_src"])), read(p["unit_path"])
    if new is None:
        m.fail_json(msg="release unit %s not found" % p["unit_src"])
    unit_changed = new != old
    dropin_changed = bool(p["dropin_path"]) and read(p["dropin_path"]) != p["dropin"]
    new_secrets = secrets_to_write(m, p)
    secrets_changed = bool(new_secrets) and p["secrets"] is not None
    props = systemd_show(p["service"], ["ActiveState", "SubState", "UnitFileState", "NeedDaemonReload"],
                         m.run_command)
    down = props.get("SubState") == "auto-restart" or props.get("ActiveState") == "failed"
    running = props.get("ActiveState") in ("active", "activating", "reloading")
    restart = unit_changed or down or ((dropin_changed or secrets_changed) and running) or (bool(retire) and running)
    start = not restart and not running
    enable = props.get("UnitFileState") != "enabled"
    res = dict(changed=(unit_changed or restart or start or enable or dropin_changed or bool(new_secrets)
                        or bool(retire)),
               restarted=restart or start, retired=retire, unit_changed=unit_changed, dropin_changed=dropin_changed,
               secrets_changed=secrets_changed, old_server=None)
    if m._diff and unit_changed:
        res["diff"] = {"before": old or "", "after": new, "before_header": p["unit_path"],
                       "after_header": p["unit_src"]}
    if m.check_mode:
        m.exit_json(**res)
    if new_secrets:
        if not os.path.isdir(p["secrets_dir"]):
            os.mkdir(p["secrets_dir"], 0o700)
        os.chmod(p["secrets_dir"], 0o700)
        for path, content in new_secrets.items():
            write_atomic(path, content, 0o600)
    if dropin_changed:
        d = os.path.dirname(p["dropin_path"])
        if not os.path.isdir(d):
            os.mkdir(d, 0o755)
        write_atomic(p["dropin_path"], p["dropin"], 0o644)
    if unit_changed:
        write_atomic(p["unit_path"], new, 0o644)
    # NeedDaemonReload: a drop-in the render stage wrote (the GPU health gate's), which systemd reads at a reload
    if unit_changed or dropin_changed or props.get("NeedDaemonReload") == "yes":
        m.run_command(["systemctl", "daemon-reload"], check_rc=True)
    if retire:
        # the old name's server answers on the port: its health is the old server's, and it stops first
        code = http_health(p["port"], p["host"])
        res["old_server"] = {"ok": code == 200, "at": round(time.time(), 3)}
        retire_units(m, retire)
    if restart:
        code = http_health(p["port"], p["host"]) if running else None
        if not retire:
            res["old_server"] = {"ok": code == 200, "at": round(time.time(), 3)}
        m.run_command(["systemctl", "restart", p["service"]], check_rc=True)
    elif start:
        m.run_command(["systemctl", "start", p["service"]], check_rc=True)
    if restart or start:
        # A start on purpose begins a new count of systemd's automatic restarts (NRestarts, what `status`
        # calls a crash loop).  systemd does not zero it when the unit was restarted out of C(auto-restart)
        # (measured on systemd 252); reset-failed does.
        m.run_command(["systemctl", "reset-failed", p["service"]], check_rc=True)
    if enable:
        m.run_command(["systemctl", "enable", p["service"]], check_rc=True)
    if p["keeper"] and not m.check_mode and os.path.exists(os.path.join(UNIT_DIR, p["keeper"] + ".service")):
        kp = systemd_show(p["keeper"], ["LoadState", "NeedDaemonReload", "ActiveState"], m.run_command)
        stale = kp.get("LoadState") != "loaded" or kp.get("NeedDaemonReload") == "yes"
        if stale:
            m.run_command(["systemctl", "daemon-reload"], check_rc=True)
        if stale or kp.get("ActiveState") not in ("active", "activating"):
            m.run_command(["systemctl", "restart", p["keeper"]], check_rc=True)
            res["keeper_started"] = True
    m.exit_json(**res)


if __name__ == "__main__":
    main()
