#!/usr/bin/env python3
"""Patch engine timings on the real files of real vLLM wheels (cached by the tests under ~/.cache/deployer/wheels).
Usage: python bench/patch_engine.py [versions...]"""
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
from deployer.host.module_utils import eagle3_patch as pe  # noqa: E402
from vllm_wheels import extract  # noqa: E402  (download + unzip the target files)


def ms(f, n=5):
    t = []
    for _ in range(n):
        t0 = time.perf_counter()
        f()
        t.append(time.perf_counter() - t0)
    return round(statistics.median(t) * 1000, 1)


def main(versions):
    print("| vLLM | needed | check (ms) | apply (ms) | re-apply (ms) | revert (ms) |")
    print("|---|---|---|---|---|---|")
    for v in versions:
        root = str(extract(v, Path(tempfile.mkdtemp()) / v))
        check = ms(lambda root=root: pe.status(root))
        t0 = time.perf_counter()
        res = pe.apply(root)
        apply_ms = round((time.perf_counter() - t0) * 1000, 1)
        again = ms(lambda root=root: pe.apply(root), 3)
        t0 = time.perf_counter()
        pe.revert(root)
        revert_ms = round((time.perf_counter() - t0) * 1000, 1)
        patches = ", ".join(res["patches"]) or "none (native)"
        print(f"| {v} | {patches} | {check} | {apply_ms} | {again} | {revert_ms} |")


if __name__ == "__main__":
    main(sys.argv[1:] or ["0.16.0", "0.17.1", "0.18.0", "0.33.0"])
