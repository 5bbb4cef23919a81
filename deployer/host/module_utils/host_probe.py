# -*- coding: utf-8 -*-
"""The live system as the no-op check and ``deployer status`` read it, in one round trip: systemd's view of the
server, its /health and /metrics, the venv the plan names (complete? patched as the plan wants?), the drafter, the
checksums of the live release's files, the NVIDIA device classes, the GPU memory in use, and the newest run's root
cause from the journal.  The release store's side is releases.py."""
from __future__ import annotations

import os

try:    # on the host
    from ansible.module_utils.host_io import http_get, nvidia_devices, systemd_show
    from ansible.module_utils.releases import drafter_changed, edited_files, live_key_set, sha256_file
except ImportError:    # the controller
    from deployer.host.module_utils.host_io import http_get, nvidia_devices, systemd_show
    from deployer.host.module_utils.releases import drafter_changed, edited_files, live_key_set, sha256_file


def _unit_props(service):
    return systemd_show(service, ["ActiveState", "SubState", "NeedDaemonReload", "NRestarts", "MainPID",
                                  "ActiveEnterTimestamp"])


def _last_fatal(service, lines=600):
    """The root cause of the newest run of the unit that logged one (module_utils root_causes.root_cause over each
    systemd invocation of the journal's last ``lines``): {kind, line, runs_ago (0: the run now), at (epoch s)}."""
    import subprocess
    try:
        from ansible.module_utils.log_lines import journal_entry  # on the host
        from ansible.module_utils.root_causes import root_cause
    except ImportError:
        from deployer.host.module_utils.log_lines import journal_entry  # on the controller
        from deployer.host.module_utils.root_causes import root_cause
    try:
        out = subprocess.run(["journalctl", "-u", service + ".service", "-n", str(lines), "-o", "json", "--all",
                              "--no-pager", "--output-fields=MESSAGE,_SYSTEMD_INVOCATION_ID"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    runs, order = {}, []
    for raw in out.splitlines():
        e = journal_entry(raw)
        if e is None:
            continue
        msg = e.get("MESSAGE")
        inv = e.get("_SYSTEMD_INVOCATION_ID") or ""
        if inv not in runs:
            runs[inv] = []
            order.append(inv)
        runs[inv].append((msg or "", e.get("__REALTIME_TIMESTAMP")))
    for ago, inv in enumerate(reversed(order)):
        found = root_cause([m for m, _t in runs[inv]])
        if found:
            at = next((t for m, t in reversed(runs[inv]) if found[1] in m), runs[inv][-1][1])
            return {"kind": found[0], "line": found[1], "runs_ago": ago,
                    "at": round(int(at) / 1e6, 3) if at else None}
    return None


def probe_host_of(argv):
    """The address the host's own checks reach a release's server on, from its argv (``--host``): the bound
    address, or loopback of the same family when it binds all (probe_address)."""
    argv = list(argv or [])
    bind = ""
    for i, a in enumerate(argv):
        if a == "--host" and i + 1 < len(argv):
            bind = argv[i + 1]
        elif a.startswith("--host="):
            bind = a.split("=", 1)[1]
    return probe_address(bind)


def probe_address(bind):
    """The address the host's checks ask a server that binds ``bind`` on: itself, or loopback of the same family
    when it binds them all.  The one rule (deployer.plan.probe_host uses it too)."""
    if bind in ("", "0.0.0.0"):
        return "127.0.0.1"
    return "::1" if bind == "::" else bind


def _http_get(port, path, host="127.0.0.1"):
    """(status, body) of a plain HTTP GET on ``host``:``port`` (the address the server binds; loopback when it
    binds all), or (None, body) when nothing answered with a status."""
    status, body = http_get(port, path, host)
    return status or None, body


def http_health(port, host="127.0.0.1"):
    return _http_get(port, "/health", host=host)[0]


def _gpu_memory_used_mib():
    import subprocess
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, universal_newlines=True,
                             timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [int(x.strip()) for x in out.splitlines() if x.strip().isdigit()]


def _venv_state(venv, patchable=True):
    """Is the venv complete, and what does its vLLM carry (patch engine status: hashes the patched files,
    so a hand-edited file shows as drift, never as "patched").  ``patchable`` false: the plan's engine is never
    patched (its description says so: deployer/engines), so its venv is native as installed."""
    out = {"path": venv, "installed": os.path.exists(os.path.join(venv, ".deployer-installed"))}
    if not out["installed"]:
        return out
    if not patchable:
        out.update(state="native", fingerprint=None, patches=[])
        return out
    try:
        from ansible.module_utils import eagle3_patch as pe
    except ImportError:
        from deployer.host.module_utils import eagle3_patch as pe
    try:
        st = pe.status(pe.vllm_root_of(venv))
        out.update(state=st.get("state"), fingerprint=st.get("fingerprint"), patches=st.get("applied") or [])
    except Exception as e:  # drift, an unsupported vLLM: not a no-op, and say why
        out.update(state="error", error=str(e)[:500])
    return out


KEEPER_STATE = "/run/deployer/state.json"


def _keeper_state():
    """What the host's state keeper wrote last (module_utils/host_state.py), or None when it runs not here."""
    import json
    try:
        with open(KEEPER_STATE) as f:
            got = json.loads(f.read(1 << 20))
    except (OSError, ValueError):
        return None
    if not isinstance(got, dict):
        return None
    import time
    try:    # on the host's own clock: how old what the keeper wrote is (a keeper that stopped writes nothing new)
        got["age_seconds"] = round(time.time() - float(got.get("updated_at")), 1)
    except (TypeError, ValueError):
        got["age_seconds"] = None
    return got


def probe(root, service, venv, drafter_dir, port, live=False, files=None, host="127.0.0.1", patchable=True):
    """What a no-op ``up`` must know, in the same round trip: the venv the plan names (installed? patch
    state and fingerprint), the drafter (complete?), the live release's env file and unit checksums, the
    checksums of other ``files`` the live unit runs (the log-line wrapper), the NVIDIA device classes (part of
    the unit), systemd's view of the server and its /health.  With ``live`` (``deployer status``) also its
    /metrics text and the GPU memory in use."""
    cur = os.path.join(root, "current")
    extra = {}
    if live:
        extra = {"metrics": _http_get(port, "/metrics", host=host)[1], "gpu_memory_used_mib": _gpu_memory_used_mib(),
                 "last_fatal": _last_fatal(service), "api_key_set": live_key_set(root), "keeper": _keeper_state()}
    return dict(extra, **{"venv": _venv_state(venv, patchable) if venv else None,
            "drafter_complete": bool(drafter_dir) and os.path.exists(os.path.join(drafter_dir, ".deployer-complete")),
            "drafter_changed": drafter_changed(drafter_dir) if drafter_dir else [],
            "live_edited": edited_files(cur),
            "live_env_sha256": sha256_file(os.path.join(cur, "vllm.env")),
            "live_unit_sha256": sha256_file(os.path.join(cur, "%s.service" % service)),
            "files_sha256": dict((f, sha256_file(f)) for f in files or []),
            "nvidia_devices": nvidia_devices(), "unit": _unit_props(service), "health": http_health(port, host)})


def status_view(state, crash_loop_restarts):
    """What ``deployer status`` and ``deployer releases`` show of a host, assembled here in one place from
    ``host_state`` (the store) and, with a live probe, ``probe``: a new datum is read above and named here, and
    deployer/cli/views.py shows it (the playbook passes this on as it is; the balancer's view is added there)."""
    try:
        from ansible.module_utils.spec_metrics import spec_decode_stats  # on the host
    except ImportError:
        from deployer.host.module_utils.spec_metrics import spec_decode_stats  # on the controller
    pr = state.get("probe") or {}
    unit = pr.get("unit") or {}
    try:
        restarts = int(unit.get("NRestarts") or 0)
    except ValueError:
        restarts = 0
    return {"releases": state.get("releases") or [], "current": state.get("current"),
            "previous": state.get("previous"), "lock": state.get("lock"),
            "unit": {"ActiveState": unit.get("ActiveState", "?"),
                     "ActiveEnterTimestamp": unit.get("ActiveEnterTimestamp", ""),
                     "NRestarts": unit.get("NRestarts", "?"), "MainPID": unit.get("MainPID", "0")} if pr else None,
            "health": pr.get("health") if pr else None,
            "last_fatal": pr.get("last_fatal") if pr else None,
            "api_key_set": pr.get("api_key_set") if pr else None,
            "keeper": pr.get("keeper") if pr else None,
            "crash_loop": bool(pr) and restarts >= int(crash_loop_restarts),
            "crash_loop_restarts": int(crash_loop_restarts),
            "spec": spec_decode_stats(pr["metrics"]) if pr.get("metrics") else None,
            "gpu_memory_used_mib": pr.get("gpu_memory_used_mib") or [] if pr else []}
