"""deployer: deploy and operate vLLM + EAGLE-3 (Kimi-K2.5) on GPU hosts.  The CLI orchestrates; Ansible acts."""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Optional

import typer
import yaml

from deployer import runner
from deployer.output import Display, err, out
from deployer.runner import Exit

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
sandbox_app = typer.Typer(no_args_is_help=True, help="The embedded sandbox GPU host (real sshd + systemd, simulated GPUs).")
patch_app = typer.Typer(no_args_is_help=True, help="The EAGLE-3 patch engine (P1-P5) on a local vLLM install.")
app.add_typer(sandbox_app, name="sandbox")
app.add_typer(patch_app, name="patch")
schedule_app = typer.Typer(no_args_is_help=True, help="Scheduled redeploys (systemd timer, or cron without systemd).")
app.add_typer(schedule_app, name="schedule")

SECRET_VARS = ("render_api_key", "render_hf_token")


def _die(code: Exit, msg: str):
    err.print(f"[bold red]error:[/] {msg}")
    raise typer.Exit(int(code))


def _parse_extra(extra: List[str]) -> dict:
    """``-e k=v`` (value parsed as YAML) or ``-e @file.yml``."""
    vals: dict = {}
    for item in extra:
        if item.startswith("@"):
            try:
                vals.update(yaml.safe_load(Path(item[1:]).read_text()) or {})
            except OSError as e:
                _die(Exit.USAGE, f"-e {item}: {e}")
            continue
        if "=" not in item:
            _die(Exit.USAGE, f"-e {item!r}: expected key=value or @file.yml")
        k, v = item.split("=", 1)
        try:
            vals[k] = yaml.safe_load(v) if v else ""
        except yaml.YAMLError:
            vals[k] = v
        if vals[k] is None:  # "-e k=null" or "-e k=~": an empty value, as before
            vals[k] = ""
    for env, var in (("DEPLOYER_API_KEY", "render_api_key"), ("DEPLOYER_HF_TOKEN", "render_hf_token")):
        if os.environ.get(env) and var not in vals:
            vals[var] = os.environ[env]
    return vals


def _adhoc_inventory(host: str, port: int, user: str, key: Optional[str], trust_new: bool = False) -> str:
    inv = {"all": {"children": {"gpu": {"hosts": {host: {"ansible_host": host, "ansible_port": port,
                                                          "ansible_user": user}}}}}}
    if trust_new:  # trust on first use: record an unknown host's key, still refuse a changed one
        inv["all"]["children"]["gpu"]["hosts"][host]["ansible_ssh_common_args"] = "-o StrictHostKeyChecking=accept-new"
    if key:
        inv["all"]["children"]["gpu"]["hosts"][host]["ansible_ssh_private_key_file"] = key
    fd, path = tempfile.mkstemp(prefix="deployer-inv-", suffix=".yml")
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(inv, f)
    return path


def _inventory(host, port, user, key, inventory, sandbox, trust_new=False) -> str:
    if sum(bool(x) for x in (host, inventory, sandbox)) != 1:
        _die(Exit.USAGE, "say where to deploy: exactly one of --host ADDR, -i INVENTORY or --sandbox")
    if sandbox:
        from deployer.sandbox import hosts as sb
        if not any(s["running"] for s in sb.status()):
            err.print("sandbox: starting 1 host ...")
            sb.start(1)
        return str(sb.STATE / "inventory.yml")
    if inventory:
        if not Path(inventory).exists():
            _die(Exit.USAGE, f"inventory {inventory}: no such file")
        return inventory
    return _adhoc_inventory(host, port, user, key, trust_new)


def _lock_note(holder: dict) -> str:
    """Stale or live?  Only the controller that took the lock can tell whether its process is gone."""
    import socket
    if not holder:
        return ""
    if holder.get("controller") == socket.gethostname():
        try:
            os.kill(int(holder.get("pid", 0)), 0)
            return "held by a live deploy on this machine; wait for it"
        except (ProcessLookupError, ValueError):
            return "STALE: its process is gone; `deployer unlock` removes it"
        except PermissionError:
            return "held by a live process of another user"
    return f"held from {holder.get('controller')}; if that run died, `deployer unlock` removes it"


