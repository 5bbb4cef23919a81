#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import annotations

DOCUMENTATION = r"""
---
module: engine_watch
short_description: Follow a vLLM server through its model load, one short look at a time
description:
  - Reads the unit's journal since its last start, folds the lines into a load phase
    (weights, drafter, torch.compile, KV cache, CUDA graphs, API, ready), and checks the process
    and C(/health).
  - Stateless; call it in an C(until) loop. It returns within I(poll_seconds) or as soon as the
    server is ready, has died, or logged a fatal error, so a crash is seen within seconds.
  - Never changes anything.
options:
  host:
    description: The address the server is asked on (the plan's C(probe_host)); loopback when it binds all.
    type: str
    default: 127.0.0.1
  service:
    description: systemd unit name.
    type: str
    required: true
  port:
    description: Port the server listens on (local to the host).
    type: int
    required: true
  poll_seconds:
    description: Longest time one call waits before reporting.
    type: float
    default: 2.0
  stall_seconds:
    description: Per-phase stall limits (phase -> seconds without progress); C(default) applies to phases not listed.
    type: dict
    default: {}
  budget_seconds:
    description: Overall load budget since the unit's start; past it the state is C(timeout).
    type: int
    default: 1800
  previous_phase_seconds:
    description: Per-phase durations recorded by the previous successful release; used for an ETA.
    type: dict
    default: {}
  engine:
    description:
      - Whose log lines to read, a key of C(RULESETS) in module_utils/engine_logs.py (the engine's C(log_rules),
        today C(vllm) or C(sglang)); the phases and fatal lines differ.  Another value fails before anything is read.
    type: str
    default: vllm
  eager:
    description:
      - The engine was launched with C(--enforce-eager) (vLLM's config then turns compilation and CUDA graphs off).
        After the model is loaded the profile run that sizes the KV cache follows, not torch.compile, and no CUDA
        graph is captured after it, so neither phase is entered on the lines that otherwise start them.
    type: bool
    default: false
  health_timeout_seconds:
    description:
      - How long one GET /health may take before it counts as unanswered (still loading).  SGLang's runs a
        one-token generation once started (at least 1 s, up to 20 s); vLLM's answers at once.
    type: float
    default: 2.0
  stall_floor_factor:
    description:
      - When above 0, a phase's stall limit is at least this many times that phase's duration in
        I(previous_phase_seconds) plus 30 s.  Used when a release that served before is restored, so that
        limits tightened with C(-e) for a new release cannot fail the restore of a known-good one.
    type: float
    default: 0
  root_cause:
    description:
      - Also name the failure this run of the server ended in, from every line since its start, those logged after
        it was ready included (a server that passed /health and died at its first request), in C(root_cause).
    type: bool
    default: false
  max_bytes_per_poll:
    description:
      - The most journal bytes one look reads (C(journalctl -o json) output).  Each line of a start is read once;
        where the last look stopped is kept (its journal cursor and what its lines said, root's, in
        C(/run/deployer-watch)), so a flood of lines costs each look at most this much, and the watch catches up
        over the next looks.
    type: int
    default: 8388608
  attached:
    description:
      - This watch did not start the load (C(deployer watch) following a load someone else started). It leaves
        the record that the starting deploy's watch keeps for the host's state keeper (its budget and stall limits
        for this start) as it is, and writes one only when there is none.
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
- name: Wait until vLLM has loaded and answers /health.
  engine_watch:
    service: deployer-engine
    port: 8000
  register: watch
  until: watch.state != 'loading'
  retries: 1000
  delay: 0
"""

RETURN = r"""
state:
  description: loading, ready, crashed, fatal, stalled or timeout.
  returned: always
  type: str
phase:
  description: Current load phase.
  returned: always
  type: str
percent:
  description: Progress within the phase, when the log shows one.
  returned: always
  type: float
elapsed_seconds:
  description: Seconds since the unit (re)started.
  returned: always
  type: float
ready_at:
  description: The host's clock (epoch seconds) when /health first answered 200 (the end of the downtime).
  returned: when state is ready
  type: float
phase_seconds:
  description: Seconds spent in each phase so far.
  returned: always
  type: dict
reason:
  description: Why the state is not loading/ready, in words.
  returned: always
  type: str
eta_seconds:
  description: Seconds until ready, from the previous release's phase durations (null without them).
  returned: always
  type: float
overdue_seconds:
  description: How far the current phase runs past its duration in the previous release (0 when not).
  returned: always
  type: float
tail:
  description: Last log lines (on failure).
  returned: always
  type: list
root_cause:
  description: The failure the server's run ended in (kind, line, advice), or null when its lines name none.
  returned: when I(root_cause) is true
  type: dict
journal:
  description:
    - What this call read of the journal and cost (bytes, lines, whether it stopped at I(max_bytes_per_poll), its
      CPU seconds and peak resident memory in KiB).
  returned: always
  type: dict
"""

import resource
import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.engine_logs import eta_seconds, overdue_seconds
from ansible.module_utils.host_io import http_get, systemd_show
from ansible.module_utils.journal_follow import load_follow, load_watch, read_journal, save_follow, save_watch
from ansible.module_utils.load_rules import RULESETS
from ansible.module_utils.root_causes import advice

