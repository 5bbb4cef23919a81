"""The playbook's process, bound to the deployer's: started in a session of its own and killed by the kernel when the
deployer dies (``spawn_bound``), its event pipe and output read until it ends (``stream``), stopped with its whole
process group on SIGINT, SIGTERM or SIGHUP (``StopOnSignal``)."""
from __future__ import annotations

import json
import os
import signal
import threading
from typing import Callable

from deployer import pdeathsig


def stream(argv: list[str], env: dict, handler: Callable[[dict], None], stop: "StopOnSignal") -> int:
    """Start the playbook bound to this process and feed ``handler`` its events until it ends (or ``stop`` asks:
    its process group is killed); its own output (stdout and stderr) arrives as ``verbose`` events, where
    ansible-playbook's errors before any host ran are found.  The playbook's exit code."""
    import selectors

    ev_r, ev_w = os.pipe()
    try:
        proc = spawn_bound(argv, dict(env, DEPLOYER_EVENTS_FD=str(ev_w)), pass_fds=(ev_w,))
    finally:
        os.close(ev_w)
    sel = selectors.DefaultSelector()
    bufs = {ev_r: b"", proc.stdout.fileno(): b""}
    for fd in bufs:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)

    def lines(fd: int, data: bytes) -> None:
        bufs[fd] += data
        *done, bufs[fd] = bufs[fd].split(b"\n")
        for raw in done:
            _dispatch(fd == ev_r, raw, handler)

    try:
        while sel.get_map():
            if stop.requested() and proc.poll() is None:
                _kill_group(proc)
            for key, _ in sel.select(timeout=1.0):
                try:
                    data = os.read(key.fd, 1 << 16)
                except BlockingIOError:
                    continue
                if data:
                    lines(key.fd, data)
                else:
                    sel.unregister(key.fd)
            # the playbook's workers or ssh masters may hold a copy of its stdout: its exit ends the stream
            if proc.poll() is not None and not sel.select(timeout=0):
                break
        for fd, rest in bufs.items():
            if rest:
                _dispatch(fd == ev_r, rest, handler)
        return proc.wait()
    finally:
        sel.close()
        os.close(ev_r)
        proc.stdout.close()
        if proc.poll() is None:
            _kill_group(proc)
            proc.wait()


def _dispatch(is_event: bool, raw: bytes, handler: Callable[[dict], None]) -> None:
    text = raw.decode("utf-8", "replace")
    if not is_event:
        if text.strip():
            handler({"event": "verbose", "stdout": text})
        return
    try:
        ev = json.loads(text)
    except ValueError:
        return
    if isinstance(ev, dict):
        handler(ev)


def _kill_group(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# The playbook must never outlive the deployer: a `deployer` killed outright (SIGKILL, the OOM killer) would
# leave it running on, unwatched, while the lock it holds names this process, now dead: the next `up` would take
# the lock over as stale and two playbooks would act on the host at once.  So the kernel sends the playbook
# SIGKILL when this process dies (PR_SET_PDEATHSIG, kept across exec), and it never starts when we are already
# gone.  (Its own session, like ansible-runner's pexpect child had, so that a stop can kill its whole group.)
def spawn_bound(argv: list[str], env: dict, pass_fds: tuple = ()):
    """Start ``argv`` in a session of its own (a stop kills its whole group), its stdout and stderr one pipe,
    killed by the kernel when this process dies."""
    import subprocess
    parent, prctl = os.getpid(), pdeathsig.prctl()
    return subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            pass_fds=pass_fds, start_new_session=True,
                            preexec_fn=lambda: pdeathsig.bind_to(parent, prctl))


class StopOnSignal:
    """While the playbook runs: SIGINT, SIGTERM and SIGHUP ask ``stream`` to stop it (checked at least once a
    second), which kills the playbook's process group, and the run says so (exit 7, ``interrupted``).  (When
    ansible-runner ran the playbook, its own handler - SIGINT and SIGTERM only, installed for good - cancelled it
    and the result came back as "no host matched (check the inventory...)", exit 2; SIGHUP, a closed terminal,
    ended this process and left ansible-playbook running on in its own session.)  What the host is left with is
    what a controller that died there leaves, which the next ``up`` finishes
    (tests/integration/test_controller_killed.py).  Only in the main thread (Python's rule for handlers)."""
    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self):
        self.signum, self.saved = 0, {}

    def requested(self) -> bool:
        return bool(self.signum)

    def _on(self, signum, _frame):
        self.signum = self.signum or signum

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self.saved = {s: signal.signal(s, self._on) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc):
        for s, h in self.saved.items():
            signal.signal(s, h)
        return False
