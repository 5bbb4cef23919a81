"""Scheduled redeploys on the controller: definitions, time windows, cron lines and systemd timers.

Pure functions (parsing, rendering, window checks) plus small installers: a systemd timer where the
controller runs systemd, a crontab entry where it does not.  The scheduled command is always
``deployer schedule run ID``, which checks the window, runs a non-interactive ``up --json`` and reports.
"""
from __future__ import annotations

import json
import os
import re
import socket
import stat
import subprocess
import sys
import uuid
from dataclasses import asdict, dataclass, field
from datetime import datetime
from datetime import time as dtime
from pathlib import Path

from deployer import tools
from deployer.events import Exit
from deployer.host.module_utils import formats

CONFIG = Path(os.environ.get("XDG_CONFIG_HOME", Path.home() / ".config")) / "deployer" / "schedules.json"
STATE = Path(os.environ.get("XDG_STATE_HOME", Path.home() / ".local" / "state")) / "deployer"
DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
CRON_DOW = {"sun": 0, "mon": 1, "tue": 2, "wed": 3, "thu": 4, "fri": 5, "sat": 6}
MARK = "# deployer-schedule:"


class ScheduleError(ValueError):
    pass


@dataclass
class Schedule:
    id: str
    at: str
    target: list[str]                 # deployer up target options, e.g. ["--host", "10.0.0.5"]
    if_changed: bool = False
    window: str | None = None         # "02:00-05:00"
    webhook: str | None = None
    extra: list[str] = field(default_factory=list)   # -e k=v items

    def log_path(self) -> Path:
        return STATE / f"schedule-{self.id}.log"


def parse_at(at: str) -> tuple[list[str], int, int]:
    """'Sun 03:00' | 'Mon,Thu 02:30' | 'daily 03:00' | '03:00' -> (days, hour, minute); days [] = every day."""
    # blanks only (never \s: it matches \n and \r, and --at reaches the timer's Description= line)
    m = re.fullmatch(r" *(?:(daily|[A-Za-z]{3}(?:,[A-Za-z]{3})*) +)?(\d{1,2}):(\d{2}) *", at or "")
    if not m:
        raise ScheduleError(f"--at {at!r}: expected e.g. 'Sun 03:00', 'Mon,Thu 02:30', 'daily 03:00' or '03:00'")
    days = [] if m.group(1) in (None, "daily") else [d.lower() for d in m.group(1).split(",")]
    for d in days:
        if d not in DAYS:
            raise ScheduleError(f"--at {at!r}: unknown day {d!r}; expected one of {', '.join(DAYS)}")
    hour, minute = int(m.group(2)), int(m.group(3))
    if hour > 23 or minute > 59:
        raise ScheduleError(f"--at {at!r}: time out of range")
    return days, hour, minute


def parse_window(window: str) -> tuple[dtime, dtime]:
    m = re.fullmatch(r"(\d{1,2}):(\d{2})-(\d{1,2}):(\d{2})", window or "")
    if not m:
        raise ScheduleError(f"--window {window!r}: expected HH:MM-HH:MM, e.g. 02:00-05:00")
    a, b = dtime(int(m.group(1)), int(m.group(2))), dtime(int(m.group(3)), int(m.group(4)))
    return a, b


def in_window(window: str | None, now: datetime) -> bool:
    """True when ``now`` (controller local time) falls in the window; windows may wrap midnight."""
    if not window:
        return True
    a, b = parse_window(window)
    t = now.time()
    return a <= t < b if a <= b else (t >= a or t < b)


def cron_line(s: Schedule, deployer: str) -> str:
    """The crontab entry (crontab(5)): every word through formats.cron_word (shell-quoted, ``%`` escaped, no
    control character)."""
    days, hour, minute = parse_at(s.at)
    dow = ",".join(str(CRON_DOW[d]) for d in days) if days else "*"
    path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # cron's own PATH lacks sbin
    try:
        words = [formats.cron_word(w, "schedule command word") for w in (deployer, "schedule", "run", s.id)]
        log = formats.cron_word(str(s.log_path()), "schedule log path")
    except formats.FormatError as e:
        raise ScheduleError(str(e)) from e
    return f"{minute} {hour} * * {dow} /usr/bin/env PATH={path} {' '.join(words)} >> {log} 2>&1 {MARK}{s.id}"


def on_calendar(s: Schedule) -> str:
    days, hour, minute = parse_at(s.at)
    d = ",".join(x.capitalize() for x in days)
    return f"{d + ' ' if d else ''}*-*-* {hour:02d}:{minute:02d}:00"