# systemd's own exit statuses (systemd.exec(5) "Process Exit Codes"): the process never ran vLLM's code,
# systemd failed to set it up - a missing user, a ReadWritePaths directory that does not exist, ...
SYSTEMD_EXIT = {"200": "CHDIR", "203": "EXEC", "204": "MEMORY", "206": "OOM_ADJUST", "209": "STDOUT",
                "210": "CHROOT", "214": "SETSCHEDULER", "216": "GROUP", "217": "USER", "218": "CAPABILITIES",
                "219": "CGROUP", "220": "SETSID", "226": "NAMESPACE", "228": "SECCOMP", "233": "RUNTIME_DIRECTORY",
                "236": "SMACK_PROCESS_LABEL", "243": "CREDENTIALS"}
# Setup failures that say nothing about the release: systemd could not create the unit's cgroup (seen right after
# the previous server's cgroup was torn down).  The unit's Restart=always retries it after RestartSec; the
# watch waits for that instead of rolling back a release that never ran, at most this many times.
TRANSIENT_SETUP = ("219",)
TRANSIENT_SETUP_RETRIES = 2
GENERIC_FATAL_GRACE_SECONDS = 3.0


def unit_props(module, service):
    return systemd_show(service, ["ActiveState", "SubState", "MainPID", "ActiveEnterTimestampMonotonic",
                                  "InvocationID", "ExecMainStatus", "NRestarts"], module.run_command)


def _advice(fatal):
    """What to change for this root cause (root_causes.advice), as a clause of the reason; "" when none."""
    text = advice(fatal["kind"], fatal["line"]) if fatal else ""
    return " (%s)" % text if text else ""


def health(port, host="127.0.0.1", timeout=2.0):
    """/health's status; None: nothing listens yet (vLLM does not until ready); 0: no answer within ``timeout``."""
    return http_get(port, "/health", host, connect_timeout=timeout, read_timeout=timeout, limit=65536)[0]


# journald takes in a dying process's last lines a moment after it is gone: read them before naming the phase
DEAD_JOURNAL_SETTLE_SECONDS = 1.0


def look(module, p, follows):
    """One look: the unit, this start's new journal lines (``follows``: {invocation: Follow}, what was read before),
    /health."""
    props = unit_props(module, p["service"])
    started = int(props.get("ActiveEnterTimestampMonotonic") or 0) / 1e6
    if props.get("ActiveState") not in ("active", "activating", "reloading") or props.get("MainPID") in ("0", None):
        time.sleep(DEAD_JOURNAL_SETTLE_SECONDS)
    inv = props.get("InvocationID") or ""
    if inv not in follows:
        follows.clear()
        follows[inv] = load_follow(p["service"], inv, p.get("engine") or "vllm", p.get("eager", False))
    follow = follows[inv]
    entries, follow.cursor, more, nbytes = read_journal(module.run_command, p["service"], inv, follow.cursor,
                                                        p["max_bytes_per_poll"])
    for t, msg in entries:
        follow.feed(t, msg)
    follow.read = {"bytes": follow.read["bytes"] + nbytes, "lines": follow.read["lines"] + len(entries),
                   "more": more}
    st = follow.state
    now = time.clock_gettime(time.CLOCK_MONOTONIC)
    snap = st.snapshot(now)
    elapsed = now - started if started else 0.0
    tail = list(follow.tail)
    res = dict(phase=snap["phase"], phase_title=snap["phase_title"], percent=snap["percent"],
               progress=snap["progress"], phase_seconds=snap["phase_seconds"], facts=snap["facts"],
               warnings=snap["warnings"], elapsed_seconds=round(elapsed, 1), pid=props.get("MainPID"),
               active_state=props.get("ActiveState"), tail=[], reason="", fatal=snap["fatal"],
               eta_seconds=eta_seconds(snap["phase"], snap["phase_seconds"].get(snap["phase"], 0.0),
                                       p.get("previous_phase_seconds") or {}),
               overdue_seconds=overdue_seconds(snap["phase"], snap["phase_seconds"].get(snap["phase"], 0.0),
                                               p.get("previous_phase_seconds") or {}))
    if p.get("root_cause"):
        cause = follow.cause.result()
        res["root_cause"] = dict(kind=cause[0], line=cause[1], advice=advice(cause[0], cause[1])) if cause else None
    active = props.get("ActiveState")
    if (props.get("SubState") == "auto-restart" and props.get("ExecMainStatus") in TRANSIENT_SETUP
            and int(props.get("NRestarts") or 0) < TRANSIENT_SETUP_RETRIES):
        res.update(state="loading", health=None,
                   note="systemd could not set the process up (exit status %s, %s): its own restart follows"
                   % (props["ExecMainStatus"], SYSTEMD_EXIT[props["ExecMainStatus"]]))
        return res
    if active not in ("active", "activating", "reloading") or props.get("MainPID") in ("0", None):
        res.update(state="crashed", tail=tail,
                   reason="the server process exited (unit %s/%s, exit status %s%s) during phase '%s'"
                   % (active, props.get("SubState"), props.get("ExecMainStatus"),
                      (": systemd could not set the process up (%s)" % SYSTEMD_EXIT[props.get("ExecMainStatus")])
                      if props.get("ExecMainStatus") in SYSTEMD_EXIT else "", snap["phase_title"])
                   + ("; cause: %s" % snap["fatal"]["line"] if snap["fatal"] else "")
                   + _advice(snap["fatal"]))
        return res
    fatal = snap["fatal"]
    if fatal and fatal.get("generic") and (fatal.get("seconds_ago") or 0) < GENERIC_FATAL_GRACE_SECONDS:
        fatal = None  # "EngineCore failed to start." comes first; give the root-cause line a moment to follow
    if fatal:
        res.update(state="fatal", tail=tail,
                   reason="fatal %s in phase '%s': %s" % (snap["fatal"]["kind"], snap["phase_title"],
                                                           snap["fatal"]["line"]) + _advice(snap["fatal"]))
        return res
    code = health(p["port"], p["host"], p["health_timeout_seconds"])
    if code == 200 and snap["phase"] in ("api", "ready"):
        res.update(state="ready", phase="ready", phase_title="ready", ready_at=round(time.time(), 3))
        return res
    limits = p["stall_seconds"] or {}
    limit = float(limits.get(snap["phase"], limits.get("default", 0)) or 0)
    prev = float((p.get("previous_phase_seconds") or {}).get(snap["phase"]) or 0)
    if limit and p.get("stall_floor_factor") and prev:
        limit = max(limit, p["stall_floor_factor"] * prev + 30)
    since = snap["seconds_since_progress"] if snap["seconds_since_progress"] is not None else elapsed
    if limit and since > limit:
        res.update(state="stalled", tail=tail,
                   reason="no progress for %.0f s in phase '%s' (stall limit %.0f s)"
                   % (since, snap["phase_title"], limit))
        return res
    if elapsed > p["budget_seconds"]:
        res.update(state="timeout", tail=tail,
                   reason="not ready after %.0f s (budget %d s), last phase '%s'"
                   % (elapsed, p["budget_seconds"], snap["phase_title"]))
        return res
    res.update(state="loading", health=code)
    return res


