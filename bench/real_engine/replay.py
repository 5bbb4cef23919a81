#!/usr/bin/env python3
"""Replay a recorded real-engine run through the deployer's own load watcher.

A run directory (recorded by ``bench/real_engine/harness.py`` on a GPU machine; the checked-in ones are under
``tests/fixtures/real-gpu/``) holds ``output.bin`` (every byte the server wrote to its one stdout+stderr pipe, as
the unit hands it to journald), ``timing.jsonl`` (for each read: seconds since start, byte offset, length) and
``result.json`` (``/health`` transitions, API answers).  The bytes are split as the unit's log-line wrapper
(``roles/render/files/journal_lines.py``) splits them: every ``\\r`` or ``\\n`` piece one journal message, stamped
with the time its bytes arrived; then fed to ``LoadState`` exactly as ``engine_watch`` feeds journal lines.

    .venv/bin/python bench/real_engine/replay.py tests/fixtures/real-gpu/vllm-0.20.0-h200/good_warm
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from deployer.host.module_utils import engine_logs, root_causes  # noqa: E402


def messages(run_dir):
    """[(t, message)] as the log-line wrapper would write them to the journal."""
    d = Path(run_dir)
    data = (d / "output.bin").read_bytes()
    out, buf = [], b""
    for line in (d / "timing.jsonl").read_text().splitlines():
        c = json.loads(line)
        buf += data[c["off"]:c["off"] + c["n"]]
        pieces = re.split(rb"[\r\n]", buf)
        buf = pieces.pop()
        for p in pieces:
            msg = p.decode("utf-8", "replace").rstrip()
            if msg:
                out.append((c["t"], msg))
    if buf.strip():
        out.append((c["t"], buf.decode("utf-8", "replace").rstrip()))
    return out


def replay(run_dir, engine="vllm"):
    """What the watcher saw: phase transitions with times, the percentages per phase, the first fatal line,
    the final snapshot, the root cause of the whole run (also after ready) with its advice."""
    st = engine_logs.LoadState(engine)
    transitions, percents, first_fatal, t = [], {}, None, 0.0
    msgs = messages(run_dir)
    for t, msg in msgs:
        before, had_fatal = st.phase, st.fatal
        st.feed(msg, t)
        if st.phase != before:
            transitions.append((round(t, 2), st.phase))
        pc = st.percent()
        if pc is not None and (not percents.get(st.phase) or percents[st.phase][-1] != pc):
            percents.setdefault(st.phase, []).append(pc)
        if st.fatal is not None and had_fatal is None:
            first_fatal = (round(t, 2), st.fatal)
    cause = root_causes.root_cause([m for _t, m in msgs])
    d = Path(run_dir)
    result = json.loads((d / "result.json").read_text()) if (d / "result.json").exists() else {}
    # phases in the order first entered (vLLM 0.20 returns from KV-cache sizing to compile for the EAGLE head)
    return {"run": d.name, "phases": list(dict.fromkeys(p for _t, p in transitions)), "transitions": transitions,
            "percents": percents, "first_fatal": first_fatal, "snapshot": st.snapshot(t),
            "root_cause": cause, "advice": root_causes.advice(cause[0], cause[1]) if cause else "",
            "ready_seconds": result.get("ready_seconds"), "returncode": result.get("returncode"),
            "health": result.get("health"), "api": result.get("api") or {}}


if __name__ == "__main__":
    for run in sys.argv[1:]:
        r = replay(run)
        r.pop("api")
        print(json.dumps(r, indent=1, default=str))
