"""deployer schedule add|list|remove|run: the CLI over deployer/schedule.py."""
from __future__ import annotations

import datetime
import json
import re
import sys
from typing import Annotated, Optional

import typer

from deployer import schedule as sc
from deployer.cli.targets import (
    SECRET_ENV,
    Extra,
    Host,
    Inventory,
    Json,
    Key,
    Port,
    Sandbox,
    Target,
    User,
    die,
    parse_extra,
)
from deployer.events import Exit
from deployer.output import lit, out

app = typer.Typer(no_args_is_help=True, help="Scheduled redeploys (systemd timer, or cron without systemd).")


def _get(sid: str) -> tuple[dict, sc.Schedule]:
    items = sc.load()
    if sid not in items:
        die(Exit.USAGE, f"no schedule {sid!r} (see `deployer schedule list`)")
    return items, items[sid]


@app.command("add")
def add(
    at: Annotated[str, typer.Option("--at", help="'Sun 03:00', 'Mon,Thu 02:30', 'daily 03:00'.")],
    host: Host = None, port: Port = 22, user: User = "root", key: Key = None,
    inventory: Inventory = None, sandbox: Sandbox = False,
    if_changed: Annotated[bool, typer.Option("--if-changed", help="Redeploy only when the desired release "
                                                                   "differs.")] = False,
    window: Annotated[Optional[str], typer.Option("--window", help="Only act between HH:MM-HH:MM "
                                                                   "(controller time).")] = None,
    webhook: Annotated[Optional[str], typer.Option("--webhook", help="POST the result as JSON to this URL.")] = None,
    extra: Extra = None,
):
    """Schedule a non-interactive `deployer up` (JSON output and stderr to a log)."""
    target = Target(host, port, user, key, inventory, sandbox).schedule_words()
    name = secret_in_extra(extra or [])
    if name:
        way = (f"use {SECRET_ENV[name]} in the scheduler's environment or a vault file" if name in SECRET_ENV else
               "keep it in the inventory (a file only you can read) or a vault file")
        die(Exit.USAGE, f"-e: {name} is a secret and secrets are not stored in schedules; {way}")
    if webhook and not webhook.startswith(("https://", "http://")):
        die(Exit.USAGE, f"--webhook {sc.redact_url(webhook)}: expected an http(s):// URL")
    s = sc.Schedule(id=sc.new_id(), at=at, target=target, if_changed=if_changed, window=window, webhook=webhook,
                    extra=sc.absolute_extra(list(extra or [])))
    try:
        how = sc.install(s)
    except sc.ScheduleError as e:
        die(Exit.USAGE, str(e))
    items = sc.load()
    items[s.id] = s
    sc.save(items)
    out.print(lit(f"schedule {s.id}: {how}; log {s.log_path()}"))


def secret_in_extra(extra: list[str]) -> str:
    """The first secret setting in ``extra`` in any form ansible-playbook takes (``k=v``, a JSON/YAML mapping,
    ``@file``), or "" when none.  Read by the parser the scheduled run uses (``parse_extra``, the environment
    left out): what it refuses - a mapping or file that cannot be parsed, which might hide a secret - is refused
    now (exit 2, nothing installed), not at 3 a.m."""
    for n, v in parse_extra(extra, from_env=False).items():
        if n in SECRET_ENV:
            return n
        why = _secret_like(n, v)
        if why:
            return why
    return ""


# Undeclared secrets (issue 53 N13): a setting or an environment variable named like one, a URL with credentials
_SECRET_NAME = re.compile(r"(?i)(password|passwd|secret|token|api[_-]?key|_key)$|password")
_URL_CREDENTIALS = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/@\s]*:[^/@\s]*@")


def _secret_like(name, value) -> str:
    """Why ``name``/``value`` is a secret by its look, or "" (a mapping's keys and values are looked into)."""
    if isinstance(value, dict):
        return next((f"{name}.{k}" for k, v in value.items() if _secret_like(str(k), v)), "")
    if isinstance(value, list):
        return next((name for v in value if _secret_like("", v)), "")
    if name and _SECRET_NAME.search(str(name)):
        return name
    return name or "a value" if isinstance(value, str) and _URL_CREDENTIALS.search(value) else ""


@app.command("list")
def list_(as_json: Json = False):
    """The schedules on this machine."""
    items = sc.load()
    if as_json:
        sys.stdout.write(json.dumps([sc.public_view(v) for v in items.values()]) + "\n")
        return
    for s in items.values():
        out.print(lit(f"{s.id}  at {s.at}  {' '.join(s.target)}  if-changed={s.if_changed}  window={s.window or '-'}"))


@app.command("remove")
def remove(sid: str = typer.Argument(...)):
    """Remove a schedule and its timer or crontab entry."""
    items, _s = _get(sid)
    sc.uninstall(sid)
    del items[sid]
    sc.save(items)
    out.print(f"removed schedule {sid}")


@app.command("run")
def run(sid: str = typer.Argument(...)):
    """What the timer/cron runs: window check, `up --json`, log (stdout and stderr), webhook.  Exit code = up's."""
    _items, s = _get(sid)
    raise typer.Exit(sc.run_now(s, datetime.datetime.now(), say=lambda m: out.print(m, markup=False)))
