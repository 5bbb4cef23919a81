"""Run the project's playbooks with ansible-runner and turn its event stream into progress.

The CLI never executes tasks itself: Ansible does, exactly as plain ``ansible-playbook`` would
(same ansible.cfg, roles, modules).  This module only builds the invocation and reads events.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import Callable

from deployer import tools

ROOT = Path(__file__).resolve().parent.parent
PLAYBOOKS = ROOT / "playbooks"
ANSIBLE_CFG = ROOT / "ansible.cfg"


class Exit(IntEnum):
    """Exit codes a cron job can act on."""
    OK = 0
    FAILED = 1          # deploy failed after changes; rolled back (or --no-rollback)
    USAGE = 2           # bad input; nothing changed
    PREFLIGHT = 3       # a read-only check failed; nothing changed
    VERIFY = 4          # vLLM's own checks refused the launch; nothing restarted
    UNREACHABLE = 5     # SSH failed
    LOCKED = 6          # another deploy holds the host lock
    INTERRUPTED = 7     # SIGINT/SIGTERM/SIGHUP stopped the run (its playbook too); the next `up` finishes the job


@dataclass
class Failure:
    host: str
    task: str
    role: str
    msg: str
    res: dict = field(default_factory=dict)


@dataclass
class Result:
    rc: int
    status: str
    failures: list[Failure] = field(default_factory=list)
    unreachable: list[str] = field(default_factory=list)
    facts: dict = field(default_factory=dict)   # host -> {name: value} from debug/set_fact we care about
    stats: dict = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)   # ansible-playbook's own [ERROR] text (e.g. a broken playbook)
    interrupted_by: int = 0     # the signal that stopped the run (its playbook was killed with it), else 0

    def refusal(self) -> list[str]:
        """ansible-playbook's own error when it ran no host for a reason other than "no host matched" (that one the
        CLI says in its own words): the playbook or inventory it could not read."""
        if self.processed() or any("no hosts to target" in e for e in self.errors):
            return []
        return self.errors

    def processed(self) -> set:
        return set((self.stats or {}).get("processed", {}) or {})

    def exit_code(self) -> Exit:
        """From each host's deployer_result (the playbooks' one result), else from what the stream showed."""
        if self.interrupted_by:
            return Exit.INTERRUPTED
        if not self.processed():
            return Exit.USAGE  # no host matched: never report success for doing nothing
        if self.unreachable:
            return Exit.UNREACHABLE
        classes = {(f.get("deployer_result") or {}).get("exit_class") for f in self.facts.values()} - {None}
        if self.rc == 0 and not self.failures:
            return Exit.OK
        if any(f.res.get("locked") for f in self.failures) or "locked" in classes:
            return Exit.LOCKED
        if self.failures and all(f.res.get("bad_value") for f in self.failures):
            return Exit.PREFLIGHT    # a role's argument spec refused a value before any task ran
        for cls, code in (("failed", Exit.FAILED), ("verify", Exit.VERIFY), ("preflight", Exit.PREFLIGHT)):
            if cls in classes:
                return code   # the worst class over the hosts
        return Exit.FAILED


# The playbooks' documented results (docs/design.md): the CLI reads nothing else of a run.
WATCHED_FACTS = ("deployer_result", "deployer_status")
HIDDEN = "(output hidden: it may contain a secret)"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


class Collector:
    """Folds ansible-runner's event stream into a ``Result``: failures (with no_log output masked),
    unreachable hosts, the facts the CLI reports, and the final stats.  Pure: fed event dicts."""

    def __init__(self):
        self.failures: list[Failure] = []
        self.unreachable: list[str] = []
        self.facts: dict = {}
        self.stats: dict = {}
        self.errors: list[str] = []

    def __call__(self, ev: dict) -> None:
        data = ev.get("event_data", {})
        kind = ev.get("event")
        if kind in ("verbose", "error") and (ev.get("stdout") or "").strip():
            # ansible-playbook's own error before any host ran (a playbook or inventory it cannot read): the
            # [ERROR] line and the lines that explain it (file, line, column)
            text = ANSI.sub("", ev["stdout"]).rstrip()
            if text.startswith(("[ERROR]", "ERROR!")) or (self.errors and len(self.errors) < 8 and text.strip()):
                self.errors.append(text)
            return
        host = data.get("host", "?")
        res = data.get("res", {}) or {}
        if kind == "runner_on_failed" and not data.get("ignore_errors"):
            msg = res.get("msg") or res.get("stderr") or res.get("module_stderr") or ""
            if res.get("results") and msg == "One or more items failed":
                # a loop: the failed items say what was measured and what was expected
                msg = [r.get("msg") or r.get("stderr") or "" for r in res["results"] if r.get("failed")] or msg
            if msg == "non-zero return code":   # a command: what it printed says why
                msg = "\n".join(x for x in (msg, str(res.get("stderr") or "")[-2000:],
                                            str(res.get("stdout") or "")[-2000:]) if x)
            if res.get("argument_errors") is not None:   # a role's argument spec refused a value: nothing ran yet
                from deployer.settings_check import explain_arg_spec_failure
                msg = explain_arg_spec_failure(msg)
                res = dict(res, bad_value=True)
            if res.get("_ansible_no_log"):
                msg = HIDDEN
            self.failures.append(Failure(host, data.get("task", "?"), data.get("role", ""),
                                         "\n".join(map(str, msg)) if isinstance(msg, list) else str(msg),
                                         {k: res[k] for k in ("holder", "locked", "bad_value") if k in res}))
        elif kind == "runner_on_unreachable":
            self.unreachable.append(host)
            self.failures.append(Failure(host, data.get("task", "?"), data.get("role", ""),
                                         str(res.get("msg", "unreachable"))))
        elif kind == "playbook_on_stats":
            self.stats.update({k: data.get(k) or {} for k in ("processed", "ok", "changed", "failures", "dark",
                                                              "skipped")})
        elif kind == "runner_on_ok":
            af = res.get("ansible_facts") or {}
            for k in WATCHED_FACTS:
                if k in af:
                    self.facts.setdefault(host, {})[k] = af[k]

    def result(self, rc: int, status: str) -> Result:
        return Result(rc=rc, status=status, failures=self.failures, unreachable=self.unreachable,
                      facts=self.facts, stats=self.stats, errors=self.errors)


def _trace_writer():
    """DEPLOYER_TRACE_FILE=path: append one JSON line per finished task and host (task, host, start, end,
    duration seconds, status) - what bench/profile.py turns into where-the-seconds-go tables."""
    path = os.environ.get("DEPLOYER_TRACE_FILE")
    if not path:
        return None

    def write(ev: dict):
        kind = ev.get("event", "")
        if not kind.startswith("runner_on_") or kind in ("runner_on_start",):
            return
        d = ev.get("event_data") or {}
        line = {"task": d.get("task"), "role": d.get("role"), "uuid": d.get("task_uuid"), "host": d.get("host"),
                "status": kind[10:],
                "start": d.get("start"), "end": d.get("end"), "duration": d.get("duration")}
        with open(path, "a") as f:
            f.write(json.dumps(line) + "\n")
    return write


def run(playbook: str, inventory: str, extravars: dict | None = None, limit: str | None = None,
        check: bool = False, diff: bool = False,
        on_event: Callable[[dict], None] | None = None, verbosity: int = 0) -> Result:
    import ansible_runner  # imported late: keeps `deployer --help` fast

    pdd = tempfile.mkdtemp(prefix="deployer-run-")
    os.chmod(pdd, 0o700)  # extravars (may hold secrets) are written here by ansible-runner
    collect = Collector()

    trace = _trace_writer()

    def handler(ev: dict) -> bool:
        collect(ev)
        if on_event:
            on_event(ev)
        if trace:
            trace(ev)
        return False  # do not keep event files

    cmdline = []
    if check:
        cmdline.append("--check")
    if diff:
        cmdline.append("--diff")
    # ansible-runner turns host-key checking OFF unless told otherwise (config/_base.py); we never do that.
    env = {"ANSIBLE_CONFIG": str(ANSIBLE_CFG), "ANSIBLE_FORCE_COLOR": "0", "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_HOST_KEY_CHECKING": "True",
           # ansible-runner appends its own callback directory to this one; ansible.cfg's would be overridden
           "ANSIBLE_CALLBACK_PLUGINS": str(ROOT / "deployer" / "ansible_plugins" / "callback_plugins"),
           # ansible-playbook from this venv, ssh from the system: never whichever the caller's PATH finds first
           "PATH": tools.subprocess_path()}
    # ansible-runner finds `ansible-playbook` on this PATH: the first one is the shim that binds it to us (an
    # explicit `binary` would switch ansible-runner to its raw mode, which drops the playbook from the command)
    env["PATH"] = os.pathsep.join([str(Path(_playbook_bound_to_us(pdd, env["PATH"])).parent), env["PATH"]])
    stop = _StopOnSignal()
    try:
        with stop:
            r = ansible_runner.run(
                private_data_dir=pdd, project_dir=str(ROOT), playbook=str(PLAYBOOKS / playbook),
                inventory=inventory, extravars=extravars or {}, limit=limit,
                cmdline=" ".join(cmdline) or None, envvars=env, event_handler=handler, quiet=True,
                verbosity=verbosity or None, suppress_env_files=False,
                cancel_callback=stop.requested, settings={"pexpect_timeout": 1},
            )
        res = collect.result(r.rc, r.status)
        res.interrupted_by = stop.signum
        return res
    finally:
        shutil.rmtree(pdd, ignore_errors=True)


# ansible-runner starts ansible-playbook through pexpect in a session of its own with SIGHUP ignored
# (runner.py: ignore_sighup=True), so a `deployer` killed outright (SIGKILL, the OOM killer) left it running on,
# unwatched, while the lock it holds names this process, now dead: the next `up` took the lock over as stale and two
# playbooks acted on the host at once.  The playbook is started through this shim instead: the kernel sends it
# SIGKILL when this process dies (PR_SET_PDEATHSIG, kept across exec), and it never starts when we are already gone.
_BOUND_CHILD = """import ctypes, os, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG
if os.getppid() != int(sys.argv[1]):
    sys.exit(137)   # the deployer died before the line above took effect: never run unwatched
