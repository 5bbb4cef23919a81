"""What a playbook run said: its event stream (callback ``deployer_events``, ansible-runner's event shapes) folded
into a ``Result`` - failures with no_log output masked, unreachable hosts, the facts the CLI reports, the stats -
and the exit code a cron job acts on.  Pure: fed event dicts (runner.py feeds it)."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import IntEnum


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
            # deployer_checks: the check that refused, not the task that holds the checks
            self.failures.append(Failure(host, res.get("check") or data.get("task", "?"), data.get("role", ""),
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