def _report(res: runner.Result, as_json: bool, what: str) -> int:
    code = res.exit_code()
    for f in res.failures:
        if f.res.get("locked"):
            f.res["lock_state"] = _lock_note(f.res.get("holder") or {})
            f.msg = f"{f.msg}\n{f.res['lock_state']}"
    if as_json:
        sys.stdout.write(json.dumps({"event": "result", "command": what, "ok": code == Exit.OK, "exit_code": int(code),
                                     "failures": [f.__dict__ for f in res.failures], "hosts": res.facts,
                                     "processed": sorted(res.processed())},
                                    default=str) + "\n")
        return int(code)
    for f in res.failures:
        msg = "\n".join(map(str, f.msg)) if isinstance(f.msg, list) else f.msg
        err.print(f"[bold red]{f.host}: {f.role or 'play'} / {f.task}[/]", highlight=False)
        err.out(msg, highlight=False)
    for h, facts in sorted(res.facts.items()):
        spec = facts.get("_deployer_spec") or {}
        rel = facts.get("_deployer_release_id", "?")
        if code == Exit.OK:
            state = "unchanged, nothing restarted" if facts.get("_deployer_release_is_live") and not facts.get(
                "_deployer_restarted") else "deployed"
            acc = (f"; EAGLE-3 acceptance rate {spec.get('acceptance_rate')}, mean acceptance length "
                   f"{spec.get('mean_acceptance_length')}") if spec else ""
            out.print(f"[bold green]{h}[/]: release {rel} {state}{acc}")
    if not res.processed():
        err.print("[bold red]no host matched[/] (check the inventory, the 'gpu' group and --limit)")
    if code != Exit.OK:
        err.print(f"[bold red]{what} failed[/] (exit {int(code)}: {code.name.lower()})")
    return int(code)


@app.command()
def up(
    host: Optional[str] = typer.Option(None, "--host", help="Deploy to this address (ad-hoc inventory of one host)."),
    port: int = typer.Option(22, "--port", help="SSH port."),
    user: str = typer.Option("root", "--user", help="SSH user."),
    key: Optional[str] = typer.Option(None, "--key", help="SSH private key file."),
    trust_new_host: bool = typer.Option(False, "--trust-new-host",
                                        help="Record an unknown host's SSH key on first contact (a changed key is still refused)."),
    inventory: Optional[str] = typer.Option(None, "-i", "--inventory", help="Ansible inventory (with group_vars)."),
    sandbox: bool = typer.Option(False, "--sandbox", help="Deploy to the embedded sandbox host."),
    limit: Optional[str] = typer.Option(None, "--limit", help="Ansible host pattern."),
    check: bool = typer.Option(False, "--check", help="Show what would change; change nothing."),
    diff: bool = typer.Option(False, "--diff", help="Show file differences (secrets never shown)."),
    extra: List[str] = typer.Option([], "-e", "--extra-vars", help="key=value or @file.yml (repeatable)."),
    serial: int = typer.Option(0, "--serial", help="Rolling deploy: N hosts at a time, stop at the first failure."),
    no_rollback: bool = typer.Option(False, "--no-rollback", help="Leave a failed release in place for debugging."),
    if_changed: bool = typer.Option(False, "--if-changed", help="Do nothing when the desired release is already live."),
    as_json: bool = typer.Option(False, "--json", help="JSON lines on stdout instead of human output."),
    verbose: int = typer.Option(0, "-v", count=True),
):
    """Deploy (or converge) vLLM + EAGLE-3.  Exit 0 only when the server answered the smoke test."""
    ev = _parse_extra(extra)
    ev["deployer_run_pid"] = os.getpid()
    if if_changed:
        ev["deployer_if_changed"] = True
    if serial:
        ev["deployer_serial"] = serial
    if no_rollback:
        ev["deployer_rollback_enabled"] = False
    inv = _inventory(host, port, user, key, inventory, sandbox, trust_new_host)
    res = runner.run("up.yml", inv, ev, limit=limit, check=check, diff=diff, on_event=Display(as_json, verbose),
                     verbosity=verbose)
    raise typer.Exit(_report(res, as_json, "up"))