def timer_units(s: Schedule, deployer: str) -> dict[str, str]:
    """The timer and its service: ExecStart= words through formats.unit_word, Description= through unit_value."""
    name = f"deployer-schedule-{s.id}"
    try:
        exec_start = " ".join(formats.unit_word(w, "schedule command word")
                              for w in (deployer, "schedule", "run", s.id))
        sid, at = formats.unit_value(s.id, "schedule id"), formats.unit_value(s.at, "--at")
    except formats.FormatError as e:
        raise ScheduleError(str(e)) from e
    return {
        f"{name}.service": (f"[Unit]\nDescription=deployer scheduled redeploy {sid}\n\n[Service]\nType=oneshot\n"
                            f"ExecStart={exec_start}\n"),
        f"{name}.timer": (f"[Unit]\nDescription=deployer scheduled redeploy {sid} ({at})\n\n[Timer]\n"
                          f"OnCalendar={on_calendar(s)}\nPersistent=false\n\n[Install]\nWantedBy=timers.target\n"),
    }


def redact_url(url: str | None) -> str:
    """A webhook URL as it may be shown or logged: scheme and host only (its path and query are often the
    secret: a token in the path, a signature in the query)."""
    if not url:
        return ""
    from urllib.parse import urlsplit
    try:
        u = urlsplit(url)
        host = u.hostname or "?"
        if u.port:
            host += f":{u.port}"
    except ValueError:
        return "<unparseable URL>"
    return f"{u.scheme}://{host}/..."


def public_view(s: Schedule) -> dict:
    """What `schedule list --json` prints: everything but the webhook's secret parts."""
    return dict(asdict(s), webhook=redact_url(s.webhook) or None)


def absolute_extra(extra: list[str]) -> list[str]:
    """``-e @file`` made absolute: a scheduled run starts in ``/``, so a relative path would name another file."""
    return [f"@{Path(e[1:]).expanduser().resolve()}" if e.startswith("@") else e for e in extra]


# ------------------------------------------------------------------ storage and installation
def load() -> dict[str, Schedule]:
    try:
        raw = json.loads(CONFIG.read_text())
    except (OSError, ValueError):
        return {}
    return {k: Schedule(**v) for k, v in raw.items()}


def save(items: dict[str, Schedule]) -> None:
    """Written 0600 in a 0700 directory: a webhook URL is often a secret (a token in its path)."""
    CONFIG.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(CONFIG.parent, 0o700)
    tmp = CONFIG.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(json.dumps({k: asdict(v) for k, v in items.items()}, indent=2))
    tmp.replace(CONFIG)


def systemd_running() -> bool:
    systemctl = tools.find("systemctl")
    if not systemctl or not os.path.isdir("/run/systemd/system"):
        return False
    r = subprocess.run([systemctl, "is-system-running"], capture_output=True, text=True)
    return r.stdout.strip() in ("running", "degraded", "starting")


def deployer_path() -> str:
    return str(Path(sys.executable).parent / "deployer")


def _crontab() -> list[str]:
    r = subprocess.run([tools.system("crontab"), "-l"], capture_output=True, text=True)
    return r.stdout.splitlines() if r.returncode == 0 else []


def _set_crontab(lines: list[str]) -> None:
    subprocess.run([tools.system("crontab"), "-"], input="\n".join(lines) + "\n", text=True, check=True)


def _not_ours_alone(path, me: int) -> str:
    """Why another local user could change ``path`` itself (owned by another user, or group/other-writable without
    the sticky bit), "" when not; a path that cannot be read is left to the caller's next one."""
    try:
        st = os.lstat(path)
    except OSError:
        return ""
    if st.st_uid not in (0, me):
        return f"{path} belongs to uid {st.st_uid}"
    sticky_dir = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX
    if st.st_mode & 0o022 and not sticky_dir and not stat.S_ISLNK(st.st_mode):
        return f"{path} is writable by its group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    return ""


def writable_by_another(path: str) -> str:
    """Why another local user could change what ``path`` names (it or a directory above it owned by another user,
    or group/other-writable without the sticky bit), or "" when only root and this user can.  A schedule runs
    these paths unattended with this user's rights (root's, for a timer): whoever can write them runs as us."""
    me = os.geteuid()
    seen = set()
    for p in (Path(os.path.abspath(path)), Path(path).resolve()):
        for part in [*reversed(p.parents), p]:
            if part in seen:
                continue
            seen.add(part)
            why = _not_ours_alone(part, me)
            if why:
                return why
    return ""


