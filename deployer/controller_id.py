"""Who holds a deploy lock, and whether that holder may still be alive (docs/security.md, "The lock").

A holder is a process on a controller: named by the controller's machine id, its boot id, the pid of the
long-lived process of the run (the ``deployer`` CLI, or ``ansible-playbook`` itself under plain Ansible: never a
short-lived worker) and that process's start time (clock ticks since boot), so that a reused pid is never taken
for the holder.  Two controllers with the same host name (cloud images, containers) have different machine ids,
and one controller never judges a pid of another's pid space.  Standard library only.
"""
from __future__ import annotations

import os


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def start_ticks(pid: int) -> str:
    """Field 22 of /proc/<pid>/stat (after the command name, which may hold blanks and parentheses): "" if gone."""
    stat = _read(f"/proc/{int(pid)}/stat")
    if not stat or ")" not in stat:
        return ""
    fields = stat.rsplit(")", 1)[1].split()
    return fields[19] if len(fields) > 19 else ""


def identity(pid: int | None = None) -> dict:
    """This controller and the run's process (``pid``; default: the caller's parent, the long-lived process when
    the caller is an Ansible worker)."""
    pid = int(pid or os.getppid())
    return {"machine_id": _read("/etc/machine-id"), "boot_id": _read("/proc/sys/kernel/random/boot_id"),
            "pid": pid, "pid_start": start_ticks(pid)}


def holder_state(holder: dict, me: dict | None = None) -> tuple[str, str]:
    """("alive" | "gone" | "unknown", why).  "gone" only when this controller can tell for certain: the holder
    ran here (same machine id) and either the machine rebooted since (boot id) or its process (pid AND start time)
    no longer exists.  Anything else, including a record without these fields, is "unknown": never taken over
    but by its time-to-live."""
    me = me or identity()
    if not holder.get("machine_id") or holder.get("machine_id") != me.get("machine_id"):
        return "unknown", "held from another controller (%s)" % (holder.get("controller") or "?")
    if holder.get("boot_id") and holder.get("boot_id") != me.get("boot_id"):
        return "gone", "this controller rebooted since it took the lock"
    try:
        pid = int(holder.get("pid") or 0)
    except (TypeError, ValueError):
        return "unknown", "its pid %r is not a number" % holder.get("pid")
    if pid <= 0:
        return "unknown", "no pid recorded"
    now = start_ticks(pid)
    if not now:
        return "gone", "its process %s is gone from this controller" % pid
    if holder.get("pid_start") and str(holder["pid_start"]) != now:
        return "gone", "its process %s is gone from this controller (the pid now names another process)" % pid
    return "alive", "held by a live deploy on this machine (pid %s)" % pid