_HOST = typer.Option(None, "--host", help="Host address (ad-hoc inventory of one host).")
_PORT = typer.Option(22, "--port", help="SSH port.")
_USER = typer.Option("root", "--user", help="SSH user.")
_KEY = typer.Option(None, "--key", help="SSH private key file.")
_INV = typer.Option(None, "-i", "--inventory", help="Ansible inventory.")
_SBX = typer.Option(False, "--sandbox", help="The embedded sandbox host(s).")
_LIMIT = typer.Option(None, "--limit", help="Ansible host pattern.")


@app.command()
def rollback(
    to: Optional[str] = typer.Option(None, "--to", help="Release id (default: the one before the live one)."),
    host: Optional[str] = _HOST, port: int = _PORT, user: str = _USER, key: Optional[str] = _KEY,
    inventory: Optional[str] = _INV, sandbox: bool = _SBX, limit: Optional[str] = _LIMIT,
    extra: List[str] = typer.Option([], "-e", "--extra-vars"),
    as_json: bool = typer.Option(False, "--json"),
):
    """Go back to the previous (or a named) release without reinstalling: flip, restart, watch, smoke."""
    ev = _parse_extra(extra)
    ev.update({"deployer_run_pid": os.getpid(), "deployer_rollback_to": to or ""})
    inv = _inventory(host, port, user, key, inventory, sandbox)
    res = runner.run("rollback.yml", inv, ev, limit=limit, on_event=Display(as_json))
    raise typer.Exit(_report(res, as_json, "rollback"))


def _read_hosts(playbook_vars: dict, host, port, user, key, inventory, sandbox, limit, extra) -> dict:
    ev = _parse_extra(extra)
    ev.update(playbook_vars)
    inv = _inventory(host, port, user, key, inventory, sandbox)
    res = runner.run("releases.yml", inv, ev, limit=limit)
    if res.exit_code() != Exit.OK:
        raise typer.Exit(_report(res, False, "read"))
    return {h: f.get("_deployer_status", {}) for h, f in res.facts.items()}


def _ts(t) -> str:
    return time.strftime("%m-%d %H:%M", time.localtime(float(t))) if t else "-"


@app.command()
def watch(host: Optional[str] = _HOST, port: int = _PORT, user: str = _USER, key: Optional[str] = _KEY,
          inventory: Optional[str] = _INV, sandbox: bool = _SBX, limit: Optional[str] = _LIMIT,
          extra: List[str] = typer.Option([], "-e", "--extra-vars"), as_json: bool = typer.Option(False, "--json")):
    """Follow a load under way (phase, progress, ETA) until the server is ready or dies; changes nothing."""
    inv = _inventory(host, port, user, key, inventory, sandbox)
    res = runner.run("watch.yml", inv, _parse_extra(extra), limit=limit, on_event=Display(as_json))
    raise typer.Exit(_report(res, as_json, "watch"))


@app.command()
def releases(host: Optional[str] = _HOST, port: int = _PORT, user: str = _USER, key: Optional[str] = _KEY,
             inventory: Optional[str] = _INV, sandbox: bool = _SBX, limit: Optional[str] = _LIMIT,
             extra: List[str] = typer.Option([], "-e", "--extra-vars"), as_json: bool = typer.Option(False, "--json")):
    """The releases on each host, newest first."""
    from rich.table import Table
    data = _read_hosts({}, host, port, user, key, inventory, sandbox, limit, extra)
    if as_json:
        sys.stdout.write(json.dumps(data, default=str) + "\n")
        return
    for h, st in sorted(data.items()):
        t = Table(title=f"{h}: releases")
        for c in ("", "id", "vLLM", "patch", "result", "deployed", "load s", "accept"):
            t.add_column(c, no_wrap=True)
        rels = sorted(st.get("releases", []), key=lambda r: r.get("deployed_at") or r.get("created_at") or 0,
                      reverse=True)
        for r in rels:
            mark = "live" if r["id"] == st.get("current") else ("prev" if r["id"] == st.get("previous") else "")
            t.add_row(mark, r["id"], str(r.get("vllm_version") or "-"), str(r.get("patch_fingerprint") or "native"),
                      str(r.get("result") or "-"), _ts(r.get("deployed_at")), str(r.get("load_seconds") or "-"),
                      str(r.get("acceptance_rate") or "-"))
        out.print(t)
        if st.get("lock"):
            out.print(f"[yellow]locked[/] by {st['lock']}")


