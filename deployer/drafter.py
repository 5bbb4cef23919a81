"""Drafter checkpoint manifests (controller side).  Pure apart from reading the files.

The drafter is addressed by the sha256 of its content: ``tree_sha256`` hashes the sorted
list of (relative path, size, file sha256).  Hashing ~6 GB takes a while, so file hashes are
cached in ``~/.cache/deployer/hashes.json`` keyed by (path, size, mtime_ns): a no-op ``up``
never re-reads the weights.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "deployer" / "hashes.json"


class DrafterError(ValueError):
    pass


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _merge_into_cache(new: dict) -> None:
    """Add this run's new hashes to the cache file as it is now.  Runs on one controller share it (a fleet's
    parallel deploys, the test suite's workers): the file is re-read under a lock, so what another run wrote while
    this one hashed is kept; written to a temp file and renamed, so a reader never sees half of it.  Hashing
    happens outside the lock (minutes for a real drafter)."""
    import fcntl
    CACHE.parent.mkdir(parents=True, exist_ok=True)
    with open(CACHE.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            cache = json.loads(CACHE.read_text())
        except (OSError, ValueError):
            cache = {}
        cache.update(new)
        tmp = CACHE.with_suffix(f".{os.getpid()}.tmp")   # concurrent deploys never share a temp file
        tmp.write_text(json.dumps(cache))
        tmp.replace(CACHE)


def tree_manifest(src_dir: str) -> dict:
    if not src_dir:
        raise DrafterError("deployer_drafter_src_dir is empty; expected the drafter checkpoint directory on this "
                           "machine")
    root = Path(os.path.expanduser(src_dir))
    if not (root / "config.json").is_file():
        raise DrafterError(f"drafter: {root}/config.json not found; expected an EAGLE-3 drafter checkpoint directory")
    try:
        cache = json.loads(CACHE.read_text())
    except (OSError, ValueError):
        cache = {}
    files, new = [], {}
    for p in sorted(x for x in root.rglob("*") if x.is_file() and not x.name.startswith(".")):
        st = p.stat()
        key = f"{p.resolve()}|{st.st_size}|{st.st_mtime_ns}"
        sha = cache.get(key)
        if sha is None:
            sha = new[key] = _file_sha256(p)
        files.append({"path": str(p.relative_to(root)), "size": st.st_size, "sha256": sha})
    tree = hashlib.sha256("".join(f"{f['path']}\0{f['size']}\0{f['sha256']}\n" for f in files).encode()).hexdigest()
    if new:
        _merge_into_cache(new)
    try:   # the drafter's model class: the SGLang backend checks that the installed release has it
        arch = (json.loads((root / "config.json").read_text()).get("architectures") or [""])[0]
    except (OSError, ValueError, AttributeError, IndexError):
        raise DrafterError(f"drafter: {root}/config.json is not a JSON model config") from None
    return {"src": str(root), "files": files, "tree_sha256": tree, "bytes": sum(f["size"] for f in files),
            "architecture": str(arch)}
