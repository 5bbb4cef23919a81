"""The lock report and the final human/JSON report, from recorded-shape runner results (no SSH)."""
import json
import os
import socket

from deployer import events
from deployer.cli import deploy


def result(failures, processed=("h1",), facts=None):
    return events.Result(rc=2 if failures else 0, status="failed" if failures else "successful", failures=failures,
                         stats={"processed": {h: 1 for h in processed}}, facts=facts or {})


def lock_failure(pid):
    from deployer import controller_id
    holder = dict(controller_id.identity(pid), controller=socket.gethostname(), user="bob")   # as lock.yml records it
    return events.Failure("h1", "Acquire the deploy lock.", "", "host is locked by bob@x (pid 1, `up`)",
                          {"locked": True, "holder": holder})


def test_stale_and_live_locks(capsys):
    dead = 2 ** 22 + 12345  # above pid_max on this machine: never a live process
    assert deploy.report(result([lock_failure(dead)]), False, "up") == events.Exit.LOCKED
    assert f"STALE: its process {dead} is gone from this controller" in capsys.readouterr().err
    assert deploy.report(result([lock_failure(os.getpid())]), True, "up") == events.Exit.LOCKED
    assert "held by a live deploy on this machine" in capsys.readouterr().out


def test_report_reads_only_the_result(capsys):
    r = {"outcome": "ok", "exit_class": "ok", "release": "abc123", "release_was_live": True, "restarted": False,
         "acceptance_rate": 0.61, "mean_acceptance_length": 2.8}
    assert deploy.report(result([], facts={"h1": {"deployer_result": r}}), False, "up") == 0
    text = capsys.readouterr().out
    assert "h1: release abc123 unchanged, nothing restarted; EAGLE-3 acceptance rate 0.61" in " ".join(text.split())
    # check mode never says "deployed"
    assert deploy.report(result([], facts={"h1": {"deployer_result": dict(r, release_was_live=False,
                                                                          check_mode=True)}}), False, "up") == 0
    said = " ".join(capsys.readouterr().out.split())
    assert "h1: release abc123 would be deployed (check mode: nothing changed)" in said
    assert deploy.report(result([], facts={"h1": {"deployer_result": dict(r, restarted=True)}}), True, "up") == 0
    line = json.loads(capsys.readouterr().out)
    assert line["event"] == "result" and line["ok"] and line["hosts"]["h1"]["release"] == "abc123"


def test_no_host_matched_is_never_success(capsys):
    assert result([], processed=()).exit_code() == events.Exit.USAGE
    assert deploy.report(result([], processed=()), False, "up") == events.Exit.USAGE
    assert "no host matched" in capsys.readouterr().err


def test_a_lock_from_another_controller_is_not_called_stale():
    note = deploy.lock_note({"controller": "ops-laptop-7", "pid": 2 ** 22 + 1, "user": "carol"})
    assert note == "held from ops-laptop-7; if that run died, `deployer unlock` removes it"