@app.command()
def status(host: Optional[str] = _HOST, port: int = _PORT, user: str = _USER, key: Optional[str] = _KEY,
           inventory: Optional[str] = _INV, sandbox: bool = _SBX, limit: Optional[str] = _LIMIT,
           extra: List[str] = typer.Option([], "-e", "--extra-vars"), as_json: bool = typer.Option(False, "--json")):
    """Live release, health, uptime, GPU memory in use, live EAGLE-3 acceptance."""
    data = _read_hosts({"deployer_status_live": True}, host, port, user, key, inventory, sandbox, limit, extra)
    if as_json:
        sys.stdout.write(json.dumps(data, default=str) + "\n")
        return
    bad = False
    for h, st in sorted(data.items()):
        unit = st.get("unit") or {}
        spec = st.get("spec") or {}
        gpu = st.get("gpu_memory_used_mib") or []
        healthy = st.get("health") == 200
        bad |= not healthy
        out.print(f"[bold]{h}[/]: release {st.get('current') or '-'} (previous {st.get('previous') or '-'}); "
                  f"unit {unit.get('ActiveState', '?')} since {unit.get('ActiveEnterTimestamp', '?') or '-'}, "
                  f"restarts {unit.get('NRestarts', '?')}; health {st.get('health')}")
        out.print(f"  GPU memory in use: {sum(gpu)} MiB over {len(gpu)} GPUs; EAGLE-3 acceptance rate "
                  f"{spec.get('acceptance_rate')}, mean acceptance length {spec.get('mean_acceptance_length')}"
                  + (f"; [yellow]locked[/] by {st['lock'].get('user')}@{st['lock'].get('controller')}" if st.get('lock') else ""))
    raise typer.Exit(int(Exit.FAILED) if bad else 0)


@app.command()
def unlock(host: Optional[str] = _HOST, port: int = _PORT, user: str = _USER, key: Optional[str] = _KEY,
           inventory: Optional[str] = _INV, sandbox: bool = _SBX, limit: Optional[str] = _LIMIT):
    """Remove a host's deploy lock (after checking `deployer releases` shows who holds it)."""
    inv = _inventory(host, port, user, key, inventory, sandbox)
    res = runner.run("unlock.yml", inv, {}, limit=limit, on_event=Display(False))
    raise typer.Exit(_report(res, False, "unlock"))


@app.command()
def logs(follow: bool = typer.Option(False, "-f", "--follow"), lines: int = typer.Option(100, "-n", "--lines"),
         host: Optional[str] = _HOST, port: int = _PORT, user: str = _USER, key: Optional[str] = _KEY,
         sandbox: bool = _SBX, sandbox_host: str = typer.Option("sbx1", "--sandbox-host"),
         service: str = typer.Option("deployer-vllm", "--service")):
    """The server's log (journal), streamed over SSH with fabric."""
    from fabric import Config, Connection
    if bool(host) == bool(sandbox):
        _die(Exit.USAGE, "say which host: --host ADDR or --sandbox")
    cmd = f"journalctl -u {service} --no-pager -n {int(lines)}" + (" -f" if follow else "")
    if sandbox:
        from deployer.sandbox import hosts as sb
        cfg = Config(runtime_ssh_path=str(sb.STATE / "ssh_config"))
        conn = Connection(sandbox_host, config=cfg)
    else:
        conn = Connection(host, user=user, port=port, connect_kwargs={"key_filename": key} if key else {})
    try:
        r = conn.run(cmd, pty=follow, warn=True)
    except KeyboardInterrupt:
        raise typer.Exit(0) from None
    raise typer.Exit(0 if r.ok else int(Exit.FAILED))


