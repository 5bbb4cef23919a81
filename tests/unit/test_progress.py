"""The CLI's progress display, fed a recorded-shape Ansible event stream (terminal, plain and JSON modes)."""
import io
import json

import pytest
from rich.console import Console

from deployer import cli

EVENTS = [
    {"event": "playbook_on_task_start", "event_data": {"task": "Follow the model load until /health answers",
                                                       "role": "watch"}},
    {"event": "runner_retry", "event_data": {"host": "h1", "role": "watch", "res": {
        "phase": "weights", "phase_title": "loading weights", "percent": 45.3, "progress": [29, 64],
        "elapsed_seconds": 70.0, "eta_seconds": 95.0}}},
    {"event": "runner_retry", "event_data": {"host": "h1", "role": "watch", "res": {
        "phase": "graphs", "phase_title": "CUDA graph capture", "percent": None, "progress": None,
        "elapsed_seconds": 200.0, "eta_seconds": None}}},
    {"event": "runner_on_ok", "event_data": {"host": "h1", "role": "watch", "task_action": "vllm_watch", "res": {
        "state": "ready", "phase": "ready", "elapsed_seconds": 230.0, "phase_seconds": {"weights": 100}}}},
    {"event": "runner_on_ok", "event_data": {"host": "h1", "role": "smoke", "task_action": "ansible.builtin.debug",
                                             "res": {"msg": "served: hello"}}},
    {"event": "playbook_on_stats", "event_data": {}},
]


@pytest.mark.parametrize("terminal", [True, False])
def test_human_progress(monkeypatch, terminal):
    buf = io.StringIO()
    monkeypatch.setattr(cli, "err", Console(file=buf, force_terminal=terminal, width=120, soft_wrap=True))
    p = cli.Progress(as_json=False)
    assert (p.live is not None) == terminal
    for ev in EVENTS:
        p(ev)
    text = buf.getvalue()
    assert "h1 ready" in text and "served: hello" in text
    if not terminal:
        assert "load: loading weights 45% (29/64)" in text and "ETA 1m35s" in text


def test_json_progress(capsys):
    p = cli.Progress(as_json=True)
    for ev in EVENTS:
        p(ev)
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    phases = [x for x in lines if x["event"] == "phase"]
    assert phases[0]["phase"] == "weights" and phases[0]["eta_seconds"] == 95.0 and phases[0]["progress"] == [29, 64]
    assert [x for x in lines if x["event"] == "watch_done"][0]["state"] == "ready"
    assert all("ts" in x for x in lines)
