# -*- coding: utf-8 -*-
"""Release bookkeeping on the host: pure helpers shared by the release modules and the CLI."""
from __future__ import annotations

import json
import os
import tempfile


def read_release(release_dir):
    try:
        with open(os.path.join(release_dir, "release.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {"id": os.path.basename(release_dir.rstrip("/"))}


def write_json_atomic(path, data):
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=os.path.dirname(path))
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")
    os.chmod(tmp, 0o644)
    os.rename(tmp, path)


def order_key(release):
    """Newest first: by last deploy time, then by creation."""
    return (release.get("deployed_at") or release.get("created_at") or 0, release.get("id", ""))


def plan_prune(releases, keep, protected_ids):
    """Pure: which release ids to delete.  ``releases``: list of manifest dicts.

    Keeps ``keep`` releases (at least 2): always the protected ones (live, previous), then
    releases that were deployed at some time (``deployed_at`` set), newest first, and only then
    releases that never served (verification or load failed), newest first.  So the never-deployed
    ones are pruned first.
    """
    keep = max(int(keep), 2)
    by_age = sorted(releases, key=order_key, reverse=True)
    kept = [r["id"] for r in by_age if r["id"] in protected_ids]
    deployed = [r for r in by_age if r.get("deployed_at")]
    never = [r for r in by_age if not r.get("deployed_at")]
    for r in deployed + never:
        if len(kept) >= keep:
            break
        if r["id"] not in kept:
            kept.append(r["id"])
    return sorted(r["id"] for r in releases if r["id"] not in kept)
