"""Exit codes and the lock report, from recorded-shape runner results (no SSH)."""
import os
import socket

from deployer import cli, runner


def result(failures, processed=("h1",)):
    return runner.Result(rc=2 if failures else 0, status="failed" if failures else "successful", failures=failures,
                         stats={"processed": {h: 1 for h in processed}})


def lock_failure(pid):
    return runner.Failure("h1", "Acquire the deploy lock.", "", "host is locked by bob@x (pid 1, `up`)",
                          {"locked": True, "holder": {"controller": socket.gethostname(), "pid": pid, "user": "bob"}})


def test_stale_and_live_locks(capsys):
    dead = 2 ** 22 + 12345  # above pid_max on this machine: never a live process
    res = result([lock_failure(dead)])
    assert cli._report(res, False, "up") == runner.Exit.LOCKED
    assert "STALE: its process is gone" in capsys.readouterr().err
    res = result([lock_failure(os.getpid())])
    assert cli._report(res, True, "up") == runner.Exit.LOCKED
    assert "held by a live deploy on this machine" in capsys.readouterr().out


def test_exit_codes():
    assert result([]).exit_code() == runner.Exit.OK
    assert result([], processed=()).exit_code() == runner.Exit.USAGE   # no host matched is never success
    pre = runner.Failure("h1", "Ensure the host has 8 GPUs.", "preflight", "GPU count: measured 7, expected 8")
    assert result([pre]).exit_code() == runner.Exit.PREFLIGHT
    ver = runner.Failure("h1", "Ensure vLLM accepts this launch.", "verify", "verification failed")
    assert result([ver]).exit_code() == runner.Exit.VERIFY
    late = runner.Failure("h1", "Fail with the reason.", "", "deploy failed in stage 'watch'")
    assert result([pre, late]).exit_code() == runner.Exit.FAILED
    r = result([runner.Failure("h1", "Gathering", "", "unreachable")])
    r.unreachable = ["h1"]
    assert r.exit_code() == runner.Exit.UNREACHABLE
