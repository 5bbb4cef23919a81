"""engine_watch's journal reading: byte-array and over-4096-byte messages (tqdm bars) are not lost."""
import json
import sys

from deployer.host.module_utils import engine_logs, host_io, journal_follow, load_rules, log_lines, root_causes
from deployer.host.module_utils.engine_logs import LoadState

# Ansible ships module_utils to the host under ansible.module_utils.*; map them for an in-process import.
for _mod in (engine_logs, host_io, load_rules, log_lines, root_causes, journal_follow):
    sys.modules.setdefault("ansible.module_utils." + _mod.__name__.rsplit(".", 1)[1], _mod)
from deployer.host.modules import engine_watch  # noqa: E402

# journalctl as the watch runs it (a real process, a real pipe): the entries of a JSON-lines file, after a cursor
# (an entry's __CURSOR is its index here), with the arguments it was given appended to a log beside it
FAKE_JOURNALCTL = """#!/usr/bin/python3
import json, os, sys
here = os.path.dirname(os.path.abspath(sys.argv[0]))
with open(os.path.join(here, "calls"), "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
after = int(sys.argv[sys.argv.index("--after-cursor") + 1]) if "--after-cursor" in sys.argv else -1
with open(os.path.join(here, "journal.jsonl")) as f:
    for i, line in enumerate(f):
        if i > after:
            e = json.loads(line)
            e["__CURSOR"] = str(i)
            sys.stdout.write(json.dumps(e) + "\\n")
"""


def fake_journal(tmp_path, monkeypatch, entries):
    d = tmp_path / "journalctl"
    d.mkdir(exist_ok=True)
    (d / "journal.jsonl").write_text("".join(json.dumps(e) + "\n" for e in entries))
    exe = d / "journalctl"
    exe.write_text(FAKE_JOURNALCTL)
    exe.chmod(0o755)
    monkeypatch.setattr(journal_follow, "JOURNALCTL", str(exe))
    monkeypatch.setattr(journal_follow, "STATE_DIR", str(tmp_path / "watch-state"))
    return d


def test_journal_decodes_binary_messages_and_asks_for_all_fields(tmp_path, monkeypatch):
    bar = "\r(Worker_TP0 pid=1) Loading safetensors checkpoint shards:  50% Completed | 32/64 [00:10<00:10]" * 60
    lines = [
        {"MESSAGE": "(Worker_TP0 pid=1) INFO 11-29 10:00:00 [x.py:1] Starting to load model /m...",
         "__MONOTONIC_TIMESTAMP": "1000000"},
        {"MESSAGE": list(bar.encode()), "__MONOTONIC_TIMESTAMP": "2000000"},  # journald: control chars -> bytes
        {"MESSAGE": None, "__MONOTONIC_TIMESTAMP": "2500000"},
    ]
    d = fake_journal(tmp_path, monkeypatch, lines)
    entries, cursor, more, _n = journal_follow.read_journal(run, "deployer-engine", "abc", None, 1 << 20)
    call = json.loads((d / "calls").read_text())
    assert "--all" in call and "_SYSTEMD_INVOCATION_ID=abc" in call
    assert len(entries) == 2 and entries[1][0] == 2.0 and cursor == "2" and not more
    st = LoadState()
    for t, msg in entries:
        st.feed(msg, t)
    assert st.phase == "weights" and st.progress == (32, 64)
    assert st.phase_durations(3.0) == {"starting": 1.0, "weights": 1.0}
    # read again from its cursor: nothing new is nothing read
    assert journal_follow.read_journal(run, "deployer-engine", "abc", cursor, 1 << 20)[:3] == ([], "2", False)


def run(args, use_unsafe_shell=False, encoding="utf-8"):
    """AnsibleModule.run_command as the watch uses it for journalctl: a shell line, bytes back."""
    import subprocess
    r = subprocess.run(args, shell=use_unsafe_shell, capture_output=True)
    return r.returncode, r.stdout if encoding is None else r.stdout.decode(), r.stderr


class UnitModule:
    """systemctl show answers ``props`` (the journal: fake_journal's)."""
    def __init__(self, **props):
        self.props = props

    def run_command(self, args, **kw):
        if args[0] == "systemctl":
            return 0, "\n".join(f"{k}={v}" for k, v in self.props.items()), ""
        return run(args, **kw)


P = {"service": "deployer-engine", "port": 1, "stall_seconds": {}, "budget_seconds": 1800,
     "previous_phase_seconds": {}, "stall_floor_factor": 0, "engine": "vllm"}


def test_a_cgroup_setup_failure_waits_for_systemds_own_restart_then_gives_up(tmp_path, monkeypatch):
    fake_journal(tmp_path, monkeypatch, [])

    def look(**kw):
        props = dict(ActiveState="activating", SubState="auto-restart", MainPID="0", ExecMainStatus="219",
                     NRestarts="0", InvocationID="", ActiveEnterTimestampMonotonic="0")
        props.update(kw)
        return engine_watch.look(UnitModule(**props), dict(P, max_bytes_per_poll=1 << 20), {})
    r = look()
    assert r["state"] == "loading" and "219, CGROUP" in r["note"]
    assert look(NRestarts="2")["state"] == "crashed"                       # a bounded number of times
    r = look(ExecMainStatus="217")                                          # USER: never transient
    assert r["state"] == "crashed" and "(USER)" in r["reason"]
    assert look(SubState="failed", ActiveState="failed")["state"] == "crashed"


