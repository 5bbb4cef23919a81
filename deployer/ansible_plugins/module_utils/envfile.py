# -*- coding: utf-8 -*-
"""The server's ``EnvironmentFile=``: written (``quote``, through the ``systemd_env_quote`` filter in
templates/vllm.env.j2) and read back (``parse``, by the ``deployer_state`` module: the rollback's smoke
test needs the target release's API key) by the code in this one file.

Format: ``KEY="value"`` lines, double quotes with backslash escapes, as systemd.exec(5) parses them
(``\\`` ``"`` ``$`` and backquote escaped; newlines and NUL refused).  Standard library only: runs on the host.
"""
from __future__ import annotations

import re


class EnvFileError(ValueError):
    pass


def quote(value):
    value = str(value)
    if "\n" in value or "\x00" in value:
        raise EnvFileError("environment values may not contain newlines")
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$").replace("`", "\\`") + '"'


_LINE = re.compile(r'^([A-Za-z_][A-Za-z0-9_]*)=(.*)$')


def unquote(raw):
    raw = raw.strip()
    if len(raw) >= 2 and raw[0] == raw[-1] == '"':
        return re.sub(r'\\(.)', r'\1', raw[1:-1])
    return raw


def parse(text):
    """``KEY=value`` lines -> dict; comments and blank lines skipped."""
    out = {}
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = _LINE.match(line.strip())
        if m:
            out[m.group(1)] = unquote(m.group(2))
    return out
