#!/usr/bin/env python3
"""Bytecode beside the sources in uv's cache of unpacked wheels, compiled once by this machine's python3.

    python3 scripts/precompile_uv_cache.py UV_CACHE_DIR STAMP_DIR        (scripts/dev.sh runs it)

The sandbox's hosts install their engines with ``uv pip install --offline --compile-bytecode`` from a hard-linked
copy of this machine's uv cache (deployer/sandbox/hosts.py).  uv links every file of a cached wheel, bytecode
included, and its compile step leaves a file alone whose bytecode is current (it compiles with force=False for
timestamp-checked bytecode), so a sandbox install then costs ~4 CPU-s instead of ~42 on a 2-core machine
(docs/benchmarks.md).  What the deployer runs on a host is unchanged - the same command on the same
files; only the sandbox's pre-seeded cache holds bytecode that a real host's cache does not (a real host compiles
it during the install, as before).  A wheel's ``.data`` tree is left alone: uv refuses a ``__pycache__`` among a
wheel's scripts.  Idempotent: a stamp named after the archive's entries skips the walk when nothing was added.
"""
import compileall
import hashlib
import os
import re
import sys
from pathlib import Path

SKIP = re.compile(r"[.]data/")   # a wheel's scripts/headers/data: installed elsewhere, and uv checks them


def compile_archive(archive: Path, workers: int = 0) -> bool:
    """Compile every Python file under ``archive`` but those in a wheel's ``.data`` tree; True when all compiled
    (vendored Python 2 files fail, as they do when uv compiles them: that is not an error here either)."""
    return bool(compileall.compile_dir(str(archive), quiet=2, workers=workers, rx=SKIP))


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    archive, stamps = Path(argv[1]) / "archive-v0", Path(argv[2])
    if not archive.is_dir():
        return 0
    key = hashlib.sha256("\n".join(sorted(os.listdir(archive))).encode()).hexdigest()[:16]
    stamp = stamps / f"uv-bytecode-{key}"
    if stamp.exists():
        return 0
    compile_archive(archive)
    stamps.mkdir(parents=True, exist_ok=True)
    for old in stamps.glob("uv-bytecode-*"):
        old.unlink()
    stamp.touch()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
