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

# A secret where an engine, a crash reporter or an environment dump prints it (SGLang 0.5.23 logs server_args with
# the API key at start-up: srt/entrypoints/engine.py): any name ending in api_key / apikey / token / password / secret,
# any case (VLLM_API_KEY=, HF_TOKEN=, apiKey=, api-key:, 'HF_TOKEN': in an environ({...}) repr) followed by = or :
# and a value (quoted, a whole [list], or a bare word: a comma not followed by a blank stays in it); a --flag of that
# kind and its value, also as an argv list's repr ('--api-key', 'K'); an Authorization header's or a Bearer token
# (issue 53 N6).  Case-insensitive, and linear on hostile lines (a name or a flag starts only where a word does).
# The same pattern, on bytes, in roles/render/files/journal_lines.py, which redacts before the journal
# (tests/unit/test_hostile_logs.py).  That file names every release (its content-named path is in the unit), so an
# edit of it, a comment too, reloads every host (tests/unit/test_promises.py).
SECRET_SETTING = (
    r'''(?<![A-Za-z0-9_-])((?:[A-Za-z0-9]+[_-])*(?:api[_-]?key|apikey|[a-z0-9]*token|password|passwd|secret))'''
    r'''(['"]?\s*[:=]\s*)(\[[^\][]*\]|'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|(?:[^\s,)}\]'"]|,(?!\s))+)'''
    r'''|(?<![A-Za-z0-9-])(--(?:[a-z0-9]+-)*(?:api-key|token|password|secret))(['"]?(?:=|,\s*['"]|\s+))([^\s'",\]]+)'''
    r'''|(authorization['"]?\s*[:=]\s*['"]?(?:basic|bearer)?\s*|\bbearer\s+)([^\s'",\]]+)'''
)
_SECRET_SETTING = re.compile(SECRET_SETTING, re.I)
NOT_SECRET = ("None", "null", "''", '""')


# Words one of which every match holds: a line with none (nearly every line) is not searched at all
HINTS = ("key", "token", "passw", "secret", "bearer", "authorization", "basic")


def redact(text):
    """``text`` with the value of every secret setting in it replaced by ``<redacted>`` (None stays None)."""
    if text is None:
        return None
    low = text.lower()
    if not any(h in low for h in HINTS):
        return text

    def sub(m):
        if m.group(7) is not None:
            return m.group(7) + "<redacted>"
        name, sep, value = m.group(1, 2, 3) if m.group(1) else m.group(4, 5, 6)
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
