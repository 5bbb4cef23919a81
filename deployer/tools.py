"""Where the programs the deployer runs come from: the project's own set-up, never the caller's PATH.

* Python tools installed with this package (``ansible-playbook``, ``ruff``) live next to the
  interpreter that runs the deployer: ``venv_bin(name)``.
* ``uv`` is the ``uv`` package's own binary (``uv.find_uv_bin()``), a dependency of this package.
* System programs (``ssh``, ``systemd-nspawn``, ``ip`` ...) come from Debian packages that
  ``scripts/dev.sh`` installs; they are looked up in the standard system directories only, and a
  missing one is reported with the package that provides it.

A cron job, a systemd timer or a CI runner may call the deployer with a PATH that has none of
these on it; nothing here depends on it.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

# A fresh Debian root's PATH (what `su -` and systemd give root).
SYSTEM_DIRS = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")

# Debian package for each system program the controller runs (scripts/dev.sh installs them).
APT_PACKAGE = {
    "ssh": "openssh-client", "ssh-keygen": "openssh-client", "scp": "openssh-client", "sshd": "openssh-server",
    "systemd-nspawn": "systemd-container", "ip": "iproute2", "unshare": "util-linux",
    "umount": "mount", "mount": "mount", "cp": "coreutils", "rsync": "rsync", "crontab": "cron",
    "systemctl": "systemd", "journalctl": "systemd", "ss": "iproute2",
}


class ToolMissing(RuntimeError):
    """A program the deployer needs is not installed; the message says how to install it."""


def venv_bin(name: str) -> str:
    """A console script installed with this package (same venv as the running interpreter).

    ``sys.executable`` is not resolved: a venv's ``bin/python`` is a symlink to the base
    interpreter, and the scripts live next to the symlink.
    """
    p = Path(sys.executable).parent / name
    if not os.access(p, os.X_OK):
        raise ToolMissing(f"{name}: not found next to {sys.executable} (expected {p}); "
                          "reinstall the deployer: bash scripts/dev.sh setup")
    return str(p)


def uv() -> str:
    """The uv binary shipped by the ``uv`` Python package (a dependency of this package)."""
    try:
        from uv import find_uv_bin
        return find_uv_bin()
    except (ImportError, FileNotFoundError) as e:
        raise ToolMissing(f"uv: the uv package is not installed with the deployer ({e}); "
                          "reinstall the deployer: bash scripts/dev.sh setup") from e


def system(name: str) -> str:
    """A system program, from the standard system directories only."""
    for d in SYSTEM_DIRS:
        p = os.path.join(d, name)
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    pkg = APT_PACKAGE.get(name, name)
    raise ToolMissing(f"{name}: not found in {':'.join(SYSTEM_DIRS)}; install it: apt-get install -y {pkg}")


def find(name: str) -> str | None:
    """``system(name)``, or None when it is not installed."""
    try:
        return system(name)
    except ToolMissing:
        return None


def subprocess_path() -> str:
    """PATH for the programs the deployer starts (ansible-playbook and the ssh it runs):
    this venv's bin first, then the system directories, then whatever the caller had."""
    parts = [str(Path(sys.executable).parent), *SYSTEM_DIRS]
    parts += [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p not in parts]
    return os.pathsep.join(parts)
