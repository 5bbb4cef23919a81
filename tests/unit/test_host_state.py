"""The host's account of its engine (module_utils/host_state.py, kept by the state keeper): what each metric says in
each state of a load, in node_exporter's textfile format as Prometheus' own promtool reads it, and the alert rules
under promtool's own rule tests (templates/prometheus/, tests/prometheus/)."""
import json
import shutil
import subprocess

import pytest

from deployer.host.module_utils import host_state
from deployer.host.module_utils.engine_logs import LoadState
from helpers import ROOT

PROMTOOL = shutil.which("promtool", path="/usr/bin:/bin")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool: apt-get install prometheus (scripts/dev.sh)")
INV = "0123456789abcdef0123456789abcdef"


def props(**kw):
    return dict({"ActiveState": "active", "SubState": "running", "MainPID": "42", "InvocationID": INV,
                 "ActiveEnterTimestampMonotonic": str(100 * 10**6), "NRestarts": "0"}, **kw)


def snap(lines, now=160.0):
    st = LoadState()
    for t, line in lines:
        st.feed(line, t)
    return st.snapshot(now)


LOADING = [(100.0, "(Worker_TP0 pid=1) INFO 11-29 10:00:00 [x.py:1] Starting to load model /m..."),
           (150.0, "(Worker_TP0 pid=1) Loading safetensors checkpoint shards:  50% Completed | 32/64 [00:10<00:10]")]
WATCH = {"invocation": INV, "budget_seconds": 1800, "stall_seconds": {"default": 600, "weights": 30},
         "previous_phase_seconds": {"starting": 40, "weights": 200, "kv_cache": 30, "api": 5}}


def test_a_load_in_its_weights_phase_with_the_deploys_budget_and_an_eta():
    ld = host_state.load(snap(LOADING), props(), None, WATCH, now_mono=160.0, now_wall=1000.0)
    assert ld["phase"] == "weights" and ld["progress_ratio"] == 0.5 and ld["budget_seconds"] == 1800
    assert ld["eta_seconds"] == 200 - 10 + 30 + 5 and ld["started_at"] == 940.0 and not ld["stalled"]
    # past its phase's stall limit (30 s without progress in weights): stalled
    assert host_state.load(snap(LOADING, 185.0), props(), None, WATCH, 185.0, 1025.0)["stalled"]
    # a watch of another start says nothing about this one; the live release's phases still give an ETA
    other = dict(WATCH, invocation="f" * 32)
    ld = host_state.load(snap(LOADING), props(), None, other, 160.0, 1000.0, {"weights": 100})
    assert ld["budget_seconds"] is None and ld["eta_seconds"] == 90 and not ld["stalled"]
    # ... but while a deploy holds the host's lock, the load's budget until the watch's first look is what is left of
    # the lock (since 900, for 10800 s; the unit started at 940): the rule's planned load, not an engine down
    holding = host_state.deploy({"since": 900, "ttl_seconds": 10800, "command": "up"}, 1000.0)
    ld = host_state.load(snap(LOADING), props(), None, other, 160.0, 1000.0, {"weights": 100}, holding)
    assert ld["budget_seconds"] == 10760 and ld["started_at"] == 940.0
    assert host_state.load(snap(LOADING), props(), None, WATCH, 160.0, 1000.0, None, holding)["budget_seconds"] == 1800


def test_ready_failed_and_stopped():
    ready = LOADING + [(170.0, "(APIServer pid=1) INFO 11-29 10:00:00 [api_server.py:1] Starting vLLM API server 0 on "
                               "http://0.0.0.0:8000")]
    ld = host_state.load(snap(ready, 171.0), props(), 200, WATCH, 171.0, 1011.0)
    assert ld["phase"] == "ready" and ld["eta_seconds"] is None and ld["progress_ratio"] is None
    crash = host_state.load(snap(LOADING), props(ActiveState="activating", SubState="auto-restart", MainPID="0",
                                                 NRestarts="3"), None, WATCH, 160.0, 1000.0)
    assert crash["phase"] == "failed" and crash["restarts"] == 3 and crash["started_at"] is None
    stopped = host_state.load(snap([]), props(ActiveState="inactive", SubState="dead", MainPID="0"), None, {}, 1, 1)
    assert stopped["phase"] == "stopped"


