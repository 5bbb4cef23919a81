"""Views of hosts: releases, status (which can roll crash-looping hosts back when asked), logs."""
from __future__ import annotations

import json
import os
import re
import sys
import time
from typing import Annotated

import typer

from deployer import runner
from deployer.cli.deploy import report
from deployer.cli.targets import (
    Extra,
    Host,
    Inventory,
    Json,
    Key,
    Limit,
    Port,
    Sandbox,
    Target,
    TrustNew,
    User,
    die,
    parse_extra,
)
from deployer.events import Exit
from deployer.output import lit, out


def read_hosts(t: Target, extra: list[str] | None, live: bool) -> dict:
    ev = parse_extra(extra or [])
    ev["deployer_status_live"] = live
    res = runner.run("releases.yml", t.inventory_path(), ev, limit=t.limit)
    if res.exit_code() != Exit.OK:
        raise typer.Exit(report(res, False, "read"))
    return {h: f.get("deployer_status", {}) for h, f in res.facts.items()}


def _ts(t) -> str:
    return time.strftime("%m-%d %H:%M", time.localtime(float(t))) if t else "-"


def _num(v) -> str:
    return "-" if v is None or v == "" else str(v)


def _prewarm(p) -> str:
    """Seconds when the prewarm ran; 'skip' / 'off' when it did not (the note says why: --json)."""
    if not p:
        return "-"
    return _num(p.get("seconds")) if p.get("state") == "done" else {"skipped": "skip", "disabled": "off"}.get(
        p.get("state"), str(p.get("state")))


def _phases(ps) -> str:
    """The load's parts in load order: ' (weights 412s, drafter 9s, torch.compile 35s, ...)'."""
    from deployer.host.module_utils.engine_logs import PHASE_TITLES, PHASES
    parts = [f"{PHASE_TITLES.get(k, k)} {ps[k]:.0f}s" for k in PHASES if isinstance((ps or {}).get(k), (int, float))]
    return f" ({', '.join(parts)})" if parts else ""


def keeper_line(k) -> str:
    """The host's state keeper's account of a load or a deploy in progress, as one line ("" when there is none: the
    engine is serving and no deploy holds the lock, or no keeper runs)."""
    if not isinstance(k, dict):
        return ""
    ld, dp = k.get("load") or {}, k.get("deploy") or {}
    if ld.get("phase") == "ready" and not dp.get("in_progress"):
        return ""
    from deployer.host.module_utils.engine_logs import PHASE_TITLES
    phase = str(ld.get("phase"))
    parts = [f"load: {PHASE_TITLES.get(phase, phase)}"]
    if isinstance(ld.get("progress_ratio"), (int, float)):
        parts[0] += f" {100 * ld['progress_ratio']:.0f}%"
    if isinstance(ld.get("elapsed_seconds"), (int, float)):
        parts.append(f"{ld['elapsed_seconds']:.0f} s in")
    if isinstance(ld.get("eta_seconds"), (int, float)):
        parts.append(f"ETA {int(ld['eta_seconds']) // 60}m{int(ld['eta_seconds']) % 60:02d}s")
    if isinstance(ld.get("budget_seconds"), (int, float)):
        parts.append(f"budget {ld['budget_seconds']:.0f} s")
    if ld.get("stalled"):
        parts.append(f"STALLED ({ld.get('seconds_since_progress')} s without progress)")
    if dp.get("in_progress"):
        parts.append(f"deploy in progress: {dp.get('command')} by {dp.get('user') or '?'}")
    age = k.get("age_seconds")
    if isinstance(age, (int, float)) and age > 30:       # the keeper writes every 2 s: said first, never cut off
        parts.insert(0, f"STALE, {age:.0f} s old (is deployer-state running?)")
    if ld.get("fatal"):
        parts.append(f"last fatal: {ld['fatal']}")
    return "; ".join(parts)[:118]


