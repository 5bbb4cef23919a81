#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import annotations

DOCUMENTATION = r"""
---
module: balancer_server
short_description: Take an inference host out of HAProxy (drain, wait for its requests) or put it back
description:
  - Talks to HAProxy's runtime API on its stats socket (C(level admin)); run on the balancer host.
  - C(state=drain) stops new requests to the server and waits until its in-flight requests are done
    (bounded by I(wait_idle_seconds)); it refuses when no other server would be left serving, unless the
    server itself serves nothing now.
  - C(state=ready) puts the server back; C(state=maint) takes it out without waiting.
  - C(state=query) only reads the backend's servers.
options:
  socket:
    description: HAProxy's stats socket.
    type: path
    default: /run/haproxy/admin.sock
  backend:
    description: The backend holding the inference servers.
    type: str
    required: true
  server:
    description: The server name (the inventory host name); not needed for C(query).
    type: str
    default: ""
  state:
    description: What the server should be.
    type: str
    choices: [ready, drain, maint, query]
    default: query
  wait_idle_seconds:
    description: With C(drain), how long to wait for the server's in-flight requests to finish.
    type: int
    default: 300
  wait_up_seconds:
    description:
      - With C(ready), how long to wait for HAProxy's own health checks to find the server up (C(rise) checks,
        C(inter) apart), so that a roll drains the next host only once this one serves through the balancer.
        Past it the module returns with the state HAProxy reports (C(after)); it does not fail.
    type: int
    default: 30
  also_leaving:
    description: With C(drain), other servers leaving in the same batch (they do not count as serving).
    type: list
    elements: str
    default: []
  only_from:
    description:
      - Act only when the server's administrative state now (what C(set server ... state) set - C(ready),
        C(drain) or C(maint) - whatever its health checks say) is one of these; in any other it is left as it is
        (C(changed) false).  Empty, the default, acts from any state.
      - A deploy with nothing to do puts back with C([drain]) a server a run left drained (a rollback that failed
        too, a run that died), never one an operator put in C(maint).
    type: list
    elements: str
    choices: [ready, drain, maint]
    default: []
attributes:
  check_mode:
    support: full
    description: Reports the state it would set and changes nothing.
  diff_mode:
    support: full
    description: Shows the server's state before and after.
author:
  - deployer maintainers (@deployer)
"""

EXAMPLES = r"""
- name: Drain this host in HAProxy before its restart.
  balancer_server:
    backend: llm
    server: gpu-01
    state: drain
    wait_idle_seconds: 600
  delegate_to: "{{ groups['balancer'] | first }}"
"""

RETURN = r"""
servers:
  description: The backend's servers after the change, by name (state ready/drain/maint/down, status, scur, admin
    ready/drain/maint).
  returned: always
  type: dict
before:
  description: The server's state before (ready, drain, maint, down), or null for C(query).
  returned: always
  type: str
after:
  description: The server's state after.
  returned: always
  type: str
waited_seconds:
  description: Seconds spent waiting for in-flight requests to finish (C(drain)), or for the server to be up (C(ready)).
  returned: always
  type: float
in_flight_left:
  description: Requests still in flight when the wait ended (0 unless I(wait_idle_seconds) ran out).
  returned: always
  type: int
"""

import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.haproxy_runtime import RuntimeError_, others_ready, servers, set_state, state_word


def view(rows):
    return {n: dict(r, state=state_word(r["status"])) for n, r in rows.items()}


def main():
    module = AnsibleModule(
        argument_spec=dict(socket=dict(type="path", default="/run/haproxy/admin.sock"),
                           backend=dict(type="str", required=True),
                           server=dict(type="str", default=""),
                           state=dict(type="str", choices=["ready", "drain", "maint", "query"], default="query"),
                           wait_idle_seconds=dict(type="int", default=300),
                           wait_up_seconds=dict(type="int", default=30),
                           also_leaving=dict(type="list", elements="str", default=[]),
                           only_from=dict(type="list", elements="str", default=[],
                                          choices=["ready", "drain", "maint"])),
        supports_check_mode=True,
    )
    p = module.params
    try:
        rows = servers(p["socket"], p["backend"])
        if p["state"] == "query":
            module.exit_json(changed=False, servers=view(rows), before=None, after=None, waited_seconds=0.0,
                             in_flight_left=0)
        if p["server"] not in rows:
            module.fail_json(msg="balancer: server %r not in backend %r (servers: %s)"
                             % (p["server"], p["backend"], ", ".join(sorted(rows)) or "none"))
        before = state_word(rows[p["server"]]["status"])
        want = p["state"]
        if want == "drain" and before == "ready" and others_ready(rows, p["server"], p["also_leaving"]) == 0:
            module.fail_json(msg="balancer: draining %s would leave no server ready in backend %s (measured: %s); "
                             "expected at least one other ready server "
                             "(roll with --serial smaller than the serving hosts)" % (
                                 p["server"], p["backend"],
                                 ", ".join("%s %s" % (n, state_word(r["status"])) for n, r in sorted(rows.items()))),
                             servers=view(rows))
        if p["only_from"] and rows[p["server"]]["admin"] not in p["only_from"]:
            module.exit_json(changed=False, servers=view(rows), before=before, after=before, waited_seconds=0.0,
                             in_flight_left=rows[p["server"]]["scur"])
        changed = before != want
        diff = {"before": "%s: %s\n" % (p["server"], before), "after": "%s: %s\n" % (p["server"], want)}
        if module.check_mode:
            module.exit_json(changed=changed, servers=view(rows), before=before, after=want, waited_seconds=0.0,
                             in_flight_left=rows[p["server"]]["scur"], diff=diff)
        set_state(p["socket"], p["backend"], p["server"], want)   # idempotent in HAProxy
        t0, left = time.time(), 0
        if want == "drain":
            while True:
                rows = servers(p["socket"], p["backend"])
                left = rows[p["server"]]["scur"]
                if left == 0 or time.time() - t0 >= p["wait_idle_seconds"]:
                    break
                time.sleep(0.5)
        if want == "ready":   # admin state ready; serving once HAProxy's checks say UP (a restart's restore)
            while (state_word(servers(p["socket"], p["backend"])[p["server"]]["status"]) != "ready"
                   and time.time() - t0 < p["wait_up_seconds"]):
                time.sleep(0.5)
        rows = servers(p["socket"], p["backend"])
    except RuntimeError_ as e:
        module.fail_json(msg=str(e))
    module.exit_json(changed=changed, servers=view(rows), before=before, after=state_word(rows[p["server"]]["status"]),
                     waited_seconds=round(time.time() - t0, 2), in_flight_left=left, diff=diff)


if __name__ == "__main__":
    main()
