"""Helpers shared by the sandbox test modules."""
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from deployer.output import STAGES
from helpers import ROOT, STRICT

SVC = "deployer-engine"


# the default release, from where it is written once
DEFAULT_VLLM = yaml.safe_load((ROOT / "roles/deployer/defaults/main.yml").read_text())["deployer_vllm_version"]


def venv(version=DEFAULT_VLLM, patched=True):
    """Where the deployer puts a vLLM venv on a host (one per version and patch engine: deployer/plan.py)."""
    from deployer.identity import patch_engine_id
    return f"/opt/deployer/venvs/vllm-{version}" + (f"-p{patch_engine_id()}" if patched else "")


def auth():
    """curl's Authorization header for the sandbox servers (they serve their bridge address: keyed)."""
    import shlex

    from deployer.sandbox.inventory import api_key
    return "-H " + shlex.quote("Authorization: Bearer " + api_key())

needs_sandbox = pytest.mark.skipif(not STRICT and (os.geteuid() != 0 or not shutil.which("systemd-nspawn")),
                                   reason="sandbox tests need root and systemd-nspawn (scripts/dev.sh installs it)")


def deployer(*args, timeout=900, env=None):
    t0 = time.time()
    r = subprocess.run([sys.executable, "-m", "deployer.cli", *args], capture_output=True, text=True,
                       timeout=timeout, cwd=ROOT, env=env)
    r.seconds = time.time() - t0
    return r


# A pre-baked image, per test run (issue 24): the first finished deploy of the default release on any worker keeps
# its venv (installed, patched, bytecode compiled) as hard links; later modules' hosts boot with it, so only
# modules that are about installing (sandbox_hosts(seed=False)) pay for it again.  Seeds of other runs are pruned
# (tests/conftest.py).
SEED_ROOT = Path("/var/lib/deployer-sandbox-seed")
SEED = SEED_ROOT / (os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"run-{os.getpid()}")


def up(*args, **kw):
    r = deployer("up", "--sandbox", *args, **kw)
    if r.returncode == 0 and not (SEED / Path(venv()).name).exists():
        from deployer.sandbox import common, hosts
        for h in common.hosts_on_disk():
            if not common.is_balancer(h) and hosts.save_seed(h, venv(), SEED):
                break
    return r


def sh(host, cmd, check=True):
    from deployer.sandbox import hosts as sb
    return sb.ssh(host, cmd, check=check).stdout.strip()


def main_pid(host):
    return sh(host, f"systemctl show -p MainPID --value {SVC}")


STAGE_NAMES = set(STAGES.values()) | {"rollback"}   # the stage words deployer/output.py prints


def stages(text, host):
    """The stage lines of human output for one host: {stage: outcome} (`  12.3s sbx1 patch changed 1.2s ...`)."""
    out = {}
    for line in text.splitlines():
        w = line.split()
        if len(w) >= 4 and w[1] == host and w[2] in STAGE_NAMES:
            out[w[2]] = w[3]
    return out


def flat(text):
    return " ".join(text.split())


def sandbox_hosts(n, seed=True, engines=(), **kw):
    """Module fixture body: fresh sandbox hosts sbx1..sbxN for the module, stopped afterwards (``kw``: start's
    options, e.g. sudo=True, or package_cache=False for a module that installs nothing: its hosts boot without the
    package cache's links); ``seed``: they boot with this run's pre-baked venv when one is saved (SEED).  A host
    that may install gets only the part of the package cache it may install from: the default release's wheels
    and those of ``engines`` (prepared venvs' names, as scripts/dev.sh calls them: "vllm-0.18.0", "sglang-0.5.23";
    ~73,000 links instead of ~280,000: image.link_package_cache).  Without a seed to boot with (a module run on its
    own, before any deploy saved one) the hosts get that package cache whatever ``package_cache`` says: they must
    install the default release (``package_cache``: a tuple of venvs' names, exactly those)."""
    from deployer.sandbox import hosts as sb
    cache = kw.get("package_cache", True)
    if cache is False and not (seed and (SEED / Path(venv()).name).exists()):
        cache = True
    kw["package_cache"] = (f"vllm-{DEFAULT_VLLM}", *engines) if cache is True else cache
    sb.stop()
    sb.start(n, seed=SEED if seed else None, **kw)
    yield sb
    sb.stop()


# ------------------------------------------------------------------ fault rehearsals on one host (sbx1)
FAST = ["-e", "verify_enabled=false"]   # vLLM's own checks are tested elsewhere; each fault would pay ~35 s


def knobs(host="sbx1", **kw):
    """The stand-in's rehearsal knobs on a host (empty: none)."""
    from deployer.sandbox import hosts as sb
    sb.set_knobs(host, standin=kw)


def health(host="sbx1"):
    return sh(host, "curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8000/health || true")


def fail_with(arg, extra=(), host="sbx1", **knob):
    """Deploy a release whose argv holds ``arg`` (--gpu-memory-utilization) with a failure knob tied to it
    (``only_if_arg``), so the release rolled back to starts normally."""
    knobs(host, only_if_arg=arg, **knob)
    try:
        return up("-e", f"deployer_gpu_memory_utilization={arg}", *FAST, *extra)
    finally:
        knobs(host)
