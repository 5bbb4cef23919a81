"""A fleet behind a real HAProxy (issue #15): three sandbox GPU hosts and a balancer host, a bounded client load
through the balancer (bench/client_load.py) during rolling deploys.  Zero failed client requests, and no
request that started while its host was out of the balancer was served by that host; hosts left out of the
balancer (a failed rollback, a run that died), an operator's `maint`, a restart of the live release (a rotated
secret)."""
import itertools
import json
import os

import pytest

from fleet_helpers import (
    GPU,
    LB,
    check_clients,
    current,
    fleet_hosts,
    lb_admin,
    lb_set,
    lb_states,
    out_spans,
    roll,
)
from sandbox_helpers import FAST, deployer, main_pid, needs_sandbox, sh

pytestmark = [pytest.mark.sandbox, needs_sandbox]


@pytest.fixture(scope="module", autouse=True)
def fleet():
    yield from fleet_hosts()



# First, while every host runs the fixture's release: the drained-host tests and a restart of the live release.
def test_a_host_whose_rollback_fails_too_stays_drained_and_the_next_up_puts_it_back():
    """docs/fleet.md item 3 (issue 24's untested promise): when the new release and the last live one both fail
    to load, the host stays drained (no client is sent to a server that does not serve), the message says so, the
    other hosts serve on; the next `up`, once the fault is gone, brings it back into the balancer."""
    from deployer.sandbox import hosts as sb
    before = {h: current(h) for h in GPU}
    sb.set_knobs("sbx2", standin={"crash_phase": "kv_cache"})    # every start crashes: the new release, the restore
    try:
        r, records, summary, rec = roll("--limit", "sbx2", "-e", "deployer_max_model_len=16384")
        said = " ".join((r.stdout + r.stderr).split())
        assert r.returncode == 1, said
        assert "ROLLBACK FAILED: the last live release did not come back" in said, said
        assert "left drained in the balancer" in said, said
        assert {h: current(h) for h in GPU} == before             # sbx2's current is its last live release again
        check_clients(records, summary, rec)                      # out before its restart, and it stayed out
        seen = [s for _t, s in rec.seen["sbx2"]]
        out = next(i for i, x in enumerate(seen) if x != "ready")     # drained before its restart ...
        assert "ready" not in seen[out:], seen[out:][:20]              # ... and never back in
        # its health checks fail (DOWN); what the deployer set stays drain, so a server systemd brings back later
        # gets no request until a deployer run says it serves
        assert lb_admin() == {"sbx1": "ready", "sbx2": "drain", "sbx3": "ready"}
        assert lb_states()["sbx2"][0] in ("down", "drain") and lb_states()["sbx1"] == lb_states()["sbx3"] == [
            "ready", 0], lb_states()
        st = deployer("status", "--sandbox", "--limit", "sbx2")      # the operator sees it held out, not just down
        assert "balancer: down (set drain)" in st.stdout or "balancer: drain," in st.stdout, st.stdout
    finally:
        sb.set_knobs("sbx2", standin={})
    r = deployer("up", "--sandbox", "--serial", "1", "--limit", "sbx2", *FAST)
    assert r.returncode == 0, r.stdout + r.stderr
    assert lb_admin() == {h: "ready" for h in GPU}
    assert lb_states() == {h: ["ready", 0] for h in GPU}
    assert sh("sbx2", "systemctl is-active deployer-engine") == "active"


