"""The page-cache prewarm module (deployer/host/modules/page_cache_prewarm.py), run by Ansible on this
machine: what it reads ends up in the page cache, and its rate limit holds (issue 24: both were promised, untested)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT

MIB = 1 << 20


def prewarm(tmp_path, *args):
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"),
           "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-tmp"),
           "ANSIBLE_LOAD_CALLBACK_PLUGINS": "0"}
    r = subprocess.run([str(Path(sys.executable).parent / "ansible"), "localhost", "-c", "local", "-o",
                        "-e", f"ansible_python_interpreter={sys.executable}", "-m", "page_cache_prewarm",
                        "-a", " ".join([f"paths={tmp_path / 'model'}", f"state_file={tmp_path / 'state.json'}",
                                        "reserve_gib=0", "slice_seconds=60", *args])],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout.split("=>", 1)[1])


def resident_pages(path):
    """(resident, total) pages of ``path`` in the page cache, as util-linux's fincore counts them."""
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--raw", "-o", "RES,SIZE", str(path)],
                         capture_output=True, text=True, check=True).stdout.split()
    return int(out[0]), int(out[1])


@pytest.fixture
def model(tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    for i in range(2):
        with open(d / f"model-{i}.safetensors", "wb") as f:
            f.write(os.urandom(12 * MIB))
            f.flush()
            os.fsync(f.fileno())
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)   # out of the page cache
    return d


def test_what_it_reads_ends_up_in_the_page_cache(tmp_path, model):
    files = sorted(model.iterdir())
    before = [resident_pages(f) for f in files]
    # the test's own precondition (a tmpfs would keep every page resident: then it would prove nothing)
    assert sum(r for r, _size in before) < 24 * MIB // 2, before
    res = prewarm(tmp_path)
    assert res["state"] == "done" and res["done_bytes"] == 24 * MIB, res
    # every page read is cached; the kernel may have let a few go again by the time fincore looks (seen: 5 of 6144)
    after = [resident_pages(f) for f in files]
    assert all(r >= 0.99 * size for r, size in after), (before, after)


def test_the_read_rate_limit_holds(tmp_path, model):
    """8 MiB/s over 24 MiB: at least ~2 s (the bucket starts empty and may lend one second's worth), never faster
    than the limit allows; unlimited, the same read takes a fraction of that."""
    res = prewarm(tmp_path, "rate_mib_per_second=8")
    assert res["state"] == "done" and res["done_bytes"] == 24 * MIB, res
    assert res["seconds"] >= 2.0, res
    assert res["done_bytes"] / MIB / res["seconds"] <= 8 * 1.5, res
