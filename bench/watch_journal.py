#!/usr/bin/env python3
"""What one look of the load watch costs when the engine floods its journal (docs/security.md rule 24).

    python bench/watch_journal.py [--lines 3200] [--line-bytes 16000]

A journal of ``--lines`` hostile lines (``(`` then ``--line-bytes`` letters, ~51 MB at the defaults: the service
user's remote code can write that in a minute) is served by a journalctl stand-in that prints it as ``journalctl -o
json`` does, after a cursor.  Each case runs in a child process, which reports its own CPU seconds (its children's,
journalctl's, included) and its peak resident memory:

* whole: every line of the start read and parsed again (what each look did before: ~8 looks a watch call);
* first: one look from no cursor, at the watch's limit (max_bytes_per_poll, 8 MiB);
* next: the look after it, from its cursor.

Prints one line a case (JSON too with --json).  Timings belong here, never in a pass/fail test.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

FAKE = """#!/usr/bin/python3
import json, os, sys
after = int(sys.argv[sys.argv.index("--after-cursor") + 1]) if "--after-cursor" in sys.argv else -1
out = sys.stdout
with open(os.path.join(os.path.dirname(os.path.abspath(sys.argv[0])), "journal.jsonl")) as f:
    for i, line in enumerate(f):
        if i > after:
            e = json.loads(line)
            e["__CURSOR"] = str(i)
            out.write(json.dumps(e) + "\\n")
"""

CHILD = """
import json, resource, sys, time
sys.path.insert(0, %(root)r)
from deployer.host.module_utils import journal_follow as jf
jf.JOURNALCTL = %(exe)r
import subprocess
def run(cmd, use_unsafe_shell=False, encoding=None):
    r = subprocess.run(cmd, shell=use_unsafe_shell, stdout=subprocess.PIPE)
    return r.returncode, r.stdout, b""
f = jf.Follow("vllm", False)
cursor = %(cursor)r
t0 = time.time()
entries, f.cursor, more, n = jf.read_journal(run, "deployer-engine", "0" * 32, cursor, %(limit)d)
for t, m in entries:
    f.feed(t, m)
me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"bytes": n, "lines": len(entries), "cursor": f.cursor, "more": more,
                  "wall_s": round(time.time() - t0, 2),
                  "cpu_s": round(me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime, 2),
                  "max_rss_mib": round(me.ru_maxrss / 1024, 1)}))
"""


def look(exe, cursor, limit):
    code = CHILD % {"root": str(ROOT), "exe": exe, "cursor": cursor, "limit": limit}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(r.stdout.splitlines()[-1])


def main():
    a = argparse.ArgumentParser()
    a.add_argument("--lines", type=int, default=3200)
    a.add_argument("--line-bytes", type=int, default=16000)
    a.add_argument("--json", action="store_true")
    args = a.parse_args()
    with tempfile.TemporaryDirectory() as d:
        exe = os.path.join(d, "journalctl")
        Path(exe).write_text(FAKE)
        os.chmod(exe, 0o755)
        line = "(" + "a" * args.line_bytes
        with open(os.path.join(d, "journal.jsonl"), "w") as f:
            for i in range(args.lines):
                f.write(json.dumps({"MESSAGE": line, "__MONOTONIC_TIMESTAMP": str(1000000 + i)}) + "\n")
        total = os.path.getsize(os.path.join(d, "journal.jsonl"))
        limit = 8 << 20
        out = {"journal_mb": round(total / 1e6, 1)}
        out["whole"] = look(exe, None, total + (1 << 20))
        out["first"] = look(exe, None, limit)
        out["next"] = look(exe, out["first"]["cursor"], limit)
    if args.json:
        print(json.dumps(out))
        return
    print(f"journal: {args.lines} hostile lines of {args.line_bytes} B, {out['journal_mb']} MB")
    for case in ("whole", "first", "next"):
        c = out[case]
        print(f"{case:6s} read {c['bytes'] / 1e6:6.1f} MB ({c['lines']:5d} lines): {c['cpu_s']:6.2f} CPU-s, "
              f"{c['wall_s']:6.2f} s, peak RSS {c['max_rss_mib']:7.1f} MiB")


if __name__ == "__main__":
    main()