def test_a_host_left_drained_while_its_live_release_serves_is_put_back_by_a_no_op_up_and_maint_is_kept():
    """A run that died after its drain (or a rollback that failed while systemd later brought the server back)
    leaves a serving host drained; `up` with nothing to deploy puts it back.  An operator's `maint` is theirs:
    the same no-op leaves it."""
    r = deployer("up", "--sandbox", "--serial", "1", *FAST)        # every host on this release (nothing to do
    assert r.returncode == 0, r.stdout + r.stderr                     # after the test before: a roll otherwise)
    before = {x: current(x) for x in GPU}
    pids = {x: main_pid(x) for x in GPU}
    lb_set("sbx1", "drain")
    lb_set("sbx3", "maint")
    try:
        r = deployer("up", "--sandbox", "--serial", "1", *FAST)
        assert r.returncode == 0, r.stdout + r.stderr
        assert lb_admin() == {"sbx1": "ready", "sbx2": "ready", "sbx3": "maint"}
        assert {x: current(x) for x in GPU} == before and {x: main_pid(x) for x in GPU} == pids   # nothing deployed
        # the same when the run takes the full path and finds the server serving (a server systemd brought back
        # after the no-op's probe, under load: CI, 2026-12-06): nothing restarts, so this run drains nothing, and
        # the smoke it passes puts back the host an earlier run left drained (it stayed drained, exit 0, before)
        lb_set("sbx1", "drain")
        r = deployer("up", "--sandbox", "--serial", "1", "--limit", "sbx1", "-e", "deployer_noop_check=false", *FAST)
        assert r.returncode == 0, r.stdout + r.stderr
        assert main_pid("sbx1") == pids["sbx1"] and lb_admin() == {"sbx1": "ready", "sbx2": "ready", "sbx3": "maint"}
        # a restart of the host in maint (its live release, a rotated token: drained first) leaves it in maint
        env = dict(os.environ, DEPLOYER_HF_TOKEN="hf_" + "m4int" * 6)
        r = deployer("up", "--sandbox", "--serial", "1", "--limit", "sbx3", *FAST, env=env)
        assert r.returncode == 0, r.stdout + r.stderr
        assert current("sbx3") == before["sbx3"] and main_pid("sbx3") != pids["sbx3"]
        assert lb_admin() == {"sbx1": "ready", "sbx2": "ready", "sbx3": "maint"}
    finally:
        lb_set("sbx3", "ready")