def _exposure(r: dict, keyed=None) -> tuple[str, bool]:
    """What a release's server answers, and to whom (``Engine.exposure`` over its recorded argv), and whether all of
    it asks the key.  ``keyed``: whether the live secrets hold a key (status reads them); else the release's record."""
    from deployer import engines
    from deployer.plan import is_loopback
    argv = [str(a) for a in r.get("argv") or []]
    if keyed is None:
        keyed = bool(r.get("api_protected"))
    try:
        eng = engines.get(r.get("backend") or engines.RECORDED_BEFORE_BACKENDS)
    except engines.EngineError:
        return "unknown engine", False
    loopback = is_loopback(engines.argv_value(argv, "--host") or "0.0.0.0")
    return eng.exposure(argv, keyed, loopback), loopback or (keyed and (eng.guarded(argv) or not eng.api_guard))


def _api(r: dict) -> str:
    if r.get("api_protected") is None and not r.get("argv"):
        return "-"
    text, closed = _exposure(r)
    if "loopback only" in text:
        return "loopback"
    return ("key+guard" if "API guard" in text else "key") if closed else (
        "[red]key /v1 only[/]" if r.get("api_protected") else "[red]OPEN[/]")


def _engine(r: dict) -> str:
    """``vllm 0.16.0`` / ``sglang 0.5.23`` (records written before the SGLang backend: vLLM)."""
    from deployer.engines import RECORDED_BEFORE_BACKENDS
    return f"{r.get('backend') or RECORDED_BEFORE_BACKENDS} {r.get('engine_version') or r.get('vllm_version') or '-'}"


def _kv(r: dict) -> str:
    """The KV cache the engine measured, in tokens, and what preflight's memory plan predicted: ``181,864 (180,000)``.
    """
    got, planned = r.get("kv_cache_tokens"), r.get("kv_cache_tokens_planned")
    shown = f"{got:,}" if isinstance(got, int) else "-"
    return shown + (f" ({planned:,})" if isinstance(planned, int) else "")


def _gain(payoff) -> str:
    """EAGLE-3's speed-up over the host's own release without it: 'x1.42', 'x0.81 slower', '-' (unmeasured)."""
    if not isinstance(payoff, dict) or payoff.get("speedup") is None:
        return "-"
    return f"x{payoff['speedup']:.2f}" + ("" if payoff.get("pays") else " slower")


def releases(host: Host = None, port: Port = 22, user: User = "root", key: Key = None,
             inventory: Inventory = None, sandbox: Sandbox = False, limit: Limit = None,
             extra: Extra = None, as_json: Json = False, trust_new_host: TrustNew = False):
    """The releases on each host, newest first."""
    from rich.table import Table
    data = read_hosts(Target(host, port, user, key, inventory, sandbox, limit, trust_new_host), extra, live=False)
    if as_json:
        sys.stdout.write(json.dumps(data, default=str) + "\n")
        return
    for h, st in sorted(data.items()):
        t = Table(title=f"{lit(h)}: releases")
        for c in ("", "id", "engine", "patch", "result", "deployed", "down s", "load s", "prewarm s", "compile",
                  "KV tokens (plan)", "accept", "tok/s", "EAGLE-3 gain", "API"):
            t.add_column(c, no_wrap=True)
        for r in st.get("releases", []):   # newest first (deployer_state sorts them)
            mark = "live" if r["id"] == st.get("current") else ("prev" if r["id"] == st.get("previous") else "")
            t.add_row(*(lit(c) for c in (
                mark, r["id"], _engine(r), str(r.get("patch_fingerprint") or "native")[:12],
                str(r.get("result") or "-"), _ts(r.get("deployed_at")), _num((r.get("downtime") or {}).get("seconds")),
                _num(r.get("load_seconds")), _prewarm(r.get("prewarm")), str(r.get("compile_cache") or "-"),
                _kv(r), _num(r.get("acceptance_rate")), _num(r.get("tokens_per_second")),
                _gain(r.get("speculation_payoff")))),
                      _api(r))
        out.print(t)
        if st.get("lock"):
            out.print(f"[yellow]locked[/] by {lit(st['lock'])}")


