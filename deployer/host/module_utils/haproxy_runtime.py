# -*- coding: utf-8 -*-
"""HAProxy's runtime API (the stats socket, ``level admin``): one command per connection, its answer.

Standard library only: used on the balancer host by the ``balancer_server`` module and on the controller by the
tests (against a real HAProxy).  Commands are HAProxy's own (management guide, "Unix Socket commands"):
``show stat`` (CSV: ``pxname,svname,...,scur,...,status,...``), ``show servers state <backend>`` (one line per
server, space-separated, ``srv_admin_state`` a bit field: what ``set server`` set, whatever the health checks
say), ``set server <backend>/<server> state ready|drain|maint``.
"""
from __future__ import annotations

import csv
import io
import socket

try:
    from ansible.module_utils.formats import FormatError, haproxy_word
except ImportError:           # imported as part of the deployer package (the controller, the tests)
    from deployer.host.module_utils.formats import FormatError, haproxy_word


class RuntimeError_(Exception):
    """The socket is missing or HAProxy refused a command (its own answer in the message)."""


def _word(value, what):
    """A backend or server name as it goes into a runtime command: a plain token (the runtime API runs commands
    separated by ``;`` and ends one at a line end: ``b; shutdown frontend x`` would be two commands)."""
    try:
        return haproxy_word(value, what)
    except FormatError as e:
        raise RuntimeError_(str(e)) from None


def command(sock_path, cmd, timeout=5.0):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(sock_path)
        s.sendall((cmd + "\n").encode())
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    except OSError as e:
        raise RuntimeError_("HAProxy runtime socket %s: %s" % (sock_path, e)) from None
    finally:
        s.close()
    return data.decode("utf-8", "replace")


def parse_stat(text):
    """``show stat`` CSV -> [{pxname, svname, scur, status, ...}] (the header line starts with ``# ``)."""
    text = text.lstrip()
    if text.startswith("# "):
        text = text[2:]
    rows = []
    for row in csv.DictReader(io.StringIO(text)):
        rows.append({k: v for k, v in row.items() if k})
    return rows


# srv_admin_state bits (HAProxy's include/haproxy/server-t.h, enum srv_admin): forced, inherited, configured,
# resolution and hostname maintenance; forced and inherited drain
ADMIN_MAINT_BITS = 0x01 | 0x02 | 0x04 | 0x20 | 0x40
ADMIN_DRAIN_BITS = 0x08 | 0x10


def parse_servers_state(text):
    """``show servers state`` -> {server name: admin state word (ready | drain | maint)}: the first line is the
    format version, the second the ``# ``-prefixed field names, then one space-separated line per server."""
    lines = [x for x in text.splitlines() if x.strip()]
    header = next((x[2:].split() for x in lines if x.startswith("# ")), None)
    if not header:
        return {}
    out = {}
    for line in lines:
        fields = line.split()
        if line.startswith("#") or len(fields) < len(header):
            continue
        row = {name: fields[i] for i, name in enumerate(header)}
        bits = int(row.get("srv_admin_state") or 0)
        out[row["srv_name"]] = ("maint" if bits & ADMIN_MAINT_BITS else "drain" if bits & ADMIN_DRAIN_BITS
                                else "ready")
    return out


def servers(sock_path, backend):
    """{server name: {status, scur (in-flight requests), weight, admin}} of one backend; ``admin`` is what ``set
    server`` set (ready | drain | maint), which ``status`` hides while the server's health checks fail (DOWN)."""
    backend = _word(backend, "backend")
    out = {}
    for r in parse_stat(command(sock_path, "show stat")):
        if r.get("pxname") == backend and r.get("svname") not in ("FRONTEND", "BACKEND"):
            out[r["svname"]] = {"status": r.get("status", ""), "scur": int(r.get("scur") or 0),
                                "weight": int(r.get("weight") or 0)}
    admin = parse_servers_state(command(sock_path, "show servers state %s" % backend))
    for name, row in out.items():
        row["admin"] = admin.get(name, "ready")
    return out


def state_word(status):
    """HAProxy's status column -> ready | drain | maint | down (what the deployer and ``status`` say)."""
    s = (status or "").upper()
    if s.startswith("MAINT"):
        return "maint"
    if s.startswith("DRAIN") or s.startswith("NOLB"):
        return "drain"
    if s.startswith("UP"):
        return "ready"
    return "down"


def set_state(sock_path, backend, server, state):
    if state not in ("ready", "drain", "maint"):
        raise ValueError("state: got %r, expected ready, drain or maint" % state)
    answer = command(sock_path, "set server %s/%s state %s" % (_word(backend, "backend"), _word(server, "server"),
                                                               state)).strip()
    if answer:   # HAProxy answers nothing on success, its reason otherwise
        raise RuntimeError_("HAProxy refused 'set server %s/%s state %s': %s" % (backend, server, state, answer))


def others_ready(rows, server, also_leaving=()):
    """How many servers other than ``server`` (and those leaving with it in the same batch) serve now."""
    return sum(1 for name, r in rows.items()
               if name != server and name not in also_leaving and state_word(r["status"]) == "ready")