def test_a_rotated_secret_restarts_each_host_out_of_the_balancer_and_a_plain_up_is_refused():
    """A rotated HF token is the same release (a release holds no secret) but restarts the server, which reads it
    at start: in a fleet that restart is drained like a new release's.  A plain `up` is refused before anything
    changes (it would restart every replica at once); `--serial 1` restarts one host at a time, each out of the
    balancer while it restarts, with no client error (two hosts of the three: the suite's time)."""
    # every host runs the fixture's release (the tests before change no release for good): the token alone restarts
    before, pids = {h: current(h) for h in GPU}, {h: main_pid(h) for h in GPU}
    env = dict(os.environ, DEPLOYER_HF_TOKEN="hf_" + "r0tated" * 5)
    r = deployer("up", "--sandbox", *FAST, env=env)              # all three at once
    assert r.returncode == 3, r.stdout + r.stderr
    assert "would leave no server ready in backend llm" in r.stdout + r.stderr
    assert {h: main_pid(h) for h in GPU} == pids                  # nothing restarted
    r, records, summary, rec = roll("--limit", "sbx1:sbx2", env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert {h: current(h) for h in GPU} == before                 # the same release ...
    assert main_pid("sbx1") != pids["sbx1"] and main_pid("sbx2") != pids["sbx2"], pids   # ... restarted
    assert main_pid("sbx3") == pids["sbx3"]
    check_clients(records, summary, rec)
    for h in ("sbx1", "sbx2"):
        states = [s for _t, s in rec.seen[h]]
        assert "drain" in states and states[-1] == "ready", (h, states[-5:])
    spans = {h: out_spans(rec, h) for h in ("sbx1", "sbx2")}
    assert max(spans["sbx1"]) < min(spans["sbx2"]), spans          # one at a time
    assert {s for _t, s in rec.seen["sbx3"]} == {"ready"}
    assert lb_states() == {h: ["ready", 0] for h in GPU}


def test_rolling_deploy_of_three_hosts_drains_each_and_no_client_request_fails(prom):
    import time
    before = {h: current(h) for h in GPU}
    t0 = time.time()
    r, records, summary, rec = roll("-e", "deployer_max_model_len=65536")
    assert r.returncode == 0, r.stdout + r.stderr
    after = {h: current(h) for h in GPU}
    assert all(after[h] != before[h] for h in GPU)                 # every host runs the new release
    check_clients(records, summary, rec)
    # each host left the balancer once (never two at a time) and came back
    for h in GPU:
        states = [s for _t, s in rec.seen[h]]
        assert "drain" in states and states[-1] == "ready", (h, states[-5:])
    out_at = {h: [t for t, s in rec.seen[h] if s != "ready"] for h in GPU}
    for a in GPU:
        for b in GPU:
            if a < b and out_at[a] and out_at[b]:
                assert max(out_at[a]) < min(out_at[b]) or max(out_at[b]) < min(out_at[a]), (a, b)
    assert set(summary["by_host"]) >= set(GPU)                     # the load was spread over the fleet
    assert lb_states() == {h: ["ready", 0] for h in GPU}
    # Prometheus, scraping the balancer's own HAProxy exporter as `deployer monitoring` says, saw each host drained,
    # and no host's restart made DeployerEngineDown so much as pending
    time.sleep(1)
    drained = {lab["server"] for _, lab, v in prom.samples('haproxy_server_status{state="DRAIN"} == 1', t0,
                                                           time.time())}
    assert drained == set(GPU), drained
    assert prom.samples('ALERTS{alertname="DeployerEngineDown"}', t0, time.time()) == []


def test_a_failed_host_stops_the_roll_is_rolled_back_and_re_enabled_with_no_client_error():
    from deployer.sandbox import hosts as sb
    before = {h: current(h) for h in GPU}
    sb.set_knobs("sbx2", standin={"crash_phase": "kv_cache", "only_if_arg": "32768"})
    try:
        r, records, summary, rec = roll("-e", "deployer_max_model_len=32768")
    finally:
        sb.set_knobs("sbx2", standin={})
    assert r.returncode == 1, r.stdout + r.stderr
    assert "deploy failed in stage 'watch'; rolled back to the last live release" in r.stdout + r.stderr
    after = {h: current(h) for h in GPU}
    assert after["sbx1"] != before["sbx1"]          # the roll went through sbx1,
    assert after["sbx2"] == before["sbx2"]          # sbx2 failed and runs its last live release again,
    assert after["sbx3"] == before["sbx3"]          # and the roll stopped before sbx3
    check_clients(records, summary, rec)
    # the balancer saw each of the two hosts the roll reached leave it (drained before its restart) and come back;
    # sbx3, never reached, never left it
    for h in ("sbx1", "sbx2"):
        states = [s for _t, s in rec.seen[h]]
        assert "drain" in states and states[-1] == "ready", (h, states[-5:])
    assert {s for _t, s in rec.seen["sbx3"]} == {"ready"}, rec.seen["sbx3"][-5:]
    assert lb_states() == {h: ["ready", 0] for h in GPU}   # the failed host serves again, re-enabled


def test_a_deploy_that_would_leave_no_host_serving_is_refused_and_changes_nothing():
    before = {h: current(h) for h in GPU}
    r = deployer("up", "--sandbox", *FAST, "-e", "deployer_max_model_len=16384")   # all three at once
    assert r.returncode == 3, r.stdout + r.stderr
    assert "would leave no server ready in backend llm" in r.stdout + r.stderr
    assert {h: current(h) for h in GPU} == before
    assert lb_states() == {h: ["ready", 0] for h in GPU}


def test_status_shows_each_hosts_state_in_the_balancer():
    r = deployer("status", "--sandbox", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads(r.stdout)
    assert {h: (data[h]["balancer"] or {}).get("state") for h in GPU} == {h: "ready" for h in GPU}
    assert all(data[h]["balancer"]["scur"] == 0 for h in GPU)
    r = deployer("status", "--sandbox")
    assert r.stdout.count("balancer: ready, 0 requests in flight") == 3, r.stdout


def test_a_roll_two_hosts_at_a_time_drains_them_together_and_the_third_after():
    """--serial 2 (issue 24: only --serial 1 was ever rolled for real): sbx1 and sbx2 leave the balancer together,
    sbx3 serves alone meanwhile and leaves only after both are back; no client request fails."""
    before = {h: current(h) for h in GPU}
    r, records, summary, rec = roll("-e", "deployer_max_model_len=49152", serial=2)
    assert r.returncode == 0, r.stdout + r.stderr
    assert all(current(h) != before[h] for h in GPU)
    check_clients(records, summary, rec)
    one, two, three = (out_spans(rec, h) for h in GPU)
    assert one and two and three, (one[-3:], two[-3:], three[-3:])
    assert min(two) < max(one) and min(one) < max(two), "sbx1 and sbx2 were out at the same time (one batch)"
    assert max(one) < min(three) and max(two) < min(three), "sbx3 left only after the first batch was back"
    assert lb_states() == {h: ["ready", 0] for h in GPU}


def test_a_fleet_rollback_rolls_one_host_at_a_time_behind_the_balancer():
    """`deployer rollback --serial 1` on the fleet (issue 24: rollback was never run on a fleet): each host back to its
    release before the last roll, drained before its restart and back after it, one at a time, no client error;
    without --serial it is refused before anything changes (it would take every server out at once)."""
    before = {h: current(h) for h in GPU}
    r = deployer("rollback", "--sandbox")
    assert r.returncode == 3, r.stdout + r.stderr
    assert "would leave no server ready in backend llm" in r.stdout + r.stderr
    assert {h: current(h) for h in GPU} == before
    previous = {h: sh(h, "readlink /opt/deployer/previous | xargs basename") for h in GPU}
    r, records, summary, rec = roll(command="rollback")
    assert r.returncode == 0, r.stdout + r.stderr
    assert {h: current(h) for h in GPU} == previous
    check_clients(records, summary, rec)
    for h in GPU:
        states = [s for _t, s in rec.seen[h]]
        assert "drain" in states and states[-1] == "ready", (h, states[-5:])
    spans = {h: out_spans(rec, h) for h in GPU}
    for a, b in itertools.combinations(GPU, 2):
        assert max(spans[a]) < min(spans[b]) or max(spans[b]) < min(spans[a]), (a, b)
    assert lb_states() == {h: ["ready", 0] for h in GPU}


def test_a_config_haproxy_refuses_is_not_installed_and_the_old_one_keeps_serving():
    """Issue 24's untested promise: the configuration is checked by `haproxy -c` before it replaces the old one.  A
    port no socket can bind (the argument spec checks an int, not a port's range) gets haproxy's own refusal; the
    file in place stays byte for byte, HAProxy keeps serving every host, no GPU host changes."""
    before = {h: current(h) for h in GPU}
    cfg = sh(LB, "sha256sum /etc/haproxy/haproxy.cfg")
    r = deployer("up", "--sandbox", "--serial", "1", *FAST, "-e", "balancer_port=70000")
    said = " ".join((r.stdout + r.stderr).split())
    # exit 3, as any check that fails before anything changes: the balancer host records its result (issue 24)
    assert r.returncode == 3, said
    assert "haproxy -c refused the new configuration; /etc/haproxy/haproxy.cfg is unchanged" in said, said
    assert "70000" in said, said                       # haproxy's own reason names the port
    assert sh(LB, "sha256sum /etc/haproxy/haproxy.cfg") == cfg
    assert sh(LB, "systemctl is-active haproxy") == "active"
    assert lb_states() == {h: ["ready", 0] for h in GPU}
    assert {h: current(h) for h in GPU} == before