def keep(p, follows):
    """Keep, for the next call and the host's state keeper, where each start's journal was read to and what the
    load is judged by (an attached watch leaves the starting deploy's record for that start alone); returns what
    the last look read."""
    read = {}
    for inv, follow in follows.items():
        read = dict(follow.read)
        save_follow(p["service"], inv, follow)
        if p["attached"] and load_watch(p["service"]).get("invocation") == inv:
            continue            # the starting deploy's record for this start stays what the keeper judges by
        save_watch(p["service"], dict(invocation=inv, budget_seconds=p["budget_seconds"],
                                      stall_seconds=p["stall_seconds"], stall_floor_factor=p["stall_floor_factor"],
                                      previous_phase_seconds=p["previous_phase_seconds"], at=time.time()))
    return read


def main():
    module = AnsibleModule(
        argument_spec=dict(
            service=dict(type="str", required=True),
            port=dict(type="int", required=True),
            host=dict(type="str", default="127.0.0.1"),
            poll_seconds=dict(type="float", default=2.0),
            stall_seconds=dict(type="dict", default={}),
            budget_seconds=dict(type="int", default=1800),
            previous_phase_seconds=dict(type="dict", default={}),
            stall_floor_factor=dict(type="float", default=0.0),
            engine=dict(type="str", default="vllm"),
            eager=dict(type="bool", default=False),
            health_timeout_seconds=dict(type="float", default=2.0),
            root_cause=dict(type="bool", default=False),
            max_bytes_per_poll=dict(type="int", default=8388608),
            attached=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    if module.params["engine"] not in RULESETS:
        module.fail_json(msg="engine: got %r, expected one of %s (module_utils/engine_logs.py RULESETS)"
                         % (module.params["engine"], ", ".join(sorted(RULESETS))))
    p = module.params
    if p["max_bytes_per_poll"] < 65536:
        module.fail_json(msg="max_bytes_per_poll: got %d, expected at least 65536 (one journal entry must fit)"
                         % p["max_bytes_per_poll"])
    deadline = time.time() + p["poll_seconds"]
    follows = {}
    first = look(module, p, follows)
    res = first
    # wait inside the call until something changes (phase, percent, state) or poll_seconds pass; a look that
    # stopped at its byte limit goes on reading at the next one
    while res["state"] == "loading" and time.time() < deadline:
        time.sleep(0.25)
        res = look(module, p, follows)
        if res["state"] != "loading" or (res["phase"], res["percent"]) != (first["phase"], first["percent"]):
            break
    read = keep(p, follows)
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    res["journal"] = dict(read, cpu_seconds=round(me.ru_utime + me.ru_stime + kids.ru_utime
                                                                   + kids.ru_stime, 3),
                          max_rss_kib=me.ru_maxrss)
    module.exit_json(changed=False, **res)


if __name__ == "__main__":
    main()
