# -*- coding: utf-8 -*-
"""Keep Ansible's built modules between playbook runs, keyed by everything they are built from."""
from __future__ import annotations

DOCUMENTATION = r"""
name: deployer_ansiballz_cache
type: aggregate
short_description: keep the AnsiballZ payloads between runs, keyed by the sources they are built from
description:
  - ansible-core builds each module's payload (the module and every module_utils file it imports, found by
    compiling their syntax trees) once per run, in the run's own temporary directory, so every
    C(ansible-playbook) run pays it again for every module it uses (~2.8 CPU seconds of a changed deploy's ~13.5
    on the controller, docs/benchmarks.md).
  - This callback points that per-run directory's C(ansiballz_cache) at a persistent one whose name is a hash
    of everything a payload is built from - the ansible-core release and every file of its package, every
    configured module and module_utils path, the collections paths, the Python version; so a changed file
    (a module edited, ansible-core upgraded) is another directory and never a stale payload.
  - The directory is the controller user's own (mode 0700), like C(~/.ansible); payloads are pickles that
    ansible-core loads, so nobody else may write there. Only the newest few directories are kept.
  - Off when the cache root cannot be made; ansible-core then builds per run, as it does by default.
  - Each cached payload also carries the bytecode of its Python files (hash-checked C(.pyc) entries beside each
    C(.py), compiled by the controller's Python). A host runs the payload from the zip, where Python cannot write
    bytecode, so it compiled C(ansible.module_utils.basic) and the rest again in every module run (~0.1 of a
    module run's ~0.2 CPU seconds). A host whose Python has another bytecode version ignores the entries and
    compiles as before; a C(.pyc) whose source hash does not match its C(.py) is never used. The payload grows
    ~3x (~155 -> ~455 KB for a module importing C(basic)), sent once per module run.
options:
  cache_root:
    description: where the keyed directories live
    default: ~/.cache/deployer/ansiballz
    env:
      - name: DEPLOYER_ANSIBALLZ_CACHE
    type: path
"""

import dataclasses
import hashlib
import importlib.util
import io
import os
import shutil
import stat
import sys
import zipfile

from ansible import constants as C
from ansible import release
from ansible.plugins.callback import CallbackBase

KEEP = 3            # keyed directories kept (one per code version a controller switches between)...
KEEP_S = 24 * 3600  # ...and any used within a day (a run of another version may be using it right now)


# Part of the key: payloads built by another version of what this file adds to them are another directory.
PAYLOAD_FORMAT = "bytecode-1"


def with_bytecode(zip_data: bytes) -> bytes:
    """A base64 AnsiballZ zip with a hash-checked ``.pyc`` entry (this Python's bytecode) beside each ``.py``."""
    import base64
    from importlib._bootstrap_external import _code_to_hash_pyc

    src = zipfile.ZipFile(io.BytesIO(base64.b64decode(zip_data)))
    names = set(src.namelist())
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            body = src.read(info)
            dst.writestr(info, body)
            pyc = info.filename[:-3] + ".pyc"
            if not info.filename.endswith(".py") or pyc in names:
                continue
            code = compile(body, info.filename, "exec", dont_inherit=True)
            entry = zipfile.ZipInfo(pyc, date_time=info.date_time)
            entry.compress_type = info.compress_type
            dst.writestr(entry, bytes(_code_to_hash_pyc(code, importlib.util.source_hash(body), checked=True)))
    return base64.b64encode(out.getvalue())


def _bytecode_in_payloads() -> None:
    """Payloads are written to the cache with their bytecode (ansible-core's ``_CachedModule.dump``: every payload
    a worker builds passes there once, before any run reads it back)."""
    from ansible.executor import module_common
    cls = module_common._CachedModule
    if getattr(cls.dump, "_deployer_bytecode", False):
        return
    plain = cls.dump

    def dump(self, path):
        try:
            self = dataclasses.replace(self, zip_data=with_bytecode(self.zip_data))
        except (SyntaxError, ValueError, zipfile.BadZipFile):
            pass     # a source this Python cannot compile: the payload as ansible-core built it
        return plain(self, path)
    dump._deployer_bytecode = True
    cls.dump = dump


def _tree_fingerprint(h, root: str) -> None:
    """Every file under ``root``: its path, size and mtime (content changes move one of them)."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            if name.endswith((".pyc", ".pyo")):
                continue
            p = os.path.join(dirpath, name)
            try:
                st = os.stat(p)
            except OSError:
                continue
            h.update(f"{p}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())


def cache_key(paths: list[str]) -> str:
    """The directory name for payloads built from ``paths`` (and this Python, and this ansible-core)."""
    h = hashlib.sha256()
    h.update(f"{sys.version}\0{release.__version__}\0{PAYLOAD_FORMAT}\n".encode())
    for p in paths:
        h.update(f"root {p}\n".encode())
        if os.path.isdir(p):
            _tree_fingerprint(h, p)
    return h.hexdigest()[:24]


def _sources() -> list[str]:
    import ansible
    paths = [os.path.dirname(ansible.__file__)]
    for name in ("DEFAULT_MODULE_PATH", "DEFAULT_MODULE_UTILS_PATH", "COLLECTIONS_PATHS"):
        paths += [os.path.realpath(os.path.expanduser(p)) for p in (getattr(C, name, None) or [])]
    return paths


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "deployer_ansiballz_cache"
    CALLBACK_NEEDS_ENABLED = True

    def v2_playbook_on_start(self, playbook):
        try:
            root = os.path.expanduser(self.get_option("cache_root"))
            os.makedirs(root, mode=0o700, exist_ok=True)
            st = os.lstat(root)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
                self._display.warning(f"deployer_ansiballz_cache: {root} is not a directory only this user may "
                                      "use (mode 0700): modules are built per run")
                return
            keyed = os.path.join(root, cache_key(_sources()))
            os.makedirs(keyed, mode=0o700, exist_ok=True)
            os.utime(keyed)      # most recently used: what pruning keeps
            _bytecode_in_payloads()
            link = os.path.join(C.DEFAULT_LOCAL_TMP, "ansiballz_cache")
            if not os.path.lexists(link):
                os.symlink(keyed, link)
            self._prune(root, keyed)
        except OSError as e:
            self._display.warning(f"deployer_ansiballz_cache: off ({e}): modules are built per run")

    @staticmethod
    def _prune(root: str, keep: str) -> None:
        import time
        dirs = sorted(((e.stat(follow_symlinks=False).st_mtime, e.path) for e in os.scandir(root)
                       if e.is_dir(follow_symlinks=False)), reverse=True)
        for mtime, path in dirs[KEEP:]:
            if path != keep and time.time() - mtime > KEEP_S:
                shutil.rmtree(path, ignore_errors=True)
