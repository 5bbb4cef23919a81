"""The CLI's progress display, fed a recorded-shape Ansible event stream (terminal, plain and JSON modes)."""
import io
import json
import re

import pytest
from rich.console import Console

from deployer import output


def ev(kind, host=None, role="", task="", action="", res=None, **extra):
    data = {"host": host, "role": role, "task": task, "task_action": action, "res": res or {},
            "task_uuid": f"{role}/{task}", "task_path": f"/repo/roles/{role}/tasks/main.yml:1", **extra}
    return {"event": kind, "event_data": data}


EVENTS = [
    ev("playbook_on_task_start", role="preflight", task="Validating arguments against arg spec 'main'"),
    ev("runner_on_start", "h1", "preflight", "Validating arguments against arg spec 'main'"),
    ev("runner_on_ok", "h1", "preflight", "Validating arguments against arg spec 'main'", "validate_argument_spec"),
    ev("runner_on_start", "h1", "preflight", "Ensure the host has 8 GPUs."),
    ev("runner_on_ok", "h1", "preflight", "Ensure the host has 8 GPUs.", "ansible.builtin.assert",
       {"msg": "All assertions passed"}),
    ev("runner_on_start", "h1", "patch", "Ensure vLLM has exactly the EAGLE-3 patches"),
    ev("runner_on_ok", "h1", "patch", "Ensure vLLM has exactly the EAGLE-3 patches", "vllm_eagle3_patch",
       {"changed": True}),
    ev("runner_on_start", "h1", "patch", "Report what the patch engine did."),
    ev("runner_on_ok", "h1", "patch", "Report what the patch engine did.", "ansible.builtin.debug",
       {"msg": "patched vLLM 0.16.0: P1, P2"}),
    ev("runner_on_start", "h1", "drafter", "Ship the drafter."),
    ev("runner_on_skipped", "h1", "drafter", "Ship the drafter."),
    ev("runner_on_start", "h1", "watch", "Follow the model load until /health answers"),
    ev("runner_retry", "h1", "watch", res={
        "phase": "weights", "phase_title": "loading weights", "percent": 45.3, "progress": [29, 64],
        "elapsed_seconds": 70.0, "eta_seconds": 95.0, "overdue_seconds": 0}),
    ev("runner_retry", "h1", "watch", res={
        "phase": "graphs", "phase_title": "CUDA graph capture", "percent": None, "progress": None,
        "elapsed_seconds": 200.0, "eta_seconds": 3.0, "overdue_seconds": 12.0}),
    ev("runner_on_ok", "h1", "watch", "Follow the model load until /health answers", "engine_watch",
       {"state": "ready", "phase": "ready", "elapsed_seconds": 230.0, "phase_seconds": {"weights": 100}}),
    ev("runner_on_start", "h1", "watch", "Ensure the server came up."),
    ev("runner_on_ok", "h1", "watch", "Ensure the server came up.", "ansible.builtin.assert",
       {"msg": "ready after 230.0 s"}),
    ev("runner_on_start", "h1", "smoke", "Report the smoke test."),
    ev("runner_on_ok", "h1", "smoke", "Report the smoke test.", "ansible.builtin.debug", {"msg": "served: hello"}),
    ev("runner_on_start", "h1", "smoke", "Report the smoke test."),
    ev("runner_on_start", "h1", "release", "Go back", task_path="/repo/roles/release/tasks/rollback.yml:3"),
    ev("runner_on_failed", "h1", "release", "Go back", "ansible.builtin.assert", {"msg": "ROLLBACK FAILED"},
       task_path="/repo/roles/release/tasks/rollback.yml:3"),
    {"event": "playbook_on_stats", "event_data": {}},
]


