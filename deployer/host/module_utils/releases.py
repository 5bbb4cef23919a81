# -*- coding: utf-8 -*-
"""Release bookkeeping on the host, shared by the release modules and the CLI: manifests, pruning, links, what a
release's files still match, and the store's state as the status and no-op read it (``host_state``).  The live
system's side - the unit, /health, the venv's patch state, the GPUs - is host_probe.py."""
from __future__ import annotations

import json
import os

try:
    from ansible.module_utils.host_io import write_atomic  # on the host
except ImportError:    # the controller
    from deployer.host.module_utils.host_io import write_atomic


def read_release(release_dir):
    try:
        with open(os.path.join(release_dir, "release.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {"id": os.path.basename(release_dir.rstrip("/"))}


def read_releases(releases_dir):
    """Every release's manifest under ``releases_dir`` (hidden names skipped), each with its ``id``."""
    out = []
    try:
        names = sorted(os.listdir(releases_dir))
    except OSError:
        names = []
    for name in names:
        d = os.path.join(releases_dir, name)
        if os.path.isdir(d) and not name.startswith("."):
            r = read_release(d)
            r["id"] = name
            out.append(r)
    return out


def write_json_atomic(path, data):
    write_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n", 0o644)


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


def plan_collect(store_dir, present, kept_manifests, key, in_use=()):
    """Pure: which entries of a shared store (venvs/, drafters/) no kept release uses.  ``present``: the
    names in ``store_dir``; ``key``: the manifest field holding the path ("venv", "drafter_dir");
    ``in_use``: paths the running deploy needs (its own venv and drafter), never collected.  Hidden names are
    left alone, except ``.trash-*`` (a removal that was interrupted) and ``.incoming-<name>`` (a drafter copy
    that was interrupted) when ``<name>`` is not what the running deploy ships: an abandoned copy nothing will
    resume (the running deploy's own staging dir is resumed, never collected)."""
    keep = {os.path.normpath(p) for p in in_use if p}
    keep |= {os.path.normpath(m[key]) for m in kept_manifests if m.get(key)}

    def abandoned(n):
        return n.startswith(".incoming-") and \
            os.path.normpath(os.path.join(store_dir, n[len(".incoming-"):])) not in keep
    return sorted(n for n in present if n.startswith(".trash-") or abandoned(n)
                  or (not n.startswith(".") and os.path.normpath(os.path.join(store_dir, n)) not in keep))


def unused_uv_archives(uv_cache_dir):
    """The entries of uv's cache (``archive-v*/<id>``: an unpacked wheel) that no venv uses: the venvs are
    hard-linked into it, so an entry none of whose files has another link is used by none.  Removing a venv frees
    its disk only once these go too (uv fetches an entry again if it is ever needed)."""
    out = []
    try:
        stores = [os.path.join(uv_cache_dir, d) for d in os.listdir(uv_cache_dir) if d.startswith("archive-v")]
    except OSError:
        return out
    for store in stores:
        for name in sorted(os.listdir(store)):
            entry = os.path.join(store, name)
            if name.startswith(".") or os.path.islink(entry) or not os.path.isdir(entry):
                continue
            shared = False
            for dirpath, _dirs, files in os.walk(entry):
                for f in files:
                    st = os.lstat(os.path.join(dirpath, f))
                    if st.st_nlink > 1:
                        shared = True
                        break
                if shared:
                    break
            if not shared:
                out.append(entry)
    return out


def record(release_dir, result, facts, check_mode=False):
    """Set a release's result and facts in its manifest, atomically.  Returns (changed, before, after);
    changed only when the result or a fact differs (recording the same outcome twice is a no-op)."""
    import time
    before = read_release(release_dir)
    after = dict(before)
    after.update(facts or {})
    after["result"] = result
    now = time.time()
    after.setdefault("created_at", now)
    changed = any(before.get(k) != v for k, v in after.items() if k != "history") or "created_at" not in before
    if result == "live" and changed:
        after["deployed_at"] = now
    if changed:
        after["history"] = (list(before.get("history") or []) + [{"result": result, "at": now}])[-20:]
    if changed and not check_mode:
        write_json_atomic(os.path.join(release_dir, "release.json"), after)
    return changed, before, after


def prune(releases_dir, keep, protect_links, venvs_dir=None, drafters_dir=None, in_use=(), check_mode=False,
          uv_cache_dir=None):
    """Keep ``keep`` releases (never the targets of ``protect_links``), then remove the venvs and drafters no
    kept release uses, and (when a venv went) the entries of ``uv_cache_dir`` no venv uses any more.  Returns
    (removed release ids, kept ids, collected paths)."""
    import shutil
    if not os.path.isdir(releases_dir):
        return [], [], []
    releases = []
    for name in sorted(os.listdir(releases_dir)):
        d = os.path.join(releases_dir, name)
        if os.path.isdir(d) and not name.startswith("."):
            r = read_release(d)
            r["id"] = name
            r.setdefault("created_at", os.stat(d).st_mtime)
            releases.append(r)
    protected = set(os.path.basename(os.path.realpath(link)) for link in protect_links if os.path.islink(link))
    removed = plan_prune(releases, keep, protected)
    kept = [r for r in releases if r["id"] not in removed]
    collected = []
    for store, key in ((venvs_dir, "venv"), (drafters_dir, "drafter_dir")):
        if store and os.path.isdir(store):
            collected += [os.path.join(store, n) for n in plan_collect(store, os.listdir(store), kept, key, in_use)]
    if not check_mode:
        for rid in removed:
            shutil.rmtree(os.path.join(releases_dir, rid))
        for path in collected:
            # rename first: a half-deleted venv must never look complete (its marker goes first)
            name = os.path.basename(path)
            trash = path if name.startswith(".trash-") else os.path.join(os.path.dirname(path), ".trash-" + name)
            if trash != path:
                os.rename(path, trash)
            shutil.rmtree(trash)
    if uv_cache_dir and any(os.path.dirname(c) == venvs_dir for c in collected):
        archives = unused_uv_archives(uv_cache_dir)
        collected += archives
        if not check_mode:
            for path in archives:
                trash = os.path.join(os.path.dirname(path), ".trash-" + os.path.basename(path))
                os.rename(path, trash)
                shutil.rmtree(trash, ignore_errors=True)
    return removed, sorted(r["id"] for r in kept), collected


def relink(link, target, check_mode=False):
    """Point ``link`` at ``target`` by an atomic rename of a new symlink; True when it moved."""
    cur = os.readlink(link) if os.path.islink(link) else None
    if cur == target:
        return False
    if not check_mode:
        tmp = os.path.join(os.path.dirname(link), "." + os.path.basename(link) + ".tmp")
        if os.path.lexists(tmp):
            os.unlink(tmp)
        os.symlink(target, tmp)
        os.rename(tmp, link)
    return True


SUMMARY_KEYS = ("id", "backend", "engine_version", "vllm_version", "patch_fingerprint", "drafter_tree_sha256",
                "result", "deployed_at", "created_at", "user", "controller", "phase_seconds", "load_seconds",
                "acceptance_rate", "mean_acceptance_length", "failed_stage", "compile_cache", "verify_platform", "venv",
                "api_protected", "service_user", "downtime", "prewarm", "kv_cache_tokens", "kv_cache_tokens_planned",
                "tokens_per_second", "speculative", "speculation_payoff", "argv", "api_exposure")


def _link(root, name):
    p = os.path.join(root, name)
    return os.path.basename(os.path.realpath(p)) if os.path.islink(p) else None


def sha256_file(path):
    import hashlib
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None


SUMS = ".deployer-sha256sums"     # a release's own files as rendered (written by the render role, `sha256sum`)


def edited_files(release_dir):
    """Names of the release's files that differ from what was rendered (its SUMS file), e.g. an ``argv.json``
    or unit edited by hand: never silently trusted.  [] when the release has no SUMS record (older releases)."""
    try:
        with open(os.path.join(release_dir, SUMS)) as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    bad = []
    for line in lines:
        sha, _, name = line.partition("  ")
        if name and sha256_file(os.path.join(release_dir, name)) != sha:
            bad.append(name)
    return bad


def drafter_changed(drafter_dir):
    """The drafter's files that changed after they were shipped, cheaply (no hashing): missing, another size
    than the manifest the drafter role wrote (``.deployer-complete``), or modified after it.  The drafter role
    re-checks every sha256 on each deploy that is not a no-op (and re-ships what differs)."""
    marker = os.path.join(drafter_dir or "", ".deployer-complete")
    try:
        with open(marker) as f:
            manifest = json.load(f)
        done = os.stat(marker).st_mtime_ns
    except (OSError, ValueError):
        return []
    out = []
    for item in manifest.get("files") or []:
        path = os.path.join(drafter_dir, item.get("path", ""))
        try:
            st = os.stat(path)
        except OSError:
            out.append("%s (missing)" % item.get("path"))
            continue
        if st.st_size != item.get("size"):
            out.append("%s (%d bytes, shipped %s)" % (item.get("path"), st.st_size, item.get("size")))
        elif st.st_mtime_ns > done:
            out.append("%s (modified after it was shipped)" % item.get("path"))
    return out


def release_needs(manifest):
    """Files a release needs to run without reinstalling anything (venv and drafter completion markers)."""
    need = []
    if manifest.get("venv"):
        need.append(os.path.join(manifest["venv"], ".deployer-installed"))
    if manifest.get("drafter_dir"):
        need.append(os.path.join(manifest["drafter_dir"], ".deployer-complete"))
    return need


def _sglang_api_key(release_dir):
    """The key in an SGLang release's secret file (``api-key: "<JSON string>"``, templates/sglang-secrets.yaml.j2)."""
    try:
        with open(os.path.join(release_dir, "sglang-secrets.yaml")) as f:
            for line in f:
                if line.startswith("api-key:"):
                    return str(json.loads(line.split(":", 1)[1].strip()))
    except (OSError, ValueError):
        pass
    return ""


def _env_key(path, envfile):
    try:
        with open(path) as f:
            return envfile.parse(f.read()).get("VLLM_API_KEY", "")
    except OSError:
        return ""


def live_key_set(root):
    """Whether the live secrets (``root``/secrets: the key whatever release runs is handed) hold an API key."""
    try:
        from ansible.module_utils import envfile  # on the host
    except ImportError:
        from deployer.host.module_utils import envfile
    live = os.path.join(root, "secrets")
    return bool(_env_key(os.path.join(live, "server.env"), envfile) or _sglang_api_key(live))


def secrets_current(root, wanted):
    """Whether the live secret files in ``root``/secrets hold exactly ``wanted`` ({name: content}); the contents
    are compared here on the host and never returned."""
    for name, content in (wanted or {}).items():
        try:
            with open(os.path.join(root, "secrets", os.path.basename(name))) as f:
                if f.read() != content:
                    return False
        except OSError:
            return False
    return True


def is_release_id(name):
    """A release id as ``deployer.identity.release_id`` makes them (12 hex digits), or any plain name of letters,
    digits, ``-`` and ``_``: never a path."""
    import re
    return bool(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}", str(name)))


def host_state(root, service, target=None, want_secrets=False):
    """Everything the deployer reads back from a host, in one call: releases (summaries, newest first),
    ``current``/``previous``, the lock holder, the live release's manifest, the checksum of the unit
    systemd runs now, and optionally one ``target`` release ("" = previous) with what it still needs."""
    try:
        from ansible.module_utils import envfile  # on the host (Ansible ships module_utils with the module)
    except ImportError:
        from deployer.host.module_utils import envfile  # on the controller (tests)
    rels_dir = os.path.join(root, "releases")
    releases = [{k: r.get(k) for k in SUMMARY_KEYS} for r in read_releases(rels_dir)]
    releases.sort(key=order_key, reverse=True)
    lock = None
    try:
        with open(os.path.join(root, ".lock", "holder.json")) as f:
            lock = json.load(f)
        lock.pop("token", None)
    except (OSError, ValueError):
        pass
    current, previous = _link(root, "current"), _link(root, "previous")
    out = {"root": root, "releases": releases, "current": current, "previous": previous, "lock": lock,
           "live": read_release(os.path.join(rels_dir, current)) if current else None,
           "unit_sha256": sha256_file("/etc/systemd/system/%s.service" % service)}
    if target is not None:
        tid = target or previous
        if tid and not is_release_id(tid):      # never a path: no '/', no '..' (docs/security.md)
            out["target"] = {"id": tid, "found": False, "missing": [], "edited": [], "dir": None,
                             "invalid": "expected a release id (letters, digits, - and _), got %r" % tid}
            return out
        t = {"id": tid, "found": False, "missing": [], "edited": [],
             "dir": os.path.join(rels_dir, tid) if tid else None}
        if tid and os.path.isfile(os.path.join(rels_dir, tid, "release.json")):
            m = read_release(t["dir"])
            t.update(found=True, manifest=m, missing=[p for p in release_needs(m) if not os.path.exists(p)],
                     edited=edited_files(t["dir"]) + ["drafter %s/%s" % (m["drafter_dir"], x)
                                                      for x in drafter_changed(m.get("drafter_dir"))])
            if want_secrets:
                # the key the target will serve with: the LIVE one (root/secrets, handed to whatever release runs
                # by the unit's drop-in; docs/security.md), else (a release rendered before secrets moved out of
                # releases, on a host that has no live secrets yet) the release's own
                live = os.path.join(root, "secrets")
                key = _env_key(os.path.join(live, "server.env"), envfile) or _sglang_api_key(live)
                if not key and not os.path.exists(os.path.join(live, "server.env")):
                    key = _env_key(os.path.join(t["dir"], "vllm.env"), envfile) or _sglang_api_key(t["dir"])
                t["api_key"] = key
        out["target"] = t
    return out
