"""engine_watch's journal reading: byte-array and over-4096-byte messages (tqdm bars) are not lost."""
import json
import sys

from deployer.host.module_utils import engine_logs, host_io, load_rules, log_lines, root_causes
from deployer.host.module_utils.engine_logs import LoadState

# Ansible ships module_utils to the host under ansible.module_utils.*; map them for an in-process import.
for _mod in (engine_logs, host_io, load_rules, log_lines, root_causes):
    sys.modules.setdefault("ansible.module_utils." + _mod.__name__.rsplit(".", 1)[1], _mod)
from deployer.host.modules import engine_watch  # noqa: E402


class FakeModule:
    def __init__(self, out):
        self.out = out
        self.calls = []

    def run_command(self, args):
        self.calls.append(args)
        return 0, self.out, ""


def test_journal_decodes_binary_messages_and_asks_for_all_fields():
    bar = "\r(Worker_TP0 pid=1) Loading safetensors checkpoint shards:  50% Completed | 32/64 [00:10<00:10]" * 60
    lines = [
        {"MESSAGE": "(Worker_TP0 pid=1) INFO 11-29 10:00:00 [x.py:1] Starting to load model /m...",
         "__MONOTONIC_TIMESTAMP": "1000000"},
        {"MESSAGE": list(bar.encode()), "__MONOTONIC_TIMESTAMP": "2000000"},  # journald: control chars -> bytes
        {"MESSAGE": None, "__MONOTONIC_TIMESTAMP": "2500000"},
    ]
    m = FakeModule("\n".join(json.dumps(x) for x in lines))
    entries = engine_watch.journal(m, "deployer-engine", "abc")
    assert "--all" in m.calls[0] and "_SYSTEMD_INVOCATION_ID=abc" in m.calls[0]
    assert len(entries) == 2 and entries[1][0] == 2.0
    st = LoadState()
    for t, msg in entries:
        st.feed(msg, t)
    assert st.phase == "weights" and st.progress == (32, 64)
    assert st.phase_durations(3.0) == {"starting": 1.0, "weights": 1.0}


class UnitModule:
    """systemctl show answers ``props``; the journal is empty."""
    def __init__(self, **props):
        self.props = props

    def run_command(self, args):
        if args[0] == "systemctl":
            return 0, "\n".join(f"{k}={v}" for k, v in self.props.items()), ""
        return 0, "", ""


P = {"service": "deployer-engine", "port": 1, "stall_seconds": {}, "budget_seconds": 1800,
     "previous_phase_seconds": {}, "stall_floor_factor": 0, "engine": "vllm"}


def test_a_cgroup_setup_failure_waits_for_systemds_own_restart_then_gives_up():
    def look(**kw):
        props = dict(ActiveState="activating", SubState="auto-restart", MainPID="0", ExecMainStatus="219",
                     NRestarts="0", InvocationID="", ActiveEnterTimestampMonotonic="0")
        props.update(kw)
        return engine_watch.look(UnitModule(**props), P)
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


def test_the_tail_a_failed_load_reports_is_capped_and_holds_no_key():
    """The tail goes into the failure message, --json, schedule logs and webhooks (issue 40, F2/F5)."""
    lines = [{"MESSAGE": "server_args={'api_key': 'sk-S3CRET', 'port': 1}", "__MONOTONIC_TIMESTAMP": "1000000"},
             {"MESSAGE": "x" * 40000, "__MONOTONIC_TIMESTAMP": "2000000"}]
    journal = "\n".join(json.dumps(x) for x in lines)

    class Dead(UnitModule):
        def run_command(self, args):
            return super().run_command(args) if args[0] == "systemctl" else (0, journal, "")
    res = engine_watch.look(Dead(ActiveState="failed", SubState="failed", MainPID="0", ExecMainStatus="1"),
                            dict(P, host="127.0.0.1", health_timeout_seconds=1))
    assert res["state"] == "crashed"
    assert "S3CRET" not in json.dumps(res) and "<redacted>" in res["tail"][0]
    assert len(res["tail"][1]) == log_lines.LINE_CHARS
