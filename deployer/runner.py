"""Run the project's playbooks with ansible-playbook and turn its event stream into progress.

The CLI never executes tasks itself: Ansible does, exactly as plain ``ansible-playbook`` would
(same ansible.cfg, roles, modules).  This module only builds the invocation and reads events.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import Callable

from deployer import pdeathsig, tools

ROOT = Path(__file__).resolve().parent.parent
PLAYBOOKS = ROOT / "playbooks"
ANSIBLE_CFG = ROOT / "ansible.cfg"


class Exit(IntEnum):
    """Exit codes a cron job can act on."""
    OK = 0
    FAILED = 1          # deploy failed after changes; rolled back (or --no-rollback)
    USAGE = 2           # bad input; nothing changed
    PREFLIGHT = 3       # a read-only check failed; nothing changed
    VERIFY = 4          # the engine's own checks, driver floor, toolchain or GPU canary refused; nothing restarted
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
    """Folds the playbook's event stream (callback ``deployer_events``, ansible-runner's event shapes) into a
    ``Result``: failures (with no_log output masked),
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
    """Run ``playbooks/<playbook>`` with ``ansible-playbook`` and fold its events (callback ``deployer_events``,
    one JSON line each on a pipe) into a ``Result``; ``on_event`` sees each event as it comes."""
    reap_run_dirs()
    weakened = host_key_overrides(os.environ)
    if weakened:    # nothing runs: exit 2 (usage), the reason as ansible-playbook's own refusals are shown
        return Result(rc=2, status="refused", errors=weakened)
    # 0700 (mkdtemp): the extra vars, 0600, go here; the pid in the name lets a later run remove it if this one is
    # killed outright (reap_run_dirs)
    pdd = tempfile.mkdtemp(prefix=f"deployer-run-{os.getpid()}-")
    collect = Collector()
    trace = _trace_writer()

    shown = [on_event]

    def handler(ev: dict) -> None:
        collect(ev)
        if shown[0]:
            try:
                shown[0](ev)
            except Exception as e:  # noqa: BLE001 - the display must never stop the playbook (mid-rollback)
                shown[0] = None
                sys.stderr.write(f"deployer: the display failed ({type(e).__name__}: {str(e)[:500]!r}); it is off for "
                                 "the rest of this run, the playbook goes on; its result follows\n")
        if trace:
            trace(ev)

    # ansible-playbook from this venv, ssh from the system: never whichever the caller's PATH finds first
    env = dict(os.environ, ANSIBLE_CONFIG=str(ANSIBLE_CFG), ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1",
               ANSIBLE_HOST_KEY_CHECKING="True", ANSIBLE_RETRY_FILES_ENABLED="False", PATH=tools.subprocess_path())
    extravars = secrets_to_env(extravars or {}, env)
    argv = playbook_argv(playbook, inventory, _extravars_file(pdd, extravars), limit, check, diff, verbosity)
    argv[0] = shutil.which("ansible-playbook", path=env["PATH"]) or argv[0]
    stop = _StopOnSignal()
    try:
        with stop:
            rc = _stream(argv, env, handler, stop)
        res = collect.result(rc, "canceled" if stop.signum else ("successful" if rc == 0 else "failed"))
        res.interrupted_by = stop.signum
        return res
    finally:
        shutil.rmtree(pdd, ignore_errors=True)


# a pid as the kernel makes them (pid_max is at most 2**22): another user's name with a pid beyond a C long made
# os.kill raise OverflowError, and every deployer command runs the reaper first
# Ansible puts these in front of its own ssh options and ssh takes the first value of an option: a
# StrictHostKeyChecking=no or a known-hosts file of /dev/null there would beat the forced host-key check (README:
# host keys are checked whatever the environment says).  Naming a real known-hosts file, or accept-new (a changed
# key still refused, as --trust-new-host), is not turning the check off.
SSH_ARG_VARIABLES = ("ANSIBLE_SSH_ARGS", "ANSIBLE_SSH_COMMON_ARGS", "ANSIBLE_SSH_EXTRA_ARGS")
_HOST_KEY_OFF = re.compile(r"(StrictHostKeyChecking)[\s=]+[\"']?(?:no|off|false)\b|"
                           r"((?:User|Global)KnownHostsFile)[\s=]+[\"']?/dev/null\b", re.I)