def writable_in_tree(path: str, limit: int = 200000) -> str:
    """``writable_by_another`` for ``path`` and, when it is a directory, everything under it (``limit`` entries at
    most: past that, said)."""
    why = writable_by_another(path)
    if why or not os.path.isdir(path) or os.path.islink(path):
        return why
    me, n = os.geteuid(), 0
    for top, dirs, files in os.walk(path):
        for name in dirs + files:
            n += 1
            if n > limit:
                return f"{path} holds more than {limit} files: not checked whole"
            why = _not_ours_alone(os.path.join(top, name), me)
            if why:
                return why
    return ""


def _paths_run(s: Schedule) -> list[str]:
    """What a scheduled run executes or reads (issue 53 N5: Ansible templates and runs the inventory's group_vars and
    host_vars, the checkout's ansible.cfg, roles, playbooks and templates, and the venv's packages, as this user):
    the deployer and its Python, the package and the checkout it runs, the venv's site-packages, the files named and
    the inventory's variable folders.  Directories are checked whole (writable_in_tree)."""
    import sysconfig
    words = list(s.target)
    root = Path(__file__).resolve().parent.parent
    paths = [deployer_path(), sys.executable, str(Path(__file__).resolve().parent), sysconfig.get_paths()["purelib"]]
    paths += [str(root / n) for n in ("ansible.cfg", "roles", "playbooks", "templates") if (root / n).exists()]
    for i, w in enumerate(words[:-1]):
        if w in ("-i", "--key"):
            paths.append(words[i + 1])
        if w == "-i":
            inv = Path(words[i + 1])
            base = inv if inv.is_dir() else inv.parent
            paths += [str(base / d) for d in ("group_vars", "host_vars") if (base / d).exists()]
    return paths + [e[1:] for e in s.extra if e.startswith("@")]


def unsafe_paths(s: Schedule) -> str:
    """The first reason another local user could change what this schedule runs, or ""."""
    for p in _paths_run(s):
        why = writable_in_tree(p)
        if why:
            return f"{p}: {why}"
    return ""


def install(s: Schedule) -> str:
    """Install the trigger; returns a description of what was installed.  A timer (systemd, when this is root) or
    this user's crontab entry; refused when another user could change what it runs."""
    parse_at(s.at)
    if s.window:
        parse_window(s.window)
    why = unsafe_paths(s)
    if why:
        raise ScheduleError(f"{why}; a scheduled run would execute or read it unattended as "
                            f"{'root' if os.geteuid() == 0 else 'this user'}: make it yours alone, or schedule "
                            "from an install that is")
    if systemd_running() and os.geteuid() == 0:     # else this user's crontab: /etc/systemd/system is root's
        d = Path("/etc/systemd/system")
        for name, text in timer_units(s, deployer_path()).items():
            (d / name).write_text(text)
        systemctl = tools.system("systemctl")
        subprocess.run([systemctl, "daemon-reload"], check=True)
        subprocess.run([systemctl, "enable", "--now", f"deployer-schedule-{s.id}.timer"], check=True)
        return f"systemd timer deployer-schedule-{s.id}.timer (OnCalendar={on_calendar(s)})"
    if not tools.find("crontab"):
        raise ScheduleError("no systemd and no crontab on this machine; install cron (apt-get install cron)")
    lines = [x for x in _crontab() if not x.endswith(MARK + s.id)]
    line = cron_line(s, deployer_path())
    _set_crontab(lines + [line])
    return f"crontab entry: {line}"


def uninstall(sid: str) -> None:
    unit = Path(f"/etc/systemd/system/deployer-schedule-{sid}.timer")
    if unit.exists():
        subprocess.run([tools.system("systemctl"), "disable", "--now", unit.name], check=False)
        unit.unlink()
        Path(f"/etc/systemd/system/deployer-schedule-{sid}.service").unlink(missing_ok=True)
    if tools.find("crontab"):
        lines = _crontab()
        keep = [x for x in lines if not x.endswith(MARK + sid)]
        if keep != lines:
            _set_crontab(keep)


def new_id() -> str:
    return uuid.uuid4().hex[:8]


# ------------------------------------------------------------------ what the timer / cron entry runs
STDERR_TAIL_LINES = 40


