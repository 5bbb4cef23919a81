# -*- coding: utf-8 -*-
"""An engine's log lines as the watch and the status read them: split (tqdm redraws), cut to LINE_CHARS, their
process prefixes and headers stripped, secrets redacted, journald's JSON decoded.  Standard library only."""
from __future__ import annotations

import json
import re

# one or more process prefixes: "(Worker_TP0 pid=1) ", "(VllmWorker rank=1 pid=2) " (0.8.x), nested ones
# One way to match a name (a letter, then letters and digits): the old [A-Za-z_]+[A-Za-z0-9_]* could split a run of
# letters n ways, so "(" + "a" * 16000 cost ~17 s per poll as root (issue 40).
_PREFIX = re.compile(r"^(?:\([A-Za-z_][A-Za-z0-9_]*(?: [^)]*)?\)\s+)*")
# What of a line is read: vLLM's and SGLang's own lines are far shorter; the service user's can be 48 KB (journald's
# LineMax), and each is parsed on every poll.
LINE_CHARS = 4096

# A secret where an engine prints its configuration (SGLang 0.5.23 logs server_args with the API key at start-up:
# srt/entrypoints/engine.py): name=value, 'name': 'value', "name": "value" and --flag value.  The same pattern, on
# bytes, in roles/render/files/journal_lines.py, which redacts before the journal (tests/unit/test_hostile_logs.py);
# its comment still names engine_logs.py, where this lived until 2026-12-06: that file names every release (its
# content-named path is in the unit), so an edit of it, a comment too, reloads every host (tests/unit/test_promises.py).
SECRET_SETTING = (r"""((?:admin_)?api_key|hf_token)(['"]?\s*[:=]\s*)"""
                  r"""('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|[^\s,)}\]]+)"""
                  r"""|(--(?:admin-)?api-key)(=|\s+)(\S+)""")
_SECRET_SETTING = re.compile(SECRET_SETTING)
NOT_SECRET = ("None", "null", "''", '""')


def redact(text):
    """``text`` with the value of every secret setting in it replaced by ``<redacted>`` (None stays None)."""
    def sub(m):
        name, sep, value = (m.group(1), m.group(2), m.group(3)) if m.group(1) else m.group(4, 5, 6)
        return name + sep + (value if value in NOT_SECRET else "<redacted>")
    return _SECRET_SETTING.sub(sub, text)


def journal_entry(raw):
    """One line of ``journalctl -o json`` as a dict with MESSAGE as text (journald gives a non-UTF-8 message as a
    list of byte values), secrets redacted, or None for a line that is not JSON."""
    try:
        e = json.loads(raw)
    except ValueError:
        return None
    if isinstance(e.get("MESSAGE"), list):
        e["MESSAGE"] = bytes(e["MESSAGE"]).decode("utf-8", "replace")
    if isinstance(e.get("MESSAGE"), str):
        e["MESSAGE"] = redact(e["MESSAGE"])     # a journal written without the line wrapper: its tail, its reason
    return e


def split_lines(text):
    """Split on ``\\n`` and ``\\r`` (tqdm redraws), dropping empties; each line's first LINE_CHARS characters."""
    return [p[:LINE_CHARS] for p in re.split(r"[\r\n]+", text) if p.strip()]


def strip_prefix(line):
    """Drop ``(Worker_TP0 pid=1)``-style prefixes and the ``INFO MM-DD HH:MM:SS [file.py:N]`` header."""
    line = _PREFIX.sub("", line.strip())
    line = re.sub(r"^(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? "
                  r"\[[^\]]*\]\s*", "", line)
    return line
