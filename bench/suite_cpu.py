#!/usr/bin/env python3
"""Where the test suite's CPU goes, per module and per test, from a run with DEPLOYER_TEST_CPU_FILE set.

    DEPLOYER_TEST_CPU_FILE=/tmp/cpu.jsonl bash scripts/dev.sh test
    python bench/suite_cpu.py /tmp/cpu.jsonl [--top 30]

CPU seconds are each test's own processes (the pytest worker and the children it waited for: the CLI,
ansible-playbook, vLLM's checks run on this machine); a sandbox host's processes land on the test during which
the host stops (tests/conftest.py says why).  The suite is CPU-bound on CI's 2 cores, so this, not wall time, is
what a change must lower.
"""
import argparse
import collections
import json


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    rows = [json.loads(x) for x in open(a.file) if x.strip()]
    mods = collections.defaultdict(lambda: [0.0, 0.0, 0])
    for r in rows:
        m = mods[r["test"].split("::")[0]]
        m[0] += r["cpu_s"]
        m[1] += r["wall_s"]
        m[2] += 1
    print(f"{len(rows)} tests, {sum(r['cpu_s'] for r in rows):.0f} CPU s, {sum(r['wall_s'] for r in rows):.0f} "
          "wall s summed over the workers\n")
    print("| module | tests | CPU s | wall s |\n|---|---|---|---|")
    for name, (cpu, wall, n) in sorted(mods.items(), key=lambda kv: -kv[1][0])[:a.top]:
        print(f"| {name} | {n} | {cpu:.0f} | {wall:.0f} |")
    print("\n| test | CPU s | wall s |\n|---|---|---|")
    for r in sorted(rows, key=lambda r: -r["cpu_s"])[:a.top]:
        print(f"| {r['test']} | {r['cpu_s']:.0f} | {r['wall_s']:.0f} |")


if __name__ == "__main__":
    main()