def status(host: Host = None, port: Port = 22, user: User = "root", key: Key = None,
           inventory: Inventory = None, sandbox: Sandbox = False, limit: Limit = None,
           extra: Extra = None, as_json: Json = False, trust_new_host: TrustNew = False,
           rollback_if_crash_looping: Annotated[bool, typer.Option(
               "--rollback-if-crash-looping",
               help="Roll back every host whose server systemd keeps restarting (deployer_crash_loop_restarts).")]
           = False):
    """Live release, health, uptime, GPU memory in use, live EAGLE-3 acceptance, a crash loop and its last fatal
    line.  Exit 1 when not healthy (with --rollback-if-crash-looping: the rollback's exit code when one ran)."""
    t = Target(host, port, user, key, inventory, sandbox, limit, trust_new_host)
    data = read_hosts(t, extra, live=True)
    bad = any(st.get("health") != 200 or st.get("crash_loop") for st in data.values())
    looping = sorted(h for h, st in data.items() if st.get("crash_loop") and st.get("previous"))
    if as_json:
        sys.stdout.write(json.dumps(data, default=str) + "\n")
        if rollback_if_crash_looping and looping:
            _rollback_crash_loops(t, looping, extra, as_json)
        raise typer.Exit(int(Exit.FAILED) if bad else 0)
    for h, st in sorted(data.items()):
        unit = st.get("unit") or {}
        spec = st.get("spec") or {}
        gpu = st.get("gpu_memory_used_mib") or []
        out.print(f"[bold]{lit(h)}[/]: release {lit(st.get('current') or '-')} (previous "
                  f"{lit(st.get('previous') or '-')}); unit {lit(unit.get('ActiveState', '?'))} since "
                  f"{lit(unit.get('ActiveEnterTimestamp') or '-')}, restarts {lit(unit.get('NRestarts', '?'))}; "
                  f"health {lit(st.get('health'))}")
        line = keeper_line(st.get("keeper"))
        if line:
            out.print("  " + lit(line))
        fatal = st.get("last_fatal") or {}
        if st.get("crash_loop"):
            out.print(f"  [red]CRASH LOOP[/]: systemd restarted the server {lit(unit.get('NRestarts'))} times "
                      f"(limit {lit(st.get('crash_loop_restarts'))})"
                      + (f"; last fatal ({lit(fatal.get('kind'))}): {lit(fatal.get('line'))}" if fatal
                         else "; no fatal line logged")
                      + (f"; roll back to {lit(st['previous'])}: deployer rollback (or status "
                         "--rollback-if-crash-looping)"
                         if st.get("previous") else "; no previous release to roll back to"))
        elif fatal and int(unit.get("NRestarts") or 0):
            out.print(f"  last fatal ({lit(fatal.get('kind'))}, {lit(fatal.get('runs_ago'))} run(s) ago): "
                      f"{lit(fatal.get('line'))}")
        live = next((r for r in st.get("releases", []) if r["id"] == st.get("current")), {})
        down = (live.get("downtime") or {}).get("seconds")
        exposed, closed = _exposure(live, st.get("api_key_set")) if live else ("unknown", True)
        out.print("  API " + (lit(exposed) if closed else f"[red]{lit(exposed)}[/]"))
        out.print(lit(f"  last deploy: downtime {_num(down)} s, load {_num(live.get('load_seconds'))} s, "
                        f"prewarm {_prewarm(live.get('prewarm'))} s, compile cache {live.get('compile_cache') or '-'}"
                        + _phases(live.get("phase_seconds"))))
        lock = st.get("lock")
        out.print(lit(f"  GPU memory in use: {sum(gpu)} MiB over {len(gpu)} GPUs; EAGLE-3 acceptance rate "
                      f"{spec.get('acceptance_rate')}, mean acceptance length {spec.get('mean_acceptance_length')}")
                  + (f"; [yellow]locked[/] by {lit(lock.get('user'))}@{lit(lock.get('controller'))}" if lock else ""))
        lb = st.get("balancer")
        if lb:
            held = lb.get("admin") not in (None, "ready", lb.get("state"))   # e.g. down, and drained: no request
            why = f" ({lb['error']})" if lb.get("error") else ""
            out.print(lit(f"  balancer: {lb.get('state')}" + (f" (set {lb['admin']})" if held else "")
                          + f", {lb.get('scur')} requests in flight{why}"))
    if rollback_if_crash_looping and looping:
        _rollback_crash_loops(t, looping, extra, as_json)
    raise typer.Exit(int(Exit.FAILED) if bad else 0)


