# -*- coding: utf-8 -*-
"""The host's own account of its engine, kept while the unit runs with or without a controller attached (the state
keeper, roles/monitor/files/keeper/state_keeper.py, every few seconds): the load's phase, progress, ETA, budget and
stall, the last fatal line, restarts, the live release, whether a deploy holds the lock, the last deploy's result,
and the same as Prometheus metrics in node_exporter's textfile format.  Pure functions over what the keeper read;
no secret goes in (the manifest's argv and env hold none: docs/security.md rule 8).  Standard library only."""
from __future__ import annotations

import math

try:
    from ansible.module_utils.engine_logs import PHASES, eta_seconds  # on the host
except ImportError:
    from deployer.host.module_utils.engine_logs import PHASES, eta_seconds  # on the controller (tests)

# what a release recorded before the manifest named its engine ran (engines.RECORDED_BEFORE_BACKENDS)
BEFORE_BACKENDS = "vllm"
# the watch's phases, and what a unit that is not loading is
ALL_PHASES = PHASES + ("failed", "stopped")
FATAL_CHARS = 300


def load(snap, props, health, watch, now_mono, now_wall, recorded_phases=None, deploy=None):
    """The load as the keeper sees it: ``snap`` (LoadState.snapshot of this start's lines), ``props`` (systemctl
    show), ``health`` (/health's status, None: nothing listens), ``watch`` (what the deploy's watch judges it by,
    journal_follow.load_watch; {} when no watch ran for this start), ``recorded_phases`` (the live release's phase
    seconds: the ETA when no watch said), ``deploy`` (what deploy() says of the lock: until the deploy's watch
    first looks at this start, the load's budget is what is left of the deploy's lock)."""
    active = props.get("ActiveState")
    started_mono = int(props.get("ActiveEnterTimestampMonotonic") or 0) / 1e6
    running = active in ("active", "activating", "reloading") and props.get("MainPID") not in ("0", None, "")
    if not running:
        phase = "failed" if active == "failed" or props.get("SubState") == "auto-restart" else "stopped"
    elif health == 200 and snap["phase"] in ("api", "ready"):
        phase = "ready"
    else:
        phase = snap["phase"]
    mine = watch if watch.get("invocation") == props.get("InvocationID") else {}
    previous = mine.get("previous_phase_seconds") or recorded_phases or {}
    in_phase = (snap.get("phase_seconds") or {}).get(snap["phase"], 0.0)
    progress = snap.get("progress")
    ratio = (float(progress[0]) / progress[1]) if progress and progress[1] else None
    limits = mine.get("stall_seconds") or {}
    limit = float(limits.get(snap["phase"], limits.get("default", 0)) or 0)
    since = snap.get("seconds_since_progress")
    loading = running and phase not in ("ready",)
    fatal = snap.get("fatal") or {}
    started_at = round(now_wall - (now_mono - started_mono), 3) if running and started_mono else None
    budget = mine.get("budget_seconds")
    if budget is None and loading and started_at and (deploy or {}).get("in_progress") and deploy.get("until"):
        budget = round(deploy["until"] - started_at, 1)
    return {
        "phase": phase,
        "progress_ratio": round(ratio, 4) if ratio is not None and loading else None,
        "eta_seconds": eta_seconds(snap["phase"], in_phase, previous) if loading else None,
        "budget_seconds": budget,
        "started_at": started_at,
        "elapsed_seconds": round(now_mono - started_mono, 1) if running and started_mono else None,
        "stalled": bool(loading and limit and since is not None and since > limit),
        "seconds_since_progress": since if loading else None,
        "fatal": (str(fatal.get("line"))[:FATAL_CHARS] if fatal else None),
        "restarts": int(props.get("NRestarts") or 0) if str(props.get("NRestarts") or "0").isdigit() else 0,
        "health": health,
    }


def deploy(holder, now_wall):
    """Whether a deploy holds the host's lock (its holder record, None when there is none): a record past its
    declared time-to-live is a dead run's, not a deploy in progress."""
    if not isinstance(holder, dict) or not holder:
        return {"in_progress": False}
    try:
        since, ttl = float(holder.get("since") or 0), float(holder.get("ttl_seconds") or 0)
    except (TypeError, ValueError):
        since, ttl = 0.0, 0.0
    alive = not ttl or now_wall - since < ttl
    return {"in_progress": bool(alive), "command": str(holder.get("command") or "")[:40],
            "since": since or None, "until": since + ttl if since and ttl else None,
            "user": str(holder.get("user") or "")[:64]}


def last_deploy(line):
    """The last audit line (a dict): its result and time."""
    if not isinstance(line, dict):
        return None
    return {"success": line.get("result") == "ok", "at": str(line.get("at") or "")[:40],
            "command": str(line.get("command") or "")[:40], "release": str(line.get("release") or "")[:40],
            "failed_stage": line.get("failed_stage") if isinstance(line.get("failed_stage"), str) else None}