def test_a_deploy_in_progress_is_a_live_lock_holder_and_the_last_deploy_is_the_audit_trails_last_line():
    assert host_state.deploy(None, 1000.0) == {"in_progress": False}
    holder = {"since": 900.0, "ttl_seconds": 7200, "command": "up", "user": "ops", "token": "t"}
    dp = host_state.deploy(holder, 1000.0)
    assert dp["in_progress"] and dp["command"] == "up" and "token" not in dp
    assert not host_state.deploy(dict(holder, since=0.0, ttl_seconds=10), 1000.0)["in_progress"]   # a dead run's
    last = host_state.last_deploy({"result": "failed", "at": "2026-12-07T03:00:00+00:00", "command": "up",
                                   "release": "abc", "failed_stage": "watch"})
    assert last == {"success": False, "at": "2026-12-07T03:00:00+00:00", "command": "up", "release": "abc",
                    "failed_stage": "watch"}


def state(phase_lines=LOADING, **over):
    rel = host_state.release({"id": "3221dfa4a5b2", "backend": "vllm", "engine_version": "0.16.0",
                              "served_model_name": 'kimi "k2.5"\n', "acceptance_rate": 0.61,
                              "downtime": {"seconds": 412.5}, "speculation_payoff": {"speedup": 1.34}})
    return dict({"service": "deployer-engine", "updated_at": 1000.5,
                 "load": host_state.load(snap(phase_lines), props(), None, WATCH, 160.0, 1000.0),
                 "deploy": host_state.deploy({"since": 900.0, "ttl_seconds": 7200, "command": "up"}, 1000.0),
                 "last_deploy": host_state.last_deploy({"result": "ok", "at": "2026-12-07T03:00:00+00:00"}),
                 "release": rel}, **over)


def test_the_textfile_holds_every_named_metric_with_help_and_type_and_no_timestamp():
    text = host_state.prom_text(state())
    lines = text.splitlines()
    for name in host_state.METRICS:
        assert f"# HELP {name} " in text and f"# TYPE {name} " in text, name
    assert 'deployer_load_phase{phase="weights",service="deployer-engine"} 1' in lines
    assert 'deployer_load_phase{phase="ready",service="deployer-engine"} 0' in lines
    assert sum(1 for x in lines if x.startswith("deployer_load_phase{")) == len(host_state.ALL_PHASES)
    assert 'deployer_deploy_in_progress{service="deployer-engine"} 1' in lines
    assert 'deployer_load_progress_ratio{service="deployer-engine"} 0.5' in lines
    assert ('deployer_release_info{engine="vllm",release="3221dfa4a5b2",service="deployer-engine",version="0.16.0"} 1'
            in lines)
    assert 'deployer_speculation_gain_ratio{service="deployer-engine"} 1.34' in lines
    assert 'deployer_last_deploy_timestamp_seconds{service="deployer-engine"} 1796612400.0' in lines
    # a sample line is name{labels} value: two fields, never a timestamp
    assert all(len(x.rsplit(" ", 1)) == 2 and "} " in x for x in lines if not x.startswith("#"))
    # unknown is NaN, never a made-up 0
    none = host_state.prom_text(state(release=None, last_deploy=None))
    assert 'deployer_last_deploy_success{service="deployer-engine"} NaN' in none.splitlines()


@needs_promtool
def test_promtool_reads_the_textfile_as_valid_exposition():
    r = subprocess.run([PROMTOOL, "check", "metrics"], input=host_state.prom_text(state()), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


@needs_promtool
def test_the_alert_rules_pass_promtools_check_and_its_rule_tests():
    rules = ROOT / "templates/prometheus/deployer-alerts.yml"
    r = subprocess.run([PROMTOOL, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr
    r = subprocess.run([PROMTOOL, "test", "rules", str(ROOT / "tests/prometheus/deployer-alerts.test.yml")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr


def test_the_state_holds_no_secret():
    holder = {"since": 900.0, "ttl_seconds": 7200, "command": "up", "token": "lock-t0ken-S3CRET"}
    st = state(deploy=host_state.deploy(holder, 1000.0))
    text = json.dumps(st) + host_state.prom_text(st)
    assert "S3CRET" not in text and '"token"' not in text and "api_key" not in text.lower()


def test_status_prints_a_load_or_a_deploy_in_progress_in_one_line_and_says_when_the_state_is_old():
    from deployer.cli.views import keeper_line
    st = state()
    line = keeper_line(dict(st, age_seconds=1.0))
    assert line == "load: loading weights 50%; 60 s in; ETA 3m45s; budget 1800 s; deploy in progress: up by ?", line
    assert keeper_line(dict(st, age_seconds=95.0)).startswith("STALE, 95 s old (is deployer-state running?); load: ")
    assert len(keeper_line(dict(st, age_seconds=95.0))) <= 118
    ready = host_state.load(snap(LOADING), props(), 200, WATCH, 160.0, 1000.0)
    assert keeper_line(dict(st, load=dict(ready, phase="ready"), deploy={"in_progress": False})) == ""
    assert keeper_line(None) == ""
