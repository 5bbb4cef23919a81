"""Commands that act on hosts through the playbooks: up, rollback, watch, unlock; and the final report."""
from __future__ import annotations

import json
import os
import signal
import sys
from typing import Annotated, Optional

import typer

from deployer import runner
from deployer.cli.targets import (
    Extra,
    Host,
    Inventory,
    Json,
    Key,
    Limit,
    Port,
    Sandbox,
    Serial,
    Target,
    TrustNew,
    User,
    die,
    parse_extra,
)
from deployer.events import Exit, Result
from deployer.output import Display, err, lit, literal, out


def lock_note(holder: dict) -> str:
    """Stale or live?  Only the controller that took the lock can tell whether its process is gone
    (deployer.controller_id: machine id, boot id, pid and its start time)."""
    if not holder:
        return ""
    from deployer import controller_id
    state, why = controller_id.holder_state(holder, controller_id.identity(os.getpid()))
    if state == "alive":
        return why + "; wait for it"
    if state == "gone":
        return f"STALE: {why}; `deployer unlock` removes it"
    return f"held from {holder.get('controller')}; if that run died, `deployer unlock` removes it"


def _speculation_note(host: str, r: dict) -> None:
    """Whether EAGLE-3 paid on this host: after a deploy that measured tokens per second, one line; a warning when
    it was slower than the host's own release without it."""
    from deployer.host.module_utils.spec_payoff import describe
    payoff = r.get("speculation_payoff")
    if r.get("tokens_per_second") is None or not r.get("restarted") or (not payoff and not r.get("speculative")):
        return
    line = f"{host}: {describe(payoff, bool(r.get('speculative')))}"
    if payoff and not payoff.get("pays"):
        err.print(f"[bold yellow]warning[/]: {lit(line)}; -e deployer_speculative_enabled=false serves without it",
                  highlight=False)
    else:
        out.print(lit(line), highlight=False)


def report(res: Result, as_json: bool, what: str) -> int:
    """Print the outcome (human or one JSON line) and return the exit code."""
    code = res.exit_code()
    for f in res.failures:
        if f.res.get("locked"):
            f.res["lock_state"] = lock_note(f.res.get("holder") or {})
            f.msg = f"{f.msg}\n{f.res['lock_state']}"
    results = {h: f.get("deployer_result") for h, f in res.facts.items() if f.get("deployer_result")}
    stopped = (f"interrupted by {signal.Signals(res.interrupted_by).name}: the playbook was stopped where it was; "
               f"the host is left as a controller that died there leaves it: `deployer status` shows it, the next "
               f"`deployer {what}` finishes the job (or rolls back)") if res.interrupted_by else ""
    if as_json:
        sys.stdout.write(json.dumps({"event": "result", "command": what, "ok": code == Exit.OK, "exit_code": int(code),
                                     "failures": [f.__dict__ for f in res.failures], "hosts": results,
                                     "processed": sorted(res.processed()), "errors": res.errors,
                                     "interrupted": stopped or None},
                                    default=str) + "\n")
        return int(code)
    if stopped:
        err.print(f"[bold red]{what} {stopped}[/]", highlight=False)
    for f in res.failures:
        err.print(f"[bold red]{lit(f.host)}: {lit(f.role or 'play')} / {lit(f.task)}[/]", highlight=False)
        err.out(literal(f.msg), highlight=False)
    if code == Exit.OK:
        for h, r in sorted(results.items()):
            state = ("unchanged, nothing restarted" if r.get("release_was_live") and not r.get("restarted")
                     else "would be deployed (check mode: nothing changed)" if r.get("check_mode") else "deployed")
            acc = (f"; EAGLE-3 acceptance rate {r['acceptance_rate']}, mean acceptance length "
                   f"{r.get('mean_acceptance_length')}") if r.get("acceptance_rate") is not None else ""
            out.print(f"[bold green]{lit(h)}[/]: release {lit(r.get('release') or '?')} {state}{lit(acc)}")
            _speculation_note(h, r)
    if res.refusal():
        who = "refused before any playbook ran" if res.status == "refused" else "ansible-playbook refused to run"
        err.print(f"[bold red]{who}[/] (nothing was changed):", highlight=False)
        err.out(literal("\n".join(res.refusal())), highlight=False)
    elif not res.processed():
        err.print("[bold red]no host matched[/] (check the inventory, the 'gpu' group and --limit)")
    if code != Exit.OK:
        err.print(f"[bold red]{what} failed[/] (exit {int(code)}: {code.name.lower()})")
    return int(code)


