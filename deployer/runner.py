"""Run the project's playbooks with ansible-playbook and turn its event stream into progress.

The CLI never executes tasks itself: Ansible does, exactly as plain ``ansible-playbook`` would
(same ansible.cfg, roles, modules).  This module only builds the invocation and reads events.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import stat
import sys
import tempfile
from pathlib import Path
from typing import Callable

from deployer import tools
from deployer.bound_process import StopOnSignal, stream
from deployer.events import Collector, Result

ROOT = Path(__file__).resolve().parent.parent
PLAYBOOKS = ROOT / "playbooks"
ANSIBLE_CFG = ROOT / "ansible.cfg"


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
    stop = StopOnSignal()
    try:
        with stop:
            rc = stream(argv, env, handler, stop)
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
_OFF_WORDS = ("no", "off", "false")
_KNOWN_HOSTS_KEYS = ("userknownhostsfile", "globalknownhostsfile")


def _ssh_options(value: str):
    """The ``-o`` options and the ``-F`` files of an ssh argument string, as ssh reads them (issue 53 N7: a regex
    let ``-F cfg``, ``/dev//null`` and ``/dev/./null`` through): [(key lowercased, value)], or ValueError."""
    words, opts = shlex.split(value), []
    i = 0
    while i < len(words):
        w = words[i]
        if w in ("-o", "-F"):
            if i + 1 >= len(words):
                raise ValueError(f"{w} without a value")
            w, i = w + words[i + 1], i + 1
        if w.startswith("-F"):
            opts.append(("-f", w[2:]))
        elif w.startswith("-o"):
            # ssh_config(5): a keyword, then blanks or one '=' (blanks around it), then the value
            m = re.match(r"\s*([A-Za-z]+)\s*(?:=\s*|\s+)?(.*)$", w[2:])
            key, val = (m.group(1), m.group(2).strip().strip("\"'")) if m else (w[2:], "")
            opts.append((key.lower(), val))
        i += 1
    return opts


def _null_or_missing(paths: str) -> bool:
    """Whether ssh could never keep a key it accepts in these known-hosts files (/dev/null, /proc, a missing
    folder): accept-new would then take whatever key a host shows, every run."""
    for p in paths.split():
        real = os.path.realpath(os.path.expanduser(p))
        if real == "/dev/null" or real.startswith(("/proc/", "/dev/", "/sys/")) or not (
                os.path.isfile(real) or os.path.isdir(os.path.dirname(real))):
            return True
    return False


def host_key_overrides(environ) -> list[str]:
    """One refusal per caller variable that would turn ssh's host-key check off, or hand it to something the deployer
    cannot read (the value is not shown)."""
    out, tail = [], ("the deployer checks SSH host keys whatever the environment says; unset it (for a new host: "
                     "--trust-new-host, which still refuses a changed key)")
    for name in SSH_ARG_VARIABLES:
        try:
            opts = _ssh_options(environ.get(name) or "")
        except ValueError:
            out.append(f"{name} cannot be read as ssh reads it (an unclosed quote): {tail}")
            continue
        keys = dict(opts)
        why = None
        if "-f" in keys:
            why = "names an ssh configuration file (-F), which may turn the host-key check off"
        elif keys.get("stricthostkeychecking", "").lower() in _OFF_WORDS:
            why = "sets StrictHostKeyChecking so that host keys go unchecked"
        else:
            for k, v in opts:
                if k in _KNOWN_HOSTS_KEYS and os.path.realpath(os.path.expanduser(v.split()[0] if v else "")) \
                        == "/dev/null":
                    why = f"sets {dict(userknownhostsfile='UserKnownHostsFile').get(k, 'GlobalKnownHostsFile')} " \
                          "so that host keys go unchecked (/dev/null)"
                elif k in _KNOWN_HOSTS_KEYS and keys.get("stricthostkeychecking", "").lower() == "accept-new" \
                        and _null_or_missing(v):
                    why = ("sets StrictHostKeyChecking=accept-new with a known-hosts file ssh cannot keep a key in: "
                           "every run would take whatever key a host shows")
        if why:
            out.append(f"{name} {why}: {tail}")
    exe = environ.get("ANSIBLE_SSH_EXECUTABLE")
    if exe:
        ssh = tools.find("ssh")
        if not ssh or os.path.realpath(exe if os.sep in exe else (shutil.which(exe) or exe)) != os.path.realpath(ssh):
            out.append("ANSIBLE_SSH_EXECUTABLE names another ssh program than the system's, which may not check host "
                       f"keys: {tail}")
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
