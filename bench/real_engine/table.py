#!/usr/bin/env python3
"""The results table of docs/real-engine.md, from the recordings (replayed through the deployer's watcher).

    .venv/bin/python bench/real_engine/table.py tests/fixtures/real-gpu/vllm-0.20.0-h200*/
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from replay import replay  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from deployer.host.module_utils.spec_metrics import spec_decode_stats  # noqa: E402

ORDER = ("weights", "drafter", "compile", "kv_cache", "graphs", "api")


def row(run: Path) -> str:
    r = replay(run)
    f, ps = r["snapshot"]["facts"], r["snapshot"]["phase_seconds"]
    phases = " / ".join(f"{ps[p]:.1f}" if p in ps else "-" for p in ORDER)
    acc = "-"
    body = ((r["api"] or {}).get("metrics_after_five") or {}).get("body")
    if body:
        s = spec_decode_stats(body)
        rate = "-" if s["acceptance_rate"] is None else f"{s['acceptance_rate']:.3f}"
        acc = f"{rate} ({int(s['num_drafts'])} drafts, {int(s['num_accepted_tokens'])} accepted)" if s["present"] \
            else "absent"
    cause = (f"`{r['root_cause'][0]}`: {(r['advice'] or r['root_cause'][1])[:110]}".replace("|", "\\|")
             if r["root_cause"] else "-")
    ready = f"{r['ready_seconds']:.1f}" if r["ready_seconds"] else f"exit {r['returncode']}"
    cc = f.get("compile_cache", "-")
    comp = f"{cc} {f['compile_seconds']:.2f} s" if f.get("compile_seconds") is not None else cc
    return (f"| {run.parent.name}/{run.name} | {' -> '.join(r['phases']) or '-'} | {phases} | {comp} | "
            f"{f.get('weights_seconds', '-')} | {ready} | {acc} | {cause} |")


def main(dirs: list[str]) -> None:
    print("| run | phases seen | seconds: weights / drafter / compile / KV / graphs / API | torch.compile | "
          "vLLM weights s | ready s | acceptance (5 chats) | root cause and advice |")
    print("|---|---|---|---|---|---|---|---|")
    for d in dirs:
        for run in sorted(p for p in Path(d).iterdir() if (p / "output.bin").exists()):
            print(row(run))


if __name__ == "__main__":
    main(sys.argv[1:])