def notify(url: str, obj: dict, attempts: int = 3) -> str | None:
    """POST ``obj`` to the webhook with retries and backoff; returns the error text, or None when delivered.
    A notification failure never changes the deploy's outcome."""
    import requests
    from tenacity import retry, stop_after_attempt, wait_exponential

    class NotDelivered(Exception):
        pass

    @retry(stop=stop_after_attempt(attempts), wait=wait_exponential(multiplier=1, max=10), reraise=True)
    def post():
        # never follow a redirect: requests would turn the POST into a GET, whose 200 is no delivery
        r = requests.post(url, json=obj, timeout=10, allow_redirects=False)
        if 300 <= r.status_code < 400:
            raise NotDelivered(f"HTTP {r.status_code} redirect (not followed: a POST is delivered where it was sent)")
        r.raise_for_status()
    try:
        post()
        return None
    except NotDelivered as e:
        return f"{type(e).__name__}: {e}"
    except requests.HTTPError as e:
        return f"HTTPError: HTTP {e.response.status_code if e.response is not None else '?'}"
    except Exception as e:  # noqa: BLE001 - any failure to deliver is reported, never raised
        # the class of the failure only: requests puts the URL's path and query (often the token) in its messages,
        # in forms no replace can catch (the path alone, re-quoted)
        return f"{type(e).__name__} (to {redact_url(url)})"


def summarize(returncode: int, result: dict) -> str:
    if returncode == Exit.LOCKED:
        return "host locked by another run; did nothing"
    if returncode == 0:
        hosts = result.get("hosts") or {}
        live = [h for h, f in hosts.items() if f.get("release_was_live") and not f.get("restarted")]
        return "nothing changed; did nothing" if hosts and len(live) == len(hosts) else "deployed"
    return "deploy failed"


def run_now(s: Schedule, now: datetime, say=print) -> int:
    """One scheduled run: window check, ``deployer up --json``, the log (stdout AND stderr), the webhook.
    Returns ``up``'s exit code (0 when outside the window)."""
    log = s.log_path()
    # the log holds the run's whole output (failure messages, journal tails): this user's alone
    log.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(log.parent, 0o700)
    os.close(os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
    os.chmod(log, 0o600)

    def record(obj: dict, log_only: tuple = ()) -> None:
        obj = dict(obj, schedule=s.id, at=now.isoformat(timespec="seconds"))
        with open(log, "a") as f:
            f.write(json.dumps(obj) + "\n")
        say(json.dumps(obj))
        if s.webhook:
            # what the run printed on stderr stays in the log; the webhook is told where that is
            sent = {k: v for k, v in obj.items() if k not in log_only}
            if log_only:
                sent["log"] = f"{log} on {socket.gethostname()}"
            error = notify(s.webhook, sent)
            if error:
                with open(log, "a") as f:
                    f.write(json.dumps({"event": "webhook_failed", "schedule": s.id, "url": redact_url(s.webhook),
                                        "error": error}) + "\n")
                say(f"webhook failed: {error}")

    if not in_window(s.window, now):
        record({"event": "skipped", "reason": f"outside window {s.window} (now {now:%H:%M})", "exit_code": 0})
        return 0
    # checked again at each run: what was ours at `schedule add` may not be now (a group_vars made writable since)
    why = unsafe_paths(s)
    if why:
        record({"event": "refused", "reason": f"{why}: another user could change what this run executes; "
                                              "nothing was run", "exit_code": 2})
        return 2
    cmd = [deployer_path(), "up", *s.target, "--json"] + (["--if-changed"] if s.if_changed else [])
    for e in s.extra:
        cmd += ["-e", e]
    p = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    result: dict = {}
    for line in p.stdout.splitlines():
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if isinstance(ev, dict) and ev.get("event") == "result":
            result = ev
    with open(log, "a") as f:
        f.write(p.stdout if p.stdout.endswith("\n") or not p.stdout else p.stdout + "\n")
        # a usage error or a traceback goes to stderr: keep it, line by line, marked as such
        for line in p.stderr.splitlines():
            f.write(json.dumps({"event": "stderr", "schedule": s.id, "line": line}) + "\n")
    stderr_tail = p.stderr.splitlines()[-STDERR_TAIL_LINES:]
    record({"event": "scheduled_up", "exit_code": p.returncode, "reason": summarize(p.returncode, result),
            "failures": result.get("failures", []), "hosts": sorted((result.get("hosts") or {}).keys()),
            **({"stderr_tail": stderr_tail} if p.returncode != 0 else {})}, log_only=("stderr_tail",))
    return p.returncode