# ----------------------------------------------------------------------------- schedule
@schedule_app.command("add")
def schedule_add(
    at: str = typer.Option(..., "--at", help="'Sun 03:00', 'Mon,Thu 02:30', 'daily 03:00'."),
    host: Optional[str] = _HOST, inventory: Optional[str] = _INV, sandbox: bool = _SBX,
    if_changed: bool = typer.Option(False, "--if-changed", help="Redeploy only when the desired release differs."),
    window: Optional[str] = typer.Option(None, "--window", help="Only act between HH:MM-HH:MM (controller time)."),
    webhook: Optional[str] = typer.Option(None, "--webhook", help="POST the result as JSON to this URL."),
    extra: List[str] = typer.Option([], "-e", "--extra-vars"),
):
    """Schedule a non-interactive `deployer up` (JSON output to a log)."""
    from deployer import schedule as sc
    if sum(bool(x) for x in (host, inventory, sandbox)) != 1:
        _die(Exit.USAGE, "say where to deploy: exactly one of --host, -i or --sandbox")
    target = ["--host", host] if host else (["-i", str(Path(inventory).resolve())] if inventory else ["--sandbox"])
    for e in extra:
        if any(e.startswith(k + "=") for k in SECRET_VARS):
            _die(Exit.USAGE, f"-e {e.split('=')[0]}=...: secrets are not stored in schedules; "
                             "use DEPLOYER_API_KEY in the scheduler's environment or a vault file")
    s = sc.Schedule(id=sc.new_id(), at=at, target=target, if_changed=if_changed, window=window, webhook=webhook,
                    extra=list(extra))
    try:
        how = sc.install(s)
    except sc.ScheduleError as e:
        _die(Exit.USAGE, str(e))
    items = sc.load()
    items[s.id] = s
    sc.save(items)
    out.print(f"schedule {s.id}: {how}; log {s.log_path()}")


@schedule_app.command("list")
def schedule_list(as_json: bool = typer.Option(False, "--json")):
    from dataclasses import asdict

    from deployer import schedule as sc
    items = sc.load()
    if as_json:
        sys.stdout.write(json.dumps([asdict(v) for v in items.values()]) + "\n")
        return
    for s in items.values():
        out.print(f"{s.id}  at {s.at}  {' '.join(s.target)}  if-changed={s.if_changed}  window={s.window or '-'}")


def _schedules(sid: str):
    """All schedules, refusing an unknown id."""
    from deployer import schedule as sc
    items = sc.load()
    if sid not in items:
        _die(Exit.USAGE, f"no schedule {sid!r} (see `deployer schedule list`)")
    return items


@schedule_app.command("remove")
def schedule_remove(sid: str = typer.Argument(...)):
    from deployer import schedule as sc
    items = _schedules(sid)
    sc.uninstall(sid)
    del items[sid]
    sc.save(items)
    out.print(f"removed schedule {sid}")


@schedule_app.command("run")
def schedule_run(sid: str = typer.Argument(...)):
    """What the timer/cron runs: window check, `up --json`, log (stdout and stderr), webhook.  Exit code = up's."""
    import datetime

    from deployer import schedule as sc
    s = _schedules(sid)[sid]
    raise typer.Exit(sc.run_now(s, datetime.datetime.now(), say=lambda m: out.print(m, markup=False)))


# ----------------------------------------------------------------------------- sandbox
@sandbox_app.command("start")
def sandbox_start(hosts: int = typer.Option(1, "--hosts", "-n", min=1, max=20, help="How many sandbox hosts.")):
    """Start N sandbox hosts (sbx1..sbxN) and write their inventory."""
    from deployer.sandbox import hosts as sb
    t0 = time.time()
    try:
        started = sb.start(hosts)
    except sb.SandboxError as e:
        _die(Exit.FAILED, str(e))
    for h in started:
        out.print(f"{h.name} {h.ip} up (ssh -F {sb.STATE}/ssh_config {h.name})")
    out.print(f"inventory: {sb.STATE}/inventory.yml  ({time.time() - t0:.1f} s)")


