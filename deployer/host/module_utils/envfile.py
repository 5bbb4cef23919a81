# -*- coding: utf-8 -*-
"""The server's ``EnvironmentFile=``: written (``quote``, through the ``systemd_env_quote`` filter in
templates/engine.env.j2) and read back (``parse``, by the ``deployer_state`` module: the rollback's smoke
test needs the target release's API key) by the code in this one file.

Format: ``KEY="value"`` lines, double quotes with backslash escapes, as systemd.exec(5) parses them
(``\\`` ``"`` ``$`` and backquote escaped; every control character refused: formats.env_value).  Read back
split where systemd splits (formats.env_lines: at ``\\n``), never at the other characters ``str.splitlines``
takes for a line end.  Standard library only: runs on the host.
"""
from __future__ import annotations

import re

try:
    from ansible.module_utils import formats
except ImportError:           # imported as part of the deployer package (the controller)
    from deployer.host.module_utils import formats


class EnvFileError(ValueError):
    pass


def quote(value):
    try:
        return formats.env_value(value)
    except formats.FormatError as e:
        raise EnvFileError(str(e)) from e


_LINE = re.compile(r'^([A-Za-z_][A-Za-z0-9_]*)=(.*)$')


def unquote(raw):
    raw = raw.strip()
    if len(raw) >= 2 and raw[0] == raw[-1] == '"':
        return re.sub(r'\\(.)', r'\1', raw[1:-1])
    return raw


def parse(text):
    """``KEY=value`` lines -> dict; comments and blank lines skipped."""
    out = {}
    for line in formats.env_lines(text):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = _LINE.match(line.strip())
        if m:
            out[m.group(1)] = unquote(m.group(2))
    return out
