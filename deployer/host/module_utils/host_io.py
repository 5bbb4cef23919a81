# -*- coding: utf-8 -*-
"""What the deployer's modules read and write on a host, in one place: a unit's systemd properties, a plain HTTP GET
of the server, the NVIDIA character devices the driver registered, a file replaced whole (write_atomic).  Standard
library only (modules run it on the host; the controller imports it from the package)."""
from __future__ import annotations

import os
import tempfile


def systemd_show(service, props, run=None):
    """``systemctl show SERVICE -p P ...`` as {property: value}; {} when systemctl cannot run.  ``run``: a
    module's ``run_command`` (argv -> (rc, out, err)); a subprocess when None."""
    args = ["systemctl", "show", service]
    for p in props:
        args += ["-p", p]
    if run is not None:
        out = run(args)[1]
    else:
        import subprocess
        try:
            out = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, universal_newlines=True,
                                 timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            return {}
    return dict(line.partition("=")[::2] for line in (out or "").splitlines() if "=" in line)


def http_get(port, path, host="127.0.0.1", connect_timeout=3.0, read_timeout=5.0, limit=4 << 20):
    """(status, body) of a plain HTTP/1.0 GET on ``host``:``port``: status None when nothing accepts the
    connection (a server still loading does not listen), 0 when it accepted but no HTTP status came back in time.
    Read to the end (closing early makes the server log a reset)."""
    import socket
    try:
        s = socket.create_connection((host or "127.0.0.1", int(port)), timeout=connect_timeout)
    except (OSError, ValueError, TypeError):
        return None, ""
    try:
        s.settimeout(read_timeout)
        s.sendall(("GET %s HTTP/1.0\r\nHost: localhost\r\nConnection: close\r\n\r\n" % path).encode())
        data = b""
        while len(data) < limit:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    except OSError:
        return 0, ""
    finally:
        s.close()
    head, _, body = data.partition(b"\r\n\r\n")
    parts = head.split(b" ", 2)
    status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
    return status, body.decode("utf-8", "replace")


def nvidia_devices(path="/proc/devices"):
    """The NVIDIA character device names the driver registered (sorted, unique): what a unit's DeviceAllow= may
    name (``char-<name>``)."""
    devs, section = set(), False
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("Character devices:"):
                    section = True
                    continue
                if not line.strip():
                    section = False
                    continue
                words = line.split()
                if section and len(words) >= 2 and words[1].startswith("nvidia"):
                    devs.add(words[1])
    except OSError:
        pass
    return sorted(devs)


def write_atomic(path, data, mode):
    """``data`` (text or bytes) to ``path`` through a temp file in the same directory and a rename: a reader never
    sees half a file.  The mode is set before any byte is written (a secret file is never readable by others)."""
    fd, tmp = tempfile.mkstemp(prefix=".deployer-", dir=os.path.dirname(path))
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


UNIT_DIR = "/etc/systemd/system"


def deployer_units(root, unit_dir=UNIT_DIR):
    """The units this deployer root installed, by name (without ``.service``): each a plain file in ``unit_dir``
    (never a link) that reads its environment from one of ``root``'s releases (``EnvironmentFile=<root>/releases/``:
    what every release's unit says, templates/engine.service.j2).  A unit renamed by the operator - or by the
    default, deployer-vllm -> deployer-engine - leaves its old name here, still running, until a start retires it."""
    mark = "EnvironmentFile=%s/releases/" % root.rstrip("/")
    out = []
    try:
        names = sorted(os.listdir(unit_dir))
    except OSError:
        return out
    for name in names:
        path = os.path.join(unit_dir, name)
        if not name.endswith(".service") or os.path.islink(path) or not os.path.isfile(path):
            continue
        try:
            with open(path) as f:
                if any(line.startswith(mark) for line in f.read(1 << 20).splitlines()):
                    out.append(name[:-len(".service")])
        except (OSError, UnicodeDecodeError):
            continue
    return out
