"""What the operator sees while a playbook runs, built from its event stream (deployer/runner.py).

Human output reads like a deploy, not a task dump: one line per stage and host when the stage ends
(seconds, outcome: changed / unchanged / failed / skipped, and what the stage said), the model
load's progress with a counting-down ETA, then the result.  Task titles only with ``-v``.
``--json``: one JSON object per line (phases, stage ends, tasks, result).

Stages are the roles of ``playbooks/up.yml`` (``STAGES``); the role a task belongs to comes with
every event, so nothing here depends on task names.
"""
from __future__ import annotations

import json
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import ProgressColumn
from rich.text import Text

from deployer.host.module_utils import formats

# What a terminal would act on, in text a host, an engine or a model wrote: every control character the line formats
# refuse (formats.py: C0 - ESC starts CSI/OSC sequences: clear the screen, set the title, OSC 52 writes the
# clipboard -, DEL, C1 - U+009B is a one-byte CSI -, U+2028/9) but tab and line feed, and the bidirectional
# overrides and marks that make a line read other than its bytes, and what prints as nothing (issue 53 N14): LRM,
# RLM, ALM, zero-width spaces and joiners, the word joiner and invisible operators, BOM, soft hyphen, tag characters.
_TERMINAL_CONTROL = re.compile(f"(?![\t\n]){formats.CONTROL.pattern}|[\u202a-\u202e\u2066-\u2069\u200b-\u200f"
                               "\u061c\u00ad\u2060-\u2064\ufeff\U000e0000-\U000e007f]")
SHOWN_CHARS = 16000     # a 40-line journal tail fits; one 48 KB journal line does not flood the terminal


def literal(text, block: bool = True, limit: int = SHOWN_CHARS) -> str:
    """Text from a host shown as data: terminal control removed (line feed and tab kept in a ``block``, all
    blank runs made one space otherwise), at most ``limit`` characters.  For ``Console.out`` (no markup)."""
    text = _TERMINAL_CONTROL.sub("", str(text))
    if not block:
        text = " ".join(text.split())
    if len(text) > limit:
        text = f"{text[:limit]} ... ({len(text) - limit} more characters not shown)"
    return text


def lit(text, block: bool = False) -> str:
    """``literal`` and escaped for Rich markup: a host's words inside a line that has markup of its own
    (``[/INST]``, ``[/]`` or ``[rank0]:`` print as written, never as a style or a MarkupError)."""
    return escape(literal(text, block))


# emoji off: a host's ":white_check_mark: deploy OK" prints as written, never as a mark of the deployer's own
err = Console(stderr=True, highlight=False, soft_wrap=True, emoji=False)
# a pipe or a log file gets every column of a table (rich would squeeze it into 80)
out = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 200, emoji=False)

# role -> stage name shown to the operator (the order of playbooks/up.yml)
def _stages() -> dict:
    """role -> the stage word printed for it.  Each stage role names its stage once, in its meta/main.yml (its
    dependency on the ``stage`` role, which times it for the audit line); the balancer's tasks show as its own."""
    import yaml
    out = {}
    for meta in sorted((Path(__file__).resolve().parent.parent / "roles").glob("*/meta/main.yml")):
        for dep in (yaml.safe_load(meta.read_text()) or {}).get("dependencies") or []:
            if isinstance(dep, dict) and dep.get("role") == "stage":
                out[meta.parent.parent.name] = str(dep["stage_name"])
    out.setdefault("balancer", "balancer")
    return out


STAGES = _stages()
ROLLBACK_TASKS = "/roles/release/tasks/rollback.yml"
QUIET_MSGS = ("All assertions passed", "All items completed")
SET_FACT = ("ansible.builtin.set_fact", "set_fact")
DEBUG = ("ansible.builtin.debug", "debug")
ASSERT = ("ansible.builtin.assert", "assert")
NOOP_CHECK = "deployer_noop_check"     # its msg, when there is nothing to do, is a note like a debug task's
CHECKS = "deployer_checks"             # its notes, each a note like an assert's success_msg