def up(
    host: Host = None, port: Port = 22, user: User = "root", key: Key = None, trust_new_host: TrustNew = False,
    inventory: Inventory = None, sandbox: Sandbox = False, limit: Limit = None,
    check: Annotated[bool, typer.Option("--check", help="Show what would change; change nothing.")] = False,
    diff: Annotated[bool, typer.Option("--diff", help="Show file differences (secrets never shown).")] = False,
    extra: Extra = None,
    serial: Serial = 0,
    no_rollback: Annotated[bool, typer.Option("--no-rollback", help="Leave a failed release in place for "
                                                                     "debugging.")] = False,
    if_changed: Annotated[bool, typer.Option("--if-changed", help="Do nothing when the desired release is already "
                                                                   "live.")] = False,
    as_json: Json = False,
    verbose: Annotated[int, typer.Option("-v", count=True, help="Show tasks (-v) and Ansible's detail (-vv...).")] = 0,
):
    """Deploy (or converge) vLLM or SGLang + EAGLE-3.  Exit 0 only when the server answered the smoke test."""
    ev = parse_extra(extra or [])
    ev["deployer_run_pid"] = os.getpid()
    if if_changed:
        ev["deployer_if_changed"] = True
    if serial:
        ev["deployer_serial"] = serial
    if no_rollback:
        ev["deployer_rollback_enabled"] = False
    t = Target(host, port, user, key, inventory, sandbox, limit, trust_new_host)
    res = runner.run("up.yml", t.inventory_path(), ev, limit=limit, check=check, diff=diff,
                     on_event=Display(as_json, verbose), verbosity=verbose)
    raise typer.Exit(report(res, as_json, "up"))


def rollback(
    to: Annotated[Optional[str],
                  typer.Option("--to", help="Release id (default: the one before the live one).")] = None,
    host: Host = None, port: Port = 22, user: User = "root", key: Key = None,
    inventory: Inventory = None, sandbox: Sandbox = False, limit: Limit = None,
    extra: Extra = None,
    serial: Serial = 0,
    as_json: Json = False,
):
    """Go back to the previous (or a named) release without reinstalling: flip, restart, watch, smoke."""
    t = Target(host, port, user, key, inventory, sandbox, limit)
    if to:
        check_release_id(to)
    raise typer.Exit(run_rollback(t, extra, as_json, to=to, limit=limit, serial=serial))


def check_release_id(to: str) -> str:
    """``rollback --to``: a release id, never a path (``..`` or ``/`` would reach outside releases/)."""
    from deployer.host.module_utils.releases import is_release_id
    if not is_release_id(to):
        die(Exit.USAGE, f"--to {to!r}: expected a release id as `deployer releases` shows it (e.g. 3c5572e4f21b): "
                        "letters, digits, - and _, at most 64")
    return to


def run_rollback(t: Target, extra, as_json: bool, to: Optional[str] = None, limit: Optional[str] = None,
                 serial: int = 0) -> int:
    """The rollback playbook on ``t`` (``limit``: only these hosts; ``serial``: N hosts at a time); its exit code.
    `rollback` and `status --rollback-if-crash-looping` both run it."""
    ev = parse_extra(extra or [])
    ev.update({"deployer_run_pid": os.getpid(), "deployer_rollback_to": to or ""})
    if serial:
        ev["deployer_serial"] = serial
    res = runner.run("rollback.yml", t.inventory_path(), ev, limit=limit, on_event=Display(as_json))
    return report(res, as_json, "rollback")


def watch(host: Host = None, port: Port = 22, user: User = "root", key: Key = None,
          inventory: Inventory = None, sandbox: Sandbox = False, limit: Limit = None,
          extra: Extra = None, as_json: Json = False):
    """Follow a load under way (phase, progress, ETA) until the server is ready or dies; changes nothing."""
    t = Target(host, port, user, key, inventory, sandbox, limit)
    res = runner.run("watch.yml", t.inventory_path(), parse_extra(extra or []), limit=limit, on_event=Display(as_json))
    raise typer.Exit(report(res, as_json, "watch"))


def unlock(host: Host = None, port: Port = 22, user: User = "root", key: Key = None,
           inventory: Inventory = None, sandbox: Sandbox = False, limit: Limit = None):
    """Remove a host's deploy lock (after checking `deployer releases` shows who holds it)."""
    t = Target(host, port, user, key, inventory, sandbox, limit)
    res = runner.run("unlock.yml", t.inventory_path(), {}, limit=limit, on_event=Display(False))
    raise typer.Exit(report(res, False, "unlock"))
