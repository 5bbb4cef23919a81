# -*- coding: utf-8 -*-
"""One rule per output format: what a value may hold before it is written into a file that another program
parses line by line.  Standard library only (the env-file reader runs on the host).

Every format here ends a line at more than ``\\n``; a value that carries one of those characters would end its
line early and start a new one in the reader (a new ``User=`` in a unit, a new variable in an env file, a second
command in a crontab).  So each writer refuses them, naming the value, the character and the format:

==============  ============================================================  ==========================================
format          ends a line / is interpreted                                   rule (function)
==============  ============================================================  ==========================================
systemd unit    ``\\n``, ``\\r`` and NUL end a line (systemd's read_line);       ``unit_word``: no control character,
                ``%`` is a specifier, ``$`` a variable in ExecStart=            ``%`` -> ``%%``, ``$`` -> ``$$``, quoted
env file        ``\\n`` and ``\\r`` end a line (systemd's env-file parser); our  ``env_value``: no control character
                reader splits exactly there
crontab         ``\\n`` ends the entry; ``%`` in the command is a newline      ``cron_word``: no control character,
                (crontab(5)); the rest is a /bin/sh command line                ``%`` -> ``\\%``, shell-quoted
HAProxy config  ``\\n`` ends a line, ``#`` starts a comment, blanks split words  ``haproxy_word``: a plain token
==============  ============================================================  ==========================================

"Control character": C0 (U+0000-U+001F), DEL, C1 (U+0080-U+009F) and the Unicode line and paragraph separators
(U+2028, U+2029): everything ``str.splitlines`` splits at, and more.  None of them has a use in a flag, a path,
a key or a token.
"""
from __future__ import annotations

import re

# Every character a reader of these formats (or Python's own str.splitlines) may take as the end of a line,
# and every other control character.
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


class FormatError(ValueError):
    """A value that the format it is written into would read differently."""


def control_char(value):
    """The first control character in ``value`` as ``'\\r' (U+000D)``, or "" when there is none."""
    m = CONTROL.search(value)
    if not m:
        return ""
    return "%r (U+%04X)" % (m.group(0), ord(m.group(0)))


def _refuse_control(value, what):
    """The value is never quoted back: it may be a secret (an API key pasted with its line end)."""
    bad = control_char(value)
    if bad:
        raise FormatError("%s contains the control character %s at position %d, which would end its line in the "
                          "file (or be read as something else); the value is not shown (it may be a secret)"
                          % (what, bad, CONTROL.search(value).start()))


def unit_word(value, what="argv word"):
    """One word of a systemd ``ExecStart=`` line (systemd.service(5), "Command lines"): double-quoted with C
    escapes; ``$`` -> ``$$`` (no variable expansion) and ``%`` -> ``%%`` (no specifier expansion), so the
    process receives ``value`` byte for byte."""
    value = str(value)
    _refuse_control(value, what)
    out = value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "$$").replace("%", "%%")
    return '"%s"' % out


def unit_value(value, what="unit setting"):
    """A value written after ``Key=`` in a unit file outside a command line (``Description=``): no control
    character, ``%`` -> ``%%``."""
    value = str(value)
    _refuse_control(value, what)
    return value.replace("%", "%%")


def env_value(value, what="environment value"):
    """A value for an ``EnvironmentFile=`` line: ``"..."`` with ``\\`` ``"`` ``$`` and backquote escaped."""
    value = str(value)
    _refuse_control(value, what)
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$").replace("`", "\\`") + '"'


def env_lines(text):
    """The lines of an env file as systemd splits them: at ``\\n`` (a ``\\r\\n`` pair is one end)."""
    return [line[:-1] if line.endswith("\r") else line for line in text.split("\n")]


def cron_word(value, what="crontab word"):
    """One word of a crontab command: shell-quoted for /bin/sh, ``%`` escaped (cron turns a bare ``%`` into a
    newline and feeds what follows to the command's stdin)."""
    value = str(value)
    _refuse_control(value, what)
    if re.fullmatch(r"[A-Za-z0-9_./:=@+-]+", value):
        quoted = value
    else:
        quoted = "'" + value.replace("'", "'\"'\"'") + "'"
    return quoted.replace("%", "\\%")


_HAPROXY_TOKEN = re.compile(r"^[A-Za-z0-9\[/][A-Za-z0-9._:/\[\]-]{0,252}$")


def haproxy_word(value, what="HAProxy config word"):
    """One word of haproxy.cfg (a server name, an address, a backend name): a plain token, so it can never be
    cut at a blank, start a comment or run onto a new line."""
    value = str(value)
    _refuse_control(value, what)
    if not _HAPROXY_TOKEN.fullmatch(value):
        raise FormatError("%s %r: expected letters, digits and . _ : / - [ ] only (a name, an address or a path)"
                          % (what, value))
    return value