def fmt_seconds(s: float) -> str:
    s = int(round(max(0.0, s)))
    return f"{s // 60}m{s % 60:02d}s"


def eta_text(eta: float | None, overdue: float | None) -> str:
    """``ETA 1m35s``; when the current phase already runs longer than last time, say so."""
    if eta is None:
        return ""
    text = f"ETA {fmt_seconds(eta)}"
    if overdue:
        text += f" (this phase {fmt_seconds(overdue)} past the last load's)"
    return text


def stage_of(data: dict) -> str | None:
    role = data.get("role") or ""
    if role == "release" and ROLLBACK_TASKS in (data.get("task_path") or ""):
        return "rollback"
    return STAGES.get(role)


@dataclass
class _Stage:
    name: str
    started: float
    ok: int = 0
    changed: bool = False
    failed: bool = False
    notes: list = field(default_factory=list)

    def outcome(self) -> str:
        if self.failed:
            return "failed"
        if self.changed:
            return "changed"
        return "unchanged" if self.ok else "skipped"


class Display:
    """Callable event handler for ``runner.run(on_event=...)``."""

    def __init__(self, as_json: bool, verbose: int = 0, console: Console | None = None):
        self.as_json = as_json
        self.verbose = verbose
        self.con = console or err
        self.t0 = time.time()
        self.stages: dict[str, _Stage] = {}
        self.tasks_shown: set = set()
        self.last_watch: dict = {}
        self.phases_shown: dict[str, set] = {}   # per host: load phases already reported
        self.live = None
        self.bars: dict = {}
        if not as_json and self.con.is_terminal:
            from rich.progress import BarColumn, Progress, TextColumn
            # host and description are escaped where they are set (lit)
            self.live = Progress(TextColumn("[magenta]{task.fields[host]}[/]"), TextColumn("{task.description}"),
                                 BarColumn(), TextColumn("{task.fields[detail]}"), _EtaColumn(),
                                 console=self.con, transient=True)

    # ------------------------------------------------------------------ output primitives
    def line(self, text: str) -> None:
        (self.live.console if self.live else self.con).print(text, highlight=False)

    def emit(self, obj: dict) -> None:
        obj = dict(obj, t=round(time.time() - self.t0, 2), ts=round(time.time(), 3))
        sys.stdout.write(json.dumps(obj, default=str) + "\n")
        sys.stdout.flush()

    # ------------------------------------------------------------------ stages
    def _open(self, host: str, stage: str) -> _Stage:
        cur = self.stages.get(host)
        if cur and cur.name == stage:
            return cur
        if cur:
            self._close(host)
        cur = self.stages[host] = _Stage(stage, time.time())
        return cur

    def _close(self, host: str) -> None:
        st = self.stages.pop(host, None)
        if not st:
            return
        secs = time.time() - st.started
        if self.as_json:
            self.emit({"event": "stage", "host": host, "stage": st.name, "outcome": st.outcome(),
                       "seconds": round(secs, 2), "notes": st.notes})
            return
        color = {"failed": "red", "changed": "yellow", "unchanged": "green", "skipped": "dim"}[st.outcome()]
        first = lit(st.notes[0]) if st.notes else ""
        self.line(f"[dim]{time.time() - self.t0:6.1f}s[/] [magenta]{lit(host)}[/] {st.name:<9} "
                  f"[{color}]{st.outcome():<9}[/] {secs:5.1f}s  {first}")
        for n in st.notes[1:]:
            self.line(f"{'':>47}{lit(n)}")

    def _note(self, host: str, stage: str | None, msg) -> None:
        text = " ".join(str(m) for m in msg) if isinstance(msg, list) else str(msg)
        text = " ".join(text.split())
        if not text or text in QUIET_MSGS:
            return
        if stage and host in self.stages:
            self.stages[host].notes.append(text)
        elif self.as_json:
            self.emit({"event": "note", "host": host, "msg": text})
        else:
            self.line(f"[dim]{time.time() - self.t0:6.1f}s[/] [magenta]{lit(host)}[/] {lit(text)}")

    # ------------------------------------------------------------------ the load
    def phase(self, host: str, res: dict) -> None:
        key = (res.get("phase"), res.get("percent"), int(res.get("elapsed_seconds") or 0) // 5)
        if key == self.last_watch.get(host):
            return
        self.last_watch[host] = key
        # a phase that began and ended between two polls is reported too (from the journal's phase_seconds, in
        # the order the engine went through them), so that the record of a load names every phase it passed
        shown = self.phases_shown.setdefault(host, set())
        for passed, seconds in (res.get("phase_seconds") or {}).items():
            if passed in shown or passed == res.get("phase"):
                continue
            shown.add(passed)
            self._passed_phase(host, passed, seconds, res)
        shown.add(res.get("phase"))
        if self.as_json:
            self.emit({"event": "phase", "host": host, "phase": res.get("phase"), "percent": res.get("percent"),
                       "progress": res.get("progress"), "elapsed_seconds": res.get("elapsed_seconds"),
                       "eta_seconds": res.get("eta_seconds"), "overdue_seconds": res.get("overdue_seconds")})
            return
        pct = res.get("percent")
        prog = f" ({lit(res['progress'][0])}/{lit(res['progress'][1])})" if res.get("progress") else ""
        title = lit(res.get("phase_title", res.get("phase")))
        elapsed = f"{res.get('elapsed_seconds', 0):.0f}s"
        eta, overdue = res.get("eta_seconds"), res.get("overdue_seconds")
        if self.live:
            if not self.live.live.is_started:
                self.live.start()
            label = "prewarm" if res.get("phase") == "prewarm" else "load"
            fields = dict(description=f"{label}: {title}{prog}", total=100 if pct is not None else None,
                          completed=pct or 0, detail=elapsed,
                          eta_at=(time.time() + eta) if eta is not None else None, overdue=overdue)
            if host not in self.bars:
                self.bars[host] = self.live.add_task(fields.pop("description"), host=lit(host), **fields)
            else:
                self.live.update(self.bars[host], **fields)
        else:
            pct_s = f" {pct:.0f}%" if pct is not None else ""
            e = eta_text(eta, overdue)
            label = "prewarm" if res.get("phase") == "prewarm" else "load"
            eta = ", " + e if e else ""
            self.line(f"{'':>8}[magenta]{lit(host)}[/] {label}: {title}{pct_s}{prog} [dim]{elapsed}{eta}[/]")

    def _passed_phase(self, host: str, phase: str, seconds, res: dict) -> None:
        if self.as_json:
            self.emit({"event": "phase", "host": host, "phase": phase, "percent": 100, "progress": None,
                       "elapsed_seconds": res.get("elapsed_seconds"), "eta_seconds": 0, "overdue_seconds": None,
                       "passed_seconds": seconds})
        elif not self.live:
            from deployer.host.module_utils.engine_logs import PHASE_TITLES
            label = "prewarm" if phase == "prewarm" else "load"
            took = f"{float(seconds):.0f}s" if isinstance(seconds, (int, float)) else "?"
            self.line(f"{'':>8}[magenta]{lit(host)}[/] {label}: {lit(PHASE_TITLES.get(phase, phase))} done "
                      f"[dim]{took}[/]")

    def _watch_done(self, host: str, res: dict) -> None:
        if self.live and host in self.bars:
            self.live.remove_task(self.bars.pop(host))
        if self.as_json:
            self.emit({"event": "watch_done", "host": host, "state": res.get("state"), "phase": res.get("phase"),
                       "reason": res.get("reason"), "elapsed_seconds": res.get("elapsed_seconds"),
                       "phase_seconds": res.get("phase_seconds")})
            return
        if res.get("state") != "ready":  # a ready load is reported by the watch stage's own line
            self._note(host, stage_of({"role": "watch"}), f"{res.get('state')}: {res.get('reason')}")

    # ------------------------------------------------------------------ events
    def __call__(self, ev: dict) -> None:
        data = ev.get("event_data", {})
        kind = ev.get("event", "")
        host = data.get("host")
        stage = stage_of(data)
        res = data.get("res", {}) or {}
        action = data.get("task_action")
        if kind == "runner_on_start" and host and stage:
            self._open(host, stage)
        elif kind == "runner_retry" and data.get("role") in ("watch", "release", "prewarm"):
            self.phase(host, res)
        elif kind in ("runner_on_ok", "runner_on_failed", "runner_on_unreachable"):
            st = self._open(host, stage) if stage else None
            failed = kind != "runner_on_ok" and not data.get("ignore_errors")
            if st:
                st.ok += 1
                st.failed |= failed
                st.changed |= bool(res.get("changed")) and action not in SET_FACT
            self._verbose_task(data, kind)
            if res.get("diff") and not self.as_json:
                self._diff(host, res["diff"])
            if action == "engine_watch" and kind == "runner_on_ok":
                self._watch_done(host, res)
            elif action == CHECKS:     # its notes, also those said before the check that refused
                for note in res.get("notes") or []:
                    self._note(host, stage, note)
            elif kind == "runner_on_ok" and (action in DEBUG or (action in ASSERT + (NOOP_CHECK,) and res.get("msg"))):
                if res.get("msg") is not None and not res.get("skipped"):
                    self._note(host, stage, res["msg"])
            if self.as_json:
                self.emit({"event": kind.replace("runner_on_", "task_"), "host": host, "role": data.get("role"),
                           "task": data.get("task"), "action": action, "changed": res.get("changed")})
        elif kind == "runner_on_skipped" and self.as_json:
            self.emit({"event": "task_skipped", "host": host, "role": data.get("role"), "task": data.get("task")})
        elif kind == "playbook_on_stats":
            for h in list(self.stages):
                self._close(h)
            if self.live and self.live.live.is_started:
                self.live.stop()

    def _diff(self, host: str, diffs) -> None:
        """--diff: what a task changed (or would change), as a unified diff.  Tasks that touch secrets set
        diff: false / no_log, so nothing secret arrives here."""
        import difflib
        for d in diffs if isinstance(diffs, list) else [diffs]:
            if not isinstance(d, dict) or "before" not in d or "after" not in d:
                continue
            before, after = str(d.get("before") or ""), str(d.get("after") or "")
            if before == after:
                continue
            lines = difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True),
                                         str(d.get("before_header") or "before"), str(d.get("after_header") or "after"))
            text = "".join(lines).rstrip("\n")
            if text:
                self.line(f"{'':>8}[magenta]{lit(host)}[/] diff:")
                (self.live.console if self.live else self.con).out(literal(text), highlight=False)

    def _verbose_task(self, data: dict, kind: str) -> None:
        if not self.verbose or self.as_json:
            return
        task, uuid = data.get("task", ""), data.get("task_uuid") or data.get("task", "")
        if uuid in self.tasks_shown or task.startswith("Validating arguments against arg spec"):
            return
        self.tasks_shown.add(uuid)
        self.line(f"[dim]{time.time() - self.t0:6.1f}s   task: {lit(data.get('role') or 'play')} / {lit(task)}[/]")


class _EtaColumn(ProgressColumn):
    """A rich progress column whose ETA counts down between watch events (and says when it is passed)."""

    def render(self, task) -> Text:
        at = task.fields.get("eta_at")
        if at is None:
            return Text("")
        left = at - time.time()
        overdue = task.fields.get("overdue") or 0
        if left < 0:
            return Text(f"{fmt_seconds(-left)} past ETA", style="yellow")
        return Text(eta_text(left, overdue), style="yellow" if overdue else "cyan")
