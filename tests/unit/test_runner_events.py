"""The event stream -> Result mapping: failures, masking of no_log output, unreachable hosts, facts, exit codes."""
from deployer import events


def ev(kind, **data):
    return {"event": kind, "event_data": data}


def collect(*evs):
    c = events.Collector()
    for e in evs:
        c(e)
    return c.result(rc=2 if c.failures else 0, status="failed" if c.failures else "successful")


def test_failure_messages_and_no_log_masking():
    r = collect(
        ev("runner_on_failed", host="h1", task="Ask for one chat completion.", role="smoke",
           res={"msg": "HTTP 401 Bearer sekrit-123", "_ansible_no_log": True}),
        ev("runner_on_failed", host="h2", task="Ensure the host has 8 GPUs.", role="preflight",
           res={"msg": ["GPU count: measured 7", "expected 8"]}),
        ev("runner_on_failed", host="h3", task="Tolerated", role="smoke", ignore_errors=True, res={"msg": "x"}),
        ev("runner_on_failed", host="h4", task="Ensure every GPU ...", role="preflight",
           res={"msg": "One or more items failed", "results": [
               {"failed": False, "msg": "All assertions passed"},
               {"failed": True, "msg": "GPU 1: measured 'NVIDIA H100' with 81559 MiB; expected ..."}]}),
        ev("playbook_on_stats", processed={"h1": 1, "h2": 1, "h3": 1, "h4": 1}),
    )
    msgs = {f.host: f.msg for f in r.failures}
    assert msgs == {"h1": events.HIDDEN, "h2": "GPU count: measured 7\nexpected 8",
                    "h4": "GPU 1: measured 'NVIDIA H100' with 81559 MiB; expected ..."}   # the item that failed
    assert "sekrit" not in repr(r.failures)
    assert r.exit_code() == events.Exit.FAILED                   # smoke + preflight: not "nothing changed"


def test_lock_unreachable_and_facts():
    holder = {"user": "bob", "controller": "c1", "pid": 7}
    r = collect(ev("runner_on_failed", host="h1", task="Acquire the deploy lock.", role="",
                   res={"msg": "host is locked", "locked": True, "holder": holder, "token": "t"}),
                ev("playbook_on_stats", processed={"h1": 1}))
    assert r.exit_code() == events.Exit.LOCKED and r.failures[0].res == {"locked": True, "holder": holder}
    r = collect(ev("runner_on_unreachable", host="h9", task="Gathering", res={"msg": "Host key verification failed"}),
                ev("playbook_on_stats", processed={"h9": 1}))
    assert r.unreachable == ["h9"] and r.exit_code() == events.Exit.UNREACHABLE
    assert "Host key verification failed" in r.failures[0].msg
    result = {"outcome": "ok", "exit_class": "ok", "release": "abc"}
    r = collect(ev("runner_on_ok", host="h1", res={"ansible_facts": {"deployer_result": result, "other": 1}}),
                ev("playbook_on_stats", processed={"h1": 1}))
    assert r.facts == {"h1": {"deployer_result": result}} and r.exit_code() == events.Exit.OK


def test_exit_code_comes_from_the_playbooks_result():
    """The CLI knows no role names: each host's deployer_result says which class of failure it was."""
    def run(*classes):
        evs = [ev("runner_on_failed", host=f"h{i}", task="Fail with the reason.", res={"msg": "x"})
               for i, c in enumerate(classes) if c != "ok"]
        evs += [ev("runner_on_ok", host=f"h{i}", res={"ansible_facts": {"deployer_result": {"exit_class": c}}})
                for i, c in enumerate(classes)]
        return collect(*evs, ev("playbook_on_stats", processed={f"h{i}": 1 for i in range(len(classes))}))
    assert run("preflight").exit_code() == events.Exit.PREFLIGHT
    assert run("verify").exit_code() == events.Exit.VERIFY
    assert run("ok", "preflight", "failed").exit_code() == events.Exit.FAILED   # the worst class wins
    assert run("locked").exit_code() == events.Exit.LOCKED


def test_ansible_playbooks_own_error_is_kept_not_reported_as_no_host_matched():
    """A playbook or inventory ansible-playbook cannot read: no host runs, and the CLI says why (the [ERROR] block
    with file, line and column) instead of "no host matched".  Seen when a task name held ': '."""
    red = "\x1b[0;31m{}\x1b[0m".format
    c = events.Collector()
    for line in ["[WARNING]: something unrelated", "[ERROR]: YAML parsing failed: Colons in unquoted values must be "
                 "followed by a non-space character.", "Origin: /repo/playbooks/up.yml:119:49", "",
                 "119         - name: Wait (refused: nothing)", "", "For example:", "    raw: x", "", "Should be:",
                 "    raw: y"]:
        c({"event": "verbose", "stdout": red(line)})
    r = c.result(rc=4, status="failed")
    assert r.errors[0].startswith("[ERROR]: YAML parsing failed")
    assert "Origin: /repo/playbooks/up.yml:119:49" in r.errors
    assert r.errors[2:] == ["119         - name: Wait (refused: nothing)", "For example:", "    raw: x", "Should be:",
                            "    raw: y"]   # blank lines dropped, colour codes stripped, the warning before not kept
    assert r.exit_code() == events.Exit.USAGE and r.refusal() == r.errors     # nothing ran, nothing changed
    # a --limit that matches nothing is ansible-playbook's [ERROR] too: the CLI says "no host matched" for it
    c = events.Collector()
    c({"event": "verbose", "stdout": red("[ERROR]: Specified inventory, host pattern and/or --limit leaves us with no "
                                         "hosts to target.")})
    r = c.result(rc=1, status="failed")
    assert r.errors and r.refusal() == [] and r.exit_code() == events.Exit.USAGE
