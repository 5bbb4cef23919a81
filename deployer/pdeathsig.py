"""A child process that dies with its parent (Linux ``PR_SET_PDEATHSIG``), for the two places the deployer needs it:
the playbook it starts (deployer/runner.py, between fork and exec) and every process that playbook forks (its
workers: the ``deployer_events`` callback).  A death signal is cleared in the child of a fork and ansible-core's
workers call ``setsid()``, so each fork has to be bound on its own.  Standard library only, and nothing is imported
when a child is bound (another thread may hold the import lock at a fork)."""
from __future__ import annotations

import os
import signal

PR_SET_PDEATHSIG = 1


def prctl():
    """libc's ``prctl``, looked up once before any fork."""
    import ctypes
    return ctypes.CDLL(None, use_errno=True).prctl


def bind_to(parent: int, prctl_fn) -> None:
    """In a child: SIGKILL when the parent dies, and exit at once if ``parent`` is already gone (it died before the
    death signal took effect: never run unwatched)."""
    prctl_fn(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(137)


def bind_forks() -> bool:
    """Bind every process this one forks from now on (and those they fork) to its parent.  False where the platform
    cannot (no ``os.register_at_fork`` or no libc ``prctl``)."""
    if not hasattr(os, "register_at_fork"):
        return False
    try:
        fn = prctl()
    except (OSError, AttributeError):
        return False
    forking = {"pid": os.getpid()}

    def note() -> None:            # in the process about to fork: the child's parent
        forking["pid"] = os.getpid()

    os.register_at_fork(before=note, after_in_child=lambda: bind_to(forking["pid"], fn))
    return True
