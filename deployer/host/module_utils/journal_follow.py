# -*- coding: utf-8 -*-
"""One start of the engine's unit as read from its journal, each line once: the journal cursor after the last line
read, the load state and root cause folded from every line up to it, its last lines; kept between readers' calls in
root's 0700 ``STATE_DIR`` (the watch module's looks, the host's state keeper).  Standard library only."""
from __future__ import annotations

import json
import os
import pickle
import re
import shlex
import stat

try:
    from ansible.module_utils.engine_logs import LoadState  # on the host
    from ansible.module_utils.host_io import write_atomic
    from ansible.module_utils.log_lines import LINE_CHARS, journal_entry
    from ansible.module_utils.root_causes import RootCause
except ImportError:
    from deployer.host.module_utils.engine_logs import LoadState  # on the controller (tests)
    from deployer.host.module_utils.host_io import write_atomic
    from deployer.host.module_utils.log_lines import LINE_CHARS, journal_entry
    from deployer.host.module_utils.root_causes import RootCause

TAIL = 40
# Where a look leaves off, between calls: root's, 0700, on tmpfs (gone at a reboot, as the unit's start is)
STATE_DIR = "/run/deployer-watch"
JOURNALCTL = "journalctl"


class Follow(object):
    """One start of the unit as read so far: the journal cursor after its last line read, the load state and the
    root cause folded from every line up to it, and its last lines."""
    FORMAT = 1      # what a kept Follow holds: a new field, or LoadState's, is a new format (an old one is not read)

    def __init__(self, engine, eager):
        self.format = self.FORMAT
        self.cursor = None
        self.state = LoadState(engine, eager=eager)
        self.cause = RootCause()
        self.tail = []
        self.read = {"bytes": 0, "lines": 0, "more": False}

    def feed(self, t, msg):
        self.state.feed(msg, t)
        self.cause.feed(msg)
        self.tail = (self.tail + [msg[:LINE_CHARS]])[-TAIL:]      # redacted by journal_entry; a hostile line capped


def _state_file(service, invocation):
    if not re.match(r"^[0-9a-f]{32}$", invocation or ""):
        return None
    return os.path.join(STATE_DIR, "%s-%s.pickle" % (service, invocation))


def _private_dir():
    """STATE_DIR when it is root's own 0700 directory (made so when missing), else None: nothing is kept."""
    try:
        os.mkdir(STATE_DIR, 0o700)
    except OSError:
        pass
    try:
        st = os.lstat(STATE_DIR)
    except OSError:
        return None
    ok = stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() == 0 and not st.st_mode & 0o077
    return STATE_DIR if ok else None


def load_follow(service, invocation, engine, eager):
    """Where the last look of this start left off (a fresh Follow for a new start, another engine or no state)."""
    path = _state_file(service, invocation)
    if path and _private_dir():
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as f:
                got = pickle.load(f)      # root's own file in root's 0700 directory
            if isinstance(got, Follow) and got.format == Follow.FORMAT and (got.state.engine, got.state.eager) == \
                    (engine, eager):
                got.read = {"bytes": 0, "lines": 0, "more": False}
                return got
        except Exception:   # none yet, or unreadable: read this start from its first line
            pass
    return Follow(engine, eager)


def save_follow(service, invocation, follow):
    path = _state_file(service, invocation)
    if not path or not _private_dir():
        return
    for name in os.listdir(STATE_DIR):      # earlier starts of this unit are done with
        if name.startswith(service + "-") and name != os.path.basename(path):
            try:
                os.unlink(os.path.join(STATE_DIR, name))
            except OSError:
                pass
    try:
        write_atomic(path, pickle.dumps(follow), 0o600)
    except Exception:   # not kept: the next call reads this start from its first line again (slower, still right)
        pass


def read_journal(run_command, service, invocation, cursor, max_bytes):
    """This start's lines after ``cursor``, at most ``max_bytes`` of journalctl's output: [(t, message)], the
    cursor after the last one, whether more are waiting, and the bytes read."""
    # only this start's lines: the invocation id changes with every (re)start of the unit
    match = ("_SYSTEMD_INVOCATION_ID=" + invocation) if invocation else ("_SYSTEMD_UNIT=" + service + ".service")
    # --all: journalctl prints fields over 4096 bytes as null without it, and a tqdm bar with all its
    # \r redraws is one such field (the 64-shard bar is ~10 KB)
    args = [JOURNALCTL, match, "-o", "json", "--all", "--no-pager"] + (["--after-cursor", cursor] if cursor else [])
    # head stops journalctl (SIGPIPE) one byte past the limit: that byte says more are waiting
    cmd = " ".join(shlex.quote(a) for a in args) + " | head -c %d" % (max_bytes + 1)
    _rc, out, _err = run_command(cmd, use_unsafe_shell=True, encoding=None)
    more = len(out) > max_bytes
    lines = out[:max_bytes].split(b"\n")
    if more:
        lines = lines[:-1]     # the line the limit cut: read again from its start by the next look
    entries = []
    for line in lines:
        e = journal_entry(line.decode("utf-8", "replace")) if line.strip() else None
        if e is None:
            continue
        cursor = e.get("__CURSOR") or cursor
        if e.get("MESSAGE") is not None:
            entries.append((int(e.get("__MONOTONIC_TIMESTAMP", 0)) / 1e6, e["MESSAGE"]))
    return entries, cursor, more, min(len(out), max_bytes)


def save_watch(service, watch):
    """What the deploy's watch judges this load by (budget, stall limits, the previous load's phases), for the
    host's state keeper: it knows no settings, and keeps judging the load if the controller is gone."""
    if not _private_dir():
        return
    try:
        write_atomic(os.path.join(STATE_DIR, "%s.watch.json" % service), json.dumps(watch), 0o600)
    except (OSError, TypeError, ValueError):
        pass


def load_watch(service):
    """What save_watch kept, or {}."""
    try:
        fd = os.open(os.path.join(STATE_DIR, "%s.watch.json" % service), os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd) as f:
            got = json.loads(f.read(1 << 20))
        return got if isinstance(got, dict) else {}
    except (OSError, ValueError):
        return {}