def test_a_slow_health_answer_is_waited_for_as_long_as_the_engine_says():
    """SGLang's /health generates one token once the server is up (>= 1 s, up to 20 s; http_server.py): with the
    2 s vLLM's instant /health needs, the probe gave up and the watch saw "still loading" until its budget ran out."""
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from deployer import engines

    class Slow(BaseHTTPRequestHandler):
        def do_GET(self):
            time.sleep(3)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        port = srv.server_address[1]
        vllm_t = engines.get("vllm").describe("")["health_timeout_seconds"]
        sglang_t = engines.get("sglang").describe("")["health_timeout_seconds"]
        assert engine_watch.health(port, timeout=vllm_t) == 0          # unanswered within vLLM's 2 s
        assert engine_watch.health(port, timeout=sglang_t) == 200      # SGLang's: waited for
    finally:
        srv.shutdown()


def test_the_tail_a_failed_load_reports_is_capped_and_holds_no_key(tmp_path, monkeypatch):
    """The tail goes into the failure message, --json, schedule logs and webhooks (issue 40, F2/F5)."""
    fake_journal(tmp_path, monkeypatch, [
        {"MESSAGE": "server_args={'api_key': 'sk-S3CRET', 'port': 1}", "__MONOTONIC_TIMESTAMP": "1000000"},
        {"MESSAGE": "x" * 40000, "__MONOTONIC_TIMESTAMP": "2000000"}])
    res = engine_watch.look(UnitModule(ActiveState="failed", SubState="failed", MainPID="0", ExecMainStatus="1"),
                            dict(P, host="127.0.0.1", health_timeout_seconds=1, max_bytes_per_poll=1 << 20), {})
    assert res["state"] == "crashed"
    assert "S3CRET" not in json.dumps(res) and "<redacted>" in res["tail"][0]
    assert len(res["tail"][1]) == log_lines.LINE_CHARS


def test_each_journal_line_is_read_once_and_a_flood_costs_each_look_a_bounded_read(tmp_path, monkeypatch):
    """Issue 53 N3: every look re-read and re-parsed the whole start's journal as root (about 3 ms of root CPU per
    hostile 16 KB line, each look: 50 MB of them cost ~10 s a look, ~8 looks a call).  Now a look reads from where
    the last one stopped, at most max_bytes_per_poll, and what it read is kept for the next call."""
    import os
    hostile = "(" + "a" * 16000
    lines = [{"MESSAGE": "(Worker_TP0 pid=1) INFO 11-29 10:00:00 [x.py:1] Starting to load model /m...",
              "__MONOTONIC_TIMESTAMP": "1000000"}]
    lines += [{"MESSAGE": hostile, "__MONOTONIC_TIMESTAMP": str(1000001 + i)} for i in range(3200)]   # ~51 MB
    lines += [{"MESSAGE": "(Worker_TP0 pid=1) Loading safetensors checkpoint shards:  50% Completed | 32/64",
               "__MONOTONIC_TIMESTAMP": "9000000"}]
    fake_journal(tmp_path, monkeypatch, lines)
    limit = 1 << 20         # the default is 8 MiB; the bound is the same at any size
    props = dict(ActiveState="active", SubState="running", MainPID="7", ExecMainStatus="0", NRestarts="0",
                 InvocationID="0123456789abcdef0123456789abcdef", ActiveEnterTimestampMonotonic="1000000")
    p = dict(P, host="127.0.0.1", health_timeout_seconds=0.2, max_bytes_per_poll=limit)
    inv = props["InvocationID"]
    follows, cursors = {}, []
    for _ in range(2):
        engine_watch.look(UnitModule(**props), p, follows)
        cursors.append(int(follows[inv].cursor))
        assert follows[inv].read["more"]
    # each look read at most its limit, the second from where the first stopped: no line twice
    assert follows[inv].read["bytes"] <= 2 * limit and follows[inv].read["lines"] == cursors[1] + 1, follows[inv].read
    assert 0 < cursors[0] < cursors[1] < 2 * limit // 16000
    assert follows[inv].state.phase == "starting" and len(follows[inv].tail) == journal_follow.TAIL
    if os.geteuid() == 0:       # kept between calls in root's 0700 directory: the next call goes on from there
        journal_follow.save_follow(P["service"], inv, follows[inv])
        assert oct(os.stat(journal_follow.STATE_DIR).st_mode & 0o777) == "0o700"
        again = {}
        engine_watch.look(UnitModule(**props), p, again)
        assert int(again[inv].cursor) > cursors[1] and again[inv].read["lines"] == int(again[inv].cursor) - cursors[1]


def test_a_watch_attached_to_a_deploys_load_leaves_the_deploys_budget_for_the_state_keeper(tmp_path, monkeypatch):
    """`deployer watch` follows a load someone else's deploy started: the record that deploy keeps for the host's
    state keeper (its budget and stall limits, which the alerts judge the load by) stays the deploy's; a load nobody
    watched yet gets the attached watch's."""
    import os
    if os.geteuid() != 0:
        return                  # the records live in a directory of root's
    monkeypatch.setattr(journal_follow, "STATE_DIR", str(tmp_path / "watch-state"))
    inv = "0123456789abcdef0123456789abcdef"
    follows = {inv: journal_follow.Follow("vllm", False)}
    engine_watch.keep(dict(P, attached=False, budget_seconds=3600, stall_seconds={"weights": 30}), follows)
    attached = dict(P, attached=True, budget_seconds=1800)
    engine_watch.keep(attached, follows)
    kept = journal_follow.load_watch(P["service"])
    assert kept["budget_seconds"] == 3600 and kept["stall_seconds"] == {"weights": 30}, kept
    other = "f" * 32            # a start no deploy watched: the attached watch's record
    engine_watch.keep(attached, {other: journal_follow.Follow("vllm", False)})
    assert journal_follow.load_watch(P["service"])["budget_seconds"] == 1800
