"""No secret value is echoed: not by a refusal, not in a schedule, its log, its webhook or a command line
(issue 40: F3, F4, F9).  The secret here is a value a person would paste; every case looks for it in everything
the deployer printed, stored or sent."""
import json
import os
import stat
import subprocess
import sys
from datetime import datetime

import pytest

from deployer import schedule as sc
from deployer.host.module_utils import envfile, formats

SECRET = "sk-live-S3CRET123"


def cli(tmp_path, *args, env_extra=None):
    env = dict(os.environ, XDG_CONFIG_HOME=str(tmp_path / "cfg"), XDG_STATE_HOME=str(tmp_path / "st"),
               **(env_extra or {}))
    env.pop("DEPLOYER_API_KEY", None)
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "deployer.cli", *args], capture_output=True, text=True, env=env,
                          timeout=60)


@pytest.mark.parametrize("ch", ["\n", "\r", "\x00", "\x1b", "\x7f", "\x85", "\u2028"])
def test_a_format_refusal_names_the_character_never_the_value(ch):
    for writer in (formats.unit_word, formats.env_value, formats.cron_word, lambda v, w: envfile.quote(v)):
        with pytest.raises((formats.FormatError, envfile.EnvFileError)) as e:
            writer(SECRET + ch, "environment value")
        assert SECRET not in str(e.value) and "U+%04X" % ord(ch) in str(e.value)


@pytest.mark.parametrize("how", ["-e", "env", "mapping", "file"])
def test_a_secret_with_a_line_end_is_refused_before_any_playbook_and_never_shown(tmp_path, how):
    """A key from a YAML ``|`` block or a CRLF key file ends in a line end: refused (exit 2, nothing contacted)
    naming the setting and the character, never the key."""
    f = tmp_path / "vars.yml"
    f.write_text("deployer_api_key: |\n  %s\n" % SECRET)
    args = {"-e": ["-e", f"deployer_api_key={SECRET}\r"], "env": [],
            "mapping": ["-e", json.dumps({"deployer_api_key": SECRET + "\n"})], "file": ["-e", f"@{f}"]}[how]
    r = cli(tmp_path, "up", "--host", "192.0.2.1", "--json", *args,
            env_extra={"DEPLOYER_API_KEY": SECRET + "\r\n"} if how == "env" else None)
    assert r.returncode == 2, r.stderr
    assert SECRET not in r.stdout + r.stderr
    assert "deployer_api_key" in r.stderr and "control character" in r.stderr


@pytest.mark.parametrize("item", ['{"deployer_api_key": "%s"' % SECRET,         # the closing brace missing
                                  '{"deployer_api_key": [%s' % SECRET])
def test_a_mapping_that_cannot_be_parsed_is_refused_unshown_and_never_scheduled(tmp_path, item):
    for args in (["up", "--host", "192.0.2.1"], ["schedule", "add", "--host", "192.0.2.1", "--at", "03:00"]):
        r = cli(tmp_path, *args, "-e", item)
        assert r.returncode == 2, r.stderr
        assert SECRET not in r.stdout + r.stderr and "not a valid" in " ".join(r.stderr.split())
    assert not (tmp_path / "cfg" / "deployer" / "schedules.json").exists()


def test_a_broken_vars_file_is_refused_by_schedule_add(tmp_path):
    f = tmp_path / "vars.yml"
    f.write_text('deployer_api_key: "%s\n  - [\n' % SECRET)
    r = cli(tmp_path, "schedule", "add", "--host", "192.0.2.1", "--at", "03:00", "-e", f"@{f}")
    assert r.returncode == 2 and SECRET not in r.stdout + r.stderr and str(f) in r.stderr
    assert not (tmp_path / "cfg" / "deployer" / "schedules.json").exists()


def test_an_item_without_equals_is_not_echoed(tmp_path):
    r = cli(tmp_path, "up", "--host", "192.0.2.1", "-e", SECRET)
    assert r.returncode == 2 and SECRET not in r.stdout + r.stderr and "key=value" in r.stderr


def test_a_schedule_log_is_private_and_its_webhook_gets_no_stderr(tmp_path, monkeypatch):
    """The log (stdout and stderr of the run) is 0600 in a 0700 directory; the webhook is told where the log is,
    not what the run printed on stderr."""
    import http.server
    import threading
    got = []

    class Sink(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            got.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *a):
            pass
    srv = http.server.HTTPServer(("127.0.0.1", 0), Sink)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    state = tmp_path / "state" / "deployer"
    monkeypatch.setattr(sc, "STATE", state)
    s = sc.Schedule(id="t9", at="03:00", target=["--host", "192.0.2.1"], extra=[f"@{tmp_path}/missing.yml"],
                    webhook=f"http://127.0.0.1:{srv.server_port}/hook/TOKEN")
    try:
        assert sc.run_now(s, datetime(2026, 11, 29, 3, 0), say=lambda m: None) == 2
    finally:
        srv.shutdown()
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    assert stat.S_IMODE((state / "schedule-t9.log").stat().st_mode) == 0o600
    assert got and "stderr_tail" not in got[-1] and "schedule-t9.log" in got[-1]["log"]
    log = [json.loads(x) for x in (state / "schedule-t9.log").read_text().splitlines()]
    assert log[-1]["stderr_tail"]      # the log keeps it


def test_a_webhook_error_never_holds_the_url_s_path_or_query():
    error = sc.notify("http://127.0.0.1:1/hooks/SECRET-T0KEN?sig=abc123", {"x": 1}, attempts=1)
    assert error and "ConnectionError" in error
    assert "SECRET-T0KEN" not in error and "abc123" not in error