os.execv(sys.argv[2], sys.argv[2:])
"""


def _playbook_bound_to_us(pdd: str, path: str) -> str:
    """``<pdd>/bin/ansible-playbook``: runs the ansible-playbook found on ``path`` with its arguments, killed by
    the kernel when this process dies."""
    import shlex
    real = shutil.which("ansible-playbook", path=path) or "ansible-playbook"
    (Path(pdd) / "bin").mkdir(mode=0o700, exist_ok=True)
    shim = Path(pdd) / "bin" / "ansible-playbook"
    shim.write_text("#!/bin/sh\nexec %s -c %s %d %s \"$@\"\n" % (
        shlex.quote(sys.executable), shlex.quote(_BOUND_CHILD), os.getpid(), shlex.quote(real)))
    shim.chmod(0o700)
    return str(shim)


class _StopOnSignal:
    """While the playbook runs: SIGINT, SIGTERM and SIGHUP ask ansible-runner to stop it (its cancel_callback,
    checked at least once a second: ``pexpect_timeout``), which kills the playbook's process group, and the run
    says so (exit 7, ``interrupted``).  Before, ansible-runner's own handler (SIGINT and SIGTERM only, installed
    for good: ``utils.signal_handler``) cancelled it and the result came back as "no host matched (check the
    inventory...)", exit 2; SIGHUP (a closed terminal) ended this process and left ansible-playbook running on in
    its own session.  What the host is left with is what a controller that died there leaves, which the next
    ``up`` finishes (tests/integration/test_controller_killed.py).  Only in the main thread (Python's rule for
    handlers)."""
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
