"""What a host, an engine or a model says is data: shown literally (no Rich markup, no terminal control), capped,
and the display can never stop the run (issue 40, docs/security.md "Output from hosts").  --json stays exact."""
import io
import json
import sys
import textwrap

from rich.console import Console

from deployer import events, output, runner
from deployer.output import Display

HOSTILE = ("CUDA out of memory [/] at [/models/kimi] [/INST] Sure. [rank0]: torch.OutOfMemoryError "
           "\x1b]0;owned\x1b\\\x1b[2J\x1b[1;32mdeploy OK\x1b[0m \x1b]52;c;ZWNobyBwd25lZA==\x07 \x9b31m csi \x7f del")


def console(terminal=False):
    buf = io.StringIO()
    return Console(file=buf, force_terminal=terminal, width=300, highlight=False, soft_wrap=True), buf


def ev(kind, host="h1", role="watch", action="engine_watch", res=None, task_path=""):
    return {"event": kind, "event_data": {"host": host, "role": role, "task_action": action, "task": "t",
                                          "task_path": task_path, "res": res or {}}}


def no_control(text):
    return not any(ord(c) < 32 and c not in "\n\t" or 0x7f <= ord(c) <= 0x9f for c in text)


def test_a_fatal_line_with_markup_and_escapes_is_shown_literally_and_the_rollback_goes_on():
    """The watch's fatal reason is a stage note; the rollback's first task closes the stage and prints it.  On
    5ba0259 this raised MarkupError (the CLI died before the rollback put the last live release back)."""
    for terminal in (False, True):
        con, buf = console(terminal)
        d = Display(as_json=False, console=con)
        d(ev("runner_on_start"))
        d(ev("runner_retry", res={"phase": "weights", "phase_title": "weights [/]", "percent": 50,
                                  "elapsed_seconds": 3}))
        d(ev("runner_on_ok", res={"state": "fatal", "reason": "fatal cuda_oom in phase 'starting': " + HOSTILE}))
        d(ev("runner_on_start", role="release", action="x", task_path="/x/roles/release/tasks/rollback.yml"))
        d(ev("runner_on_ok", role="release", action="ansible.builtin.debug", res={"msg": "served: " + HOSTILE},
             task_path="/x/roles/release/tasks/rollback.yml"))
        d({"event": "playbook_on_stats", "event_data": {}})
        shown = buf.getvalue()
        assert "\x1b]" not in shown and "\x1b[2J" not in shown and "\x9b" not in shown and "\x7f" not in shown
        if not terminal:   # a terminal gets Rich's own colours; a pipe gets no ESC at all
            assert "\x1b" not in shown
        flat = " ".join(shown.split())
        for piece in ("[/]", "[/models/kimi]", "[/INST]", "[rank0]: torch.OutOfMemoryError", "deploy OK"):
            assert piece in flat, (piece, flat)


def test_literal_strips_terminal_control_keeps_lines_and_caps_length():
    assert output.literal("a\x1b[2Jb\tc\nd\x07\r\x9b\x85e\u2028") == "a[2Jb\tc\nde"
    assert output.literal("one\ntwo", block=False) == "one two"
    long = output.literal("x" * 100_000)
    assert len(long) < 20_000 and long.endswith("more characters not shown)")


def test_the_failure_report_and_a_die_message_are_literal(monkeypatch):
    from deployer.cli import deploy
    con, buf = console()
    monkeypatch.setattr(deploy, "err", con)
    monkeypatch.setattr(deploy, "out", con)
    res = events.Result(rc=2, status="failed", stats={"processed": {"h1": 1}},
                        failures=[events.Failure("h1 [/]", "watch [/x]", "watch", "tail:\n" + HOSTILE)])
    deploy.report(res, False, "up")
    shown = buf.getvalue()
    assert "\x1b" not in shown and "[/INST]" in shown and "h1 [/]" in shown and "watch [/x]" in shown
    assert "[rank0]: torch" in shown