@sandbox_app.command("stop")
def sandbox_stop(name: List[str] = typer.Argument(None, help="Hosts to stop (default: all).")):
    """Stop sandbox hosts and delete their state."""
    from deployer.sandbox import hosts as sb
    out.print("stopped: " + (", ".join(sb.stop(name or None)) or "nothing"))


@sandbox_app.command("status")
def sandbox_status():
    from deployer.sandbox import hosts as sb
    for s in sb.status():
        out.print(f"{s['name']} {s['ip']} {'running' if s['running'] else 'stopped'}")


# ----------------------------------------------------------------------------- patch
def _vllm_root(vllm_root: Optional[str], python: Optional[str]) -> str:
    from deployer.ansible_plugins.module_utils import eagle3_patch as pe
    if bool(vllm_root) == bool(python):
        _die(Exit.USAGE, "give exactly one of --vllm-root DIR or --python VENV_PYTHON")
    if python:
        import subprocess
        r = subprocess.run([python, "-c", "import importlib.util as u, os; "
                            "print(os.path.dirname(u.find_spec('vllm').origin))"], capture_output=True, text=True)
        if r.returncode != 0:
            _die(Exit.USAGE, f"{python}: no vllm package importable ({r.stderr.strip()[-300:]})")
        return r.stdout.strip()
    try:
        return pe.vllm_root_of(vllm_root)
    except pe.PatchError as e:
        _die(Exit.USAGE, str(e))


def _patch_cmd(action: str, vllm_root, python, as_json):
    from deployer.ansible_plugins.module_utils import eagle3_patch as pe
    root = _vllm_root(vllm_root, python)
    try:
        if action == "check":
            res = pe.status(root)
            res["msg"] = {"native": "native support, nothing to patch", "patched": "patched",
                          "unpatched": f"needs {', '.join(res.get('needed', []))}",
                          "partial": "partially patched (an apply was interrupted; run apply)"}[res["state"]]
        elif action == "diff":
            res = pe.apply(root, check_mode=True)
        elif action == "apply":
            res = pe.apply(root)
        else:
            res = pe.revert(root)
    except pe.PatchError as e:
        if as_json:
            sys.stdout.write(json.dumps({"ok": False, "error": str(e)}) + "\n")
            raise typer.Exit(int(Exit.FAILED)) from e
        _die(Exit.FAILED, str(e))
    if as_json:
        sys.stdout.write(json.dumps(dict(res, ok=True, vllm_root=root)) + "\n")
        return
    if action == "diff":
        sys.stdout.write(res["diff"])
    out.print(f"{root}: {res['msg']}" + (f" (fingerprint {res['fingerprint']})" if res.get("fingerprint") else ""))


_ROOT_OPT = typer.Option(None, "--vllm-root", help="The vllm package directory, its site-packages or its venv.")
_PY_OPT = typer.Option(None, "--python", help="A venv's python; the vllm it imports is used.")
_JSON_OPT = typer.Option(False, "--json")


def _patch_command(action: str, doc: str):
    def cmd(vllm_root: Optional[str] = _ROOT_OPT, python: Optional[str] = _PY_OPT, as_json: bool = _JSON_OPT):
        _patch_cmd(action, vllm_root, python, as_json)
    cmd.__doc__ = doc
    return cmd


for _action, _doc in (("check", "Which of P1-P5 this vLLM needs (changes nothing)."),
                      ("diff", "Unified diff of every edit apply would make (changes nothing)."),
                      ("apply", "Apply exactly the patches needed, all files or none."),
                      ("revert", "Restore the originals byte for byte.")):
    patch_app.command(_action)(_patch_command(_action, _doc))


def main():
    app()


if __name__ == "__main__":
    main()
