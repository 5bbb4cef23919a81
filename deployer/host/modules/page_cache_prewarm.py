#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import annotations

DOCUMENTATION = r"""
---
module: page_cache_prewarm
short_description: Read model files into the page cache while the old server still serves
description:
  - Reads every file under I(paths) once, in parallel and optionally rate-limited, so that the next
    server start reads its weights from memory instead of disk.  Run it before the old server stops; the
    seconds it takes are not downtime.
  - Skipped, with a note saying why, when C(MemAvailable) in C(/proc/meminfo) cannot hold the files plus
    I(reserve_gib), because prewarming what the kernel would evict again is wasted I/O.
  - Works in slices of I(slice_seconds) and returns its progress, so a caller can loop (C(until)) and show
    it; the next call resumes where the last one stopped (progress kept in I(state_file)).  A changed file
    set (names, sizes, mtimes) starts over.
options:
  paths:
    description: Directories (read recursively) or files to read.
    type: list
    elements: path
    required: true
  threads:
    description: Files read at the same time.
    type: int
    default: 4
  rate_mib_per_second:
    description: Read at most this many MiB per second in total (0 = as fast as the disk goes).
    type: int
    default: 0
  reserve_gib:
    description: MemAvailable that must remain after the files are cached, GiB.
    type: float
    default: 16
  slice_seconds:
    description: Return after about this long with the progress so far (the caller loops).
    type: float
    default: 5
  state_file:
    description: Where the progress between calls is kept.
    type: path
    default: /run/deployer-prewarm.json
attributes:
  check_mode:
    support: full
    description: Measures and reports whether the files would fit; reads nothing.
  diff_mode:
    support: none
    description: Returns no diff.
author:
  - deployer maintainers (@deployer)
"""

EXAMPLES = r"""
- name: Prewarm the checkpoint.
  page_cache_prewarm:
    paths: [/srv/models/Kimi-K2.5, /opt/deployer/drafters/0123456789abcdef]
    rate_mib_per_second: 2000
  register: prewarm
  until: prewarm.state != 'running'
  retries: 1000
  delay: 0
"""

RETURN = r"""
state:
  description: running (call again), done, or skipped (see note).
  returned: always
  type: str
total_bytes:
  description: Bytes in the files.
  returned: always
  type: int
done_bytes:
  description: Bytes read so far.
  returned: always
  type: int
percent:
  description: done_bytes / total_bytes, percent.
  returned: always
  type: float
seconds:
  description: Seconds spent reading over all calls.
  returned: always
  type: float
finished_at:
  description: The host's clock (epoch seconds) when the last byte was read.
  returned: when state is done
  type: float
mem_available_bytes:
  description: MemAvailable when the prewarm started.
  returned: always
  type: int
note:
  description: What happened, in words (why it was skipped, or the read rate).
  returned: always
  type: str
"""

import hashlib
import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.host_io import write_atomic

CHUNK = 8 << 20


def list_files(paths):
    files = []
    for p in paths:
        if os.path.isfile(p):
            files.append(p)
            continue
        for d, dirs, names in os.walk(p):
            dirs.sort()
            files += [os.path.join(d, n) for n in sorted(names)]
    out = []
    for f in files:
        st = os.stat(f)
        out.append((f, st.st_size, int(st.st_mtime)))
    return out


def mem_available():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


class Bucket(object):
    """Shared token bucket: at most ``rate`` bytes per second over all threads (0 = unlimited)."""

    def __init__(self, rate):
        self.rate, self.lock, self.t, self.allow = rate, threading.Lock(), time.monotonic(), 0.0

    def take(self, n):
        if not self.rate:
            return
        with self.lock:
            now = time.monotonic()
            self.allow = min(self.allow + (now - self.t) * self.rate, self.rate)
            self.t = now
            self.allow -= n
            wait = -self.allow / self.rate if self.allow < 0 else 0
        if wait:
            time.sleep(wait)


