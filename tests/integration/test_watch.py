"""Seeing the load: stall and crash detection, acceptance floor, ETA from the previous release; and what a real
Prometheus, scraping the host as `deployer monitoring` says, sees of it and alerts on (prom_helpers.py)."""
import json
import re

import pytest

from sandbox_helpers import FAST, flat, needs_sandbox, sandbox_hosts, sh, up

pytestmark = [pytest.mark.sandbox, needs_sandbox]
H = "sbx1"


@pytest.fixture(scope="module", autouse=True)
def sandbox():
    for sb in sandbox_hosts(1, package_cache=False):   # installs nothing: no package cache to link
        r = up(*FAST)           # what is watched, not vLLM's checks (test_sandbox, test_real_host)
        assert r.returncode == 0, r.stderr
        yield sb



def test_second_deploy_shows_eta_and_json_phases():
    r = up("-e", "deployer_max_model_len=65536", "--json", *FAST)
    assert r.returncode == 0, r.stderr
    events = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    phases = [e for e in events if e["event"] == "phase"]
    assert phases and all(e["eta_seconds"] is not None for e in phases)   # the first release recorded its phases
    assert {"drafter", "compile"} & {e["phase"] for e in phases}
    done = [e for e in events if e["event"] == "watch_done"]
    assert done[-1]["state"] == "ready"
    assert {"weights", "drafter", "compile", "kv_cache", "graphs"} <= set(done[-1]["phase_seconds"])
    assert events[-1]["event"] == "result" and events[-1]["ok"] is True
    r = up("-e", "deployer_max_model_len=32768", *FAST)
    assert "ETA " in r.stderr


def test_stall_is_reported_by_the_stall_limit_not_the_budget(sandbox, prom):
    live = sh(H, "readlink /opt/deployer/current")
    t0 = __import__("time").time()
    sandbox.set_knobs(H, standin={"stall_phase": "compile", "only_if_arg": "0.957"})
    try:
        r = up("-e", "deployer_gpu_memory_utilization=0.957",
               "-e", "watch_stall_seconds={'default': 600, 'compile': 6}", "-e", "watch_budget_seconds=1500", *FAST)
    finally:
        sandbox.set_knobs(H, standin={})
    assert r.returncode == 1, r.stderr
    err = flat(r.stderr)
    # the compile phase's own limit ended it: named, and measured above it but far below the default's 600 s and
    # the 1500 s budget (the engine's silence, not the controller's wall clock, which a loaded machine stretches)
    m = re.search(r"stalled: no progress for (\d+) s in phase 'torch.compile' \(stall limit 6 s\)", err)
    assert m and 6 <= int(m.group(1)) < 60, err
    assert "budget" not in err.split("stalled:")[1].split(";")[0], err
    assert sh(H, "readlink /opt/deployer/current") == live
    # Prometheus fired the stall's alert from the host's own metrics (the keeper judges by the watch's stall limits)
    stalled = prom.firing("DeployerLoadStalled", t0, __import__("time").time())
    assert stalled and stalled[0][1]["service"] == "deployer-engine", stalled
    assert stalled[0][1]["instance"].endswith(":9100"), stalled


def test_acceptance_below_floor_fails_the_smoke_test(sandbox):
    live = sh(H, "readlink /opt/deployer/current")
    sandbox.set_knobs(H, standin={"acceptance_rate": 0.2})
    try:
        r = up("-e", "deployer_gpu_memory_utilization=0.958", "-e", "smoke_min_acceptance_rate=0.5", *FAST)
    finally:
        sandbox.set_knobs(H, standin={})
    assert r.returncode == 1, r.stderr
    err = flat(r.stderr)
    assert "deploy failed in stage 'smoke'" in err
    assert "EAGLE-3 acceptance rate: measured 0.2" in err and "expected >= 0.5" in err
    assert sh(H, "readlink /opt/deployer/current") == live


def deployer_status():
    from sandbox_helpers import deployer
    return deployer("status", "--sandbox").stdout