def _rollback_crash_loops(t: Target, hosts: list[str], extra, as_json: bool):
    """Roll the crash-looping ``hosts`` back to their previous release (the rollback playbook, limited to them);
    exits with the rollback's code."""
    from deployer.cli.deploy import run_rollback
    if not as_json:
        out.print(lit(f"rolling back (crash loop): {', '.join(hosts)}"))
    raise typer.Exit(run_rollback(t, extra, as_json, limit=",".join(hosts)))


_UNIT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}(\.service)?")


def journal_command(service: str, lines: int, follow: bool, as_root: bool) -> str:
    """The remote command `deployer logs` runs: the unit name checked (the same rule as the plan's
    deployer_service_name) and shell-quoted, the line count an integer."""
    import shlex
    if not _UNIT_RE.fullmatch(service or ""):
        raise ValueError(f"--service {service!r}: expected a unit name (a letter or digit, then [A-Za-z0-9_-], "
                         "at most 64, optionally .service)")
    unit = service if service.endswith(".service") else service + ".service"
    cmd = f"journalctl -u {shlex.quote(unit)} --no-pager -n {int(lines)}" + (" -f" if follow else "")
    # a login user reads the system journal through sudo, as the deploy does (become)
    return cmd if as_root else "sudo -n " + cmd


def ssh_connection(host: str, user: str, port: int, key, known_hosts=None, ssh_config=None):
    """A fabric connection that checks the host key as the deploy does (Ansible's ssh): known_hosts only, an
    unknown or changed key refused (fabric's own default would accept any key)."""
    import paramiko
    from fabric import Config, Connection
    config = Config(runtime_ssh_path=str(ssh_config)) if ssh_config else None
    kw = {"config": config} if config else {}
    conn = Connection(host, user=user, port=port, connect_kwargs={"key_filename": key} if key else {}, **kw) \
        if not ssh_config else Connection(host, **kw)
    conn.client.set_missing_host_key_policy(paramiko.RejectPolicy())
    # the files OpenSSH (and so the deploy) reads: the system's, then the user's; hashed entries are understood
    files = [known_hosts] if known_hosts else ["/etc/ssh/ssh_known_hosts", os.path.expanduser("~/.ssh/known_hosts")]
    for f in files:
        try:
            conn.client.load_host_keys(str(f))
        except FileNotFoundError:
            pass
    return conn


def logs(follow: Annotated[bool, typer.Option("-f", "--follow")] = False,
         lines: Annotated[int, typer.Option("-n", "--lines")] = 100,
         host: Host = None, port: Port = 22, user: User = "root", key: Key = None, sandbox: Sandbox = False,
         sandbox_host: Annotated[str, typer.Option("--sandbox-host")] = "sbx1",
         service: Annotated[str, typer.Option("--service")] = "deployer-engine"):
    """The server's log (journal), streamed over SSH with fabric (host keys checked against known_hosts)."""
    if bool(host) == bool(sandbox):
        die(Exit.USAGE, "say which host: --host ADDR or --sandbox")
    if sandbox:
        from deployer.sandbox import hosts as sb
        conn = ssh_connection(sandbox_host, "root", 22, None, known_hosts=sb.STATE / "known_hosts",
                              ssh_config=sb.STATE / "ssh_config")
        as_root = not sb.is_sudo(sandbox_host)
    else:
        conn = ssh_connection(host, user, port, key)     # /etc/ssh/ssh_known_hosts and ~/.ssh/known_hosts
        as_root = user == "root"
    try:
        cmd = journal_command(service, lines, follow, as_root)
    except ValueError as e:
        die(Exit.USAGE, str(e))
    try:
        r = conn.run(cmd, pty=follow, warn=True)
    except KeyboardInterrupt:
        raise typer.Exit(0) from None
    except Exception as e:  # noqa: BLE001 - paramiko's refusal of an unknown host key, a refused connection ...
        die(Exit.UNREACHABLE, f"{host or sandbox_host}: {type(e).__name__}: {e}")
    raise typer.Exit(0 if r.ok else int(Exit.FAILED))