def release(manifest):
    """The live release, as the host recorded it (current/release.json)."""
    m = manifest if isinstance(manifest, dict) else {}
    if not m.get("id"):
        return None
    payoff = m.get("speculation_payoff") if isinstance(m.get("speculation_payoff"), dict) else {}
    downtime = m.get("downtime") if isinstance(m.get("downtime"), dict) else {}
    return {"id": str(m["id"])[:40], "engine": str(m.get("backend") or BEFORE_BACKENDS)[:40],
            "version": str(m.get("engine_version") or m.get("vllm_version") or "")[:40],
            "model": str(m.get("served_model_name") or "")[:200], "drafter": m.get("drafter_tree_sha256"),
            "acceptance_rate": _num(m.get("acceptance_rate")), "downtime_seconds": _num(downtime.get("seconds")),
            "speculation_gain_ratio": _num(payoff.get("speedup")), "phase_seconds": m.get("phase_seconds") or {}}


def _num(v):
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _label(value):
    """A label value in the text format: backslash, double quote and line feed escaped."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _value(v):
    if v is None:
        return "NaN"
    if isinstance(v, bool):
        return "1" if v else "0"
    return repr(float(v)) if isinstance(v, float) else str(int(v))


# name -> (HELP, TYPE): every metric the keeper writes (README "Monitoring"; the alert rules in roles/monitor)
METRICS = {
    "deployer_load_phase": ("The engine's load phase: 1 for the current one (the watch's phases, failed, stopped).",
                            "gauge"),
    "deployer_load_progress_ratio": ("Progress within the current load phase, 0 to 1 (NaN when the log shows none).",
                                     "gauge"),
    "deployer_load_eta_seconds": ("Seconds until ready, from the previous load's phases (NaN without them).", "gauge"),
    "deployer_load_budget_seconds": ("The deploy's budget for this load (NaN when no deploy watched it).", "gauge"),
    "deployer_load_started_timestamp_seconds": ("When the engine's unit last started (NaN when not running).",
                                                "gauge"),
    "deployer_load_stalled": ("1 when the load made no progress for longer than its phase's stall limit.", "gauge"),
    "deployer_deploy_in_progress": ("1 while a deployer run holds the host's lock.", "gauge"),
    "deployer_last_deploy_success": ("1 when the last deployer run succeeded (NaN before any).", "gauge"),
    "deployer_last_deploy_timestamp_seconds": ("When the last deployer run ended (NaN before any).", "gauge"),
    "deployer_release_info": ("The live release: 1, its id, engine and version as labels.", "gauge"),
    "deployer_engine_restarts_total": ("systemd's restarts of the engine's unit since its last start by hand.",
                                       "counter"),
    "deployer_downtime_seconds": ("The last deploy's downtime: old server's last answer to the new one's first.",
                                  "gauge"),
    "deployer_smoke_acceptance_rate": ("EAGLE-3 acceptance rate the live release's smoke test measured.", "gauge"),
    "deployer_speculation_gain_ratio": ("The live release's tokens/s over the host's release served the other way.",
                                        "gauge"),
    "deployer_state_updated_timestamp_seconds": ("When the state keeper last wrote this file.", "gauge"),
}


def _iso_seconds(text):
    import datetime
    try:
        return datetime.datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def prom_text(state):
    """The state in node_exporter's textfile format: HELP and TYPE on every metric, no timestamps."""
    ld, dp, last, rel = state["load"], state["deploy"], state.get("last_deploy"), state.get("release")
    samples = {name: [] for name in METRICS}
    for p in ALL_PHASES:
        samples["deployer_load_phase"].append(({"phase": p}, ld["phase"] == p))
    samples["deployer_load_progress_ratio"].append(({}, ld["progress_ratio"]))
    samples["deployer_load_eta_seconds"].append(({}, ld["eta_seconds"]))
    samples["deployer_load_budget_seconds"].append(({}, ld["budget_seconds"]))
    samples["deployer_load_started_timestamp_seconds"].append(({}, ld["started_at"]))
    samples["deployer_load_stalled"].append(({}, ld["stalled"]))
    samples["deployer_deploy_in_progress"].append(({}, dp["in_progress"]))
    samples["deployer_last_deploy_success"].append(({}, last["success"] if last else None))
    samples["deployer_last_deploy_timestamp_seconds"].append(({}, _iso_seconds(last["at"]) if last else None))
    if rel:
        samples["deployer_release_info"].append(({"release": rel["id"], "engine": rel["engine"],
                                                   "version": rel["version"]}, 1))
    samples["deployer_engine_restarts_total"].append(({}, ld["restarts"]))
    samples["deployer_downtime_seconds"].append(({}, rel["downtime_seconds"] if rel else None))
    samples["deployer_smoke_acceptance_rate"].append(({}, rel["acceptance_rate"] if rel else None))
    samples["deployer_speculation_gain_ratio"].append(({}, rel["speculation_gain_ratio"] if rel else None))
    samples["deployer_state_updated_timestamp_seconds"].append(({}, round(float(state["updated_at"]), 3)))
    base = {"service": state["service"]}
    out = []
    for name, (text, kind) in METRICS.items():
        out += ["# HELP %s %s" % (name, text), "# TYPE %s %s" % (name, kind)]
        for labels, v in samples[name]:
            lab = ",".join('%s="%s"' % (k, _label(x)) for k, x in sorted(dict(base, **labels).items()))
            out.append("%s{%s} %s" % (name, lab, _value(v)))
    return "\n".join(out) + "\n"