def test_status_prints_a_hostile_last_fatal_and_still_rolls_back(monkeypatch):
    """`status --rollback-if-crash-looping` printed `last fatal` as markup and died before it rolled back."""
    import typer

    from deployer.cli import views
    con, buf = console()
    monkeypatch.setattr(views, "out", con)
    host = {"current": "a" * 12, "previous": "b" * 12, "crash_loop": True, "crash_loop_restarts": 5, "health": None,
            "unit": {"ActiveState": "activating", "NRestarts": 7},
            "last_fatal": {"kind": "cuda_oom", "line": HOSTILE, "runs_ago": 0},
            "lock": {"user": "op [/]", "controller": "c"},
            "balancer": {"state": "UP", "scur": 0, "error": "[/bad] \x1b[2J"}, "releases": []}
    monkeypatch.setattr(views, "read_hosts", lambda *a, **k: {"gpu-01": host})
    rolled = []
    monkeypatch.setattr(views, "_rollback_crash_loops", lambda t, hosts, *a: rolled.append(hosts))
    try:
        views.status(host="10.0.0.1", rollback_if_crash_looping=True)
    except typer.Exit:
        pass
    assert rolled == [["gpu-01"]]
    shown = buf.getvalue()
    assert "\x1b" not in shown and "[/INST]" in shown and "op [/]" in shown and "[/bad]" in shown


def test_json_output_stays_exact(monkeypatch, capsys):
    d = Display(as_json=True)
    d(ev("runner_on_start"))
    d(ev("runner_on_ok", res={"state": "fatal", "reason": HOSTILE}))
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert any(x.get("reason") == HOSTILE for x in lines)


def test_a_display_that_raises_never_stops_the_playbook(tmp_path, capsys):
    """An exception in the event handler turns the display off; the playbook runs on to its end (in a deploy:
    to its rollback).  On 5ba0259 the exception left runner._stream (now bound_process.stream), whose finally
    killed the playbook."""
    marker = tmp_path / "marker"
    book = tmp_path / "book.yml"
    book.write_text(textwrap.dedent(f"""\
        - hosts: all
          gather_facts: false
          tasks:
            - ansible.builtin.debug:
                msg: "Sure. [/INST] Hello"
            - ansible.builtin.command: sleep 1
              changed_when: false
            - ansible.builtin.file:
                path: {marker}
                state: touch
        """))
    seen = []

    def handler(e):
        seen.append(e.get("event"))
        if e.get("event") == "runner_on_ok":
            raise RuntimeError("display broke [/]")
    res = runner.run(str(book), "localhost,", {"ansible_connection": "local",
                                               "ansible_python_interpreter": output.sys.executable},
                     on_event=handler)
    assert marker.exists()
    assert res.rc == 0
    assert seen.count("runner_on_ok") == 1          # the display was turned off at its first failure
    assert "display broke [/]" in capsys.readouterr().err


def test_invisible_marks_and_emoji_codes_from_a_host_print_as_nothing_and_as_written(monkeypatch):
    """Issue 53 N14: LRM/RLM, ALM, zero-width characters, BOM, soft hyphen and tag characters went through lit(), and
    Rich turned a host's ':white_check_mark:' into a mark of the deployer's own."""
    hidden = "\u200e\u200f\u061c\u200b\u200c\u200d\u2060\ufeff\u00ad\U000e0041"
    assert output.lit(f"dep{hidden}loy OK") == "deploy OK"
    buf = io.StringIO()
    monkeypatch.setattr(output.out, "file", buf)
    output.out.print(output.lit(":white_check_mark: deploy OK"))
    assert buf.getvalue().strip() == ":white_check_mark: deploy OK"
    assert not output.err._emoji


def test_what_root_reads_of_the_servers_answers_is_bounded():
    """Issue 53 N10: the smoke read the server's /metrics and reply whole (the service user writes them); root's
    module, its result file and the controller held whatever size the server sent."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from deployer.host.module_utils import answer_shape
    sys.modules.setdefault("ansible.module_utils.answer_shape", answer_shape)   # where Ansible ships it on the host
    from deployer.host.modules import smoke_request
    big = b"x" * (3 * smoke_request.READ_LIMIT)

    class Huge(BaseHTTPRequestHandler):
        def _answer(self):
            self.send_response(200)
            self.send_header("Content-Length", str(len(big)))
            self.end_headers()
            self.wfile.write(big)
        do_GET = do_POST = _answer

        def log_message(self, *a):
            pass
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Huge)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_port}"
        assert len(smoke_request._get(url + "/metrics", 30)) == smoke_request.READ_LIMIT
        status, data, _error = smoke_request._chat(url + "/v1/chat/completions", {"x": 1}, {}, 30)
        assert status == 200 and isinstance(data, dict)
    finally:
        srv.shutdown()