def test_live_shard_and_graph_progress_through_real_journald(sandbox, prom):
    """vLLM's shard bar (a newline after every redraw) reaches the watch live through journald; so do its
    CUDA-graph bars, which redraw with \r only: the unit runs the engine under journal_lines.py, which makes each
    redraw a journal line (without it the graph phase showed no percentage until the bar closed).
    The watch samples (one SSH round trip each, ~3 s on a loaded CI machine: a 6 s graph phase gave two
    samples there), so the phases last long enough for >= 3 samples and the graph check asks for two distinct
    values inside the bar, which a bar seen only when it closed cannot give."""
    sandbox.set_knobs(H, standin={"phase_seconds": {"weights": 8, "graphs": 10}})
    # issue 54: from another terminal, with no access to the deploy, the host itself says what is loading: its
    # node_exporter serves the state keeper's metrics, and `deployer status` reads the keeper's state
    import subprocess
    import sys
    import time

    from deployer.sandbox import common
    from sandbox_helpers import ROOT
    ip = {h.name: h.ip for h in common.hosts_on_disk()}[H]
    deploy = subprocess.Popen([sys.executable, "-m", "deployer.cli", "up", "--sandbox", "-e",
                               "deployer_max_model_len=16384", "--json", *FAST], cwd=ROOT, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    seen, status, t0 = "", "", time.time()
    try:
        deadline = time.time() + 300
        while deploy.poll() is None and time.time() < deadline:
            seen = subprocess.run(["curl", "-s", f"http://{ip}:9100/metrics"], capture_output=True, text=True,
                                  timeout=30).stdout
            if 'deployer_load_phase{phase="weights",service="deployer-engine"} 1' in seen:
                status = deployer_status()
                break
            time.sleep(0.5)
        out, err = deploy.communicate(timeout=600)
    finally:
        sandbox.set_knobs(H, standin={})
    r = subprocess.CompletedProcess(deploy.args, deploy.returncode, out, err)
    assert r.returncode == 0, r.stderr
    assert 'deployer_deploy_in_progress{service="deployer-engine"} 1' in seen, seen[-3000:]
    assert re.search(r'deployer_load_budget_seconds\{service="deployer-engine"\} \d', seen), seen[-3000:]
    # (the load goes on while status asks: weights, or a phase after it, with a count or without one: on a loaded
    # machine the look landed in "KV cache sizing; 13 s in", which has none)
    assert re.search(r"load: [a-zA-Z. ]+(?: \d+%?[^;]*)?;.*ETA \dm\d\ds; budget 1800 s; deploy in progress: up",
                     flat(status)), status
    after = subprocess.run(["curl", "-s", f"http://{ip}:9100/metrics"], capture_output=True, text=True).stdout
    for _ in range(20):         # the keeper writes every 2 s
        if 'deployer_load_phase{phase="ready",service="deployer-engine"} 1' in after and \
                'deployer_deploy_in_progress{service="deployer-engine"} 0' in after:
            break
        time.sleep(1)
        after = subprocess.run(["curl", "-s", f"http://{ip}:9100/metrics"], capture_output=True, text=True).stdout
    assert 'deployer_last_deploy_success{service="deployer-engine"} 1' in after, after[-3000:]
    assert 'deployer_load_phase{phase="ready",service="deployer-engine"} 1' in after, after[-3000:]
    # a real Prometheus saw the load move through its phases, and the planned load never so much as made
    # DeployerEngineDown pending (not serving for the whole restart, but a deploy holds the lock, within its budget:
    # from the old server's stop, through the start before the watch's first look, to ready)
    time.sleep(1.5)
    phases = [lab["phase"] for _, lab, v in sorted(prom.samples("deployer_load_phase == 1", t0, time.time()),
                                                   key=lambda x: x[0]) if v == 1]
    order = [p for i, p in enumerate(phases) if i == 0 or phases[i - 1] != p]
    assert {"weights", "graphs"} <= set(order) and order[-1] == "ready", order
    assert order.index("weights") < order.index("graphs") < len(order) - 1, order
    assert prom.samples('ALERTS{alertname="DeployerEngineDown"}', t0, time.time()) == [], order
    # every query of the Grafana dashboard returns series here: no dead panel (the state keeper's metrics and the
    # engine's own, the chat the smoke sent included)
    from deployer import monitoring
    dead = [(title, q) for title, q in monitoring.dashboard_queries(json.loads(monitoring.DASHBOARD.read_text()))
            if not prom.query(q)]
    assert dead == [], dead
    events = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    pcts = sorted({e["percent"] for e in events if e["event"] == "phase" and e["phase"] == "weights"
                   and e["percent"] is not None})
    assert len([p for p in pcts if 0 < p < 100]) >= 3, pcts
    graphs = sorted({e["percent"] for e in events if e["event"] == "phase" and e["phase"] == "graphs"
                     and e["percent"] is not None})
    assert len([p for p in graphs if 0 < p < 100]) >= 2, graphs
    # every redraw is its own journal entry, as vLLM's _BAR_FORMAT makes it
    n = int(sh(H, "journalctl -u deployer-engine --no-pager -o cat --all | grep -c 'Loading safetensors checkpoint "
                  "shards: .* Completed | [0-9]*/64' || true"))
    assert n >= 64, n
    # the \r-only graph bar too, once split by the wrapper; the wrapper passes the engine's pid-less lines on
    g = int(sh(H, "journalctl -u deployer-engine --no-pager -o cat --all | grep -c '^Capturing CUDA graphs' || true"))
    assert g >= 10, g
    assert "journal_lines-" in sh(H, "systemctl show -p ExecStart --value deployer-engine")