def plain(text):
    """Terminal output without colours and cursor codes, one screen line per item."""
    lines = re.split(r"\x1b\[2K|\r|\n", text)
    return "\n".join(re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", x) for x in lines)


def stage_lines(text):
    return {line.split()[2]: line.split()[3] for line in text.splitlines()
            if len(line.split()) > 3 and line.split()[1] == "h1" and line.split()[2] in
            ("preflight", "patch", "drafter", "watch", "smoke", "rollback")}


@pytest.mark.parametrize("terminal", [True, False])
@pytest.mark.parametrize("verbose", [0, 1])
def test_one_line_per_stage(terminal, verbose):
    buf = io.StringIO()
    d = output.Display(as_json=False, verbose=verbose,
                       console=Console(file=buf, force_terminal=terminal, width=160, soft_wrap=True))
    assert (d.live is not None) == terminal
    for e in EVENTS:
        d(e)
    text = plain(buf.getvalue())
    assert stage_lines(text) == {"preflight": "unchanged", "patch": "changed", "drafter": "skipped",
                                 "watch": "unchanged", "smoke": "unchanged", "rollback": "failed"}, text
    assert "patched vLLM 0.16.0: P1, P2" in text and "served: hello" in text and "ready after 230.0 s" in text
    assert "Validating arguments" not in text and "All assertions passed" not in text
    assert "Ship the drafter" not in text                       # a skipped task's title never shows
    if verbose:
        assert text.count("task: patch / Report what the patch engine did.") == 1
    else:
        assert "task:" not in text and "Report what the patch engine did" not in text
    if not terminal:
        assert "load: loading weights 45% (29/64)" in text and "ETA 1m35s" in text
        assert "ETA 0m03s (this phase 0m12s past the last load's)" in text


def test_eta_counts_down_and_says_when_passed(monkeypatch):
    col = output._EtaColumn()
    now = [1000.0]
    monkeypatch.setattr(output.time, "time", lambda: now[0])

    class T:
        fields = {"eta_at": 1013.0, "overdue": 0}
    assert col.render(T).plain == "ETA 0m13s"
    now[0] = 1006.0
    assert col.render(T).plain == "ETA 0m07s"
    now[0] = 1020.0
    assert col.render(T).plain == "0m07s past ETA"


def test_json_progress(capsys):
    d = output.Display(as_json=True)
    for e in EVENTS:
        d(e)
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    phases = [x for x in lines if x["event"] == "phase"]
    assert phases[0]["phase"] == "weights" and phases[0]["eta_seconds"] == 95.0 and phases[0]["progress"] == [29, 64]
    assert [x for x in lines if x["event"] == "watch_done"][0]["state"] == "ready"
    stages = {x["stage"]: x["outcome"] for x in lines if x["event"] == "stage"}
    assert stages["patch"] == "changed" and stages["rollback"] == "failed"
    assert all("ts" in x for x in lines)


def test_diff_is_shown_as_a_unified_diff():
    buf = io.StringIO()
    d = output.Display(as_json=False, console=Console(file=buf, force_terminal=False, width=160))
    d(ev("runner_on_start", "h1", "render", "Write the launch argv (JSON, one word per item)."))
    d(ev("runner_on_ok", "h1", "render", "Write the launch argv (JSON, one word per item).", "ansible.builtin.copy",
         {"changed": True, "diff": [{"before": '[\n  "--max-model-len",\n  "131072"\n]\n',
                                     "after": '[\n  "--max-model-len",\n  "4096"\n]\n',
                                     "before_header": "argv.json", "after_header": "argv.json"}]}))
    text = buf.getvalue()
    assert '-  "131072"' in text and '+  "4096"' in text and "--- argv.json" in text


def test_phases_passed_between_two_polls_are_reported(capsys):
    # guards: a poll saw weights, the next one graphs; the drafter, compile and KV-cache phases passed in between
    # (fast phases, a loaded controller) and were never reported - the load's record skipped them
    seen = {"weights": 100.0, "drafter": 4.0, "compile": 30.0, "kv_cache": 2.0}
    d = output.Display(as_json=True)
    d(ev("runner_retry", "h1", "watch", res={"phase": "weights", "percent": 45.3, "elapsed_seconds": 70.0,
                                             "eta_seconds": 95.0, "phase_seconds": {"weights": 60.0}}))
    d(ev("runner_retry", "h1", "watch", res={"phase": "graphs", "percent": None, "elapsed_seconds": 200.0,
                                             "eta_seconds": 3.0, "phase_seconds": {**seen, "graphs": 1.0}}))
    phases = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [(p["phase"], p.get("passed_seconds")) for p in phases] == [
        ("weights", None), ("drafter", 4.0), ("compile", 30.0), ("kv_cache", 2.0), ("graphs", None)]
    assert all(p["eta_seconds"] is not None for p in phases)
    buf = io.StringIO()
    d = output.Display(as_json=False, console=Console(file=buf, force_terminal=False, width=200))
    d(ev("runner_retry", "h1", "watch", res={"phase": "graphs", "phase_title": "CUDA graph capture",
                                             "elapsed_seconds": 200.0, "phase_seconds": {**seen, "graphs": 1.0}}))
    text = buf.getvalue()
    assert "load: torch.compile done 30s" in text and text.index("loading drafter") < text.index("CUDA graph")
