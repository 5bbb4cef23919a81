"""Run the project's playbooks with ansible-runner and turn its event stream into progress.

The CLI never executes tasks itself: Ansible does, exactly as plain ``ansible-playbook`` would
(same ansible.cfg, roles, modules).  This module only builds the invocation and reads events.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
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
           # ansible-playbook from this venv, ssh from the system: never whichever the caller's PATH finds first
           "PATH": tools.subprocess_path()}
    try:
        r = ansible_runner.run(
            private_data_dir=pdd, project_dir=str(ROOT), playbook=str(PLAYBOOKS / playbook),
            inventory=inventory, extravars=extravars or {}, limit=limit,
            cmdline=" ".join(cmdline) or None, envvars=env, event_handler=handler, quiet=True,
            verbosity=verbosity or None, suppress_env_files=False,
        )
        return collect.result(r.rc, r.status)
    finally:
        shutil.rmtree(pdd, ignore_errors=True)
