# -*- coding: utf-8 -*-
"""HAProxy's runtime API (the stats socket, ``level admin``): one command per connection, its answer.

Standard library only: used on the balancer host by the ``balancer_server`` module and on the controller by the
tests (against a real HAProxy).  Commands are HAProxy's own (management guide, "Unix Socket commands"):
``show stat`` (CSV: ``pxname,svname,...,scur,...,status,...``), ``set server <backend>/<server> state
ready|drain|maint``.
"""
from __future__ import annotations

import csv
import io
import socket


class RuntimeError_(Exception):
    """The socket is missing or HAProxy refused a command (its own answer in the message)."""


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


def servers(sock_path, backend):
    """{server name: {status, scur (in-flight requests), weight}} of one backend."""
    out = {}
    for r in parse_stat(command(sock_path, "show stat")):
        if r.get("pxname") == backend and r.get("svname") not in ("FRONTEND", "BACKEND"):
            out[r["svname"]] = {"status": r.get("status", ""), "scur": int(r.get("scur") or 0),
                                "weight": int(r.get("weight") or 0)}
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
    answer = command(sock_path, "set server %s/%s state %s" % (backend, server, state)).strip()
    if answer:   # HAProxy answers nothing on success, its reason otherwise
        raise RuntimeError_("HAProxy refused 'set server %s/%s state %s': %s" % (backend, server, state, answer))


def others_ready(rows, server, also_leaving=()):
    """How many servers other than ``server`` (and those leaving with it in the same batch) serve now."""
    return sum(1 for name, r in rows.items()
               if name != server and name not in also_leaving and state_word(r["status"]) == "ready")