def host_key_overrides(environ) -> list[str]:
    """One refusal per caller variable that would turn ssh's host-key check off (the value is not shown)."""
    out = []
    for name in SSH_ARG_VARIABLES:
        m = _HOST_KEY_OFF.search(environ.get(name) or "")
        if m:
            out.append(f"{name} sets {m.group(1) or m.group(2)} so that host keys go unchecked: the deployer checks "
                       "SSH host keys whatever the environment says; unset it (for a new host: --trust-new-host, "
                       "which still refuses a changed key)")
    return out


RUN_DIR = re.compile(r"deployer-run-([1-9][0-9]{0,9})-[^/]+\Z")


def reap_run_dirs(tmp: str | None = None) -> list[str]:
    """Remove the run directories (``deployer-run-<pid>-*``, beside the temporary files) that this user's
    deployers killed outright left behind (no ``finally`` runs on SIGKILL): those whose deployer is gone.  A
    live run's, another user's and anything not a real directory (``/tmp`` is everyone's: a symlink is never
    followed) are left.  Returns the names removed."""
    tmp = tmp or tempfile.gettempdir()
    gone = []
    try:
        names = os.listdir(tmp)
    except OSError:
        return gone
    for name in names:
        m = RUN_DIR.match(name)
        if not m:
            continue
        path = os.path.join(tmp, name)
        try:
            st = os.lstat(path)
            os.kill(int(m.group(1)), 0)
            continue                                    # its deployer (or a process with its pid) still runs
        except ProcessLookupError:
            pass
        except (OSError, OverflowError):                # gone already, a pid of another user's, or none: leave it
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid():
            shutil.rmtree(path, ignore_errors=True)
            gone.append(name)
    return gone


def playbook_argv(playbook: str, inventory: str, extravars_file: str, limit: str | None = None, check: bool = False,
                  diff: bool = False, verbosity: int = 0) -> list[str]:
    """The ``ansible-playbook`` command line of a run (what plain Ansible users type, less the extra vars file)."""
    argv = ["ansible-playbook", "-i", inventory, "-e", "@" + extravars_file]
    if limit is not None:
        argv += ["--limit", limit]
    argv += ["--check"] * check + ["--diff"] * diff
    if verbosity:
        argv.append("-" + "v" * verbosity)
    return argv + [str(PLAYBOOKS / playbook)]


# The secrets among the settings and where the CLI also reads them from.
SECRET_ENV = {"deployer_api_key": "DEPLOYER_API_KEY", "deployer_hf_token": "DEPLOYER_HF_TOKEN"}


def secrets_to_env(extravars: dict, env: dict) -> dict:
    """The extra vars with each secret replaced by an ``env`` lookup of it, its value put into ``env`` (the
    playbook's environment, readable by this user alone, gone with the process).  The extra vars file is the one
    thing a deployer killed outright (SIGKILL, the OOM killer) leaves behind, so a secret is never written there
    (found: a killed run left the API key in ``/tmp/deployer-run-*/extravars.json``).  The lookup keeps the extra
    vars' precedence and the string type, and its result is not templated again (a key holding ``{{`` stays as
    given)."""
    out = dict(extravars)
    for var, name in SECRET_ENV.items():
        if isinstance(out.get(var), str):
            env[name] = out[var]
            out[var] = "{{ lookup('ansible.builtin.env', '%s') }}" % name
    return out


def _extravars_file(pdd: str, extravars: dict) -> str:
    """The extra vars as JSON (types kept: a string stays a string), readable by this user only."""
    path = os.path.join(pdd, "extravars.json")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(extravars, f)
    return path


def _stream(argv: list[str], env: dict, handler: Callable[[dict], None], stop: "_StopOnSignal") -> int:
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


class _StopOnSignal:
    """While the playbook runs: SIGINT, SIGTERM and SIGHUP ask ``_stream`` to stop it (checked at least once a
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