def read_file(path, start, size, deadline, bucket, progress, lock):
    """Read from ``start`` until the end or the deadline; returns the new offset."""
    pos = start
    buf = bytearray(CHUNK)
    with open(path, "rb", buffering=0) as f:
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        f.seek(pos)
        while pos < size and time.monotonic() < deadline:
            bucket.take(CHUNK)
            n = f.readinto(buf)
            if not n:
                break
            pos += n
            with lock:
                progress[path] = pos
    return pos


def main():
    m = AnsibleModule(argument_spec=dict(
        paths=dict(type="list", elements="path", required=True),
        threads=dict(type="int", default=4),
        rate_mib_per_second=dict(type="int", default=0),
        reserve_gib=dict(type="float", default=16),
        slice_seconds=dict(type="float", default=5),
        state_file=dict(type="path", default="/run/deployer-prewarm.json"),
    ), supports_check_mode=True)
    p = m.params
    missing = [x for x in p["paths"] if not os.path.exists(x)]
    if missing:
        m.fail_json(msg="prewarm: %s not found" % ", ".join(missing))
    files = list_files(p["paths"])
    total = sum(s for _f, s, _t in files)
    key = hashlib.sha256(json.dumps(files).encode()).hexdigest()
    try:
        with open(p["state_file"]) as f:
            st = json.load(f)
        if st.get("key") != key:
            st = None
    except (OSError, ValueError):
        st = None
    if st is None:
        st = {"key": key, "offsets": {}, "seconds": 0.0, "mem_available": mem_available()}
    avail, reserve = st["mem_available"], int(p["reserve_gib"] * (1 << 30))
    res = dict(changed=False, total_bytes=total, mem_available_bytes=avail)
    if total + reserve > avail:
        m.exit_json(state="skipped", done_bytes=0, percent=0.0, seconds=0.0,
                    note="skipped: the files take %.1f GiB, MemAvailable is %.1f GiB and %.1f GiB must stay free"
                    % (total / 2.0 ** 30, avail / 2.0 ** 30, p["reserve_gib"]), **res)
    if m.check_mode:
        m.exit_json(state="skipped", done_bytes=0, percent=0.0, seconds=0.0,
                    note="check mode: would read %.1f GiB (MemAvailable %.1f GiB)"
                    % (total / 2.0 ** 30, avail / 2.0 ** 30),
                    **res)
    offsets = st["offsets"]
    todo = [(f, s) for f, s, _t in files if offsets.get(f, 0) < s]
    t0 = time.monotonic()
    deadline = t0 + max(0.5, p["slice_seconds"])
    bucket, lock = Bucket(p["rate_mib_per_second"] << 20), threading.Lock()
    progress = dict(offsets)
    with ThreadPoolExecutor(max_workers=max(1, p["threads"])) as pool:
        futures = [pool.submit(read_file, f, offsets.get(f, 0), s, deadline, bucket, progress, lock) for f, s in todo]
        errors = []
        for fut in futures:
            try:
                fut.result()
            except OSError as e:
                errors.append(str(e))
    if errors:
        m.fail_json(msg="prewarm: reading failed: %s" % "; ".join(errors[:3]))
    st["offsets"] = progress
    st["seconds"] = round(st["seconds"] + time.monotonic() - t0, 3)
    done = sum(min(progress.get(f, 0), s) for f, s, _t in files)
    finished = done >= total
    if finished:
        try:
            os.unlink(p["state_file"])
        except OSError:
            pass
    else:
        write_atomic(p["state_file"], json.dumps(st), 0o644)
    rate = done / st["seconds"] / 2.0 ** 30 if st["seconds"] else 0.0
    res.update(state="done" if finished else "running", done_bytes=done, seconds=st["seconds"],
               percent=round(100.0 * done / total, 1) if total else 100.0,
               phase="prewarm", phase_title="page-cache prewarm", elapsed_seconds=st["seconds"],
               progress=[round(done / 2.0 ** 30, 1), round(total / 2.0 ** 30, 1)],
               note="read %.1f GiB in %.1f s (%.2f GiB/s)" % (done / 2.0 ** 30, st["seconds"], rate))
    if finished:
        res["finished_at"] = round(time.time(), 3)
    m.exit_json(**res)


if __name__ == "__main__":
    main()
