"""The host's state keeper: while the engine's unit exists, every few seconds it reads what changed (the unit, this
start's new journal lines from a cursor, /health, the lock, the live release, the audit log's last line) and writes
the host's account of its engine (module_utils/host_state.py) where anyone may read it: ``/run/deployer/state.json``
(no secret in it) and ``<textfile dir>/deployer.prom`` for node_exporter (temporary file + rename).  A controller
need not be attached: a schedule's load at 03:00 is as visible as one a teammate watches.

Shipped by the render stage beside the host module_utils it uses (in an ``ansible/module_utils`` package of its own,
so they import as they do under Ansible), run by ``deployer-state.service`` (templates/state-keeper.service.j2)
with the system Python, ``-I``.  Usage: state_keeper.py --root R --service S --port P --host H --textfile-dir D.
"""
import argparse
import json
import os
import stat
import subprocess
import sys
import time

# -I leaves this folder off sys.path: it is root's and named by its content, so it goes first, explicitly
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ansible.module_utils import host_state  # noqa: E402
from ansible.module_utils.host_io import http_get, systemd_show, write_atomic  # noqa: E402
from ansible.module_utils.journal_follow import Follow, load_watch, read_journal  # noqa: E402
from ansible.module_utils.load_rules import RULESETS  # noqa: E402

DEFAULT_RULES = "vllm"    # LoadState's own default: a release recorded before its manifest named its log rules

PROPS = ["ActiveState", "SubState", "MainPID", "ActiveEnterTimestampMonotonic", "InvocationID", "ExecMainStatus",
         "NRestarts"]
RUN_DIR = "/run/deployer"
MAX_BYTES_PER_LOOK = 8 << 20


def run_command(cmd, use_unsafe_shell=False, encoding=None):
    """AnsibleModule.run_command as journal_follow.read_journal calls it."""
    r = subprocess.run(cmd, shell=use_unsafe_shell, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=60)
    return r.returncode, r.stdout if encoding is None else r.stdout.decode(encoding, "replace"), ""


def read_json(path, limit=1 << 20):
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as f:
            return json.loads(f.read(limit))
    except (OSError, ValueError):
        return None


def last_line(path, tail=65536):
    """The audit log's last JSON line (its tail only is read)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - tail))
            lines = f.read().splitlines()
        return json.loads(lines[-1]) if lines else None
    except (OSError, ValueError, IndexError):
        return None


def roots_own(folder):
    """Whether ``folder`` is a real directory of root's that no one else may write (root never writes where another
    user could plant a file: docs/security.md rule 1); the textfile directory is the operator's setting."""
    try:
        st = os.lstat(folder)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == 0 and not st.st_mode & 0o022


def code_stamp(folder):
    """The keeper's own files as they are now (name, size, mtime of each .py under ``folder``)."""
    out = []
    for top, _dirs, files in os.walk(folder):
        for n in sorted(files):
            if n.endswith(".py"):
                st = os.stat(os.path.join(top, n))
                out.append((os.path.join(top, n), st.st_size, st.st_mtime_ns))
    return sorted(out)


def unit_of(root, service):
    """The engine's log rules and eager flag, from the live release (the unit the keeper follows)."""
    m = read_json(os.path.join(root, "current", "release.json")) or {}
    argv = m.get("argv") or []
    # the engine's log rules, as the release recorded them (one recorded before they were: vLLM's, the default)
    rules = m.get("log_rules") if m.get("log_rules") in RULESETS else DEFAULT_RULES
    return m, rules, "--enforce-eager" in argv


def main(argv=None):
    a = argparse.ArgumentParser()
    a.add_argument("--root", required=True)
    a.add_argument("--service", required=True)
    a.add_argument("--port", type=int, required=True)
    a.add_argument("--host", default="127.0.0.1")
    a.add_argument("--textfile-dir", default="")
    a.add_argument("--interval", type=float, default=2.0)
    a.add_argument("--once", action="store_true")
    args = a.parse_args(argv)
    me = os.path.dirname(os.path.abspath(__file__))
    mine = code_stamp(me)
    follow, inv = None, None
    while True:
        now_wall, now_mono = time.time(), time.clock_gettime(time.CLOCK_MONOTONIC)
        props = systemd_show(args.service, PROPS)
        manifest, engine, eager = unit_of(args.root, args.service)
        if props.get("InvocationID") != inv or follow is None or (follow.state.engine, follow.state.eager) != \
                (engine, eager):
            inv, follow = props.get("InvocationID"), Follow(engine, eager)
        entries, follow.cursor, _more, _n = read_journal(run_command, args.service, inv or "", follow.cursor,
                                                         MAX_BYTES_PER_LOOK)
        for t, msg in entries:
            follow.feed(t, msg)
        running = props.get("ActiveState") in ("active", "activating", "reloading")
        health = http_get(args.port, "/health", args.host, connect_timeout=1.0, read_timeout=2.0,
                          limit=65536)[0] if running else None
        rel = host_state.release(manifest)
        dep = host_state.deploy(read_json(os.path.join(args.root, ".lock", "holder.json")), now_wall)
        state = {
            "service": args.service, "updated_at": round(now_wall, 3), "invocation": inv,
            "load": host_state.load(follow.state.snapshot(now_mono), props, health, load_watch(args.service),
                                    now_mono, now_wall, (rel or {}).get("phase_seconds"), dep),
            "deploy": dep,
            "last_deploy": host_state.last_deploy(last_line(os.path.join(args.root, "audit.jsonl"))),
            "release": rel,
        }
        state["release"] = dict(rel, phase_seconds=None) if rel else None
        try:
            write_atomic(os.path.join(RUN_DIR, "state.json"), json.dumps(state, sort_keys=True) + "\n", 0o644)
        except OSError as e:
            sys.stderr.write("state.json: %s\n" % e)
        if args.textfile_dir and roots_own(args.textfile_dir):
            try:
                write_atomic(os.path.join(args.textfile_dir, "deployer.prom"), host_state.prom_text(state), 0o644)
            except OSError as e:
                sys.stderr.write("deployer.prom: %s\n" % e)
        if args.once:
            return 0
        if code_stamp(me) != mine:
            return 0            # the render stage wrote a newer keeper here: systemd starts it (Restart=always)
        time.sleep(args.interval)


if __name__ == "__main__":
    sys.exit(main())
